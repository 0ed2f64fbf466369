//! The bad-input suite's properties for the proxy (issue 11): arbitrary
//! and near-miss volume IDs, StorageClass parameters, device selectors and
//! agents files never panic the parsers; every refusal is an error that
//! says what was wrong; and what parses means what it says.
//!
//! Quick by default (what CI runs); `PROPTEST_CASES=20000` for the full
//! run. A failing property prints `PROPTEST_RNG_SEED=... cargo test ...`,
//! which replays it. See docs/reliability-properties.md.

// The agent's suite support, shared; the proxy's properties use only part
// of it.
#[allow(dead_code)]
#[path = "../../agent/tests/bad_input/support.rs"]
mod support;

#[path = "bad_input/properties.rs"]
mod properties;
