//! The caller's deadline, carried from a CSI call to the agent calls and
//! lock waits it causes. A sidecar sends `grpc-timeout`, and tonic drops the
//! handler the moment it passes: mid-operation, with no answer and no undo.
//! So the proxy works to that deadline minus a safety margin and answers
//! (UNAVAILABLE naming the node, say) while the caller still listens.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// The gRPC metadata key of the caller's timeout.
pub const GRPC_TIMEOUT_HEADER: &str = "grpc-timeout";

/// The least kept back from a caller's timeout (unless that is under 0.5 s).
const MIN_MARGIN: Duration = Duration::from_millis(250);
/// The most kept back from a caller's timeout.
const MAX_MARGIN: Duration = Duration::from_secs(2);

tokio::task_local! {
    static CALLER_DEADLINE: Option<Instant>;
}

/// Parses a `grpc-timeout` value: at most 8 digits, then `H`, `M`, `S`,
/// `m`, `u` or `n` (gRPC over HTTP/2).
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at_checked(value.len().checked_sub(1)?)?;
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// What the proxy keeps back from a caller's `timeout` to send its answer:
/// a tenth of it, within 250 ms..2 s, and never more than half of it.
pub fn margin(timeout: Duration) -> Duration {
    (timeout / 10)
        .clamp(MIN_MARGIN, MAX_MARGIN)
        .min(timeout / 2)
}

/// The proxy's deadline for a call received at `received` with
/// `metadata`: the caller's timeout minus [`margin`]. `None` when the
/// caller sent no (valid) `grpc-timeout`.
pub fn from_metadata(
    metadata: &tonic::metadata::MetadataMap,
    received: Instant,
) -> Option<Instant> {
    let timeout = parse_grpc_timeout(metadata.get(GRPC_TIMEOUT_HEADER)?.to_str().ok()?)?;
    Some(received + timeout.saturating_sub(margin(timeout)))
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
    fn grpc_timeouts_parse_in_every_unit() {
        let cases = [
            ("3H", Duration::from_secs(3 * 3600)),
            ("2M", Duration::from_secs(120)),
            ("8S", Duration::from_secs(8)),
            ("7999m", Duration::from_millis(7999)),
            ("15u", Duration::from_micros(15)),
            ("99999999n", Duration::from_nanos(99_999_999)),
            ("0S", Duration::ZERO),
        ];
        for (value, want) in cases {
            assert_eq!(parse_grpc_timeout(value), Some(want), "{value}");
        }
    }

    #[test]
    fn malformed_grpc_timeouts_are_ignored() {
        for value in [
            "",
            "S",
            "8",
            "8s",
            "123456789S",
            "-1S",
            "1.5S",
            "+1S",
            "8 S",
            "٣S",
        ] {
            assert_eq!(parse_grpc_timeout(value), None, "{value:?}");
        }
    }

    #[test]
    fn the_margin_is_a_tenth_within_its_bounds_and_at_most_half() {
        let ms = Duration::from_millis;
        assert_eq!(margin(ms(8000)), ms(800));
        assert_eq!(margin(ms(60_000)), ms(2000), "capped at 2 s");
        assert_eq!(margin(ms(1000)), ms(250), "at least 250 ms");
        assert_eq!(margin(ms(300)), ms(150), "never more than half");
        assert_eq!(margin(Duration::ZERO), Duration::ZERO);
        for t in (0..120_000).step_by(997).map(ms) {
            let m = margin(t);
            assert!(m <= t / 2 && m <= MAX_MARGIN, "{t:?}: {m:?}");
        }
    }

    #[test]
    fn the_deadline_comes_from_the_callers_header_less_the_margin() {
        let now = Instant::now();
        let mut md = tonic::metadata::MetadataMap::new();
        assert_eq!(from_metadata(&md, now), None, "no header, no deadline");
        md.insert(GRPC_TIMEOUT_HEADER, "8S".parse().expect("value"));
        assert_eq!(
            from_metadata(&md, now),
            Some(now + Duration::from_millis(7200))
        );
        md.insert(GRPC_TIMEOUT_HEADER, "soon".parse().expect("value"));
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
