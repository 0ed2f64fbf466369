//! The operators' HTTP endpoints over a real TCP socket: unauthenticated,
//! so bounded (connections, header read time, per peer and in all, with
//! slots kept for the machine's own probes), cheap to hammer (one state
//! read per snapshot period however many clients ask), and telling a peer
//! off the machine less.
//!
//! All of 127/8 is loopback on Linux: clients bind 127.0.0.x to be
//! different peers, and the server is told that only 127.0.0.1 is the
//! machine ([`TrustedPeers::only`]), so that 127.0.0.2 and up play remote
//! peers through the same rule production uses.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use csi_scsi_daemon::{
    HEADER_READ_TIMEOUT, MAX_CONNECTIONS, Metrics, PER_PEER_CONNECTIONS, PROBE_CONNECTIONS,
    Readiness, StatusListener, StatusService, StatusSource, TrustedPeers,
};
use csi_scsi_status::{SCHEMA, Status, agent};
use futures::future::BoxFuture;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Counts how often the state is read; its document names a session's
/// target and portal, and an error that quotes them.
#[derive(Default)]
struct Counting(AtomicUsize);

const IQN: &str = "iqn.2026-11.io.csi-scsi.test:array-a";
const PORTAL: &str = "198.18.250.1:3260";

impl StatusSource for Counting {
    fn status(&self) -> BoxFuture<'_, Status> {
        Box::pin(async {
            let reads = self.0.fetch_add(1, Ordering::SeqCst) + 1;
            // A state read takes a moment (sysfs, the mount table).
            tokio::time::sleep(Duration::from_millis(50)).await;
            Status::Agent(agent::Document {
                schema: SCHEMA,
                node: format!("reads-{reads}"),
                version: "test".into(),
                started: "2026-11-27T00:00:00.000Z".into(),
                uptime_seconds: 0,
                sessions: vec![agent::Session {
                    sid: 1,
                    target: IQN.into(),
                    portal: PORTAL.into(),
                    state: "LOGGED_IN".into(),
                    disks: 1,
                }],
                devices: vec![],
                volumes: agent::Volumes::default(),
                recent_errors: vec![csi_scsi_status::ErrorRecord {
                    time: "2026-11-27T00:00:00.000Z".into(),
                    source: "csi.agent.v1.Agent".into(),
                    method: "Attach".into(),
                    code: "Unavailable".into(),
                    message: format!("login to {IQN} at {PORTAL} failed"),
                    request_id: "rid-1".into(),
                }],
                problems: vec![],
                kubelet_registration: None,
                redacted: false,
            })
        })
    }
}

/// A server on 127.0.0.1 that takes 127.0.0.1 alone for the machine.
async fn serve() -> (SocketAddr, Arc<Counting>, Metrics) {
    let source = Arc::new(Counting::default());
    let listener = StatusListener::bind("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind");
    let addr = listener.local_addr();
    let metrics = Metrics::new("agent", "test", None);
    let service = StatusService::new(Readiness::new(), metrics.clone(), source.clone())
        .with_peers(TrustedPeers::only(vec![LOCAL]));
    tokio::spawn(listener.serve(service, std::future::pending()));
    (addr, source, metrics)
}

/// The machine itself.
const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// 127.0.0.`n`: a remote peer for the server of [`serve`] when `n` > 1.
fn peer(n: u8) -> IpAddr {
    IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, n))
}

/// A connection to `addr` from `from`.
async fn connect_from(from: IpAddr, addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::new(from, 0))
        .expect("bind the client");
    socket.connect(addr).await.expect("connect")
}

async fn get(addr: SocketAddr, path: &str) -> String {
    get_from(LOCAL, addr, path).await
}

/// One `GET path` from `from`; empty when the server closed unanswered.
async fn get_from(from: IpAddr, addr: SocketAddr, path: &str) -> String {
    let mut s = connect_from(from, addr).await;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .ok();
    let mut out = String::new();
    // A connection closed at once may be reset: that reads as no answer.
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut out)).await;
    out
}

/// Whether the server closed `s` (EOF or reset) within `within`.
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match tokio::time::timeout(within, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

#[tokio::test]
async fn many_status_requests_at_once_read_the_state_once() {
    let (addr, source, _) = serve().await;
    // From a few peers, each within its share.
    let answers =
        futures::future::join_all((0..20).map(|i| get_from(peer(2 + i % 4), addr, "/status")))
            .await;
    assert!(
        answers.iter().all(|a| a.starts_with("HTTP/1.1 200")),
        "{answers:?}"
    );
    assert_eq!(
        source.0.load(Ordering::SeqCst),
        1,
        "one read serves them all"
    );
}

#[tokio::test]
async fn a_client_that_never_finishes_its_headers_is_cut_off() {
    let (addr, _, _) = serve().await;
    let mut slow = TcpStream::connect(addr).await.expect("connect");
    slow.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("part");
    let start = Instant::now();
    assert!(
        closed_within(&mut slow, HEADER_READ_TIMEOUT * 3).await,
        "still open"
    );
    assert!(start.elapsed() >= HEADER_READ_TIMEOUT - Duration::from_millis(500));
    // The endpoint still answers others.
    assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
}

/// Connections from each `(peer, n)`, held without a request (so within
/// [`HEADER_READ_TIMEOUT`]), and how many the server closed at once.
async fn hold(addr: SocketAddr, from: &[(IpAddr, usize)]) -> (Vec<TcpStream>, usize) {
    let mut held = Vec::new();
    for (peer, n) in from {
        for _ in 0..*n {
            held.push(connect_from(*peer, addr).await);
        }
    }
    // Let the server accept them all.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let checked = futures::future::join_all(held.into_iter().map(|mut s| async move {
        let closed = closed_within(&mut s, Duration::from_millis(100)).await;
        (s, closed)
    }))
    .await;
    let closed = checked.iter().filter(|(_, c)| *c).count();
    let open = checked
        .into_iter()
        .filter(|(_, c)| !c)
        .map(|(s, _)| s)
        .collect();
    (open, closed)
}

/// Enough remote peers, each at its share, to fill the shared pool.
fn crowd() -> Vec<(IpAddr, usize)> {
    (0..MAX_CONNECTIONS / PER_PEER_CONNECTIONS)
        .map(|i| (peer(2 + i as u8), PER_PEER_CONNECTIONS))
        .collect()
}

/// The refusal counter's value for `reason`.
fn refused(metrics: &Metrics, reason: &str) -> u64 {
    let series = format!("csi_scsi_status_connections_refused_total{{reason=\"{reason}\"}} ");
    let text = metrics.encode();
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in {text}"))
}

#[tokio::test]
async fn connections_beyond_the_cap_are_closed_at_once() {
    let (addr, _, metrics) = serve().await;
    let (held, closed) = hold(addr, &crowd()).await;
    assert_eq!(
        (held.len(), closed),
        (MAX_CONNECTIONS, 0),
        "within the pool"
    );
    let newcomer = peer(100);
    let (_extra, closed) = hold(addr, &[(newcomer, 1)]).await;
    assert_eq!(closed, 1, "over the cap");
    assert_eq!(refused(&metrics, "global"), 1);
    assert_eq!(refused(&metrics, "per_peer"), 0);
    drop(held);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        get_from(newcomer, addr, "/healthz")
            .await
            .starts_with("HTTP/1.1 200"),
        "room again"
    );
}

/// One Pod opening every connection it can gets its share and no more: the
/// probes and other peers are still answered.
#[tokio::test]
async fn a_flood_from_one_peer_leaves_probes_and_other_peers_answered() {
    let (addr, _, metrics) = serve().await;
    let flooder = peer(2);
    let (held, closed) = hold(addr, &[(flooder, MAX_CONNECTIONS + 8)]).await;
    assert_eq!(held.len(), PER_PEER_CONNECTIONS, "its share stays open");
    assert_eq!(closed, MAX_CONNECTIONS + 8 - PER_PEER_CONNECTIONS);
    assert_eq!(
        refused(&metrics, "per_peer"),
        (MAX_CONNECTIONS + 8 - PER_PEER_CONNECTIONS) as u64
    );
    for path in ["/healthz", "/readyz"] {
        let a = get(addr, path).await;
        assert!(
            a.starts_with("HTTP/1.1 200"),
            "{path} from the machine: {a:?}"
        );
    }
    // Another peer (a Prometheus) gets its own slots.
    let (other, closed) = hold(addr, &[(peer(3), PER_PEER_CONNECTIONS - 1)]).await;
    assert_eq!(closed, 0, "another peer's share");
    let a = get_from(peer(3), addr, "/metrics").await;
    assert!(a.starts_with("HTTP/1.1 200"), "another peer: {a:?}");
    assert_eq!(refused(&metrics, "global"), 0);
    drop((held, other));
}

/// Many peers, each within its share, fill the shared pool: the machine's
/// own probes take the slots kept for them, others are closed.
#[tokio::test]
async fn a_crowd_filling_the_shared_pool_leaves_the_probes_answered() {
    let (addr, _, metrics) = serve().await;
    let (held, closed) = hold(addr, &crowd()).await;
    assert_eq!(
        (held.len(), closed),
        (MAX_CONNECTIONS, 0),
        "within the pool"
    );
    let a = get_from(peer(100), addr, "/healthz").await;
    assert_eq!(a, "", "a remote newcomer finds no slot");
    assert_eq!(refused(&metrics, "global"), 1);
    for path in ["/healthz", "/readyz", "/healthz"] {
        let a = get(addr, path).await;
        assert!(
            a.starts_with("HTTP/1.1 200"),
            "{path} from the machine: {a:?}"
        );
    }
    // The probes' slots are bounded too.
    let (probes, closed) = hold(addr, &[(LOCAL, PROBE_CONNECTIONS + 1)]).await;
    assert_eq!(
        (probes.len(), closed),
        (PROBE_CONNECTIONS.min(PER_PEER_CONNECTIONS), 1)
    );
    drop((held, probes));
}

/// Portals, IQNs and error messages reach the machine only.
#[tokio::test]
async fn a_remote_peer_reads_the_status_without_portals_iqns_or_messages() {
    let (addr, _, _) = serve().await;
    let full = get(addr, "/status").await;
    assert!(full.starts_with("HTTP/1.1 200"), "{full}");
    for shown in [IQN, PORTAL, "failed", "LOGGED_IN", "rid-1"] {
        assert!(full.contains(shown), "the machine reads {shown}: {full}");
    }
    assert!(!full.contains("redacted"), "{full}");
    let remote = get_from(peer(2), addr, "/status").await;
    assert!(remote.starts_with("HTTP/1.1 200"), "{remote}");
    for hidden in [IQN, PORTAL, "failed"] {
        assert!(
            !remote.contains(hidden),
            "{hidden} off the machine: {remote}"
        );
    }
    for shown in ["LOGGED_IN", "rid-1", "\"redacted\": true"] {
        assert!(remote.contains(shown), "{shown} off the machine: {remote}");
    }
}
