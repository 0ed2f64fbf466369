//! The caller's deadline, carried from a CSI call to the agent calls and
//! lock waits it causes. A sidecar sends `grpc-timeout`, and tonic drops the
//! handler the moment it passes: mid-operation, with no answer and no undo.
//! So the proxy works to that deadline minus a safety margin and answers
//! (UNAVAILABLE naming the node, say) while the caller still listens.

use std::future::Future;
use std::time::Duration;

use csi_scsi_daemon::grpc_timeout;
use tokio::time::Instant;

tokio::task_local! {
    static CALLER_DEADLINE: Option<Instant>;
}

/// The proxy's deadline for a call received at `received` with
/// `metadata`: the caller's timeout less its margin
/// ([`grpc_timeout::budget`]). `None` when the caller sent no (valid)
/// `grpc-timeout`.
pub fn from_metadata(
    metadata: &tonic::metadata::MetadataMap,
    received: Instant,
) -> Option<Instant> {
    Some(received + grpc_timeout::budget(grpc_timeout::from_metadata(metadata)?))
}

/// Runs `f` with `deadline` as the caller's deadline of everything it does
/// on this task.
pub async fn within<F: Future>(deadline: Option<Instant>, f: F) -> F::Output {
    CALLER_DEADLINE.scope(deadline, f).await
}

/// The caller's deadline of the current task, if it has one.
pub fn caller_deadline() -> Option<Instant> {
    CALLER_DEADLINE.try_with(|d| *d).ok().flatten()
}

/// `configured` from `now`, cut short by the caller's deadline.
pub fn effective(configured: Duration, now: Instant) -> Instant {
    let own = now + configured;
    caller_deadline().map_or(own, |caller| caller.min(own))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deadline_comes_from_the_callers_header_less_the_margin() {
        let now = Instant::now();
        let mut md = tonic::metadata::MetadataMap::new();
        assert_eq!(from_metadata(&md, now), None, "no header, no deadline");
        md.insert(
            grpc_timeout::GRPC_TIMEOUT_HEADER,
            "8S".parse().expect("value"),
        );
        assert_eq!(
            from_metadata(&md, now),
            Some(now + Duration::from_millis(7200))
        );
        md.insert(
            grpc_timeout::GRPC_TIMEOUT_HEADER,
            "soon".parse().expect("value"),
        );
        assert_eq!(from_metadata(&md, now), None, "a bad header is ignored");
    }

    #[tokio::test]
    async fn the_callers_deadline_caps_the_configured_one_within_its_scope_only() {
        let now = Instant::now();
        let long = Duration::from_secs(30);
        assert_eq!(effective(long, now), now + long, "no caller deadline");
        let caller = now + Duration::from_secs(7);
        within(Some(caller), async {
            assert_eq!(caller_deadline(), Some(caller));
            assert_eq!(effective(long, now), caller, "the caller's is shorter");
            let short = Duration::from_secs(1);
            assert_eq!(
                effective(short, now),
                now + short,
                "the configured is shorter"
            );
        })
        .await;
        within(None, async { assert_eq!(effective(long, now), now + long) }).await;
        assert_eq!(caller_deadline(), None, "the scope ended");
    }
}
