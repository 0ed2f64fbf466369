//! Builds the proxy's services and runs them until shutdown.

use std::sync::Arc;

use anyhow::Context;
use csi_scsi_certs::{MaterialStore, Role};
use csi_scsi_daemon::{
    CallSpan, Check, CsiSocket, IdentityService, Metrics, Readiness, Shutdown, SocketCheck,
    StatusListener, StatusService, TlsMaterialCheck, TrustedPeers, server_layers,
};
use csi_scsi_proto::csi::controller_server::ControllerServer;
use csi_scsi_proto::csi::identity_server::IdentityServer;
use csi_scsi_proto::csi::plugin_capability::service::Type as ServiceCapability;
use tokio::sync::Notify;
use tonic::transport::Server;
use tower::Layer;

use crate::agents::AgentPool;
use crate::config::{Backend, Config};
use crate::csi::ControllerService;
use crate::directory::{AgentDirectory, DirectoryCheck, FileDirectory};
use crate::inventory::{EmbeddedInventory, Inventory};
use crate::leader::{
    LeaderCheck, LeaderGate, LeaderHandle, exit_when_leadership_lost, run_while_leader,
};
use crate::lifecycle::Lifecycle;
use crate::reconcile::{discovery, qualify, release, targets_file};
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
    tls.watch(config.tls_poll_interval);
    let backends = backends(&config).await?;
    let directory = backends.directory.clone();
    let inventory = backends.inventory.clone();
    let secrets: Arc<dyn SecretSource> = match (backends.secrets.clone(), &config.secrets_dir) {
        (Some(api), dir) => {
            // Kept for old manifests; the API is the one source there.
            if let Some(dir) = dir {
                tracing::warn!(dir = %dir.display(), "--secrets-dir is ignored with the kubernetes backend: CHAP Secrets are read through the API from the driver's namespace");
            }
            api
        }
        (None, Some(dir)) => Arc::new(DirSecrets(dir.clone())),
        (None, None) => Arc::new(NoSecrets),
    };
    let pool = AgentPool::new(
        directory.clone(),
        tls.clone(),
        config.calls.clone(),
        backends.leader.clone(),
    );
    let metrics = Metrics::new("proxy", env!("CARGO_PKG_VERSION"), Some(tls.clone()));
    pool.set_metrics(&metrics);
    let mut life = Lifecycle::new(inventory.clone(), pool, secrets)
        .allow_kubelet_settable_selectors(config.allow_kubelet_settable_selectors);
    if let Some(events) = backends.events.clone() {
        life = life.with_events(events);
    }
    let life = Arc::new(life);

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

    let trigger = backends.targets_changed.clone();
    let mut background = tokio::task::JoinSet::new();
    if let (Some(path), Backend::Embedded { .. }) = (config.targets_file.clone(), &config.backend) {
        background.spawn(targets_file::watch(
            path,
            inventory.clone(),
            trigger.clone(),
            std::time::Duration::from_secs(30),
        ));
    }
    // Only the leader discovers and writes (always us when embedded).
    let (interval, discovering) = (config.discovery_interval, life.clone());
    let settings = discovery::PassSettings {
        concurrency: config.calls.concurrency,
        forget_after: config.device_forget_after,
    };
    background.spawn(run_while_leader(backends.leader.clone(), move || {
        discovery::run(discovering.clone(), interval, trigger.clone(), settings)
    }));
    // Agents' certificates: first ones and renewals (leader only).
    if let Some(enrolment) = &config.enrolment {
        let enroller = Arc::new(enroller(
            enrolment,
            &backends,
            directory.clone(),
            tls.clone(),
            &metrics,
        )?);
        let interval = enrolment.interval;
        // Every replica follows the signer's files (a CA rotation); the
        // leader's passes renew whom a change leaves on another bundle.
        let signer_changed = Arc::new(tokio::sync::Notify::new());
        background.spawn(enroller.clone().watch_signer(
            enrolment.ca_dir.clone(),
            config.tls_poll_interval,
            signer_changed.clone(),
        ));
        background.spawn(run_while_leader(backends.leader.clone(), move || {
            enroller.clone().run(interval, signer_changed.clone())
        }));
    }
    // The wipes of deleted volumes, off the CSI call path; a new leader's
    // first scan resumes what the last one left.
    let (releasing, release_config) = (life.clone(), config.release.clone());
    background.spawn(run_while_leader(backends.leader.clone(), move || {
        release::run(releasing.clone(), release_config.clone())
    }));

    // The probes that offer a new LUN once it reads blank.
    let (qualifying, qualify_config) = (life.clone(), config.qualify.clone());
    background.spawn(run_while_leader(backends.leader.clone(), move || {
        qualify::run(qualifying.clone(), qualify_config.clone())
    }));

    // Probe (the sidecars wait for it) and /readyz alike: until the
    // directory has listed once, a missing agent says nothing about its node.
    let readiness = Readiness::new()
        .with(TlsMaterialCheck(tls.clone()))
        .with(backends.store_check)
        .with(DirectoryCheck(backends.directory.clone()));
    let mode = match config.backend {
        Backend::Embedded { .. } => "single-replica",
        Backend::Kubernetes { .. } => "lease",
    };
    let status = crate::status::ProxyStatus::new(life.clone(), metrics.clone())
        .with_leader(backends.leader.clone(), mode);
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
            )
            .with_peers(
                TrustedPeers::loopback().with_probe_sources(config.status_probe_sources.clone()),
            ),
            async move { stop.signaled().await },
        ),
    );
    // A replica that lost the Lease exits, taking its sidecars' connections
    // with it (see `exit_when_leadership_lost`); kubelet restarts it as a
    // standby.
    if backends.election.is_some() {
        let (leader, stop) = (backends.leader.clone(), shutdown.clone());
        tokio::spawn(async move {
            exit_when_leadership_lost(leader).await;
            tracing::warn!(
                "the proxy's Lease was lost: shutting down, so the sidecars here stop leading too"
            );
            stop.trigger();
        });
    }
    // The LUN grows on the array; the filesystem grows online on the node.
    let probe = readiness.with(LeaderCheck(backends.leader.clone()));
    let identity = IdentityService::new(env!("CARGO_PKG_VERSION"), CAPABILITIES.to_vec(), probe)
        .with_expansion(csi_scsi_proto::csi::plugin_capability::volume_expansion::Type::Online);
    let csi = Server::builder()
        .layer(server_layers(
            &metrics,
            "CSI Identity and Controller (csi-scsi-proxy)",
            CallSpan::InHandlers,
        ))
        .add_service(IdentityServer::new(identity))
        .add_service(
            LeaderGate(backends.leader.clone())
                .layer(ControllerServer::new(ControllerService::new(life))),
        )
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
    if let Some(election) = backends.election {
        election.step_down().await;
    }
    drop(socket);
    Ok(())
}

/// The signer of agents' certificates, with the credential check of the
/// backend: TokenReview in a cluster, join tokens without one.
fn enroller(
    config: &crate::config::EnrolmentConfig,
    backends: &Backends,
    directory: Arc<dyn crate::directory::AgentDirectory>,
    tls: Arc<MaterialStore>,
    metrics: &Metrics,
) -> anyhow::Result<crate::enrolment::Enroller> {
    use crate::enrolment::{CredentialCheck, JoinTokenCheck, RenewalsOnly, TokenReviewCheck};
    let ca = csi_scsi_certs::CertificateAuthority::load(
        &config.ca_dir.join(csi_scsi_certs::CA_CERT_FILE),
        &config.ca_dir.join(csi_scsi_certs::CA_KEY_FILE),
    )
    .context("loading the signer's CA (--signer-ca-dir)")?;
    let check: Arc<dyn CredentialCheck> = match (&backends.client, &config.join_tokens) {
        (Some(client), _) => Arc::new(TokenReviewCheck::new(client.clone(), config.token.clone())),
        (None, Some(dir)) => Arc::new(JoinTokenCheck(csi_scsi_certs::JoinTokens::new(dir))),
        (None, None) => Arc::new(RenewalsOnly),
    };
    tracing::info!(lifetime = ?config.lifetime, "signing agents' certificates");
    Ok(
        crate::enrolment::Enroller::new(directory, tls, ca, config.lifetime, check)
            .with_metrics(crate::enrolment::EnrolmentMetrics::register(metrics)),
    )
}

/// The inventory, directory and leadership of one backend.
struct Backends {
    inventory: Arc<Inventory>,
    directory: Arc<dyn AgentDirectory>,
    leader: LeaderHandle,
    election: Option<crate::leader::LeaderElection>,
    targets_changed: Arc<Notify>,
    store_check: Box<dyn Check>,
    events: Option<crate::events::VolumeEvents>,
    /// The backend's own Secret source (Kubernetes: the API).
    secrets: Option<Arc<dyn SecretSource>>,
    /// The Kubernetes client, with that backend.
    client: Option<kube::Client>,
}

/// The kube watch caches are synced.
struct SyncedCheck(crate::inventory::KubeInventory);

impl Check for SyncedCheck {
    fn name(&self) -> &str {
        "kubernetes"
    }

    fn check(&self) -> Result<(), String> {
        if self.0.is_synced() {
            Ok(())
        } else {
            Err("the watch caches of SCSITargets and SCSIDevices are not synced yet".into())
        }
    }
}

async fn backends(config: &Config) -> anyhow::Result<Backends> {
    match &config.backend {
        Backend::Embedded { agents_file } => {
            let store =
                EmbeddedInventory::open(&config.store).context("opening the inventory store")?;
            let directory =
                FileDirectory::load_with_grace(&agents_file.path, agents_file.removal_grace)
                    .context("reading the agents file")?;
            directory.watch(std::time::Duration::from_secs(30));
            Ok(Backends {
                inventory: Arc::new(Inventory::new(Arc::new(store.clone()))),
                directory,
                leader: LeaderHandle::always(),
                election: None,
                targets_changed: Arc::new(Notify::new()),
                store_check: Box::new(StoreCheck(store)),
                events: None,
                secrets: None,
                client: None,
            })
        }
        Backend::Kubernetes {
            namespace,
            chap_secret_namespace,
            pod_name,
            agents,
            lease_name,
        } => {
            let b = crate::kube_wiring::kube_backends(crate::kube_wiring::KubeOptions {
                namespace: namespace.clone(),
                chap_secret_namespace: chap_secret_namespace.clone(),
                agents: agents.clone(),
                lease_name: lease_name.clone(),
                identity: pod_name.clone(),
                driver_name: csi_scsi_daemon::PLUGIN_NAME.to_owned(),
                sync_timeout: std::time::Duration::from_secs(30),
            })
            .await
            .context("connecting to the Kubernetes API")?;
            Ok(Backends {
                inventory: b.inventory,
                directory: b.directory,
                leader: b.leader,
                election: Some(b.election),
                targets_changed: b.targets_changed,
                store_check: Box::new(SyncedCheck(b.kube_inventory)),
                events: Some(b.events),
                secrets: Some(b.secrets),
                client: Some(b.client),
            })
        }
    }
}
