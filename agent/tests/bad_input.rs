//! The bad-input suite's properties for the agent (issue 11): arbitrary
//! and near-miss input to every parser and validator the agent runs on
//! untrusted text or bytes never panics; every rejection is an error that
//! says what was wrong; and what parses prints back to something that
//! parses to the same value.
//!
//! Quick by default (what CI runs); `PROPTEST_CASES=20000` for the full
//! run. A failing property prints `PROPTEST_RNG_SEED=... cargo test ...`,
//! which replays it. See docs/reliability-properties.md.

#[path = "bad_input/support.rs"]
mod support;

// Canonical WWIDs, from the contract crate's suite (which holds the WWID
// and volume-ID properties).
#[allow(dead_code)]
#[path = "../../contract/tests/bad_input/generators.rs"]
mod generators;

#[path = "bad_input/ids.rs"]
mod ids;

#[path = "bad_input/vpd.rs"]
mod vpd;

#[path = "bad_input/mountinfo.rs"]
mod mountinfo;

#[path = "bad_input/requests.rs"]
mod requests;

#[path = "bad_input/sysfs_tree.rs"]
mod sysfs_tree;
