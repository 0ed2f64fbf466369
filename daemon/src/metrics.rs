//! Metrics of one process, through `prometheus-client` (OpenMetrics text),
//! and the tower layer that times every gRPC call a server answers.
//!
//! This is the mechanism both binaries share: the registry (with the build
//! info, the gRPC server histogram and the certificate expiry), the recent
//! errors, and helpers to set gauges. Each binary registers its own domain
//! series ([`Metrics::register`]) next to the code that sets them.
//!
//! The layer reads the method from the request path, the request ID that
//! [`crate::RequestIdLayer`] settled, and the outcome from `grpc-status` (in the response
//! headers for an immediate error, in the trailers otherwise), so it sees
//! every call, including the ones a service refuses before its handler
//! runs. Failed calls also go to a bounded list of recent errors that
//! `/status` shows.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Instant, SystemTime};

use csi_scsi_certs::MaterialStore;
/// A failed call, as `/status` lists it (the type the CLI reads too).
pub use csi_scsi_status::ErrorRecord;
use hyper::body::{Body, Frame, SizeHint};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Metric, Registry, Unit};
use tonic::{Code, Status};

use csi_scsi_textfs::text;

/// How many failed calls `/status` keeps.
pub const RECENT_ERRORS: usize = 50;

/// Longest error message kept (the rest is cut).
const MAX_MESSAGE: usize = 1024;
/// Longest service or method label (an invented path is not echoed whole).
const MAX_LABEL: usize = 64;

/// The process's metrics. Cheap to clone; every clone updates the same
/// series.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

/// The tower layer recording every call of a gRPC server.
#[derive(Clone)]
pub struct GrpcMetricsLayer {
    metrics: Metrics,
}

/// The service [`GrpcMetricsLayer`] wraps around a server's routes.
#[derive(Clone)]
pub struct GrpcMetricsService<S> {
    inner: S,
    metrics: Metrics,
}

/// A response body that records the call when its trailers pass (or when
/// it ends or is dropped without them).
pub struct MeteredBody<B> {
    inner: B,
    call: Option<CallRecord>,
}

struct Inner {
    /// The registry and the names registered in it (one family per name).
    registry: RwLock<(Registry, HashSet<String>)>,
    grpc: Family<GrpcLabels, Histogram, fn() -> Histogram>,
    errors: Mutex<VecDeque<ErrorRecord>>,
    /// `(service, method)` pairs seen, bounded: paths come from callers.
    methods: Mutex<HashSet<(String, String)>>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GrpcLabels {
    service: String,
    method: String,
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    component: String,
    version: String,
}

/// The digest of the CA bundle a process trusts now.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TrustLabels {
    sha256: String,
}

/// Seconds left on the process's own certificate, read at each scrape.
#[derive(Debug)]
struct CertificateExpiry(Arc<MaterialStore>);

/// One call in progress: recorded exactly once.
struct CallRecord {
    metrics: Metrics,
    service: String,
    method: String,
    request_id: String,
    start: Instant,
    done: bool,
}

/// Latency buckets of RPCs, served or made: 1 ms to about 2 minutes.
pub fn rpc_histogram() -> Histogram {
    Histogram::new([
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        120.0,
    ])
}

/// The name Prometheus users expect for a gRPC code (`OK`, `NotFound`).
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// RFC 3339 UTC text of `t`, to the millisecond.
pub fn rfc3339(t: SystemTime) -> String {
    let t = time::OffsetDateTime::from(t);
    let t = t
        .replace_nanosecond(t.millisecond() as u32 * 1_000_000)
        .unwrap_or(t);
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

// === impl Metrics ===

impl Metrics {
    /// The metrics of `component` (the `component` label of
    /// `csi_scsi_build_info`: `agent`, `proxy`) at `version`; with `tls`,
    /// the seconds left on its certificate too. The binary registers its
    /// own series afterwards ([`Metrics::register`]).
    pub fn new(component: &str, version: &str, tls: Option<Arc<MaterialStore>>) -> Self {
        let metrics = Self {
            inner: Arc::new(Inner {
                registry: RwLock::new((Registry::with_prefix("csi_scsi"), HashSet::new())),
                grpc: Family::new_with_constructor(rpc_histogram),
                errors: Mutex::new(VecDeque::new()),
                methods: Mutex::new(HashSet::new()),
            }),
        };
        metrics.register(
            "build",
            "Version of this binary",
            Info::new(BuildLabels {
                component: component.to_owned(),
                version: version.to_owned(),
            }),
        );
        metrics.register_with_unit(
            "grpc_server_handling",
            "Time to answer a gRPC call (CSI or agent API), by service, method and gRPC code",
            Unit::Seconds,
            metrics.inner.grpc.clone(),
        );
        if let Some(tls) = tls {
            let mut guard = metrics
                .inner
                .registry
                .write()
                .unwrap_or_else(|p| p.into_inner());
            guard.0.register_collector(Box::new(CertificateExpiry(tls)));
        }
        metrics
    }

    /// Exposes `metric` as `csi_scsi_<name>` with `help`, after the series
    /// registered before it. A name registered already is refused (logged):
    /// two families of one name would make the exposition invalid.
    pub fn register(&self, name: &str, help: &str, metric: impl Metric) {
        self.add(name, help, None, metric);
    }

    /// [`Metrics::register`] with a unit (`csi_scsi_<name>_<unit>`).
    pub fn register_with_unit(&self, name: &str, help: &str, unit: Unit, metric: impl Metric) {
        self.add(name, help, Some(unit), metric);
    }

    fn add(&self, name: &str, help: &str, unit: Option<Unit>, metric: impl Metric) {
        let mut guard = self
            .inner
            .registry
            .write()
            .unwrap_or_else(|p| p.into_inner());
        let (registry, names) = &mut *guard;
        if !names.insert(name.to_owned()) {
            tracing::error!(name, "metric registered twice; the second is not exposed");
            return;
        }
        match unit {
            Some(unit) => registry.register_with_unit(name, help, unit, metric),
            None => registry.register(name, help, metric),
        }
    }

    /// The layer that times every call of a tonic server; servers take it
    /// inside [`crate::server_layers`], behind the request ID layer.
    pub fn grpc_layer(&self) -> GrpcMetricsLayer {
        GrpcMetricsLayer {
            metrics: self.clone(),
        }
    }

    /// The OpenMetrics text exposition, `# EOF` included.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let guard = self
            .inner
            .registry
            .read()
            .unwrap_or_else(|p| p.into_inner());
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &guard.0) {
            tracing::warn!(error = %e, "cannot encode metrics");
        }
        out
    }

    /// Remembers a failure for `/status` (the oldest drops out past
    /// [`RECENT_ERRORS`]). The message must already be free of secrets.
    pub fn note_error(&self, source: &str, method: &str, code: Code, message: &str, rid: &str) {
        let record = ErrorRecord {
            time: rfc3339(SystemTime::now()),
            source: source.to_owned(),
            method: method.to_owned(),
            code: code_name(code).to_owned(),
            message: text::bounded(message, MAX_MESSAGE).into_owned(),
            request_id: text::bounded(rid, crate::request_id::MAX_LEN).into_owned(),
        };
        let mut errors = self.inner.errors.lock().unwrap_or_else(|p| p.into_inner());
        if errors.len() == RECENT_ERRORS {
            errors.pop_front();
        }
        errors.push_back(record);
    }

    /// The recent failures, newest first.
    pub fn recent_errors(&self) -> Vec<ErrorRecord> {
        let errors = self.inner.errors.lock().unwrap_or_else(|p| p.into_inner());
        errors.iter().rev().cloned().collect()
    }
}

/// Most distinct `(service, method)` label pairs; later ones are `other`.
const MAX_METHODS: usize = 256;

impl Metrics {
    /// The labels of a call: as given while fewer than [`MAX_METHODS`]
    /// pairs were seen, else `other` (a caller cannot grow the series
    /// without bound by inventing paths).
    fn method_labels(&self, (service, method): (String, String)) -> (String, String) {
        let mut seen = self.inner.methods.lock().unwrap_or_else(|p| p.into_inner());
        let key = (service, method);
        if seen.contains(&key) || seen.len() < MAX_METHODS {
            seen.insert(key.clone());
            key
        } else {
            ("other".to_owned(), "other".to_owned())
        }
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// Sets `gauge` to a count (saturating at `i64::MAX`).
pub fn set_gauge(gauge: &Gauge, n: u64) {
    gauge.set(gauge_value(n));
}

fn gauge_value(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Sets `family` to exactly `values`, each labelled by `labels(key)`:
/// keys absent from `values` drop out.
pub fn set_gauges<'a, L>(
    family: &Family<L, Gauge>,
    values: impl IntoIterator<Item = (&'a str, u64)>,
    labels: impl Fn(String) -> L,
) where
    L: Clone + std::hash::Hash + Eq,
{
    let values: Vec<(L, i64)> = values
        .into_iter()
        .map(|(k, n)| (labels(k.to_owned()), gauge_value(n)))
        .collect();
    // Drop the states that are gone, then set the rest.
    family.clear();
    for (l, n) in values {
        family.get_or_create(&l).set(n);
    }
}

// === impl CertificateExpiry ===

impl Collector for CertificateExpiry {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let material = self.0.current();
        let left = material.remaining().as_secs_f64();
        let gauge = ConstGauge::<f64>::new(left);
        let metric = encoder.encode_descriptor(
            "certificate_expiry_seconds",
            "Seconds until this process's own TLS certificate expires (0 once expired).",
            None,
            gauge.metric_type(),
        )?;
        gauge.encode(metric)?;
        let gauge = ConstGauge::<f64>::new(material.trust_remaining().as_secs_f64());
        let metric = encoder.encode_descriptor(
            "trusted_ca_expiry_seconds",
            "Seconds until the first CA this process trusts (its ca.crt) expires (0 once expired).",
            None,
            gauge.metric_type(),
        )?;
        gauge.encode(metric)?;
        // Which bundle is loaded: a CA rotation step has reached this
        // process once it shows the step's digest.
        let info = Info::new(TrustLabels {
            sha256: material.trust_digest().unwrap_or_default(),
        });
        let metric = encoder.encode_descriptor(
            "trust_bundle",
            "The CA bundle this process trusts now (sha256 of its certificates, as csi_scsi_certs::trust_digest)",
            None,
            info.metric_type(),
        )?;
        info.encode(metric)
    }
}

// === impl GrpcMetricsLayer ===

impl<S> tower::Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetricsService {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for GrpcMetricsService<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = http::Response<MeteredBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<ReqBody>) -> Self::Future {
        let (service, method) = self.metrics.method_labels(split_path(req.uri().path()));
        // Settled by the request ID layer outside; settled here when this
        // layer runs alone.
        let request_id = crate::request_id::settle(&mut req).to_string();
        let mut call = CallRecord {
            metrics: self.metrics.clone(),
            service,
            method,
            request_id,
            start: Instant::now(),
            done: false,
        };
        let fut = self.inner.call(req);
        let fut = async move {
            match fut.await {
                Ok(response) => {
                    let (parts, body) = response.into_parts();
                    // A trailers-only response carries its status in the
                    // headers: the call is over.
                    let call = match Status::from_header_map(&parts.headers) {
                        Some(status) => {
                            call.finish(status.code(), status.message());
                            None
                        }
                        None => Some(call),
                    };
                    Ok(http::Response::from_parts(
                        parts,
                        MeteredBody { inner: body, call },
                    ))
                }
                Err(e) => {
                    call.finish(Code::Internal, "the server failed before answering");
                    Err(e)
                }
            }
        };
        Box::pin(fut)
    }
}

/// `/csi.v1.Node/NodeStageVolume` -> (`csi.v1.Node`, `NodeStageVolume`).
fn split_path(path: &str) -> (String, String) {
    let trimmed = path.trim_start_matches('/');
    match trimmed.split_once('/') {
        Some((service, method)) if !service.is_empty() && !method.contains('/') => (
            text::bounded(service, MAX_LABEL).into_owned(),
            text::bounded(method, MAX_LABEL).into_owned(),
        ),
        // Not a gRPC path: one series for all of them, not one per path.
        _ => ("unknown".to_owned(), "unknown".to_owned()),
    }
}

// === impl CallRecord ===

impl CallRecord {
    fn finish(&mut self, code: Code, message: &str) {
        if self.done {
            return;
        }
        self.done = true;
        let took = self.start.elapsed();
        let metrics = &self.metrics;
        metrics
            .inner
            .grpc
            .get_or_create(&GrpcLabels {
                service: self.service.clone(),
                method: self.method.clone(),
                code: code_name(code),
            })
            .observe(took.as_secs_f64());
        tracing::debug!(
            service = %self.service,
            method = %self.method,
            code = code_name(code),
            took_ms = took.as_millis() as u64,
            request_id = %self.request_id,
            "call finished"
        );
        if code != Code::Ok {
            metrics.note_error(&self.service, &self.method, code, message, &self.request_id);
        }
    }
}

impl Drop for CallRecord {
    fn drop(&mut self) {
        // The response went away before its status: the client cancelled.
        self.finish(Code::Cancelled, "the call was cancelled before it finished");
    }
}

// === impl MeteredBody ===

impl<B> Body for MeteredBody<B>
where
    B: Body + Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref()
                    && let Some(mut call) = this.call.take()
                {
                    // tonic's own decoder of `grpc-status` and the
                    // percent-encoded `grpc-message`.
                    match Status::from_header_map(trailers) {
                        Some(status) => call.finish(status.code(), status.message()),
                        None => call.finish(Code::Unknown, "trailers without grpc-status"),
                    }
                }
            }
            Poll::Ready(Some(Err(_))) => {
                if let Some(mut call) = this.call.take() {
                    call.finish(Code::Internal, "the response body failed");
                }
            }
            Poll::Ready(None) => {
                if let Some(mut call) = this.call.take() {
                    call.finish(Code::Unknown, "the response ended without a status");
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_into_service_and_method() {
        assert_eq!(
            split_path("/csi.v1.Node/NodeStageVolume"),
            ("csi.v1.Node".to_owned(), "NodeStageVolume".to_owned())
        );
        assert_eq!(
            split_path("/a/b/c"),
            ("unknown".to_owned(), "unknown".to_owned())
        );
        assert_eq!(
            split_path("/"),
            ("unknown".to_owned(), "unknown".to_owned())
        );
    }

    #[test]
    fn invented_paths_cannot_grow_the_series_without_bound() {
        let m = Metrics::new("agent", "0.0.0", None);
        for i in 0..(MAX_METHODS + 10) {
            m.method_labels(("svc".into(), format!("M{i}")));
        }
        assert_eq!(
            m.method_labels(("svc".into(), "M0".into())),
            ("svc".to_owned(), "M0".to_owned())
        );
        assert_eq!(
            m.method_labels(("svc".into(), "New".into())),
            ("other".to_owned(), "other".to_owned())
        );
    }

    #[tokio::test]
    async fn the_status_comes_from_the_headers_or_the_trailers_decoded() {
        use http_body_util::{BodyExt, Empty, StreamBody};
        use hyper::body::Bytes;
        use tower::{Layer, Service};

        let m = Metrics::new("agent", "0.0.0", None);
        let req = || {
            http::Request::builder()
                .uri("/csi.v1.Node/NodeStageVolume")
                .body(())
                .expect("request")
        };
        // Trailers-only: the status is in the headers.
        let mut svc = m.grpc_layer().layer(tower::service_fn(|_| async {
            http::Response::builder()
                .header("grpc-status", "5")
                .header("grpc-message", "no%20device%3A%20%C3%A9")
                .body(Empty::<Bytes>::new())
        }));
        svc.call(req()).await.expect("response");
        let e = &m.recent_errors()[0];
        assert_eq!(
            (e.code.as_str(), e.message.as_str()),
            ("NotFound", "no device: é")
        );

        // A body, then the status in the trailers.
        let mut svc = m.grpc_layer().layer(tower::service_fn(|_| async {
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", http::HeaderValue::from_static("9"));
            trailers.insert(
                "grpc-message",
                http::HeaderValue::from_static("100%25 full"),
            );
            let frames = [
                Frame::data(Bytes::from_static(b"x")),
                Frame::trailers(trailers),
            ];
            let body = StreamBody::new(futures::stream::iter(
                frames.map(Ok::<_, std::convert::Infallible>),
            ));
            http::Response::builder().body(body)
        }));
        let body = svc.call(req()).await.expect("response").into_body();
        body.collect().await.expect("body");
        let e = &m.recent_errors()[0];
        assert_eq!(
            (e.code.as_str(), e.message.as_str()),
            ("FailedPrecondition", "100% full")
        );
    }

    #[test]
    fn recent_errors_are_bounded_and_newest_first() {
        let m = Metrics::new("agent", "0.0.0", None);
        for i in 0..(RECENT_ERRORS + 5) {
            m.note_error("s", "M", Code::NotFound, &format!("e{i}"), "rid");
        }
        let errors = m.recent_errors();
        assert_eq!(errors.len(), RECENT_ERRORS);
        assert_eq!(errors[0].message, format!("e{}", RECENT_ERRORS + 4));
        assert_eq!(errors[0].code, "NotFound");
    }

    #[test]
    fn exposition_names_the_series_and_ends_with_eof() {
        #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
        struct Labels {
            phase: String,
        }
        let m = Metrics::new("proxy", "1.2.3", None);
        let family = Family::<Labels, Gauge>::default();
        m.register("devices", "Devices by phase", family.clone());
        set_gauges(&family, [("Available", 2), ("Bound", 1)], |phase| Labels {
            phase,
        });
        set_gauges(&family, [("Available", 3)], |phase| Labels { phase });
        let count = Gauge::default();
        m.register("things", "Things", count.clone());
        set_gauge(&count, u64::MAX);
        let text = m.encode();
        assert!(text.contains("csi_scsi_build_info{component=\"proxy\",version=\"1.2.3\"} 1"));
        assert!(text.contains("csi_scsi_devices{phase=\"Available\"} 3"));
        assert!(!text.contains("Bound"), "gone from the last set: {text}");
        assert!(text.contains(&format!("csi_scsi_things {}", i64::MAX)));
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn a_name_is_registered_once() {
        let m = Metrics::new("agent", "0.0.0", None);
        let (first, second) = (Gauge::<i64>::default(), Gauge::<i64>::default());
        m.register("things", "Things", first.clone());
        m.register_with_unit("things", "Things again", Unit::Bytes, second.clone());
        first.set(1);
        second.set(2);
        let text = m.encode();
        assert_eq!(text.matches("# TYPE csi_scsi_things").count(), 1, "{text}");
        assert!(text.contains("csi_scsi_things 1"), "{text}");
    }
}
