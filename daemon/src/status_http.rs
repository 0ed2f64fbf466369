//! The operators' HTTP endpoints of both binaries (`--status-listen`):
//!
//! - `GET /healthz`: 200 while the process serves HTTP at all;
//! - `GET /readyz`: 200 when every readiness check passes, else 503 with
//!   each failing check and its reason;
//! - `GET /metrics`: the OpenMetrics text exposition;
//! - `GET /status`: a JSON document from the binary's [`StatusSource`].
//!
//! Plain HTTP/1.1 on its own port, never the mTLS agent API port: it serves
//! nothing secret (the status sources never include credentials, initiator
//! names or pod UIDs), and a peer that is not on the machine gets `/status`
//! without portals, IQNs, WWPNs, Secret names or error messages
//! ([`Status::redacted`]). Unauthenticated, so bounded: at most
//! [`PER_PEER_CONNECTIONS`] from one address and [`MAX_CONNECTIONS`] in
//! all, plus [`PROBE_CONNECTIONS`] kept for the machine itself (kubelet's
//! probes: [`TrustedPeers`]), so that no one Pod, nor a crowd of them, can
//! starve the liveness probe; [`HEADER_READ_TIMEOUT`] to send a request's
//! headers, [`CONNECTION_MAX_AGE`] per connection; and the state behind
//! `/status` and `/metrics` is read at most once per [`SNAPSHOT_TTL`]
//! however often they are asked for.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use csi_scsi_status::Status;
use futures::future::BoxFuture;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::net::TcpListener;
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore};

use crate::{Check, Metrics, Readiness};

/// Content type of `/metrics` (OpenMetrics 1.0 text; Prometheus scrapes it).
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Most connections served at once to peers in general (the shared
/// pool); more are closed as they arrive.
pub const MAX_CONNECTIONS: usize = 64;
/// Most connections from one address at once: a Prometheus, a person and
/// kubelet need one or two each, and one Pod holding the whole shared pool
/// would fail the liveness probe and restart the process in a loop.
pub const PER_PEER_CONNECTIONS: usize = 8;
/// Connections beyond the shared pool that only trusted peers (the machine
/// itself: [`TrustedPeers`]) may take, so that kubelet's probes are
/// answered while many peers fill the shared pool. kubelet holds one per
/// probe (liveness, readiness, startup).
pub const PROBE_CONNECTIONS: usize = 8;
/// How long a client may take to send a request's headers, the first or
/// the next on a kept-alive connection.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one connection may live.
pub const CONNECTION_MAX_AGE: Duration = Duration::from_secs(60);
/// How long a `/status` document or a metrics refresh is reused: each
/// reads sysfs and the mount table.
pub const SNAPSHOT_TTL: Duration = Duration::from_secs(1);

/// What a binary shows on `/status`, and the gauges it computes from its
/// own state before each scrape.
pub trait StatusSource: Send + Sync + 'static {
    /// The full `/status` document (a peer off the machine gets it
    /// [`Status::redacted`]). Must hold no secret.
    fn status(&self) -> BoxFuture<'_, Status>;

    /// Updates the gauges that are read from state (devices, sessions,
    /// volumes) just before `/metrics` answers.
    fn refresh_metrics(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// The bound status port, not yet serving (bind it with the other
/// listeners, before anything is served).
#[derive(Debug)]
pub struct StatusListener {
    listener: TcpListener,
    addr: SocketAddr,
}

/// What the endpoints answer from.
pub struct StatusService {
    readiness: Readiness,
    metrics: Metrics,
    source: Arc<dyn StatusSource>,
    peers: TrustedPeers,
    refused: Family<RefusalLabels, Counter>,
    /// The last `/status` bodies and when they were made.
    status_cache: Mutex<Option<(Instant, Bodies)>>,
    /// When the metrics were last refreshed from state.
    metrics_refreshed: Mutex<Option<Instant>>,
}

/// Which peers are the machine itself: they get the full `/status` and may
/// take the [`PROBE_CONNECTIONS`] kept for probes.
#[derive(Clone, Debug)]
pub struct TrustedPeers {
    local: Local,
    /// Addresses, besides local ones, that kubelet's probes come from.
    probe_sources: Vec<IpAddr>,
}

/// Who counts as on the machine.
#[derive(Clone, Debug)]
enum Local {
    /// Every loopback address (production).
    Loopback,
    /// Exactly these (tests: all of 127/8 is loopback, so a test makes
    /// 127.0.0.2 stand for a remote peer).
    Only(Vec<IpAddr>),
}

/// The two renderings of one `/status` document.
#[derive(Clone)]
struct Bodies {
    full: Bytes,
    redacted: Bytes,
}

/// Why a connection was closed unanswered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    /// Its address held [`PER_PEER_CONNECTIONS`] already.
    PerPeer,
    /// The shared pool (and, for a trusted peer, the probes' slots) was full.
    Global,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    reason: &'static str,
}

/// The connection slots: the shared pool, the probes' pool, and how many
/// each address holds.
struct Slots {
    shared: Arc<Semaphore>,
    probes: Arc<Semaphore>,
    by_peer: std::sync::Mutex<HashMap<IpAddr, usize>>,
}

/// One connection's slot, given back when it ends.
struct Slot {
    slots: Arc<Slots>,
    peer: IpAddr,
    _permit: OwnedSemaphorePermit,
}

/// The CSI socket exists and is a socket (the process serves CSI).
pub struct SocketCheck(pub PathBuf);

// === impl StatusListener ===

impl StatusListener {
    /// Binds `addr` (port 0 picks a free port; see [`Self::local_addr`]).
    pub async fn bind(addr: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        Ok(Self { listener, addr })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves `service` until `shutdown` resolves. Each connection is its
    /// own task; a failing connection never stops the listener. A peer
    /// whose address is the one the connection arrived on is on this host
    /// (a host-network agent's kubelet) and may take the probes' slots too.
    pub async fn serve(
        self,
        service: StatusService,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        let service = Arc::new(service);
        let slots = Arc::new(Slots::new());
        tokio::pin!(shutdown);
        loop {
            let (stream, peer) = tokio::select! {
                () = &mut shutdown => return,
                accepted = self.listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "status endpoint: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let peer_ip = peer.ip().to_canonical();
            // The node's own address, for a host-network process: kubelet
            // probes the pod IP, and a connection from the host to its own
            // address comes from that address.
            let same_host = stream
                .local_addr()
                .is_ok_and(|l| l.ip().to_canonical() == peer_ip);
            let trusted = same_host || service.peers.may_probe(peer_ip);
            let slot = match slots.take(peer_ip, trusted) {
                Ok(slot) => slot,
                Err(why) => {
                    service.refused.get_or_create(&why.labels()).inc();
                    tracing::debug!(%peer, reason = why.as_str(), "status endpoint: no slot; closing this connection");
                    continue;
                }
            };
            let local = service.peers.is_local(peer_ip);
            let service = service.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let handler = hyper::service::service_fn(move |req| {
                    let service = service.clone();
                    async move { Ok::<_, Infallible>(service.handle(req, local).await) }
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), handler);
                match tokio::time::timeout(CONNECTION_MAX_AGE, connection).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "status endpoint: connection ended")
                    }
                    Err(_) => tracing::debug!(%peer, "status endpoint: connection too old; closed"),
                }
            });
        }
    }
}

// === impl StatusService ===

impl StatusService {
    /// Endpoints over `readiness`, `metrics` and `source`, trusting
    /// loopback peers only (see [`Self::with_peers`]). Registers
    /// `csi_scsi_status_connections_refused_total` in `metrics`.
    pub fn new(readiness: Readiness, metrics: Metrics, source: Arc<dyn StatusSource>) -> Self {
        let refused = Family::<RefusalLabels, Counter>::default();
        // Both series from the start, so that an alert can compare them.
        for why in [Refusal::PerPeer, Refusal::Global] {
            let _ = refused.get_or_create(&why.labels());
        }
        metrics.register(
            "status_connections_refused",
            "Connections to the status port closed unanswered, by reason: per_peer (one address held its share) or global (every slot it may take was held)",
            refused.clone(),
        );
        Self {
            readiness,
            metrics,
            source,
            peers: TrustedPeers::loopback(),
            refused,
            status_cache: Mutex::new(None),
            metrics_refreshed: Mutex::new(None),
        }
    }

    /// Trusts `peers` instead of loopback alone.
    pub fn with_peers(mut self, peers: TrustedPeers) -> Self {
        self.peers = peers;
        self
    }

    /// The `/status` body, full for a `local` peer and redacted otherwise,
    /// made at most once per [`SNAPSHOT_TTL`] (callers that arrive while it
    /// is being made wait for it, then share it).
    async fn status_body(&self, local: bool) -> Bytes {
        let mut cache = self.status_cache.lock().await;
        let bodies = match cache.as_ref() {
            Some((at, bodies)) if at.elapsed() < SNAPSHOT_TTL => bodies.clone(),
            _ => {
                let doc = self.source.status().await;
                let bodies = Bodies {
                    full: json_body(&doc),
                    redacted: json_body(&doc.redacted()),
                };
                *cache = Some((Instant::now(), bodies.clone()));
                bodies
            }
        };
        if local { bodies.full } else { bodies.redacted }
    }

    /// Refreshes the state-read gauges, at most once per [`SNAPSHOT_TTL`].
    async fn refresh_metrics(&self) {
        let mut last = self.metrics_refreshed.lock().await;
        if last.is_some_and(|at| at.elapsed() < SNAPSHOT_TTL) {
            return;
        }
        self.source.refresh_metrics().await;
        *last = Some(Instant::now());
    }

    /// Answers `req` from a peer that is on the machine when `local`.
    async fn handle(&self, req: Request<Incoming>, local: bool) -> Response<Full<Bytes>> {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n".into());
        }
        match req.uri().path() {
            "/healthz" | "/livez" => text(StatusCode::OK, "ok\n".into()),
            "/readyz" => {
                let failures = self.readiness.failures();
                if failures.is_empty() {
                    let mut body = String::from("ready\n");
                    for (name, note) in self.readiness.notes() {
                        body.push_str(&format!("[+] {name}: {note}\n"));
                    }
                    text(StatusCode::OK, body)
                } else {
                    let mut body = String::from("not ready\n");
                    for (name, why) in failures {
                        body.push_str(&format!("[-] {name}: {why}\n"));
                    }
                    text(StatusCode::SERVICE_UNAVAILABLE, body)
                }
            }
            "/metrics" => {
                self.refresh_metrics().await;
                respond(
                    StatusCode::OK,
                    METRICS_CONTENT_TYPE,
                    self.metrics.encode().into(),
                )
            }
            "/status" => respond(
                StatusCode::OK,
                "application/json",
                self.status_body(local).await,
            ),
            _ => text(
                StatusCode::NOT_FOUND,
                "not found: try /healthz, /readyz, /metrics or /status\n".into(),
            ),
        }
    }
}

// === impl TrustedPeers ===

impl TrustedPeers {
    /// Production: loopback peers are the machine; no other address may
    /// take the probes' slots except the one a connection arrives on (see
    /// [`StatusListener::serve`]).
    pub fn loopback() -> Self {
        Self {
            local: Local::Loopback,
            probe_sources: Vec::new(),
        }
    }

    /// Tests: exactly `addresses` are the machine (so that another
    /// loopback address can play a remote peer).
    pub fn only(addresses: Vec<IpAddr>) -> Self {
        Self {
            local: Local::Only(addresses.into_iter().map(|a| a.to_canonical()).collect()),
            probe_sources: Vec::new(),
        }
    }

    /// Also lets `addresses` take the probes' slots (the address kubelet's
    /// probes come from, when it is not the one they arrive on); they
    /// still get the redacted `/status`.
    pub fn with_probe_sources(mut self, addresses: Vec<IpAddr>) -> Self {
        self.probe_sources = addresses.into_iter().map(|a| a.to_canonical()).collect();
        self
    }

    /// Whether `peer` is on the machine: the full `/status`.
    pub fn is_local(&self, peer: IpAddr) -> bool {
        let peer = peer.to_canonical();
        match &self.local {
            Local::Loopback => peer.is_loopback(),
            Local::Only(addresses) => addresses.contains(&peer),
        }
    }

    /// Whether `peer` may take the probes' slots.
    fn may_probe(&self, peer: IpAddr) -> bool {
        self.is_local(peer) || self.probe_sources.contains(&peer.to_canonical())
    }
}

// === impl Slots ===

impl Slots {
    fn new() -> Self {
        Self {
            shared: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            probes: Arc::new(Semaphore::new(PROBE_CONNECTIONS)),
            by_peer: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// A slot for a connection from `peer`: within its share, from the
    /// shared pool, or (`trusted` only) from the probes' pool.
    fn take(self: &Arc<Self>, peer: IpAddr, trusted: bool) -> Result<Slot, Refusal> {
        let mut by_peer = self.by_peer.lock().unwrap_or_else(|p| p.into_inner());
        let held = by_peer.get(&peer).copied().unwrap_or(0);
        if held >= PER_PEER_CONNECTIONS {
            return Err(Refusal::PerPeer);
        }
        let permit = match self.shared.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) if trusted => self
                .probes
                .clone()
                .try_acquire_owned()
                .map_err(|_| Refusal::Global)?,
            Err(_) => return Err(Refusal::Global),
        };
        by_peer.insert(peer, held + 1);
        Ok(Slot {
            slots: self.clone(),
            peer,
            _permit: permit,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut by_peer = self.slots.by_peer.lock().unwrap_or_else(|p| p.into_inner());
        // Gone at zero: the map holds only addresses with a connection.
        if let Some(n) = by_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                by_peer.remove(&self.peer);
            }
        }
    }
}

// === impl Refusal ===

impl Refusal {
    fn as_str(self) -> &'static str {
        match self {
            Self::PerPeer => "per_peer",
            Self::Global => "global",
        }
    }

    fn labels(self) -> RefusalLabels {
        RefusalLabels {
            reason: self.as_str(),
        }
    }
}

fn json_body(doc: &Status) -> Bytes {
    let mut body = serde_json::to_vec_pretty(doc).unwrap_or_else(|e| {
        format!("{{\"error\":\"cannot encode the status: {e}\"}}").into_bytes()
    });
    body.push(b'\n');
    Bytes::from(body)
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    respond(status, "text/plain; charset=utf-8", body.into())
}

fn respond(status: StatusCode, content_type: &str, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        response.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    response
}

// === impl SocketCheck ===

impl Check for SocketCheck {
    fn name(&self) -> &str {
        "csi-socket"
    }

    fn check(&self) -> Result<(), String> {
        use std::os::unix::fs::FileTypeExt;
        match std::fs::metadata(&self.0) {
            Ok(m) if m.file_type().is_socket() => Ok(()),
            Ok(_) => Err(format!("{} is not a socket", self.0.display())),
            Err(e) => Err(format!("{}: {}", self.0.display(), e.kind())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The production rule: loopback, in either family, is the machine;
    /// nothing else is, however close.
    #[test]
    fn loopback_peers_and_only_they_are_local() {
        let peers = TrustedPeers::loopback();
        for local in [
            "127.0.0.1",
            "127.0.0.2",
            "127.255.255.254",
            "::1",
            "::ffff:127.0.0.1",
        ] {
            assert!(peers.is_local(local.parse().expect("ip")), "{local}");
            assert!(peers.may_probe(local.parse().expect("ip")), "{local}");
        }
        for remote in [
            "198.18.127.1",
            "10.0.0.1",
            "0.0.0.0",
            "::",
            "::ffff:10.0.0.1",
            "fe80::1",
        ] {
            assert!(!peers.is_local(remote.parse().expect("ip")), "{remote}");
            assert!(!peers.may_probe(remote.parse().expect("ip")), "{remote}");
        }
        let kubelet: IpAddr = "10.244.0.1".parse().expect("ip");
        let peers = peers.with_probe_sources(vec![kubelet]);
        assert!(
            peers.may_probe(kubelet),
            "a probe source takes the probes' slots"
        );
        assert!(!peers.is_local(kubelet), "but reads the redacted /status");
        assert!(peers.may_probe("::ffff:10.244.0.1".parse().expect("ip")));
    }
}
