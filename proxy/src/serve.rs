//! Builds the proxy's services and runs them until shutdown.

use std::sync::Arc;

use anyhow::Context;
use csi_scsi_certs::{MaterialStore, Role};
use csi_scsi_daemon::{
    Check, Component, CsiSocket, IdentityService, Metrics, Readiness, Shutdown, SocketCheck,
    StatusListener, StatusService, TlsMaterialCheck,
};
use csi_scsi_proto::csi::controller_server::ControllerServer;
use csi_scsi_proto::csi::identity_server::IdentityServer;
use csi_scsi_proto::csi::plugin_capability::service::Type as ServiceCapability;
use tokio::sync::Notify;
use tonic::transport::Server;

use crate::agents::AgentPool;
use crate::config::Config;
use crate::csi::ControllerService;
use crate::directory::{AgentDirectory, FileDirectory};
use crate::inventory::{EmbeddedInventory, Inventory};
use crate::lifecycle::Lifecycle;
use crate::reconcile::{discovery, targets_file};
use crate::secrets::{DirSecrets, NoSecrets, SecretSource};

/// Plugin capabilities of the controller side.
const CAPABILITIES: [ServiceCapability; 2] = [
    ServiceCapability::ControllerService,
    ServiceCapability::VolumeAccessibilityConstraints,
];

/// The embedded store answers queries.
struct StoreCheck(EmbeddedInventory);

impl Check for StoreCheck {
    fn name(&self) -> &str {
        "store"
    }

    fn check(&self) -> Result<(), String> {
        if self.0.is_open() {
            Ok(())
        } else {
            Err(format!(
                "inventory store {} does not answer",
                self.0.path().display()
            ))
        }
    }
}

/// Serves CSI on the Unix socket until SIGTERM/SIGINT.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let shutdown = Shutdown::on_signals().context("installing signal handlers")?;
    let tls = MaterialStore::load(config.tls.clone(), Role::Proxy, config.trust_domain.clone())
        .context("loading TLS material")?;
    tls.watch(config.tls_poll_interval)
        .context("watching TLS material")?;
    let store = EmbeddedInventory::open(&config.store).context("opening the inventory store")?;
    let directory = FileDirectory::load(&config.agents_file).context("reading the agents file")?;
    directory
        .watch(std::time::Duration::from_secs(30))
        .context("watching the agents file")?;
    let directory: Arc<dyn AgentDirectory> = directory;
    let inventory: Arc<dyn Inventory> = Arc::new(store.clone());
    let secrets: Arc<dyn SecretSource> = match &config.secrets_dir {
        Some(dir) => Arc::new(DirSecrets(dir.clone())),
        None => Arc::new(NoSecrets),
    };
    let pool = AgentPool::new(directory, tls.clone(), config.calls.clone());
    let metrics = Metrics::new(
        Component::Proxy,
        env!("CARGO_PKG_VERSION"),
        Some(tls.clone()),
    );
    pool.set_metrics(metrics.clone());
    let life = Arc::new(Lifecycle::new(inventory.clone(), pool, secrets));

    let mut socket = CsiSocket::bind(&config.csi_socket).await?;
    let status_listener = StatusListener::bind(config.status_listen)
        .await
        .with_context(|| format!("binding the status endpoints on {}", config.status_listen))?;
    tracing::info!(
        csi = %socket.path().display(),
        status = %status_listener.local_addr(),
        store = %config.store.display(),
        serial = tls.current().serial(),
        "csi-scsi-proxy serving"
    );

    let trigger = Arc::new(Notify::new());
    let mut background = tokio::task::JoinSet::new();
    if let Some(path) = config.targets_file.clone() {
        background.spawn(targets_file::watch(
            path,
            inventory.clone(),
            trigger.clone(),
            std::time::Duration::from_secs(30),
        ));
    }
    background.spawn(discovery::run(
        life.clone(),
        config.discovery_interval,
        trigger,
        config.calls.concurrency,
    ));

    let readiness = Readiness::new()
        .with(TlsMaterialCheck(tls.clone()))
        .with(StoreCheck(store));
    // The LUN grows on the array; the filesystem grows online on the node.
    let status = crate::status::ProxyStatus::new(life.clone(), metrics.clone());
    status.spawn_prober(
        config.agent_probe_interval,
        std::time::Duration::from_secs(5),
        config.calls.concurrency,
    );
    let stop = shutdown.clone();
    tokio::spawn(
        status_listener.serve(
            StatusService::new(
                readiness
                    .clone()
                    .with(SocketCheck(socket.path().to_owned())),
                metrics.clone(),
                Arc::new(status),
            ),
            async move { stop.signaled().await },
        ),
    );
    let identity =
        IdentityService::new(env!("CARGO_PKG_VERSION"), CAPABILITIES.to_vec(), readiness)
            .with_expansion(csi_scsi_proto::csi::plugin_capability::volume_expansion::Type::Online);
    let csi = Server::builder()
        .layer(metrics.grpc_layer())
        .add_service(IdentityServer::new(identity))
        .add_service(ControllerServer::new(ControllerService::new(life)))
        .serve_with_incoming_shutdown(
            socket.incoming().context("CSI socket already served")?,
            shutdown.signaled(),
        );

    tokio::select! {
        served = csi => {
            served.context("CSI server")?;
            tracing::info!("drained; exiting");
        }
        () = shutdown.grace_elapsed(config.grace_period) => {
            tracing::warn!(grace = ?config.grace_period, "in-flight calls outlived the grace period; exiting");
        }
    }
    background.shutdown().await;
    drop(socket);
    Ok(())
}
