//! The records the inventory keeps: targets, devices, pending resizes.
//! Both stores and the custom resources hold these types; the transitions
//! between phases are in `policy`.

use std::collections::{BTreeMap, BTreeSet};

use csi_scsi_contract::{NodeName, Wwid};
use csi_scsi_proto::agent::WipeMode;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::access::{Access, Capability};
use super::node_label::{KubeletSettableSelector, LabelSetter, SelectorKeys};
use csi_scsi_contract::FsType;

/// `text` as a WWID, only when it is in canonical form already (what the
/// agents report and the stores keep): any other spelling would be a
/// second key for one LUN, and no volume ID could name it.
pub fn canonical_wwid(text: &str) -> Result<Wwid, String> {
    match Wwid::parse(text) {
        Ok(w) if w.as_str() == text => Ok(w),
        Ok(w) => Err(format!(
            "WWID {:?} is not in canonical form ({w})",
            csi_scsi_textfs::text::bounded(text, csi_scsi_textfs::text::INPUT_MAX)
        )),
        Err(e) => Err(e.to_string()),
    }
}

/// A device's life-cycle phase.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    PartialOrd,
    Ord,
    JsonSchema,
)]
pub enum Phase {
    /// Free: can be bound to a new volume.
    #[default]
    Available,
    /// Seen for the first time (or back after no node saw it, holding no
    /// volume): not offered until a probe reads it blank, or its target's
    /// `newLuns: wipe` has wiped it.
    Unverified,
    /// A probe found data on it (a LUN the array handed over with somebody's
    /// data): never offered until it reads blank again or its target's
    /// `newLuns: wipe` wipes it.
    HoldsData,
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
    /// iSCSI or Fibre Channel: exactly one (stored as the `iscsi` or the
    /// `fibreChannel` key).
    #[serde(flatten)]
    pub transport: Transport,
    /// Node labels a node must carry to reach this target (empty: all).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Node names that reach this target (empty: all matching the selector).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    /// Labels stamped onto every device of this target.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub device_labels: BTreeMap<String, String>,
    /// The storage array this target is one way into. Targets naming the
    /// same array may report the same LUNs (one array under several target
    /// names: an IQN per controller, portal groups); a WWID reported through
    /// targets of different arrays, or of none named, is a conflict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<String>,
    /// What happens to a LUN of this target the inventory has not seen
    /// before (the default: probe it).
    #[serde(default, skip_serializing_if = "NewLuns::is_default")]
    pub new_luns: NewLuns,
}

/// What a target's new LUNs go through before they are offered: a LUN an
/// array hands over may hold somebody's data, and a filesystem on it would
/// be mounted as it is by the first volume bound to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NewLuns {
    /// Read both ends and ranges spread at random through a node that
    /// sees it: offered when every range reads zeroes, HoldsData otherwise.
    #[default]
    Probe,
    /// Zero it whole (as a release does) and offer it: the operator says
    /// every LUN this target shows is this driver's to erase.
    Wipe,
    /// Offer it at once: only for arrays that hand out nothing but fresh
    /// (zeroed) LUNs, as `cleanup: none` is only for trusted use.
    Trust,
}

/// How a target is reached.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Transport {
    /// iSCSI portals and IQN.
    Iscsi(IscsiTarget),
    /// Target port WWPNs.
    FibreChannel(FcTarget),
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    /// Node name.
    pub node: NodeName,
    /// Target the paths come through.
    pub target: String,
    /// `/dev/disk/by-path` (or by-id) names on that node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
}

/// A target that reported a LUN of the device's WWID although the device is
/// known through targets of another array: its report was not merged (one
/// WWID is one LUN; the second report is a node or an array claiming an
/// identity that is taken), and it stays here until that target's nodes
/// answer without it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetConflict {
    /// The target whose report was refused.
    pub target: String,
    /// The nodes that reported the WWID through it.
    pub nodes: Vec<NodeName>,
    /// Unix seconds when it was first seen.
    pub since: i64,
}

/// What DeleteVolume does to a LUN before it is offered again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Cleanup {
    /// Nothing: the next volume may see the old data. Only for trusted use.
    #[serde(rename = "none")]
    None,
    /// Discard every block (zero where the device cannot discard).
    #[serde(rename = "discard")]
    Discard,
    /// Write zeroes over the whole LUN (the default).
    #[default]
    #[serde(rename = "zero")]
    Zero,
    /// One pass of random data.
    #[serde(rename = "random-1")]
    Random1,
    /// Three passes of random data.
    #[serde(rename = "random-3")]
    Random3,
}

/// What a volume asked for when it was bound; fixed for its life.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Binding {
    /// Fresh for every binding: the second half of the volume ID.
    pub uid: String,
    /// The CreateVolume request name (the PV name).
    pub volume_name: String,
    /// Bytes asked for (CreateVolume's required bytes), for idempotency checks.
    #[serde(default)]
    pub required_bytes: u64,
    /// Upper bound asked for (CreateVolume's limit bytes; 0: none).
    #[serde(default)]
    pub limit_bytes: u64,
    /// Access modes and types requested.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<Capability>,
    /// StorageClass parameters, for idempotency checks and cleanup.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parameters: BTreeMap<String, String>,
    /// Wipe mode to apply on delete (a record without one: the default).
    #[serde(default)]
    pub cleanup: Cleanup,
}

/// One LUN in the inventory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Canonical WWID.
    pub wwid: Wwid,
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
    /// How many wipes of it have failed, ever (bind prefers fewer).
    pub wipe_failures: u32,
    /// Targets of another array that report its WWID (never merged).
    pub conflicts: Vec<TargetConflict>,
    /// Taken out of service by an operator: never bound to a new volume,
    /// never counted as capacity, never wiped or forgotten by the proxy
    /// (a volume on it keeps working). Only an operator sets or clears it.
    pub retired: bool,
    /// An operator's request to retry the LUN's wipe now: any new value
    /// ends the backoff of a release that did not finish (see
    /// `crate::reconcile::release`). Only an operator sets it.
    pub retry_wipe: String,
    /// Bumped on every write: the compare-and-swap token.
    pub generation: i64,
}

/// One ControllerPublish of a device: the node, and the capability and
/// readonly flag it was published with (a second publish to that node must
/// ask for the same, or it is ALREADY_EXISTS).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Publication {
    /// Node name.
    pub node: NodeName,
    /// The capability; absent from a record written before publications
    /// kept it (then any capability among the binding's is taken as the one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<Capability>,
    /// ControllerPublishVolume's `readonly`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub readonly: bool,
}

/// How a publication is stored: records written before publications kept
/// their capability hold the node name alone.
#[derive(Deserialize)]
#[serde(untagged)]
enum StoredPublication {
    NodeOnly(NodeName),
    Full {
        node: NodeName,
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
                access: None,
                readonly: false,
            },
            StoredPublication::Full {
                node,
                access,
                readonly,
            } => Self {
                node,
                access: match access.as_str() {
                    "" => None,
                    text => Some(Capability::parse(text).map_err(serde::de::Error::custom)?),
                },
                readonly,
            },
        })
    }
}

/// A LUN as one node reported it in one discovery round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LunReport {
    /// Canonical WWID.
    pub wwid: Wwid,
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
    pub answered: BTreeMap<NodeName, Vec<LunReport>>,
    /// Nodes that should see the target but did not answer, or whose
    /// report was refused; their earlier reports stand.
    pub unanswered: Vec<NodeName>,
    /// The other targets naming the same array as this one: a device known
    /// through one of them may be reported through this one too.
    pub same_array: BTreeSet<String>,
    /// The target's policy for LUNs it shows for the first time.
    pub new_luns: NewLuns,
}

/// What a discovery round changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiscoveryOutcome {
    /// Devices seen for the first time.
    pub added: Vec<Wwid>,
    /// Devices that no node reports any more.
    pub lost: Vec<Wwid>,
    /// Lost devices that came back.
    pub found: Vec<Wwid>,
    /// Devices whose WWID this target reported while they are known
    /// through another array's targets (not merged).
    pub conflicts: Vec<Wwid>,
    /// Devices no node reported for longer than the forget time, never
    /// bound: removed.
    pub forgotten: Vec<Wwid>,
    /// Devices that could not be read or written this round, with why
    /// (the others were merged all the same).
    pub failed: Vec<(Wwid, String)>,
}

/// What CreateVolume needs from a device.
#[derive(Clone, Debug)]
pub struct BindRequest {
    /// The binding to record.
    pub binding: Binding,
    /// Where the device may be seen from, and in which order to look.
    pub placement: super::Placement,
    /// Label selector over device labels.
    pub selector: crate::selector::Selector,
    /// Smallest size that fits (`required_bytes`).
    pub min_bytes: u64,
    /// Largest size that fits (`limit_bytes`, `u64::MAX` for none).
    pub max_bytes: u64,
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
            Self::Unverified => "Unverified",
            Self::HoldsData => "HoldsData",
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
            "Unverified" => Self::Unverified,
            "HoldsData" => Self::HoldsData,
            "Bound" => Self::Bound,
            "Releasing" => Self::Releasing,
            "Failed" => Self::Failed,
            "Lost" => Self::Lost,
            _ => return None,
        })
    }
}

impl Target {
    /// Whether node `node`, carrying `labels`, is one this target is for:
    /// named in `nodes` (or none named) and matching `node_selector`, whose
    /// keys `allowed` admits. Only such nodes are asked to discover it or
    /// sent its CHAP credentials.
    pub fn selects(
        &self,
        node: &NodeName,
        labels: &BTreeMap<String, String>,
        allowed: SelectorKeys,
    ) -> bool {
        self.check_selector(allowed).is_ok()
            && (self.nodes.is_empty() || self.nodes.iter().any(|n| node == n.as_str()))
            && self
                .node_selector
                .iter()
                .all(|(k, v)| labels.get(k) == Some(v))
    }

    /// The `node_selector` keys a node's kubelet can set on its own Node.
    pub fn kubelet_settable_keys(&self) -> Vec<String> {
        self.node_selector
            .keys()
            .filter(|k| LabelSetter::of(k) == LabelSetter::Kubelet)
            .cloned()
            .collect()
    }

    /// Refuses a selector that rests on keys a kubelet can set, unless
    /// `allowed` admits any key. A `nodes` list alone names nodes by the
    /// identity their certificates carry, so it is never refused.
    pub fn check_selector(&self, allowed: SelectorKeys) -> Result<(), KubeletSettableSelector> {
        let keys = match allowed {
            SelectorKeys::Any => return Ok(()),
            SelectorKeys::AdminOnly => self.kubelet_settable_keys(),
        };
        if keys.is_empty() {
            Ok(())
        } else {
            Err(KubeletSettableSelector {
                target: self.name.clone(),
                keys,
            })
        }
    }
}

impl NewLuns {
    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Probe => "probe",
            Self::Wipe => "wipe",
            Self::Trust => "trust",
        }
    }

    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

impl Cleanup {
    /// Parses `none`, `discard`, `zero`, `random-1`, `random-3`.
    pub fn parse(v: &str) -> Option<Self> {
        Some(match v {
            "none" => Self::None,
            "discard" => Self::Discard,
            "zero" => Self::Zero,
            "random-1" => Self::Random1,
            "random-3" => Self::Random3,
            _ => return None,
        })
    }

    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Discard => "discard",
            Self::Zero => "zero",
            Self::Random1 => "random-1",
            Self::Random3 => "random-3",
        }
    }

    /// The agent's wipe mode (`None` for no agent call at all).
    pub fn wipe_mode(self) -> Option<WipeMode> {
        match self {
            Self::None => None,
            Self::Discard => Some(WipeMode::Discard),
            Self::Zero => Some(WipeMode::Zero),
            Self::Random1 => Some(WipeMode::Random1),
            Self::Random3 => Some(WipeMode::Random3),
        }
    }
}

impl Binding {
    /// The filesystem its mount capabilities name, if it has any.
    pub fn fs_type(&self) -> Option<FsType> {
        self.capabilities.iter().find_map(|c| c.fs_type())
    }

    /// The capability `access` stands for on this volume: a mount without
    /// a filesystem means the volume's own.
    pub fn resolve(&self, access: &Access) -> Capability {
        access.resolve(self.fs_type().unwrap_or(FsType::DEFAULT))
    }

    /// Whether the volume was created with `cap`.
    pub fn allows(&self, cap: Capability) -> bool {
        self.capabilities.contains(&cap)
    }
}

impl Device {
    /// Node names that see the device, sorted, without duplicates.
    pub fn node_names(&self) -> Vec<NodeName> {
        let mut names: Vec<NodeName> = self.nodes.iter().map(|n| n.node.clone()).collect();
        names.sort();
        names.dedup();
        names
    }

    /// Names of the nodes it is published to, in publish order.
    pub fn published_nodes(&self) -> Vec<NodeName> {
        self.published.iter().map(|p| p.node.clone()).collect()
    }

    /// Its publication on `node`, if it is published there.
    pub fn publication(&self, node: &NodeName) -> Option<&Publication> {
        self.published.iter().find(|p| &p.node == node)
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
    use crate::device::{AccessMode, Capability};

    #[test]
    fn a_publication_stored_as_a_bare_node_name_still_loads_with_its_capability_unrecorded() {
        let old: Vec<Publication> = serde_json::from_str(r#"["node-a"]"#).expect("old record");
        assert_eq!(
            old,
            vec![Publication {
                node: crate::node("node-a"),
                access: None,
                readonly: false,
            }]
        );
        let new = Publication {
            node: crate::node("node-b"),
            access: Some(Capability::Block(AccessMode::MultiNodeMultiWriter)),
            readonly: true,
        };
        let text = serde_json::to_string(&vec![new.clone()]).expect("write");
        let back: Vec<Publication> = serde_json::from_str(&text).expect("read");
        assert_eq!(back, vec![new]);
    }
}
