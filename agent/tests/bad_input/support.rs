//! What every property shares: the runner configuration (cases, seed,
//! where failures are kept) and generators of hostile text. The proxy's and
//! the contract crate's bad-input suites include this file too
//! (proxy/tests/bad_input.rs, contract/tests/bad_input.rs), so one copy
//! serves all three; paths built from `CARGO_MANIFEST_DIR` are each crate's
//! own.

use std::fmt::Display;
use std::sync::OnceLock;

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, FileFailurePersistence, RngSeed};

/// Where proptest records the seeds of failing cases; replayed first on
/// every later run. Commit it only with the fix of what it records.
const REGRESSIONS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/proptest-regressions/bad_input.txt"
);

/// The longest error text a rejection may have: an error quotes an
/// excerpt of the input, never all of it (a megabyte of echoed input is
/// not a clear error, and does not fit in a gRPC status).
pub const MAX_ERROR_LEN: usize = 2048;

/// The seed of this run: `PROPTEST_RNG_SEED` when set (a replay), else a
/// fresh one. One per process, so every property of a run shares it.
pub fn seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| {
        std::env::var("PROPTEST_RNG_SEED")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| fastrand::u64(..))
    })
}

/// The runner of one property: `default_cases` unless `PROPTEST_CASES`
/// says otherwise, the run's seed, failures kept in [`REGRESSIONS`]. Prints
/// the command that replays the run (the harness shows it when the
/// property fails).
pub fn config(default_cases: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(default_cases);
    let seed = seed();
    let test = std::thread::current().name().unwrap_or_default().to_owned();
    eprintln!(
        "replay: PROPTEST_RNG_SEED={seed} PROPTEST_CASES={cases} cargo test -p {} --test bad_input -- --exact {test}",
        env!("CARGO_PKG_NAME")
    );
    Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(REGRESSIONS))),
        ..Config::default()
    }
}

/// Checks that a rejection is a clear error: non-empty, on one line, of
/// bounded length, and naming at least one of `mentions` (the field, the
/// kind of input, or the input itself).
pub fn clear_error(e: &dyn Display, mentions: &[&str]) -> Result<(), TestCaseError> {
    let text = e.to_string();
    prop_assert!(!text.trim().is_empty(), "empty error text");
    prop_assert!(
        !text.chars().any(char::is_control),
        "error text has control characters (raw input echoed?): {text:?}"
    );
    prop_assert!(
        text.len() <= MAX_ERROR_LEN,
        "error text is {} bytes: {:?}...",
        text.len(),
        text.chars().take(200).collect::<String>()
    );
    prop_assert!(
        mentions.iter().any(|m| text.contains(m)),
        "error {text:?} mentions none of {mentions:?}"
    );
    Ok(())
}

/// Checks the part of [`clear_error`] that errors quoting their input
/// whole still meet: non-empty and naming one of `mentions`. For refusals
/// whose text is built outside the files this suite may fix (see
/// docs/reliability-properties.md, known issues).
pub fn names_field(e: &dyn Display, mentions: &[&str]) -> Result<(), TestCaseError> {
    let text = e.to_string();
    prop_assert!(!text.trim().is_empty(), "empty error text");
    prop_assert!(
        mentions.iter().any(|m| text.contains(m)),
        "error {:?} mentions none of {mentions:?}",
        text.chars().take(300).collect::<String>()
    );
    Ok(())
}

/// Characters that break naive parsers: the separators of every format
/// here, blanks, NUL and other controls, and non-ASCII look-alikes.
pub fn nasty_char() -> impl Strategy<Value = char> {
    prop_oneof![
        3 => prop::sample::select(vec![
            '\0', '\n', '\r', '\t', ' ', ':', '.', '/', '\\', '-', '_', ',', '=', '(', ')',
            '[', ']', '%', '#', '!', '"', '\'', '*', '`', '|', '0', '9', 'f', 'x', 'Z',
            '\u{7f}', '\u{85}', '\u{a0}', '\u{200b}', '\u{202e}', '\u{3000}', '\u{feff}',
            'é', 'ı', '\u{212a}', '\u{ff10}',
        ]),
        1 => any::<char>(),
    ]
}

/// Any text, weighted towards what breaks parsers: arbitrary Unicode,
/// printable ASCII, runs of nasty characters, and long repetitions.
pub fn hostile_text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => any::<String>(),
        3 => "[ -~]{0,64}",
        2 => prop::collection::vec(nasty_char(), 0..32).prop_map(|v| v.into_iter().collect()),
        1 => ("[ -~]{1,8}", 64usize..2048).prop_map(|(s, n)| s.repeat(n)),
    ]
}

/// `valid` with one edit: a character deleted, replaced or inserted, the
/// text cut short, doubled, case-flipped, padded with blanks or a NUL, or
/// repeated into a very long field.
pub fn near_miss(valid: impl Strategy<Value = String>) -> impl Strategy<Value = String> {
    (valid, any::<Index>(), nasty_char(), 0u8..9).prop_map(|(s, at, c, op)| mutate(&s, at, c, op))
}

/// `valid` as is, or one edit away (see [`near_miss`]).
pub fn valid_or_near(
    valid: impl Strategy<Value = String> + Clone,
) -> impl Strategy<Value = String> {
    prop_oneof![valid.clone(), near_miss(valid)]
}

/// Applies edit `op` at `at` (see [`near_miss`]).
pub fn mutate(s: &str, at: Index, c: char, op: u8) -> String {
    let mut chars: Vec<char> = s.chars().collect();
    let i = if chars.is_empty() {
        0
    } else {
        at.index(chars.len())
    };
    match op {
        0 if !chars.is_empty() => {
            chars.remove(i);
        }
        0 | 1 if chars.is_empty() => chars.push(c),
        1 => chars[i] = c,
        2 => chars.insert(i, c),
        3 => chars.truncate(i),
        4 => return format!("{s}{s}"),
        5 => {
            return s
                .chars()
                .map(|c| {
                    if c.is_ascii_lowercase() {
                        c.to_ascii_uppercase()
                    } else {
                        c.to_ascii_lowercase()
                    }
                })
                .collect();
        }
        6 => return format!(" {s}\n"),
        7 => return format!("{s}\0"),
        _ => return s.repeat(64),
    }
    chars.into_iter().collect()
}

/// Lower-case hex of `n` digits.
pub fn hex(n: usize) -> impl Strategy<Value = String> + Clone {
    prop::collection::vec(prop::sample::select(b"0123456789abcdef".to_vec()), n)
        .prop_map(|v| String::from_utf8(v).unwrap_or_default())
}

/// A Kubernetes node name (DNS-1123 subdomain), the independent oracle.
pub fn is_node_name(n: &str) -> bool {
    // A name that reads as an address would be checked against IP SANs,
    // never the node's DNS SAN: refused.
    n.parse::<std::net::IpAddr>().is_err()
        && n.len() <= 253
        && n.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}
