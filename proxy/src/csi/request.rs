//! Raw CSI messages into typed values: capabilities, topology, capacity,
//! request IDs. A failure names the field.

use csi_scsi_contract::NodeName;
use csi_scsi_contract::node_name::MAX_LEN as MAX_NODE_ID;
use csi_scsi_proto::csi::volume_capability::AccessType;
use csi_scsi_proto::csi::volume_capability::access_mode::Mode as CsiMode;
use csi_scsi_proto::csi::{Topology, TopologyRequirement, VolumeCapability};
use csi_scsi_textfs::text;

use crate::device::{Access, AccessMode, Placement};
use crate::error::ProxyError;
use crate::lifecycle::NODE_TOPOLOGY_KEY;
use crate::parameters;

fn invalid(field: &'static str, reason: impl Into<String>) -> ProxyError {
    ProxyError::InvalidArgument {
        field,
        reason: reason.into(),
    }
}

/// The longest volume ID this driver issues: `<wwid>:<binding-uid>`, a WWID
/// of at most 256 characters and a binding UID of at most 64.
const MAX_VOLUME_ID: usize = csi_scsi_contract::volume_id::MAX_LEN;

/// The spec's general size limit for a string field.
const MAX_STRING: usize = 128;

/// The longest filesystem type name worth quoting back.
const MAX_FS_TYPE: usize = 64;

/// The most bytes of `field` a request may carry. Longer values are
/// refused before anything looks them up, so that no message, log line or
/// store record ever carries them whole.
fn max_len(field: &str) -> usize {
    match field {
        "volume_id" => MAX_VOLUME_ID,
        _ => MAX_STRING,
    }
}

/// `s` quoted for a message, cut to the contract's input bound, so hostile
/// input is never echoed whole.
fn quote(s: &str) -> String {
    text::quote(s, text::INPUT_MAX)
}

/// A required non-empty string field, no longer than its limit.
pub(crate) fn required<'a>(field: &'static str, value: &'a str) -> Result<&'a str, ProxyError> {
    let max = max_len(field);
    if value.is_empty() {
        Err(invalid(field, "is required"))
    } else if value.len() > max {
        Err(invalid(
            field,
            format!("is {} bytes long; at most {max}", value.len()),
        ))
    } else {
        Ok(value)
    }
}

/// A request's `node_id`: a node name (required, at most 256 bytes, no
/// control characters).
pub(crate) fn node_id(value: &str) -> Result<NodeName, ProxyError> {
    NodeName::parse(value).map_err(|e| invalid("node_id", e.reason))
}

/// One capability.
pub(crate) fn access(cap: &VolumeCapability) -> Result<Access, ProxyError> {
    // The spec's names are the contract's: UNKNOWN and unknown numbers
    // are no mode.
    let Some(m) = cap.access_mode.as_ref() else {
        return Err(invalid("volume_capability.access_mode", "is required"));
    };
    let mode = CsiMode::try_from(m.mode)
        .ok()
        .and_then(|m| AccessMode::parse(m.as_str_name()).ok())
        .ok_or_else(|| invalid("volume_capability.access_mode", "unknown access mode"))?;
    let (block, fs_type) = match &cap.access_type {
        Some(AccessType::Block(_)) => (true, None),
        Some(AccessType::Mount(m)) => {
            let fs = if m.fs_type.is_empty() {
                None
            } else if m.fs_type.len() > MAX_FS_TYPE {
                return Err(invalid(
                    "volume_capability.mount.fs_type",
                    format!("is {} bytes long: not a filesystem type", m.fs_type.len()),
                ));
            } else {
                Some(
                    parameters::fs_type(&m.fs_type)
                        .map_err(|e| invalid("volume_capability.mount.fs_type", e.to_string()))?,
                )
            };
            (false, fs)
        }
        None => {
            return Err(invalid(
                "volume_capability.access_type",
                "is required (block or mount)",
            ));
        }
    };
    let access = Access {
        block,
        fs_type,
        mode,
    };
    if let Some(why) = access.unsupported() {
        return Err(invalid("volume_capability", why));
    }
    Ok(access)
}

/// Every capability of a request; at least one.
pub(crate) fn accesses(caps: &[VolumeCapability]) -> Result<Vec<Access>, ProxyError> {
    if caps.is_empty() {
        return Err(invalid("volume_capabilities", "at least one is required"));
    }
    caps.iter().map(access).collect()
}

/// Nodes from accessibility requirements, preferred first, then the rest
/// of requisite; empty when there are none.
pub(crate) fn topology_nodes(
    req: Option<&TopologyRequirement>,
) -> Result<Vec<NodeName>, ProxyError> {
    let Some(req) = req else {
        return Ok(Vec::new());
    };
    let mut nodes: Vec<NodeName> = Vec::new();
    for node in nodes_of(req.preferred.iter().chain(req.requisite.iter()))? {
        if !nodes.contains(&node) {
            nodes.push(node);
        }
    }
    Ok(nodes)
}

/// Where CreateVolume may bind: the requirements' preferred and requisite
/// nodes, each list in its order (the rule is [`Placement::new`]'s).
pub(crate) fn placement(req: Option<&TopologyRequirement>) -> Result<Placement, ProxyError> {
    let Some(req) = req else {
        return Ok(Placement::anywhere());
    };
    let preferred = nodes_of(req.preferred.iter())?;
    let requisite = nodes_of(req.requisite.iter())?;
    Placement::new(&preferred, &requisite)
        .map_err(|e| invalid("accessibility_requirements", e.to_string()))
}

/// The node each topology names, in order; a topology without the node
/// key names none.
fn nodes_of<'a>(
    topologies: impl Iterator<Item = &'a Topology>,
) -> Result<Vec<NodeName>, ProxyError> {
    let mut nodes = Vec::new();
    for t in topologies {
        for key in t.segments.keys() {
            if key != NODE_TOPOLOGY_KEY {
                return Err(invalid(
                    "accessibility_requirements",
                    format!(
                        "unknown topology key {} (only {NODE_TOPOLOGY_KEY})",
                        quote(key)
                    ),
                ));
            }
        }
        let Some(node) = t.segments.get(NODE_TOPOLOGY_KEY) else {
            continue;
        };
        if node.len() > MAX_NODE_ID {
            return Err(invalid(
                "accessibility_requirements",
                format!(
                    "a node name of {} bytes; node IDs are at most {MAX_NODE_ID}",
                    node.len()
                ),
            ));
        }
        nodes.push(NodeName::parse(node).map_err(|e| {
            invalid(
                "accessibility_requirements",
                format!("node name {:?} {}", e.input, e.reason),
            )
        })?);
    }
    Ok(nodes)
}

/// `(required, limit)` bytes; 0 means unset.
pub(crate) fn capacity(
    range: Option<&csi_scsi_proto::csi::CapacityRange>,
) -> Result<(u64, u64), ProxyError> {
    let Some(r) = range else { return Ok((0, 0)) };
    let required = u64::try_from(r.required_bytes)
        .map_err(|_| invalid("capacity_range.required_bytes", "is negative"))?;
    let limit = u64::try_from(r.limit_bytes)
        .map_err(|_| invalid("capacity_range.limit_bytes", "is negative"))?;
    if limit != 0 && limit < required {
        return Err(ProxyError::CapacityOutOfRange(format!(
            "limit_bytes {limit} is below required_bytes {required}"
        )));
    }
    Ok((required, limit))
}

#[cfg(test)]
mod tests {
    use csi_scsi_proto::csi::volume_capability::{AccessMode, MountVolume};
    use csi_scsi_proto::csi::{Topology, TopologyRequirement, VolumeCapability};

    use super::*;

    fn message(e: ProxyError) -> String {
        assert!(matches!(e, ProxyError::InvalidArgument { .. }), "{e:?}");
        e.to_string()
    }

    #[test]
    fn ids_over_their_limit_are_refused_without_being_echoed() {
        for (field, ok) in [("name", 128), ("volume_id", 321)] {
            assert!(required(field, &"x".repeat(ok)).is_ok(), "{field}");
            let m = message(required(field, &"x".repeat(1 << 20)).expect_err(field));
            assert!(m.len() < 200, "{field}: {m}");
        }
        assert!(required("name", "").is_err());
        assert!(node_id(&"x".repeat(256)).is_ok());
        let m = message(node_id(&"x".repeat(1 << 20)).expect_err("node_id"));
        assert!(m.len() < 200, "node_id: {m}");
        assert_eq!(
            m,
            message(invalid("node_id", "is 1048576 bytes long; at most 256"))
        );
        assert_eq!(
            message(node_id("").expect_err("empty")),
            message(invalid("node_id", "is required"))
        );
    }

    #[test]
    fn a_huge_fs_type_or_topology_is_refused_without_being_echoed() {
        let cap = VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume {
                fs_type: "x".repeat(1 << 20),
                mount_flags: Vec::new(),
                volume_mount_group: String::new(),
            })),
            access_mode: Some(AccessMode {
                mode: CsiMode::SingleNodeWriter as i32,
            }),
        };
        assert!(message(access(&cap).expect_err("fs_type")).len() < 200);
        for (key, node) in [
            ("k".repeat(1 << 20), "node-a".to_owned()),
            (NODE_TOPOLOGY_KEY.to_owned(), "n".repeat(1 << 20)),
        ] {
            let t = Topology {
                segments: std::collections::HashMap::from([(key, node)]),
            };
            let req = TopologyRequirement {
                requisite: vec![t],
                preferred: Vec::new(),
            };
            let m = message(topology_nodes(Some(&req)).expect_err("topology"));
            assert!(m.len() < 300, "{m}");
            let m = message(placement(Some(&req)).expect_err("placement"));
            assert!(m.len() < 300, "{m}");
        }
    }

    #[test]
    fn requirements_become_a_placement_or_a_refusal() {
        let topologies = |names: &[&str]| -> Vec<Topology> {
            names
                .iter()
                .map(|n| Topology {
                    segments: std::collections::HashMap::from([(
                        NODE_TOPOLOGY_KEY.to_owned(),
                        (*n).to_owned(),
                    )]),
                })
                .collect()
        };
        // (preferred, requisite, the order a bind tries, or None: refused)
        type Names = &'static [&'static str];
        let cases: [(Names, Names, Option<Names>); 4] = [
            (&["c"], &["a", "b", "c"], Some(&["c", "a", "b"])),
            (&[], &["b", "a"], Some(&["b", "a"])),
            (&["a"], &[], Some(&["a"])),
            (&["c"], &["a", "b"], None),
        ];
        for (preferred, requisite, want) in cases {
            let req = TopologyRequirement {
                requisite: topologies(requisite),
                preferred: topologies(preferred),
            };
            let got = placement(Some(&req));
            match want {
                Some(order) => {
                    let got: Vec<String> = got
                        .expect("placement")
                        .order()
                        .iter()
                        .map(|n| n.to_string())
                        .collect();
                    assert_eq!(got, order, "{preferred:?} / {requisite:?}");
                }
                None => {
                    message(got.expect_err("refused"));
                }
            }
        }
        assert!(placement(None).expect("none").is_anywhere());
    }
}
