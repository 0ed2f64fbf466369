//! `PendingResizeRequest` (namespaced, beside its PVC): the driver cannot
//! grow a LUN, so when a PVC asks for more than its LUN has, the proxy
//! records what is wanted here for the storage administrator. Once a rescan
//! shows the LUN grew, expansion completes and the status says done.
// The derive takes one `printcolumn(...)` per column; clippy reads the
// repeated `type_ = ...` arguments as duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::device::ResizeRequest;

/// A volume that wants more bytes than its LUN has.
#[derive(
    CustomResource, JsonSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize,
)]
#[kube(
    group = "csi-scsi.io",
    version = "v1alpha1",
    kind = "PendingResizeRequest",
    plural = "pendingresizerequests",
    singular = "pendingresizerequest",
    shortname = "scsiresize",
    category = "csi-scsi",
    namespaced,
    status = "PendingResizeRequestStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "A PVC asked for more bytes than its LUN has: grow the LUN on the array, the driver finishes the expansion.",
    printcolumn(name = "Claim", type_ = "string", json_path = ".spec.claimName"),
    printcolumn(name = "WWID", type_ = "string", json_path = ".spec.wwid"),
    printcolumn(
        name = "Requested",
        type_ = "integer",
        json_path = ".spec.requestedBytes"
    ),
    printcolumn(
        name = "Current",
        type_ = "integer",
        json_path = ".status.currentBytes"
    ),
    printcolumn(name = "Done", type_ = "boolean", json_path = ".status.done"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct PendingResizeRequestSpec {
    /// The PVC that asked (empty when the proxy could not tell).
    #[serde(default)]
    pub claim_name: String,
    /// The PersistentVolume (the CSI volume name).
    #[serde(default)]
    pub volume_name: String,
    /// The CSI volume ID.
    pub volume_id: String,
    /// The LUN to grow.
    pub wwid: String,
    /// Bytes the volume asked for.
    pub requested_bytes: u64,
}

/// Progress of the request.
#[derive(JsonSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingResizeRequestStatus {
    /// Bytes the LUN has (when asked, then after each rescan).
    #[serde(default)]
    pub current_bytes: u64,
    /// Whether the LUN has grown enough and expansion went on.
    #[serde(default)]
    pub done: bool,
    /// When the request was last updated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update: Option<Time>,
}

// === impl PendingResizeRequest ===

impl PendingResizeRequest {
    /// The inventory's view (its name is the object's name).
    pub fn to_request(&self) -> ResizeRequest {
        let status = self.status.clone().unwrap_or_default();
        ResizeRequest {
            name: self.metadata.name.clone().unwrap_or_default(),
            volume_id: self.spec.volume_id.clone(),
            wwid: self.spec.wwid.clone(),
            requested_bytes: self.spec.requested_bytes,
            current_bytes: status.current_bytes,
            created: self
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_second())
                .unwrap_or(0),
            done: status.done,
        }
    }
}
