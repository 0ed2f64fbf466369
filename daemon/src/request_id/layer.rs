//! The tower layer that settles each call's request ID before anything
//! else sees the call, so the metrics, the recent errors, the handler's span
//! and the logs all name the same ID.

use std::task::{Context, Poll};

use tracing::Instrument;
use tracing::instrument::Instrumented;

use super::{HEADER, RequestId};

/// Whether the layer also opens a span per call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallSpan {
    /// An `rpc{method, request_id}` span around each call, for servers
    /// whose handlers open no span carrying the ID (CSI Node, called by
    /// kubelet).
    PerCall,
    /// None: the handlers open their own span with the ID.
    InHandlers,
}

/// Settles the request ID of every call: the caller's usable
/// `x-request-id`, or a fresh one written back into the header. The ID goes
/// into the request's extensions, where [`RequestId::of`] reads it.
#[derive(Clone, Copy, Debug)]
pub struct RequestIdLayer {
    span: CallSpan,
}

impl RequestIdLayer {
    /// A layer that opens spans as `span` says.
    pub fn new(span: CallSpan) -> Self {
        Self { span }
    }
}

impl<S> tower::Layer<S> for RequestIdLayer {
    type Service = RequestIdService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestIdService {
            inner,
            span: self.span,
        }
    }
}

/// The service [`RequestIdLayer`] wraps around a server's routes.
#[derive(Clone, Debug)]
pub struct RequestIdService<S> {
    inner: S,
    span: CallSpan,
}

impl<S, ReqBody> tower::Service<http::Request<ReqBody>> for RequestIdService<S>
where
    S: tower::Service<http::Request<ReqBody>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Instrumented<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<ReqBody>) -> Self::Future {
        let id = settle(&mut req);
        let span = match self.span {
            CallSpan::PerCall => {
                let method = req.uri().path().rsplit('/').next().unwrap_or_default();
                let method = csi_scsi_textfs::text::bounded(method, 64);
                tracing::info_span!("rpc", method = %method, request_id = %id)
            }
            CallSpan::InHandlers => tracing::Span::none(),
        };
        span.in_scope(|| self.inner.call(req)).instrument(span)
    }
}

/// The call's ID: one already settled, the caller's usable one, or a fresh
/// one (then also written into the header, for whatever reads it there).
pub(crate) fn settle<B>(req: &mut http::Request<B>) -> RequestId {
    if let Some(id) = req.extensions().get::<RequestId>() {
        return id.clone();
    }
    let id = RequestId::from_headers(req.headers()).unwrap_or_else(|| {
        let id = RequestId::fresh();
        if let Ok(v) = http::HeaderValue::from_str(id.as_str()) {
            req.headers_mut().insert(HEADER, v);
        }
        id
    });
    req.extensions_mut().insert(id.clone());
    id
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer, Service, ServiceExt};

    async fn seen(req: http::Request<()>) -> (Option<RequestId>, Option<String>) {
        let svc = RequestIdLayer::new(CallSpan::PerCall).layer(tower::service_fn(
            |req: http::Request<()>| async move {
                Ok::<_, std::convert::Infallible>((
                    req.extensions().get::<RequestId>().cloned(),
                    req.headers()
                        .get(HEADER)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned),
                ))
            },
        ));
        let mut svc = svc;
        svc.ready()
            .await
            .expect("ready")
            .call(req)
            .await
            .expect("infallible")
    }

    #[tokio::test]
    async fn the_callers_usable_id_is_kept_and_put_in_the_extensions() {
        let req = http::Request::builder()
            .uri("/csi.v1.Node/NodeStageVolume")
            .header(HEADER, "from-caller")
            .body(())
            .expect("request");
        let (ext, header) = seen(req).await;
        assert_eq!(ext.map(|i| i.to_string()).as_deref(), Some("from-caller"));
        assert_eq!(header.as_deref(), Some("from-caller"));
    }

    #[tokio::test]
    async fn an_unusable_or_missing_id_is_replaced_by_a_fresh_one_everywhere() {
        for header in [None, Some("has space")] {
            let mut b = http::Request::builder().uri("/x.Y/Z");
            if let Some(h) = header {
                b = b.header(HEADER, h);
            }
            let (ext, header) = seen(b.body(()).expect("request")).await;
            let ext = ext.expect("an ID in the extensions");
            assert_eq!(ext.as_str().len(), 16, "a fresh one");
            assert_eq!(
                header.as_deref(),
                Some(ext.as_str()),
                "the same one in the header"
            );
        }
    }
}
