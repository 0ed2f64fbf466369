//! Request IDs: the one rule for the `x-request-id` a call carries. The
//! outermost layer of every server ([`RequestIdLayer`]) settles each call's
//! ID (the caller's when usable, a fresh one otherwise), writes it back into
//! the header and puts it in the request's extensions, where the metrics
//! layer and the handlers read it ([`RequestId::of`]): the span, the
//! recent-error list, the logs and the calls forwarded to an agent all name
//! the same ID.

use std::fmt;

mod layer;

pub(crate) use layer::settle;
pub use layer::{CallSpan, RequestIdLayer, RequestIdService};

/// The header that carries a request ID.
pub const HEADER: &str = "x-request-id";

/// The longest caller-given ID kept as is.
pub const MAX_LEN: usize = 128;

/// A call's request ID: 1 to [`MAX_LEN`] visible ASCII characters.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RequestId(String);

impl RequestId {
    /// A fresh ID: 16 hex digits, random per process and call.
    pub fn fresh() -> Self {
        use std::hash::BuildHasher;
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Self(format!(
            "{:016x}",
            std::collections::hash_map::RandomState::new().hash_one(n)
        ))
    }

    /// A caller's ID, if it is usable as is.
    pub fn parse(text: &str) -> Option<Self> {
        (!text.is_empty() && text.len() <= MAX_LEN && text.bytes().all(|b| b.is_ascii_graphic()))
            .then(|| Self(text.to_owned()))
    }

    /// The caller's usable ID in `headers`, if any.
    pub fn from_headers(headers: &http::HeaderMap) -> Option<Self> {
        Self::parse(headers.get(HEADER)?.to_str().ok()?)
    }

    /// The ID [`RequestIdLayer`] settled for this call; for a call that did
    /// not pass through it (a handler called directly), the caller's usable
    /// ID or a fresh one.
    pub fn of<T>(req: &tonic::Request<T>) -> Self {
        req.extensions()
            .get::<Self>()
            .cloned()
            .or_else(|| {
                req.metadata()
                    .get(HEADER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(Self::parse)
            })
            .unwrap_or_else(Self::fresh)
    }

    /// The ID as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_visible_ascii_of_a_bounded_length_is_kept() {
        assert_eq!(
            RequestId::parse("abc-123").map(|r| r.to_string()),
            Some("abc-123".to_owned())
        );
        for bad in ["", "has space", "tab\t", "é", &"x".repeat(MAX_LEN + 1)] {
            assert_eq!(RequestId::parse(bad), None, "{bad:?}");
        }
        assert!(RequestId::parse(&"x".repeat(MAX_LEN)).is_some());
    }

    #[test]
    fn fresh_ids_differ_and_are_usable() {
        let (a, b) = (RequestId::fresh(), RequestId::fresh());
        assert_ne!(a, b);
        assert_eq!(RequestId::parse(a.as_str()), Some(a));
    }

    #[test]
    fn a_handler_reads_the_settled_id_first_then_the_header() {
        let mut req = tonic::Request::new(());
        req.metadata_mut()
            .insert(HEADER, "from-caller".parse().expect("ascii"));
        assert_eq!(RequestId::of(&req).as_str(), "from-caller");
        req.extensions_mut()
            .insert(RequestId::parse("settled").expect("valid"));
        assert_eq!(RequestId::of(&req).as_str(), "settled");
        let unusable = {
            let mut r = tonic::Request::new(());
            r.metadata_mut()
                .insert(HEADER, "a b".parse().expect("ascii"));
            r
        };
        let id = RequestId::of(&unusable);
        assert_ne!(id.as_str(), "a b");
        assert_eq!(id.as_str().len(), 16, "a fresh one");
    }
}
