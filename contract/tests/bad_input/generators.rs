//! Generators of what the contract's types accept: canonical WWIDs of
//! every kind and volume IDs as the proxy issues them. The agent's
//! bad-input suite includes this file too (agent/tests/bad_input.rs), to
//! build requests and sysfs trees around valid WWIDs.

use proptest::prelude::*;
use proptest::sample::select;

use crate::support::hex;

/// One blank-free word of a T10 or SCSI-name identifier (printable ASCII
/// without `_`, which canonical form uses as the word separator).
fn word(max: usize) -> impl Strategy<Value = String> + Clone {
    prop::collection::vec(
        prop::char::ranges(vec!['!'..='^', '`'..='~'].into()),
        1..=max,
    )
    .prop_map(|v| v.into_iter().collect())
}

/// A canonical WWID of every kind, including identifiers near the length
/// limit (some over it: those are refused).
pub fn canonical_wwid() -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        3 => prop_oneof![hex(16), hex(32)].prop_map(|h| format!("naa.{h}")),
        1 => prop_oneof![hex(16), hex(24), hex(32)].prop_map(|h| format!("eui.{h}")),
        2 => prop::collection::vec(word(16), 1..5).prop_map(|w| format!("t10.{}", w.join("_"))),
        1 => (select(vec!["iqn.", "eui.", "naa."]), prop::collection::vec(word(24), 1..4))
            .prop_map(|(p, w)| format!("name.{p}{}", w.join("_"))),
        1 => word(270).prop_map(|w| format!("t10.{w}")),
    ]
}

/// A binding UID: a UUID v4 as the proxy makes them, or anything of the
/// grammar the contract accepts (1 to 64 of `[A-Za-z0-9-]`).
pub fn binding_uid() -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        "[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
        "[A-Za-z0-9-]{1,64}",
    ]
}

/// A volume ID as the proxy issues it, as its WWID and binding UID (the
/// WWID may be over the length limit: filter when that matters).
pub fn volume_id() -> impl Strategy<Value = (String, String)> + Clone {
    (canonical_wwid(), binding_uid())
}
