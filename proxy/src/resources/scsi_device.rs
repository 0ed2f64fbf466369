//! `SCSIDevice` (cluster-scoped): one LUN, named from its WWID. The spec
//! holds what discovery reported, and the two fields an operator sets
//! (`retired`, `retryWipe`), which the proxy carries over unchanged in
//! every write (a compare-and-swap: an operator's edit between its read
//! and its write makes it read again). The status holds the inventory's
//! state (phase, binding, where it is visible) and is written only through
//! the status subresource, by the proxy alone; agents never write.
// The derive takes one `printcolumn(...)` per column; clippy reads the
// repeated `type_ = ...` arguments as duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use csi_scsi_contract::NodeName;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::device::{
    Binding, Device, NodeView, Phase, Publication, TargetConflict, canonical_wwid,
};

/// One LUN as discovery reported it.
#[derive(
    CustomResource, JsonSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize,
)]
#[kube(
    group = "csi-scsi.io",
    version = "v1alpha1",
    kind = "SCSIDevice",
    plural = "scsidevices",
    singular = "scsidevice",
    shortname = "scsidev",
    category = "csi-scsi",
    status = "SCSIDeviceStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "One SCSI LUN, named from its WWID, as the csi-scsi proxy keeps it in its inventory.",
    printcolumn(name = "LUN", type_ = "integer", json_path = ".spec.lun"),
    printcolumn(name = "Serial", type_ = "string", json_path = ".spec.serial"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Size", type_ = "string", json_path = ".status.size"),
    printcolumn(
        name = "PV",
        type_ = "string",
        json_path = ".status.binding.volumeName"
    ),
    printcolumn(
        name = "Published",
        type_ = "string",
        json_path = ".status.publishedNodes"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "WWID",
        type_ = "string",
        json_path = ".spec.wwid",
        priority = 1
    ),
    printcolumn(
        name = "Target",
        type_ = "string",
        json_path = ".spec.target",
        priority = 1
    ),
    printcolumn(
        name = "Retired",
        type_ = "boolean",
        json_path = ".spec.retired",
        priority = 1
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.reason",
        priority = 1
    )
)]
#[serde(rename_all = "camelCase")]
pub struct SCSIDeviceSpec {
    /// Canonical WWID (VPD page 0x83): the LUN's only stable identity.
    pub wwid: String,
    /// The first target that reported it.
    pub target: String,
    /// LUN number on that target.
    pub lun: u32,
    /// Size in bytes, as last reported.
    pub size_bytes: u64,
    /// INQUIRY vendor.
    #[serde(default)]
    pub vendor: String,
    /// INQUIRY product.
    #[serde(default)]
    pub model: String,
    /// Unit serial number.
    #[serde(default)]
    pub serial: String,
    /// Labels from the targets' deviceLabels, matched by StorageClass
    /// `deviceSelector`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Set by an operator to take the LUN out of service: it is never
    /// bound to a new volume, counted as capacity, wiped or forgotten. A
    /// volume on it keeps working; nothing is detached or wiped because of
    /// it. The proxy never changes it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retired: bool,
    /// Set by an operator to any new value (a date, a counter) to have a
    /// LUN whose wipe did not finish (Failed, or Releasing) tried again at
    /// the next release scan, not after its backoff. The proxy never
    /// changes it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub retry_wipe: String,
}

/// The inventory's state of the device.
#[derive(JsonSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SCSIDeviceStatus {
    /// Life-cycle phase (required: a status without one is never read as
    /// Available).
    pub phase: Phase,
    /// `spec.sizeBytes` in binary units (`512Mi`, `1.5Gi`), rounded down,
    /// so a claim of the size shown fits; for `kubectl get`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub size: String,
    /// The CSI volume ID (`<wwid>:<binding uid>`) while bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_id: Option<String>,
    /// The binding, while bound (kept while Releasing, Failed or Lost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<Binding>,
    /// Where it is visible: node, target, and the paths on that node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeView>,
    /// Node names that see it, sorted (for `kubectl get`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_names: Vec<NodeName>,
    /// Where it is attached (ControllerPublished), and how.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub published: Vec<Publication>,
    /// The nodes of `published`, in publish order (for `kubectl get`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub published_nodes: Vec<NodeName>,
    /// When a node last reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<Time>,
    /// Why it is Failed or Lost.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// How many wipes of it have failed, ever.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub wipe_failures: u32,
    /// Targets of another array that report its WWID: their reports are
    /// not merged until an operator resolves it (`TargetConflict`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicts: Vec<TargetConflict>,
    /// Standard conditions (`Usable`, `TargetConflict`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The condition set while another array's target reports the device's WWID.
pub const TARGET_CONFLICT_CONDITION: &str = "TargetConflict";

/// Why a stored object cannot become an inventory device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceObjectError {
    /// The object has no resourceVersion (it was not read from the API).
    #[error("SCSIDevice {0} has no resourceVersion")]
    NoResourceVersion(String),
    /// The resourceVersion is not the decimal number the API server uses.
    #[error("SCSIDevice {name} has a non-numeric resourceVersion {version:?}")]
    OpaqueResourceVersion {
        /// The object.
        name: String,
        /// What the server sent.
        version: String,
    },
    /// The spec's WWID is not a canonical WWID.
    #[error("SCSIDevice {name}: {reason}")]
    Wwid {
        /// The object.
        name: String,
        /// Why its WWID was refused.
        reason: String,
    },
}

// === impl SCSIDevice ===

impl SCSIDevice {
    /// The inventory's view. `generation` carries the resourceVersion, so
    /// the compare-and-swap token survives the trip through the caller.
    /// An object without status (created, status not yet written) is Lost
    /// with no binding: never offered, and the next discovery fixes it.
    pub fn to_device(&self) -> Result<Device, DeviceObjectError> {
        let name = self.metadata.name.clone().unwrap_or_default();
        let version = self
            .metadata
            .resource_version
            .clone()
            .ok_or_else(|| DeviceObjectError::NoResourceVersion(name.clone()))?;
        let generation = version
            .parse::<i64>()
            .map_err(|_| DeviceObjectError::OpaqueResourceVersion { name, version })?;
        let status = self.status.clone().unwrap_or(SCSIDeviceStatus {
            phase: Phase::Lost,
            reason: "status not written yet".into(),
            ..SCSIDeviceStatus::default()
        });
        let wwid = canonical_wwid(&self.spec.wwid).map_err(|reason| DeviceObjectError::Wwid {
            name: self.metadata.name.clone().unwrap_or_default(),
            reason,
        })?;
        Ok(Device {
            wwid,
            target: self.spec.target.clone(),
            lun: self.spec.lun,
            size_bytes: self.spec.size_bytes,
            vendor: self.spec.vendor.clone(),
            model: self.spec.model.clone(),
            serial: self.spec.serial.clone(),
            labels: self.spec.labels.clone(),
            phase: status.phase,
            binding: status.binding,
            nodes: status.nodes,
            published: status.published,
            last_seen: status.last_seen.map(|t| t.0.as_second()).unwrap_or(0),
            reason: status.reason,
            wipe_failures: status.wipe_failures,
            conflicts: status.conflicts,
            retired: self.spec.retired,
            retry_wipe: self.spec.retry_wipe.clone(),
            generation,
        })
    }
}

// === impl SCSIDeviceSpec ===

impl SCSIDeviceSpec {
    /// The spec part of an inventory device.
    pub fn from_device(d: &Device) -> Self {
        Self {
            wwid: d.wwid.to_string(),
            target: d.target.clone(),
            lun: d.lun,
            size_bytes: d.size_bytes,
            vendor: d.vendor.clone(),
            model: d.model.clone(),
            serial: d.serial.clone(),
            labels: d.labels.clone(),
            retired: d.retired,
            retry_wipe: d.retry_wipe.clone(),
        }
    }
}

// === impl SCSIDeviceStatus ===

impl SCSIDeviceStatus {
    /// The status part of an inventory device. `previous` keeps the
    /// `Usable` condition's transition time when its state did not change.
    /// A retired device is not Usable, whatever its phase.
    pub fn from_device(d: &Device, previous: Option<&Self>, now: Timestamp) -> Self {
        let usable = matches!(d.phase, Phase::Available | Phase::Bound);
        let (cond_status, reason, message) = if d.retired {
            ("False", RETIRED_REASON, retired_message(d))
        } else if usable {
            ("True", d.phase.as_str(), String::new())
        } else {
            ("False", d.phase.as_str(), d.reason.clone())
        };
        let transition = |type_: &str, status: &str, reason: &str| {
            previous
                .and_then(|p| p.conditions.iter().find(|c| c.type_ == type_))
                .filter(|c| c.status == status && c.reason == reason)
                .map(|c| c.last_transition_time.clone())
                .unwrap_or(Time(now))
        };
        let mut conditions = vec![Condition {
            type_: "Usable".into(),
            status: cond_status.into(),
            reason: reason.into(),
            message,
            last_transition_time: transition("Usable", cond_status, reason),
            observed_generation: None,
        }];
        // Present only while there is a conflict, so a device without one
        // reads as it did before conflicts were kept.
        if !d.conflicts.is_empty() {
            conditions.push(Condition {
                type_: TARGET_CONFLICT_CONDITION.into(),
                status: "True".into(),
                reason: "ReportedByAnotherArray".into(),
                message: conflict_message(d),
                last_transition_time: transition(
                    TARGET_CONFLICT_CONDITION,
                    "True",
                    "ReportedByAnotherArray",
                ),
                observed_generation: None,
            });
        }
        Self {
            phase: d.phase,
            size: size_text(d.size_bytes),
            volume_id: d.volume_id(),
            binding: d.binding.clone(),
            nodes: d.nodes.clone(),
            node_names: d.node_names(),
            published: d.published.clone(),
            published_nodes: d.published_nodes(),
            last_seen: (d.last_seen > 0)
                .then(|| Timestamp::from_second(d.last_seen).ok().map(Time))
                .flatten(),
            reason: d.reason.clone(),
            wipe_failures: d.wipe_failures,
            conflicts: d.conflicts.clone(),
            conditions,
        }
    }
}

/// What an operator reads of a device's conflicts: which targets claim
/// its WWID, from which nodes, and which target it is known through.
pub fn conflict_message(d: &Device) -> String {
    let claims: Vec<String> = d
        .conflicts
        .iter()
        .map(|c| {
            let nodes: Vec<&str> = c.nodes.iter().map(NodeName::as_str).collect();
            format!("target {} (nodes {})", c.target, nodes.join(", "))
        })
        .collect();
    format!(
        "WWID {} is known through target {}, and also reported through {}: not merged. The same array under two SCSITargets: give both the same spec.array. Otherwise unmap the LUN from the other target on its array (or remove that target)",
        d.wwid,
        d.target,
        claims.join("; ")
    )
}

/// The `Usable` condition's reason on a retired device.
pub const RETIRED_REASON: &str = "Retired";

/// What the `Usable` condition says of a retired device.
fn retired_message(d: &Device) -> String {
    let mut text = format!(
        "retired by an operator (spec.retired): never bound to a new volume, never wiped; phase {}",
        d.phase.as_str()
    );
    if !d.reason.is_empty() {
        text.push_str(": ");
        text.push_str(&d.reason);
    }
    text
}

/// `bytes` in binary units, as Kubernetes quantities spell them: `512`,
/// `64Mi`, `1.5Gi`. Exact multiples of a unit have no decimals; anything
/// else has one decimal, rounded down, so the figure shown is never more
/// than the LUN holds (a claim of that size fits).
pub fn size_text(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes < 1024 {
        return bytes.to_string();
    }
    let (mut unit, mut scale) = (0, 1024u128);
    let n = u128::from(bytes);
    while unit + 1 < UNITS.len() && n / scale >= 1024 {
        unit += 1;
        scale *= 1024;
    }
    let (whole, rest) = (n / scale, n % scale);
    if rest == 0 {
        format!("{whole}{}", UNITS[unit])
    } else {
        format!("{whole}.{}{}", rest * 10 / scale, UNITS[unit])
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{AccessMode, Capability};

    /// A device as the proxy keeps it, read back from an object.
    fn object(spec: serde_json::Value, status: serde_json::Value) -> SCSIDevice {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "csi-scsi.io/v1alpha1",
            "kind": "SCSIDevice",
            "metadata": {"name": "naa.60014050000000000000000000000001", "resourceVersion": "7"},
            "spec": spec,
            "status": status,
        }))
        .expect("an SCSIDevice")
    }

    #[test]
    fn sizes_read_in_binary_units_and_never_more_than_the_lun_holds() {
        for (bytes, text) in [
            (0, "0"),
            (1023, "1023"),
            (1024, "1Ki"),
            (64 << 20, "64Mi"),
            (3 << 29, "1.5Gi"),
            (1 << 30, "1Gi"),
            ((1 << 30) + 1, "1.0Gi"),
            // One byte short of 2Gi: shown below 2Gi, as a 2Gi claim does not fit.
            ((2 << 30) - 1, "1.9Gi"),
            ((1 << 30) - 1, "1023.9Mi"),
            (5 << 40, "5Ti"),
            (u64::MAX, "15.9Ei"),
        ] {
            assert_eq!(size_text(bytes), text, "{bytes}");
        }
    }

    #[test]
    fn the_operator_s_fields_survive_the_proxy_s_read_and_write_and_derived_columns_are_written() {
        let obj = object(
            serde_json::json!({
                "wwid": "naa.60014050000000000000000000000001",
                "target": "t1",
                "lun": 3,
                "sizeBytes": 3u64 << 29,
                "retired": true,
                "retryWipe": "2026-05-01T10:00:00Z",
            }),
            serde_json::json!({
                "phase": "Bound",
                "binding": {"uid": "u1", "volumeName": "pvc-1"},
                "published": [{"node": "node-b"}, {"node": "node-a"}],
            }),
        );
        let d = obj.to_device().expect("device");
        assert!(d.retired);
        assert_eq!(d.retry_wipe, "2026-05-01T10:00:00Z");
        assert_eq!(d.generation, 7);
        let spec = SCSIDeviceSpec::from_device(&d);
        assert_eq!(spec, obj.spec, "what the proxy writes back is what it read");
        let status = SCSIDeviceStatus::from_device(&d, None, Timestamp::UNIX_EPOCH);
        assert_eq!(status.size, "1.5Gi");
        assert_eq!(
            status.published_nodes,
            [crate::node("node-b"), crate::node("node-a")]
        );
        let usable = &status.conditions[0];
        assert_eq!(
            (
                usable.type_.as_str(),
                usable.status.as_str(),
                usable.reason.as_str()
            ),
            ("Usable", "False", RETIRED_REASON)
        );
        // Not retired: the fields stay out of the object, Bound is Usable.
        let mut back = d.clone();
        back.retired = false;
        back.retry_wipe.clear();
        let text = serde_json::to_value(SCSIDeviceSpec::from_device(&back)).expect("json");
        assert!(
            text.get("retired").is_none() && text.get("retryWipe").is_none(),
            "{text}"
        );
        let status = SCSIDeviceStatus::from_device(&back, None, Timestamp::UNIX_EPOCH);
        assert_eq!(status.conditions[0].status, "True");
        // An object written before these fields reads as not retired.
        let old = object(
            serde_json::json!({"wwid": "naa.60014050000000000000000000000001", "target": "t1", "lun": 3, "sizeBytes": 1}),
            serde_json::json!({"phase": "Available"}),
        );
        let d = old.to_device().expect("device");
        assert!(!d.retired && d.retry_wipe.is_empty());
    }

    #[test]
    fn a_status_written_before_publications_kept_their_capability_still_reads() {
        let old: SCSIDeviceStatus =
            serde_json::from_str(r#"{"phase":"Bound","published":["node-a"]}"#).expect("old");
        assert_eq!(
            old.published,
            [Publication {
                node: crate::node("node-a"),
                access: None,
                readonly: false,
            }]
        );
        let new: SCSIDeviceStatus = serde_json::from_str(
            r#"{"phase":"Bound","published":[{"node":"node-b","access":"block:MULTI_NODE_MULTI_WRITER","readonly":true}]}"#,
        )
        .expect("new");
        assert_eq!(
            new.published[0].access,
            Some(Capability::Block(AccessMode::MultiNodeMultiWriter))
        );
        assert!(new.published[0].readonly);
    }
}
