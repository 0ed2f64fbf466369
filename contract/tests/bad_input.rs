//! The bad-input suite's properties for the proxy–agent contract (issue
//! 11): arbitrary and near-miss WWIDs and volume IDs never panic the
//! parsers; every refusal is an error that says what was wrong; and what
//! parses prints back to something that parses to the same value.
//!
//! Quick by default (what CI runs); `PROPTEST_CASES=20000` for the full
//! run. A failing property prints `PROPTEST_RNG_SEED=... cargo test ...`,
//! which replays it. See docs/reliability.md.

// The agent's suite support, shared; these properties use only part of it.
#[allow(dead_code)]
#[path = "../../agent/tests/bad_input/support.rs"]
mod support;

// The generators of canonical WWIDs and issued volume IDs, which the
// agent's suite includes too.
#[allow(dead_code)]
#[path = "bad_input/generators.rs"]
mod generators;

#[path = "bad_input/ids.rs"]
mod ids;
