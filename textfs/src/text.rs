//! Text from outside (request fields, tool output, error messages) cut to
//! a bound before it goes into a status, a log line, a metric label or an
//! Event: hostile or runaway input is never echoed whole, and what is sent
//! still fits the HTTP/2 trailer or API field that carries it. Every cut
//! ends in the same marker, `…(N bytes)`, N being the full length.

use std::borrow::Cow;

/// Most bytes of one outside value (a request field, a name or flag read
/// from the host) that an error quotes back: enough to recognise it, never
/// a whole hostile input.
pub const INPUT_MAX: usize = 96;

/// Most bytes of a gRPC status message. It travels in an HTTP/2 trailer
/// that clients cap (hyper at 16 KiB, percent-encoded at up to 3 bytes a
/// byte), so a message quoting a huge request field would reach the caller
/// as a transport error instead of its code.
pub const STATUS_MAX: usize = 2048;

/// `s` unchanged when it is at most `max` bytes long. Otherwise its head,
/// cut at a character boundary, then `…(N bytes)` with N = `s.len()`: at
/// most `max` bytes in all (just the marker when `max` is shorter).
pub fn bounded(s: &str, max: usize) -> Cow<'_, str> {
    match cut(s, max) {
        None => Cow::Borrowed(s),
        Some((head, marker)) => Cow::Owned(format!("{head}{marker}")),
    }
}

/// `s` quoted with `{:?}` (control characters escaped, so a message stays
/// on one line): whole when at most `max` bytes, else the head [`bounded`]
/// keeps, quoted, then the marker.
pub fn quote(s: &str, max: usize) -> String {
    match cut(s, max) {
        None => format!("{s:?}"),
        Some((head, marker)) => format!("{head:?}{marker}"),
    }
}

/// `s` cut to [`INPUT_MAX`] bytes: what an error quotes of a rejected
/// input, so hostile input of any size is never echoed whole into logs and
/// gRPC statuses.
pub fn excerpt(s: &str) -> String {
    bounded(s, INPUT_MAX).into_owned()
}

/// The head of `s` and the marker, when `s` is over `max` bytes.
fn cut(s: &str, max: usize) -> Option<(&str, String)> {
    if s.len() <= max {
        return None;
    }
    let marker = format!("…({} bytes)", s.len());
    let end = s.floor_char_boundary(max.saturating_sub(marker.len()));
    Some((&s[..end], marker))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_within_the_bound_is_unchanged() {
        assert!(matches!(bounded("abc", 3), Cow::Borrowed("abc")));
        assert_eq!(bounded("", 0), "");
        assert_eq!(bounded("ééé", 6), "ééé", "6 bytes, exactly the bound");
        assert_eq!(quote("a\nb", 3), r#""a\nb""#);
    }

    #[test]
    fn a_cut_ends_in_the_marker_and_keeps_to_the_bound() {
        let s = "x".repeat(100);
        let b = bounded(&s, 40);
        // The marker is 14 bytes ('…' is 3).
        assert_eq!(b, format!("{}…(100 bytes)", "x".repeat(40 - 14)));
        assert_eq!(b.len(), 40);
        assert_eq!(quote(&s, 40), format!("{:?}…(100 bytes)", "x".repeat(26)));
        // A bound shorter than the marker leaves only the marker.
        assert_eq!(bounded(&s, 4), "…(100 bytes)");
    }

    #[test]
    fn a_cut_never_splits_a_character() {
        for s in ["é".repeat(50), "日本語".repeat(20), "🦀a".repeat(30)] {
            for max in 0..s.len() {
                let b = bounded(&s, max);
                let marker = format!("…({} bytes)", s.len());
                let head = b.strip_suffix(&marker).expect("marked");
                assert!(s.starts_with(head), "{max}: {b}");
                assert!(b.len() <= max.max(marker.len()), "{max}: {b}");
                // The head is as long as fits: one more character would not.
                let next = s[head.len()..].chars().next().map_or(0, char::len_utf8);
                assert!(head.len() + next + marker.len() > max, "{max}: {b}");
            }
        }
    }
}
