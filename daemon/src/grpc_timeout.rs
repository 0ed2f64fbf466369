//! The caller's `grpc-timeout`, read the one way the proxy and the agent
//! share. tonic enforces the header by dropping the handler when it passes
//! (mid-operation, with no answer), but its parser is private and gives the
//! handler no deadline; so a server that wants to answer in time reads the
//! header itself and keeps back a [`margin`] to send its answer.

use std::time::Duration;

use tonic::metadata::MetadataMap;

/// The gRPC metadata key of the caller's timeout.
pub const GRPC_TIMEOUT_HEADER: &str = "grpc-timeout";

/// The least kept back from a caller's timeout (unless that is under 0.5 s).
const MIN_MARGIN: Duration = Duration::from_millis(250);
/// The most kept back from a caller's timeout.
const MAX_MARGIN: Duration = Duration::from_secs(2);

/// Parses a `grpc-timeout` value as the gRPC over HTTP/2 spec writes it:
/// 1 to 8 ASCII digits, then one of `H`, `M`, `S`, `m`, `u`, `n`. Anything
/// else (a sign, a ninth digit, a blank, another unit) is `None`.
pub fn parse(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at_checked(value.len().checked_sub(1)?)?;
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // At most 99_999_999 hours: no overflow in u64 seconds.
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

/// The caller's timeout in `metadata`, if it sent a valid one.
pub fn from_metadata(metadata: &MetadataMap) -> Option<Duration> {
    parse(metadata.get(GRPC_TIMEOUT_HEADER)?.to_str().ok()?)
}

/// What a server keeps back from a caller's `timeout` to send its answer:
/// a tenth of it, within 250 ms..2 s, and never more than half of it.
pub fn margin(timeout: Duration) -> Duration {
    (timeout / 10)
        .clamp(MIN_MARGIN, MAX_MARGIN)
        .min(timeout / 2)
}

/// The time a server has to work on a call with `timeout`: the timeout
/// less its [`margin`].
pub fn budget(timeout: Duration) -> Duration {
    timeout.saturating_sub(margin(timeout))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_specs_forms_parse_in_every_unit() {
        let cases = [
            ("3H", Duration::from_secs(3 * 3600)),
            ("2M", Duration::from_secs(120)),
            ("8S", Duration::from_secs(8)),
            ("7999m", Duration::from_millis(7999)),
            ("15u", Duration::from_micros(15)),
            ("99999999n", Duration::from_nanos(99_999_999)),
            ("99999999H", Duration::from_secs(99_999_999 * 3600)),
            ("00000001S", Duration::from_secs(1)),
            ("0S", Duration::ZERO),
        ];
        for (value, want) in cases {
            assert_eq!(parse(value), Some(want), "{value}");
        }
    }

    #[test]
    fn anything_else_is_refused() {
        for value in [
            "",
            "S",
            "8",
            "8s",
            "8x",
            "8SS",
            "123456789S",
            "-1S",
            "+5S",
            "1.5S",
            "8 S",
            " 8S",
            "٣S",
            "８S",
            "8é",
        ] {
            assert_eq!(parse(value), None, "{value:?}");
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
        assert_eq!(budget(ms(8000)), ms(7200));
        for t in (0..120_000).step_by(997).map(ms) {
            let m = margin(t);
            assert!(m <= t / 2 && m <= MAX_MARGIN, "{t:?}: {m:?}");
            assert_eq!(budget(t) + m, t);
        }
    }

    #[test]
    fn the_timeout_comes_from_the_header_and_a_bad_one_is_ignored() {
        let mut md = MetadataMap::new();
        assert_eq!(from_metadata(&md), None);
        md.insert(GRPC_TIMEOUT_HEADER, "8S".parse().expect("value"));
        assert_eq!(from_metadata(&md), Some(Duration::from_secs(8)));
        md.insert(GRPC_TIMEOUT_HEADER, "+8S".parse().expect("value"));
        assert_eq!(from_metadata(&md), None);
    }
}
