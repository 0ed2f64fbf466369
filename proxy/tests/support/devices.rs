//! Devices, discovery rounds and bind requests for inventory tests.
//! Shared by the test binaries through `#[path]`; not every binary uses
//! every helper.
#![allow(dead_code)]

use std::collections::BTreeMap;

use csi_scsi_contract::{NodeName, Wwid};
use csi_scsi_proxy::device::{
    AccessMode, BindRequest, Binding, Capability, Cleanup, DiscoveryRound, FsType, LunReport,
    NewLuns, Placement, Publication,
};
use csi_scsi_proxy::selector::Selector;

/// Node `name` (a valid node name).
pub fn node(name: &str) -> NodeName {
    NodeName::parse(name).expect("a test node name")
}

/// The WWID of LUN `i`.
pub fn wwid(i: u32) -> Wwid {
    Wwid::parse(&format!("naa.6001405{i:025x}")).expect("a canonical WWID")
}

/// LUN `i` of `size` bytes, as a node reports it.
pub fn lun(i: u32, size: u64) -> LunReport {
    LunReport {
        wwid: wwid(i),
        lun: i,
        size_bytes: size,
        vendor: "LIO-ORG".into(),
        model: "disk".into(),
        serial: format!("sn{i}"),
        paths: vec![format!(
            "ip-198.18.0.1:3260-iscsi-iqn.2026-01.io.csi-scsi:a-lun-{i}"
        )],
    }
}

/// Labels from `k=v` pairs.
pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A discovery round of `target` (device labels `tier=fast`), of a target
/// that trusts its new LUNs: these tests are about what follows discovery
/// (the probe that proves a new LUN blank has tests of its own).
pub fn round(
    target: &str,
    answered: &[(&str, Vec<LunReport>)],
    unanswered: &[&str],
) -> DiscoveryRound {
    DiscoveryRound {
        target: target.into(),
        device_labels: labels(&[("tier", "fast")]),
        answered: answered.iter().map(|(n, l)| (node(n), l.clone())).collect(),
        unanswered: unanswered.iter().map(|s| node(s)).collect(),
        same_array: Default::default(),
        new_luns: NewLuns::Trust,
    }
}

/// The capability every test volume is created with.
pub const WRITER: Capability = Capability::Mount(FsType::Ext4, AccessMode::SingleNodeWriter);

/// The binding of a volume named `name` (uid `uid-<name>`).
pub fn binding(name: &str) -> Binding {
    Binding {
        uid: uid(name),
        volume_name: name.into(),
        required_bytes: 1,
        limit_bytes: 0,
        capabilities: vec![WRITER],
        parameters: BTreeMap::new(),
        cleanup: Cleanup::Zero,
    }
}

/// The binding uid `binding(name)` gets.
pub fn uid(name: &str) -> String {
    format!(
        "uid-{}",
        name.replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "-")
    )
}

/// A request for volume `name`, any size, trying `nodes` in order (none:
/// anywhere), over devices matching `selector`.
pub fn bind_req(name: &str, nodes: &[&str], selector: &str) -> BindRequest {
    BindRequest {
        binding: binding(name),
        placement: Placement::new(&[], &nodes.iter().map(|n| node(n)).collect::<Vec<_>>())
            .expect("placement"),
        selector: Selector::parse(selector).expect("selector"),
        min_bytes: 1,
        max_bytes: u64::MAX,
    }
}

/// A publication on `node` (single-node writer, on ext4).
pub fn publication(name: &str) -> Publication {
    Publication {
        node: node(name),
        access: Some(WRITER),
        readonly: false,
    }
}
