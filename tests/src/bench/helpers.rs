//! The bench binary's helper modes, each run as its own process so the
//! process being measured holds only what it would hold in production:
//!
//! - `__echo --tls-dir D --node N --ports-file F --socket S`: the baselines
//!   of row 1, a bare tonic server over mutual TLS answering one unary RPC
//!   (the gRPC health check), built exactly as the agent builds its API
//!   server (`server_config` + `tls_incoming`) with the agent's own
//!   certificate, and the same service on a Unix socket (the CSI hop's floor).
//! - `__agents --ca D --dir D --count N --ports-file F`: row 2's fleet, N
//!   agent API servers on loopback ports, each with its own certificate
//!   (issued here from the CA), answering Discover after the latency
//!   [`latency_of`] gives them.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use csi_scsi_certs::{
    CertificateAuthority, Identity, MaterialPaths, MaterialStore, Role, TrustDomain, Validity,
    server_config, write_issued,
};
use csi_scsi_contract::NodeName;
use csi_scsi_daemon::tls_incoming;
use csi_scsi_proto::agent::agent_server::{Agent, AgentServer};
use csi_scsi_proto::agent::*;
use tokio::net::TcpListener;
use tonic::transport::Server;
use tonic::{Request, Response, Status};

use super::proc::write_atomically;

/// The trust domain the bench's certificates use (the default one).
pub const DOMAIN: &str = "csi-scsi.local";

/// Runs the helper mode named by `args[0]` (which starts with `__`).
pub fn run(args: &[String]) -> anyhow::Result<()> {
    csi_scsi_certs::install_crypto_provider();
    let flag = |name: &str| -> anyhow::Result<String> {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
            .with_context(|| format!("{} needs {name}", args[0]))
    };
    let rt = tokio::runtime::Runtime::new()?;
    match args.first().map(String::as_str) {
        Some("__echo") => rt.block_on(echo(
            Path::new(&flag("--tls-dir")?),
            &flag("--node")?,
            Path::new(&flag("--ports-file")?),
            Path::new(&flag("--socket")?),
        )),
        Some("__agents") => rt.block_on(agents(
            Path::new(&flag("--ca")?),
            Path::new(&flag("--dir")?),
            flag("--count")?.parse()?,
            Path::new(&flag("--ports-file")?),
        )),
        other => anyhow::bail!("unknown helper mode {other:?}"),
    }
}

async fn echo(tls_dir: &Path, node: &str, ports_file: &Path, socket: &Path) -> anyhow::Result<()> {
    let store = MaterialStore::load(
        MaterialPaths::in_dir(tls_dir),
        Role::Agent { node: node.into() },
        TrustDomain::new(DOMAIN)?,
    )?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let unix =
        tokio_stream::wrappers::UnixListenerStream::new(tokio::net::UnixListener::bind(socket)?);
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let over_unix = Server::builder()
        .add_service(health.clone())
        .serve_with_incoming(unix);
    let over_tls = Server::builder()
        .add_service(health)
        .serve_with_incoming(tls_incoming(listener, server_config(store)?));
    write_atomically(ports_file, &format!("{}\n", port))?;
    tokio::try_join!(over_unix, over_tls)?;
    Ok(())
}

/// Injected Discover latency of agent `i` of `n`: 1 % of the fleet (at
/// least one agent, spread evenly) is slow, [`SLOW`]; 10 % is busy,
/// [`BUSY`]; the rest answer at once.
pub fn latency_of(i: usize, n: usize) -> Duration {
    let slow_offset = 50.min(n / 2);
    if i % 100 == slow_offset {
        SLOW
    } else if i % 10 == 3 {
        BUSY
    } else {
        Duration::ZERO
    }
}

/// The slow agents' latency (a Discover that waits for a slow scan).
pub const SLOW: Duration = Duration::from_millis(500);
/// The busy agents' latency.
pub const BUSY: Duration = Duration::from_millis(20);

/// Node name of fleet agent `i`.
pub fn fleet_node(i: usize) -> NodeName {
    NodeName::parse(&format!("node-{i:04}")).expect("node-NNNN is a node name")
}

async fn agents(ca_dir: &Path, dir: &Path, count: usize, ports_file: &Path) -> anyhow::Result<()> {
    let ca = CertificateAuthority::load(&ca_dir.join("ca.crt"), &ca_dir.join("ca.key"))?;
    let domain = TrustDomain::new(DOMAIN)?;
    let mut lines = String::new();
    let mut servers = tokio::task::JoinSet::new();
    for i in 0..count {
        let node = fleet_node(i);
        let tls: PathBuf = dir.join(node.as_str());
        write_issued(
            &tls,
            &ca.issue(&Identity::Node(node.to_string()), Validity::days(1))?,
        )?;
        let store = MaterialStore::load(
            MaterialPaths::in_dir(&tls),
            Role::Agent {
                node: node.to_string(),
            },
            domain.clone(),
        )?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        lines.push_str(&format!("{node} {}\n", listener.local_addr()?));
        let agent = FakeAgent {
            node: node.to_string(),
            latency: latency_of(i, count),
        };
        let incoming = tls_incoming(listener, server_config(store)?);
        servers.spawn(
            Server::builder()
                .add_service(AgentServer::new(agent))
                .serve_with_incoming(incoming),
        );
    }
    write_atomically(ports_file, &lines)?;
    while let Some(done) = servers.join_next().await {
        done??;
    }
    Ok(())
}

/// An agent API server that answers Discover with four LUNs after a fixed
/// latency; nothing else is used by the bench.
struct FakeAgent {
    node: String,
    latency: Duration,
}

#[tonic::async_trait]
impl Agent for FakeAgent {
    async fn discover(
        &self,
        _request: Request<DiscoverRequest>,
    ) -> Result<Response<DiscoverResponse>, Status> {
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
        let luns = (0..4u32)
            .map(|l| Lun {
                wwid: format!("naa.600a0980{:024x}", l + 1),
                size_bytes: 1 << 30,
                vendor: "NETAPP".into(),
                model: "LUN C-Mode".into(),
                serial: format!("sn{l}"),
                lun: l,
                paths: vec![DevicePath {
                    kernel_name: format!("sd{}", char::from(b'b' + l as u8)),
                    hctl: format!("1:0:0:{l}"),
                    by_path: format!("pci-0000:00:1f.0-fc-0x500a0981891b8dc5-lun-{l}"),
                    by_id: format!("wwn-0x600a0980{:024x}", l + 1),
                    target: "fc-1".into(),
                }],
                multipath_device: String::new(),
                holders: Vec::new(),
            })
            .collect();
        Ok(Response::new(DiscoverResponse {
            luns,
            portals: vec![PortalState {
                portal: format!("{}/host1", self.node),
                reachable: true,
                error: String::new(),
            }],
        }))
    }

    async fn attach(&self, _: Request<AttachRequest>) -> Result<Response<AttachResponse>, Status> {
        Err(Status::unimplemented("bench fleet agent"))
    }

    async fn detach(&self, _: Request<DetachRequest>) -> Result<Response<DetachResponse>, Status> {
        Err(Status::unimplemented("bench fleet agent"))
    }

    type WipeStream = futures::stream::Empty<Result<WipeProgress, Status>>;

    async fn wipe(&self, _: Request<WipeRequest>) -> Result<Response<Self::WipeStream>, Status> {
        Err(Status::unimplemented("bench fleet agent"))
    }

    async fn rescan(&self, _: Request<RescanRequest>) -> Result<Response<RescanResponse>, Status> {
        Err(Status::unimplemented("bench fleet agent"))
    }

    async fn verify(&self, _: Request<VerifyRequest>) -> Result<Response<VerifyResponse>, Status> {
        Err(Status::unimplemented("bench fleet agent"))
    }

    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        Ok(Response::new(StatusResponse {
            node: self.node.clone(),
            ..Default::default()
        }))
    }
}

/// Shared between the bench's rows: the proxy's certificate store.
pub fn proxy_store(tls_dir: &Path) -> anyhow::Result<Arc<MaterialStore>> {
    Ok(MaterialStore::load(
        MaterialPaths::in_dir(tls_dir),
        Role::Proxy,
        TrustDomain::new(DOMAIN)?,
    )?)
}
