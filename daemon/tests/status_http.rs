//! The operators' HTTP endpoints over a real TCP socket: unauthenticated,
//! so bounded (connections, header read time) and cheap to hammer (one
//! state read per snapshot period however many clients ask).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use csi_scsi_daemon::{
    HEADER_READ_TIMEOUT, MAX_CONNECTIONS, Metrics, Readiness, StatusListener, StatusService,
    StatusSource,
};
use futures::future::BoxFuture;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Counts how often the state is read.
#[derive(Default)]
struct Counting(AtomicUsize);

impl StatusSource for Counting {
    fn status(&self) -> BoxFuture<'_, serde_json::Value> {
        Box::pin(async {
            self.0.fetch_add(1, Ordering::SeqCst);
            // A state read takes a moment (sysfs, the mount table).
            tokio::time::sleep(Duration::from_millis(50)).await;
            serde_json::json!({"reads": self.0.load(Ordering::SeqCst)})
        })
    }
}

async fn serve() -> (std::net::SocketAddr, Arc<Counting>) {
    let source = Arc::new(Counting::default());
    let listener = StatusListener::bind("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind");
    let addr = listener.local_addr();
    let service = StatusService::new(
        Readiness::new(),
        Metrics::new("agent", "test", None),
        source.clone(),
    );
    tokio::spawn(listener.serve(service, std::future::pending()));
    (addr, source)
}

async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
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
    let (addr, source) = serve().await;
    let answers = futures::future::join_all((0..20).map(|_| get(addr, "/status"))).await;
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
    let (addr, _) = serve().await;
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

#[tokio::test]
async fn connections_beyond_the_cap_are_closed_at_once() {
    let (addr, _) = serve().await;
    let mut held = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        held.push(TcpStream::connect(addr).await.expect("connect"));
    }
    // Let the server accept them all.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut extra = TcpStream::connect(addr).await.expect("connect");
    assert!(
        closed_within(&mut extra, Duration::from_secs(2)).await,
        "over the cap"
    );
    drop(held);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        get(addr, "/healthz").await.starts_with("HTTP/1.1 200"),
        "room again"
    );
}
