//! Names the methods an endpoint does not serve. tonic answers them
//! UNIMPLEMENTED with an empty message; the CSI spec's error scheme asks
//! every error for a human-readable one, and an operator who dialled the
//! wrong socket should read which one it was.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Adds a message to UNIMPLEMENTED answers that have none.
#[derive(Clone, Copy, Debug)]
pub struct NameUnservedLayer {
    served: &'static str,
}

impl NameUnservedLayer {
    /// For an endpoint that serves `served` (e.g. "CSI Identity and Node").
    pub fn new(served: &'static str) -> Self {
        Self { served }
    }
}

impl<S> tower::Layer<S> for NameUnservedLayer {
    type Service = NameUnserved<S>;

    fn layer(&self, inner: S) -> Self::Service {
        NameUnserved {
            inner,
            served: self.served,
        }
    }
}

/// The service [`NameUnservedLayer`] makes.
#[derive(Clone, Debug)]
pub struct NameUnserved<S> {
    inner: S,
    served: &'static str,
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for NameUnserved<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        let path = req.uri().path().to_owned();
        let served = self.served;
        let fut = self.inner.call(req);
        Box::pin(async move {
            let mut resp = fut.await?;
            let headers = resp.headers_mut();
            let unimplemented = headers.get("grpc-status").is_some_and(|v| v == "12");
            let silent = headers
                .get("grpc-message")
                .is_none_or(|v| v.as_bytes().is_empty());
            if unimplemented && silent {
                let message = format!(
                    "{} is not served on this endpoint, which serves {served}",
                    header_safe(&path)
                );
                if let Ok(v) = http::HeaderValue::from_str(&message) {
                    headers.insert("grpc-message", v);
                }
            }
            Ok(resp)
        })
    }
}

/// `s` as a grpc-message may carry it unencoded: printable ASCII but `%`,
/// at most 200 characters.
fn header_safe(s: &str) -> String {
    s.chars()
        .take(200)
        .map(|c| {
            if c.is_ascii_graphic() && c != '%' {
                c
            } else {
                '?'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_made_safe_for_the_message_header() {
        assert_eq!(
            header_safe("/csi.v1.Node/NodeStageVolume"),
            "/csi.v1.Node/NodeStageVolume"
        );
        assert_eq!(header_safe("/a b%\u{e9}"), "/a?b??");
        assert_eq!(header_safe(&"x".repeat(500)).len(), 200);
    }
}
