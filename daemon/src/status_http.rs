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
//! names or pod UIDs). Unauthenticated, so bounded: at most
//! [`MAX_CONNECTIONS`] at once, [`HEADER_READ_TIMEOUT`] to send a request's
//! headers, [`CONNECTION_MAX_AGE`] per connection, and the state behind
//! `/status` and `/metrics` is read at most once per [`SNAPSHOT_TTL`]
//! however often they are asked for.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{Mutex, Semaphore};

use crate::{Check, Metrics, Readiness};

/// Content type of `/metrics` (OpenMetrics 1.0 text; Prometheus scrapes it).
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Most connections served at once; more are closed as they arrive.
pub const MAX_CONNECTIONS: usize = 64;
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
    /// The `/status` document. Must hold no secret.
    fn status(&self) -> BoxFuture<'_, serde_json::Value>;

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
    /// The last `/status` body and when it was made.
    status_cache: Mutex<Option<(Instant, Bytes)>>,
    /// When the metrics were last refreshed from state.
    metrics_refreshed: Mutex<Option<Instant>>,
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
    /// own task; a failing connection never stops the listener.
    pub async fn serve(
        self,
        service: StatusService,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        let service = Arc::new(service);
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
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
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                tracing::debug!(%peer, "status endpoint: {MAX_CONNECTIONS} connections open; closing this one");
                continue;
            };
            let service = service.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let handler = hyper::service::service_fn(move |req| {
                    let service = service.clone();
                    async move { Ok::<_, Infallible>(service.handle(req).await) }
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
    /// Endpoints over `readiness`, `metrics` and `source`.
    pub fn new(readiness: Readiness, metrics: Metrics, source: Arc<dyn StatusSource>) -> Self {
        Self {
            readiness,
            metrics,
            source,
            status_cache: Mutex::new(None),
            metrics_refreshed: Mutex::new(None),
        }
    }

    /// The `/status` body, made at most once per [`SNAPSHOT_TTL`] (callers
    /// that arrive while it is being made wait for it, then share it).
    async fn status_body(&self) -> Bytes {
        let mut cache = self.status_cache.lock().await;
        if let Some((at, body)) = cache.as_ref()
            && at.elapsed() < SNAPSHOT_TTL
        {
            return body.clone();
        }
        let doc = self.source.status().await;
        let mut body = serde_json::to_vec_pretty(&doc).unwrap_or_else(|e| {
            format!("{{\"error\":\"cannot encode the status: {e}\"}}").into_bytes()
        });
        body.push(b'\n');
        let body = Bytes::from(body);
        *cache = Some((Instant::now(), body.clone()));
        body
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

    async fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
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
            "/status" => respond(StatusCode::OK, "application/json", self.status_body().await),
            _ => text(
                StatusCode::NOT_FOUND,
                "not found: try /healthz, /readyz, /metrics or /status\n".into(),
            ),
        }
    }
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
