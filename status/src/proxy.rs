//! The proxy's `/status`: leadership, the inventory by phase and its
//! devices (up to a limit), the targets, every agent of the directory with
//! its last probe, the pending resize requests and the last failed calls.
//! Targets name their CHAP Secret, never its contents.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ErrorRecord;

/// The proxy's `/status` document (`"component": "proxy"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Document {
    /// The document's schema ([`crate::SCHEMA`] when written).
    #[serde(default = "crate::unversioned")]
    pub schema: u32,
    /// The proxy's release.
    pub version: String,
    /// When the process started (RFC 3339, UTC).
    pub started: String,
    /// Seconds since it started.
    pub uptime_seconds: u64,
    /// Whether this replica leads.
    pub leader: Leader,
    /// Device counts over the whole inventory.
    pub inventory: Inventory,
    /// The first devices in WWID order (see `devices_truncated`).
    pub devices: Vec<Device>,
    /// Whether the inventory holds more devices than `devices` lists.
    pub devices_truncated: bool,
    /// The targets nodes log in to.
    pub targets: Vec<Target>,
    /// Every agent of the directory, with its last probe.
    pub agents: Vec<Agent>,
    /// Resize requests not yet satisfied.
    pub pending_resizes: Vec<Resize>,
    /// The last failed calls, newest first.
    pub recent_errors: Vec<ErrorRecord>,
    /// What could not be read (the rest of the document still stands).
    pub problems: Vec<String>,
    /// Whether storage addresses, names and error messages were left out
    /// for a reader off the machine ([`crate::Status::redacted`]); absent
    /// (false) in the full document.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub redacted: bool,
}

/// Leadership among the proxy's replicas.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leader {
    /// The election (`single-replica`, `kubernetes-lease`, ...).
    pub mode: String,
    /// Whether this replica is the leader.
    pub this_replica_leads: bool,
}

/// Device counts over the whole inventory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    /// Devices by phase name (every [`Phase`] appears, zero or not).
    pub devices_by_phase: BTreeMap<String, u64>,
    /// All devices.
    pub devices_total: u64,
}

/// One device of the inventory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    /// Canonical WWID.
    pub wwid: String,
    /// Life-cycle phase.
    pub phase: Phase,
    /// Size in bytes, as last reported.
    pub size_bytes: u64,
    /// The first target that reported it.
    pub target: String,
    /// LUN number on that target.
    pub lun: u32,
    /// INQUIRY vendor.
    pub vendor: String,
    /// INQUIRY model.
    pub model: String,
    /// Labels (from the targets' device labels).
    pub labels: BTreeMap<String, String>,
    /// The volume ID (`<wwid>:<binding uid>`) while bound.
    pub volume_id: Option<String>,
    /// The volume's name (the PV name) while bound.
    pub volume_name: Option<String>,
    /// Nodes that see it, sorted.
    pub nodes: Vec<String>,
    /// Nodes it is published to, in publish order.
    pub published: Vec<String>,
    /// Why it is Failed, Lost or HoldsData (absent when empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

/// A device's life-cycle phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Phase {
    /// Free: can be bound to a new volume.
    Available,
    /// New: not offered until a probe reads it blank.
    Unverified,
    /// New, and a probe found data on it: held.
    HoldsData,
    /// Bound to a volume.
    Bound,
    /// Being wiped after its volume was deleted.
    Releasing,
    /// A wipe failed; needs attention.
    Failed,
    /// No node reports it any more.
    Lost,
}

/// A target, as the inventory holds it (camelCase, as in the SCSITarget spec).
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
    /// Node labels a node must carry to reach it (empty: all).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Node names that reach it (empty: all matching the selector).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    /// Labels stamped onto every device of it.
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
    /// The Secret holding the CHAP credentials, by name only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chap_secret_ref: Option<SecretRef>,
}

/// A Secret by name (never its contents).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    /// Secret name.
    pub name: String,
    /// Secret namespace (empty, and absent, outside Kubernetes).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
}

/// The Fibre Channel part of a target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FcTarget {
    /// Target port WWPNs.
    pub wwpns: Vec<String>,
}

/// An agent of the directory and its last probe.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Agent {
    /// Its node.
    pub node: String,
    /// Its agent API address.
    pub address: String,
    /// The last probe's result; `None` (`null`) until the first probe of
    /// this address answered or failed.
    pub reachable: Option<bool>,
    /// The last probe's round trip in milliseconds.
    pub round_trip_ms: Option<f64>,
    /// When it was last probed (RFC 3339, UTC).
    pub last_probe: Option<String>,
    /// The release it reported.
    pub version: Option<String>,
    /// Why the last probe failed.
    pub error: Option<String>,
}

/// A request to grow a volume beyond its LUN (camelCase, as stored).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resize {
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
    /// Whether the LUN has since grown enough (false in `pending_resizes`).
    pub done: bool,
}

// === impl Phase ===

impl Phase {
    /// Its name, as in JSON (`Available`, ...).
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
}
