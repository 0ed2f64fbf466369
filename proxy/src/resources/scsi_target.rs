//! `SCSITarget` (cluster-scoped): how nodes reach a set of LUNs. Written by
//! the storage administrator; its status by the proxy after each discovery.
// The derives re-emit these types in a way `unreachable_pub` misreads:
// they are exported (resources/mod.rs) and used by the tests and crdgen.
#![allow(unreachable_pub)]
// The derive takes one `printcolumn(...)` per column; clippy reads the
// repeated `type_ = ...` arguments as duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use csi_scsi_contract::NodeName;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::device::{FcTarget, IscsiTarget, NewLuns, SecretRef, Target, Transport};

/// How nodes reach a set of LUNs: exactly one of `iscsi` or `fibreChannel`.
#[derive(
    CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize,
)]
#[kube(
    group = "csi-scsi.io",
    version = "v1alpha1",
    kind = "SCSITarget",
    plural = "scsitargets",
    singular = "scsitarget",
    shortname = "scsitgt",
    category = "csi-scsi",
    status = "SCSITargetStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "How nodes reach a set of SCSI LUNs (iSCSI portals and IQN, or Fibre Channel target ports).",
    printcolumn(name = "IQN", type_ = "string", json_path = ".spec.iscsi.iqn"),
    printcolumn(
        name = "WWPNs",
        type_ = "string",
        json_path = ".spec.fibreChannel.wwpns",
        priority = 1
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Nodes",
        type_ = "integer",
        json_path = ".status.reachableNodes"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new("has(self.iscsi) != has(self.fibreChannel)")
    .message("exactly one of iscsi or fibreChannel must be set"))]
#[serde(rename_all = "camelCase")]
pub struct SCSITargetSpec {
    /// iSCSI portals and target IQN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iscsi: Option<IscsiSpec>,
    /// Fibre Channel target port WWPNs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fibre_channel: Option<FibreChannelSpec>,
    /// Labels a node must carry to reach this target (empty: every node).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Node names that reach this target (empty: every node matching nodeSelector).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    /// Labels stamped onto every SCSIDevice of this target, for the
    /// StorageClass `deviceSelector` parameter.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub device_labels: BTreeMap<String, String>,
    /// The storage array this target is one way into. SCSITargets naming
    /// the same array may report the same LUNs (an IQN per controller,
    /// several portal groups); a LUN reported through targets of different
    /// arrays, or of none named, is a conflict, flagged on its SCSIDevice
    /// and never merged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub array: Option<String>,
    /// What a LUN of this target the inventory has not seen before goes
    /// through before it is offered: `probe` (the default: read back from a
    /// node, offered when blank, HoldsData otherwise), `wipe` (zeroed
    /// whole, then offered; this also wipes the target's LUNs held for
    /// data), or `trust` (offered at once: only for arrays that hand out
    /// nothing but fresh LUNs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_luns: Option<NewLuns>,
}

/// The iSCSI part of a target.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IscsiSpec {
    /// Portals as `ip:port` (port 3260 when omitted).
    #[schemars(length(min = 1))]
    pub portals: Vec<String>,
    /// Target IQN.
    #[x_kube(validation = Rule::new("self.startsWith('iqn.') || self.startsWith('eui.') || self.startsWith('naa.')")
        .message("must be an iqn., eui. or naa. name"))]
    pub iqn: String,
    /// The Secret holding CHAP credentials (keys `username`, `password`,
    /// and optionally `mutual_username`, `mutual_password`). Never the
    /// credentials themselves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chap_secret_ref: Option<SecretReference>,
}

/// A reference to a Secret by name.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretReference {
    /// Secret name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Secret namespace (default: the driver's namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// The Fibre Channel part of a target.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FibreChannelSpec {
    /// Target port WWPNs: 16 hex digits, colon-separated, or 0x-prefixed.
    #[schemars(length(min = 1))]
    pub wwpns: Vec<String>,
}

/// What the proxy saw of the target in its last discovery pass.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SCSITargetStatus {
    /// `Ready` (every node answered), `Degraded` (some did not), `Unreachable` (none did),
    /// `Refused` (its nodeSelector uses a key a node's kubelet can set, or its IQN, portals or
    /// WWPNs do not parse: no node is asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Nodes that answered the last pass.
    #[serde(default)]
    pub reachable_nodes: u32,
    /// Per node: whether its agent answered and how many LUNs it saw.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<TargetNodeStatus>,
    /// Devices whose labels from this target disagree with another target's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub label_conflicts: Vec<String>,
    /// When the last pass finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_discovery: Option<Time>,
    /// Standard conditions (`Discovered`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// One node's view of a target.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TargetNodeStatus {
    /// Node name.
    pub node: NodeName,
    /// Whether the node's agent answered.
    pub answered: bool,
    /// LUNs it reported.
    #[serde(default)]
    pub luns: u32,
}

// === impl SCSITarget ===

impl SCSITarget {
    /// The inventory's view of this target (name from the object); `Err`
    /// names the fault when the spec has both transports or neither (the
    /// CRD's rule refuses that, but an object may predate the rule).
    pub fn to_target(&self) -> Result<Target, String> {
        let name = self.metadata.name.clone().unwrap_or_default();
        let transport = match (&self.spec.iscsi, &self.spec.fibre_channel) {
            (Some(i), None) => Transport::Iscsi(IscsiTarget {
                portals: i.portals.clone(),
                iqn: i.iqn.clone(),
                chap_secret_ref: i.chap_secret_ref.as_ref().map(|r| SecretRef {
                    name: r.name.clone(),
                    namespace: r.namespace.clone().unwrap_or_default(),
                }),
            }),
            (None, Some(f)) => Transport::FibreChannel(FcTarget {
                wwpns: f.wwpns.clone(),
            }),
            (Some(_), Some(_)) => {
                return Err(format!("SCSITarget {name} has both iscsi and fibreChannel"));
            }
            (None, None) => {
                return Err(format!(
                    "SCSITarget {name} has neither iscsi nor fibreChannel"
                ));
            }
        };
        Ok(Target {
            name,
            transport,
            node_selector: self.spec.node_selector.clone(),
            nodes: self.spec.nodes.clone(),
            device_labels: self.spec.device_labels.clone(),
            array: self.spec.array.clone(),
            new_luns: self.spec.new_luns.unwrap_or_default(),
        })
    }
}

// === impl SCSITargetSpec ===

impl SCSITargetSpec {
    /// The spec of an inventory target.
    pub fn from_target(t: &Target) -> Self {
        let (iscsi, fibre_channel) = match &t.transport {
            Transport::Iscsi(i) => (
                Some(IscsiSpec {
                    portals: i.portals.clone(),
                    iqn: i.iqn.clone(),
                    chap_secret_ref: i.chap_secret_ref.as_ref().map(|r| SecretReference {
                        name: r.name.clone(),
                        namespace: (!r.namespace.is_empty()).then(|| r.namespace.clone()),
                    }),
                }),
                None,
            ),
            Transport::FibreChannel(f) => (
                None,
                Some(FibreChannelSpec {
                    wwpns: f.wwpns.clone(),
                }),
            ),
        };
        Self {
            iscsi,
            fibre_channel,
            node_selector: t.node_selector.clone(),
            nodes: t.nodes.clone(),
            device_labels: t.device_labels.clone(),
            array: t.array.clone(),
            new_luns: (t.new_luns != NewLuns::default()).then_some(t.new_luns),
        }
    }
}
