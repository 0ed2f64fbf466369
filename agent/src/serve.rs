//! Builds the agent's services and runs them until shutdown.

use std::sync::Arc;

use anyhow::Context;
use csi_scsi_certs::{MaterialStore, Role, server_config};
use csi_scsi_daemon::{
    CallSpan, CsiSocket, HandshakeLimit, IdentityService, Metrics, Readiness, Shutdown,
    SocketCheck, StatusListener, StatusService, TlsMaterialCheck, ToolsCheck, server_layers,
    tls_incoming_bounded,
};
use csi_scsi_proto::agent::agent_server::AgentServer;
use csi_scsi_proto::agent::enrolment_server::EnrolmentServer;
use csi_scsi_proto::csi::identity_server::IdentityServer;
use csi_scsi_proto::csi::node_server::NodeServer;
use csi_scsi_proto::csi::plugin_capability::service::Type as PluginService;
use csi_scsi_proto::pluginregistration::registration_server::RegistrationServer;
use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tonic::transport::Server;

use crate::api::enrolment::EnrolmentService;
use crate::api::{AgentApi, ProxyOnly};
use crate::config::Config;
use crate::csi::node::NodeService;
use crate::device::{Attachments, Devices};
use crate::registration::{
    KubeletRegistration, RegistrationCheck, RegistrationService, fix_authority,
};

/// The longest an agent API connection lives before the agent asks the
/// proxy to reconnect (HTTP/2 GOAWAY; the proxy's channel reconnects by
/// itself, with a new handshake).
pub const AGENT_API_CONNECTION_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(600);
/// How long calls in flight on a connection past its age may finish.
pub const AGENT_API_CONNECTION_GRACE: std::time::Duration = std::time::Duration::from_secs(120);
/// Serves CSI (Unix socket), the agent API (mTLS) and, when on, kubelet's
/// plugin registration (Unix socket) until SIGTERM/SIGINT.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let shutdown = Shutdown::on_signals().context("installing signal handlers")?;
    let role = Role::Agent {
        node: config.node_name.clone(),
    };
    let store = match &config.enrolment {
        None => MaterialStore::load(config.tls.clone(), role, config.trust_domain.clone())
            .context("loading TLS material")?,
        Some(_) => {
            let (store, why) = MaterialStore::load_or_enrol(
                config.tls.clone(),
                role,
                config.trust_domain.clone(),
                config.enrol_ca.as_deref(),
            )
            .context("loading TLS material, or the CA to enrol with")?;
            if let Some(why) = why {
                tracing::warn!(reason = %why, "no usable certificate; serving the Enrolment service until the proxy enrols this node");
            }
            store
        }
    };
    store.watch(config.tls_poll_interval);

    let mut socket = CsiSocket::bind(&config.csi_socket).await?;
    let listener = TcpListener::bind(config.agent_listen)
        .await
        .with_context(|| format!("binding the agent API on {}", config.agent_listen))?;
    let api_addr = listener.local_addr()?;
    let status_listener = StatusListener::bind(config.status_listen)
        .await
        .with_context(|| format!("binding the status endpoints on {}", config.status_listen))?;
    tracing::info!(
        node = %config.node_name,
        csi = %socket.path().display(),
        agent_api = %api_addr,
        status = %status_listener.local_addr(),
        serial = store.current().serial(),
        "csi-scsi-agent serving"
    );

    let readiness = Readiness::new()
        .with(TlsMaterialCheck(store.clone()))
        .with(ToolsCheck::new(config.required_tools.clone()));
    // NodeGetInfo reports the node's topology, which the spec allows only
    // with the VOLUME_ACCESSIBILITY_CONSTRAINTS plugin capability.
    let identity = IdentityService::new(
        env!("CARGO_PKG_VERSION"),
        vec![PluginService::VolumeAccessibilityConstraints],
        readiness.clone(),
    );
    let metrics = Metrics::new("agent", env!("CARGO_PKG_VERSION"), Some(store.clone()));
    let handshakes = HandshakeLimit::new(HandshakeLimit::DEFAULT);
    metrics.register(
        "agent_api_handshakes_refused",
        "Connections to the agent API closed unanswered because every TLS handshake slot was taken",
        handshakes.refused().clone(),
    );
    // One operation per LUN across kubelet's calls and the proxy's.
    let luns = csi_scsi_daemon::KeyedLocks::new();
    let node = NodeService::new(
        std::sync::Arc::new(config.host.clone()),
        config.node_name.clone(),
        config.max_volumes,
        luns.clone(),
    );
    let csi = Server::builder()
        .layer(server_layers(
            &metrics,
            "CSI Identity and Node (csi-scsi-agent)",
            CallSpan::PerCall,
        ))
        .add_service(IdentityServer::new(identity))
        .add_service(NodeServer::new(node))
        .serve_with_incoming_shutdown(
            socket.incoming().context("CSI socket already served")?,
            shutdown.signaled(),
        );

    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    // Sessions that cannot be listed may be live: doubt keeps them.
    let live = crate::host::sysfs::iscsi_sessions(&config.host)
        .map(|s| s.into_iter().map(|s| s.target).collect())
        .map_err(|e| e.to_string());
    let attachments =
        Arc::new(Attachments::load(&config.state_dir, live).with_limit(config.max_volumes));
    let devices = Arc::new(Devices::new(
        config.host.clone(),
        attachments,
        config.login_timeout,
        luns,
    ));
    let registration = config.registration.clone().map(KubeletRegistration::new);
    let mut status =
        crate::status::AgentStatus::new(&config.node_name, devices.clone(), metrics.clone());
    let fence = crate::api::EpochFence::load(&config.state_dir);
    let agent_api = AgentApi::new(devices, &config.node_name, fence).with_metrics(&metrics);
    let mut readiness = readiness.with(SocketCheck(socket.path().to_owned()));
    // /readyz only: a failing CSI Probe would have the livenessprobe
    // sidecar restart the agent, which a refusal by kubelet does not cure.
    if let Some(registration) = &registration {
        readiness = readiness.with(RegistrationCheck(registration.clone()));
        status = status.with_registration(registration.clone());
    }
    let stop = shutdown.clone();
    tokio::spawn(status_listener.serve(
        StatusService::new(readiness, metrics.clone(), Arc::new(status)),
        async move { stop.signaled().await },
    ));
    let api = Server::builder()
        // A connection is re-established (a full handshake against the
        // current trust material) at least this often.
        .max_connection_age(AGENT_API_CONNECTION_MAX_AGE)
        .max_connection_age_grace(AGENT_API_CONNECTION_GRACE)
        .layer(server_layers(
            &metrics,
            "the csi-scsi agent API and gRPC health",
            CallSpan::InHandlers,
        ))
        .add_service(health)
        // Both behind the one authorisation check, so a new RPC cannot
        // forget it.
        .add_service(AgentServer::with_interceptor(
            agent_api,
            ProxyOnly::new(store.clone()),
        ))
        .add_service(EnrolmentServer::with_interceptor(
            EnrolmentService::new(&config.node_name, store.clone(), config.enrolment.clone()),
            ProxyOnly::new(store.clone()),
        ))
        .serve_with_incoming_shutdown(
            tls_incoming_bounded(listener, server_config(store.clone())?, handshakes),
            shutdown.signaled(),
        );

    // Bound last, once every service it leads kubelet to is being set up:
    // kubelet acts on the socket as soon as it appears.
    let registrar = match registration {
        Some(registration) => {
            let socket = CsiSocket::bind(&registration.paths().socket)
                .await
                .context("binding the kubelet registration socket")?;
            tracing::info!(
                socket = %socket.path().display(),
                endpoint = %registration.paths().endpoint.display(),
                "serving kubelet plugin registration"
            );
            Some((registration, socket))
        }
        None => {
            tracing::info!("kubelet registration is off");
            None
        }
    };
    let registrar = async {
        let Some((registration, mut socket)) = registrar else {
            return Ok(());
        };
        let incoming = socket
            .incoming()
            .context("registration socket already served")?
            .map(|conn| conn.map(fix_authority));
        let stop = shutdown.clone();
        Server::builder()
            .layer(server_layers(
                &metrics,
                "kubelet plugin registration (csi-scsi-agent)",
                CallSpan::InHandlers,
            ))
            .add_service(RegistrationServer::new(RegistrationService::new(
                registration,
            )))
            .serve_with_incoming_shutdown(incoming, async move {
                stop.signaled().await;
                // Removed at the signal, not after the drain: its removal
                // is what tells kubelet to deregister the driver.
                drop(socket);
            })
            .await
            .context("kubelet registration server")
    };

    tokio::select! {
        (csi, api, registrar) = async { tokio::join!(csi, api, registrar) } => {
            csi.context("CSI server")?;
            api.context("agent API server")?;
            registrar?;
            tracing::info!("drained; exiting");
        }
        () = shutdown.grace_elapsed(config.grace_period) => {
            tracing::warn!(grace = ?config.grace_period, "in-flight calls outlived the grace period; exiting");
        }
    }
    drop(socket);
    Ok(())
}
