//! Builds the proxy's services and runs them until shutdown.

use anyhow::Context;
use csi_scsi_certs::{MaterialStore, Role};
use csi_scsi_daemon::{CsiSocket, IdentityService, Readiness, Shutdown, TlsMaterialCheck};
use csi_scsi_proto::csi::identity_server::IdentityServer;
use csi_scsi_proto::csi::plugin_capability::service::Type as ServiceCapability;
use tonic::transport::Server;

use crate::config::Config;

/// Plugin capabilities of the controller side.
const CAPABILITIES: [ServiceCapability; 2] = [
    ServiceCapability::ControllerService,
    ServiceCapability::VolumeAccessibilityConstraints,
];

/// Serves CSI on the Unix socket until SIGTERM/SIGINT.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let shutdown = Shutdown::on_signals().context("installing signal handlers")?;
    let store = MaterialStore::load(config.tls.clone(), Role::Proxy, config.trust_domain.clone())
        .context("loading TLS material")?;
    store
        .watch(config.tls_poll_interval)
        .context("watching TLS material")?;

    let mut socket = CsiSocket::bind(&config.csi_socket).await?;
    tracing::info!(
        csi = %socket.path().display(),
        serial = store.current().serial(),
        "csi-scsi-proxy serving"
    );

    let readiness = Readiness::new().with(TlsMaterialCheck(store.clone()));
    let identity =
        IdentityService::new(env!("CARGO_PKG_VERSION"), CAPABILITIES.to_vec(), readiness);
    let csi = Server::builder()
        .add_service(IdentityServer::new(identity))
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
    drop(socket);
    Ok(())
}
