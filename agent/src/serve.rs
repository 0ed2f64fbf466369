//! Builds the agent's services and runs them until shutdown.

use anyhow::Context;
use csi_scsi_certs::{MaterialStore, Role, server_config};
use csi_scsi_daemon::{
    CsiSocket, IdentityService, Readiness, Shutdown, TlsMaterialCheck, ToolsCheck, tls_incoming,
};
use csi_scsi_proto::csi::identity_server::IdentityServer;
use tokio::net::TcpListener;
use tonic::transport::Server;

use crate::config::Config;

/// Serves CSI (Unix socket) and the agent API (mTLS) until SIGTERM/SIGINT.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let shutdown = Shutdown::on_signals().context("installing signal handlers")?;
    let store = MaterialStore::load(
        config.tls.clone(),
        Role::Agent {
            node: config.node_name.clone(),
        },
        config.trust_domain.clone(),
    )
    .context("loading TLS material")?;
    store
        .watch(config.tls_poll_interval)
        .context("watching TLS material")?;

    let mut socket = CsiSocket::bind(&config.csi_socket).await?;
    let listener = TcpListener::bind(config.agent_listen)
        .await
        .with_context(|| format!("binding the agent API on {}", config.agent_listen))?;
    let api_addr = listener.local_addr()?;
    tracing::info!(
        node = %config.node_name,
        csi = %socket.path().display(),
        agent_api = %api_addr,
        serial = store.current().serial(),
        "csi-scsi-agent serving"
    );

    let readiness = Readiness::new()
        .with(TlsMaterialCheck(store.clone()))
        .with(ToolsCheck::new(config.required_tools.clone()));
    // The node plugin's capabilities (topology) arrive with the Node service.
    let identity = IdentityService::new(env!("CARGO_PKG_VERSION"), Vec::new(), readiness);
    let csi = Server::builder()
        .add_service(IdentityServer::new(identity))
        .serve_with_incoming_shutdown(
            socket.incoming().context("CSI socket already served")?,
            shutdown.signaled(),
        );

    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let api = Server::builder()
        .add_service(health)
        .serve_with_incoming_shutdown(
            tls_incoming(listener, server_config(store.clone())?),
            shutdown.signaled(),
        );

    tokio::select! {
        (csi, api) = async { tokio::join!(csi, api) } => {
            csi.context("CSI server")?;
            api.context("agent API server")?;
            tracing::info!("drained; exiting");
        }
        () = shutdown.grace_elapsed(config.grace_period) => {
            tracing::warn!(grace = ?config.grace_period, "in-flight calls outlived the grace period; exiting");
        }
    }
    drop(socket);
    Ok(())
}
