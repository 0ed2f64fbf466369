//! The records the inventory keeps: targets, devices, pending resizes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A device's life-cycle phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub enum Phase {
    /// Free: can be bound to a new volume.
    Available,
    /// Bound to a volume.
    Bound,
    /// Being wiped after its volume was deleted.
    Releasing,
    /// A wipe failed; needs attention (never offered again by itself).
    Failed,
    /// No node reports it any more; keeps its binding if it had one.
    Lost,
}

/// How nodes reach a set of LUNs (the SCSITarget spec).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Target {
    /// Unique name.
    pub name: String,
    /// iSCSI portals and IQN, if an iSCSI target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iscsi: Option<IscsiTarget>,
    /// Target port WWPNs, if a Fibre Channel target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fibre_channel: Option<FcTarget>,
    /// Node labels a node must carry to reach this target (empty: all).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Node names that reach this target (empty: all matching the selector).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    /// Labels stamped onto every device of this target.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub device_labels: BTreeMap<String, String>,
}

/// The iSCSI part of a target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IscsiTarget {
    /// `ip:port` portals.
    pub portals: Vec<String>,
    /// Target IQN.
    pub iqn: String,
    /// The Secret holding CHAP credentials, by name only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chap_secret_ref: Option<SecretRef>,
}

/// A reference to a Secret (never the secret itself).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    /// Secret name.
    pub name: String,
    /// Secret namespace (Kubernetes backend).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
}

/// The Fibre Channel part of a target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FcTarget {
    /// Target port WWPNs, any usual spelling.
    pub wwpns: Vec<String>,
}

/// Where one node sees a device, through one target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    /// Node name.
    pub node: String,
    /// Target the paths come through.
    pub target: String,
    /// `/dev/disk/by-path` (or by-id) names on that node.
    pub paths: Vec<String>,
}

/// What a volume asked for when it was bound; fixed for its life.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Binding {
    /// Fresh for every binding: the second half of the volume ID.
    pub uid: String,
    /// The CreateVolume request name (the PV name).
    pub volume_name: String,
    /// Bytes asked for (`required_bytes`), for idempotency checks.
    pub required_bytes: u64,
    /// Upper bound asked for (`limit_bytes`, 0 = none).
    pub limit_bytes: u64,
    /// Access modes and types requested, canonical text.
    pub capabilities: Vec<String>,
    /// StorageClass parameters, for idempotency checks and cleanup.
    pub parameters: BTreeMap<String, String>,
    /// Wipe mode to apply on delete.
    pub cleanup: String,
}

/// One LUN in the inventory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Canonical WWID.
    pub wwid: String,
    /// The first target that reported it.
    pub target: String,
    /// LUN number on that target (informational).
    pub lun: u32,
    /// Size in bytes, as last reported.
    pub size_bytes: u64,
    /// INQUIRY vendor.
    pub vendor: String,
    /// INQUIRY model.
    pub model: String,
    /// Unit serial number.
    pub serial: String,
    /// Labels (from the targets' deviceLabels).
    pub labels: BTreeMap<String, String>,
    /// Life-cycle phase.
    pub phase: Phase,
    /// The binding, while bound (also kept while Releasing, Failed, Lost).
    pub binding: Option<Binding>,
    /// Where it is visible.
    pub nodes: Vec<NodeView>,
    /// Where it is attached (ControllerPublished), and how.
    pub published: Vec<Publication>,
    /// Unix seconds when a node last reported it.
    pub last_seen: i64,
    /// Why it is Failed or Lost.
    pub reason: String,
    /// Bumped on every write: the compare-and-swap token.
    pub generation: i64,
}

/// One ControllerPublish of a device: the node, and the capability and
/// readonly flag it was published with (a second publish to that node must
/// ask for the same, or it is ALREADY_EXISTS).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Publication {
    /// Node name.
    pub node: String,
    /// The capability, canonical text (`Access::canonical`); empty in a
    /// record written before publications kept it (then any capability
    /// among the binding's is taken as the one).
    pub access: String,
    /// ControllerPublishVolume's `readonly`.
    pub readonly: bool,
}

/// How a publication is stored: records written before publications kept
/// their capability hold the node name alone.
#[derive(Deserialize)]
#[serde(untagged)]
enum StoredPublication {
    NodeOnly(String),
    Full {
        node: String,
        #[serde(default)]
        access: String,
        #[serde(default)]
        readonly: bool,
    },
}

impl<'de> Deserialize<'de> for Publication {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match StoredPublication::deserialize(d)? {
            StoredPublication::NodeOnly(node) => Self {
                node,
                access: String::new(),
                readonly: false,
            },
            StoredPublication::Full {
                node,
                access,
                readonly,
            } => Self {
                node,
                access,
                readonly,
            },
        })
    }
}

/// A LUN as one node reported it in one discovery round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LunReport {
    /// Canonical WWID.
    pub wwid: String,
    /// LUN number.
    pub lun: u32,
    /// Size in bytes.
    pub size_bytes: u64,
    /// INQUIRY vendor.
    pub vendor: String,
    /// INQUIRY model.
    pub model: String,
    /// Unit serial number.
    pub serial: String,
    /// Paths on the node.
    pub paths: Vec<String>,
}

/// What a discovery round of one target found.
#[derive(Clone, Debug, Default)]
pub struct DiscoveryRound {
    /// The target.
    pub target: String,
    /// Labels of that target, stamped onto new devices.
    pub device_labels: BTreeMap<String, String>,
    /// Nodes that answered, with what they see.
    pub answered: BTreeMap<String, Vec<LunReport>>,
    /// Nodes that should see the target but did not answer; their earlier
    /// reports stand.
    pub unanswered: Vec<String>,
}

/// What a discovery round changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiscoveryOutcome {
    /// Devices seen for the first time.
    pub added: Vec<String>,
    /// Devices that no node reports any more.
    pub lost: Vec<String>,
    /// Lost devices that came back.
    pub found: Vec<String>,
}

/// What CreateVolume needs from a device.
#[derive(Clone, Debug)]
pub struct BindRequest {
    /// The binding to record.
    pub binding: Binding,
    /// Nodes to try, in order of preference; the device must be visible
    /// from one of them (empty: anywhere).
    pub topology: Vec<Vec<String>>,
    /// Label selector over device labels.
    pub selector: crate::selector::Selector,
}

/// A request to grow a volume beyond its LUN.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResizeRequest {
    /// Name (`resize-<volume name>`).
    pub name: String,
    /// The volume ID.
    pub volume_id: String,
    /// The LUN.
    pub wwid: String,
    /// Bytes asked for.
    pub requested_bytes: u64,
    /// Bytes the LUN had when asked.
    pub current_bytes: u64,
    /// Unix seconds when recorded.
    pub created: i64,
    /// Whether the LUN has since grown enough.
    pub done: bool,
}

impl Phase {
    /// The text stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Available => "Available",
            Self::Bound => "Bound",
            Self::Releasing => "Releasing",
            Self::Failed => "Failed",
            Self::Lost => "Lost",
        }
    }

    /// Parses the stored text.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "Available" => Self::Available,
            "Bound" => Self::Bound,
            "Releasing" => Self::Releasing,
            "Failed" => Self::Failed,
            "Lost" => Self::Lost,
            _ => return None,
        })
    }
}

impl Device {
    /// Node names that see the device, sorted, without duplicates.
    pub fn node_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.nodes.iter().map(|n| n.node.clone()).collect();
        names.sort();
        names.dedup();
        names
    }

    /// Names of the nodes it is published to, in publish order.
    pub fn published_nodes(&self) -> Vec<String> {
        self.published.iter().map(|p| p.node.clone()).collect()
    }

    /// Its publication on `node`, if it is published there.
    pub fn publication(&self, node: &str) -> Option<&Publication> {
        self.published.iter().find(|p| p.node == node)
    }

    /// The volume ID of the current binding.
    pub fn volume_id(&self) -> Option<String> {
        self.binding
            .as_ref()
            .map(|b| format!("{}:{}", self.wwid, b.uid))
    }
}

#[cfg(test)]
mod publication_tests {
    use super::Publication;

    #[test]
    fn a_publication_stored_as_a_bare_node_name_still_loads_with_its_capability_unrecorded() {
        let old: Vec<Publication> = serde_json::from_str(r#"["node-a"]"#).expect("old record");
        assert_eq!(
            old,
            vec![Publication {
                node: "node-a".into(),
                access: String::new(),
                readonly: false,
            }]
        );
        let new = Publication {
            node: "node-b".into(),
            access: "block:MULTI_NODE_MULTI_WRITER".into(),
            readonly: true,
        };
        let text = serde_json::to_string(&vec![new.clone()]).expect("write");
        let back: Vec<Publication> = serde_json::from_str(&text).expect("read");
        assert_eq!(back, vec![new]);
    }
}
