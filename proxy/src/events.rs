//! Kubernetes Events for failures an operator must see, on the PVC when it
//! is known: no device fits (CreateVolume), resize pending (the LUN must
//! be grown on the array), and wipe failed (DeleteVolume; by then the PVC
//! is usually gone, so the Event goes on the PersistentVolume and names
//! the SCSIDevice); and on the SCSIDevice, a target conflict (discovery)
//! and a new LUN found holding data (a probe). Publishing is best effort: a failure is logged, never
//! returned, and never fails the CSI call that caused it.
//!
//! The PVC of a CreateVolume comes from the parameters the
//! external-provisioner adds with `--extra-create-metadata`.

use std::collections::HashMap;

use csi_scsi_textfs::text;
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client};

use crate::resources::{GROUP, VERSION, object_name};

/// CreateVolume parameter naming the PVC (with `--extra-create-metadata`).
pub const PVC_NAME_PARAMETER: &str = "csi.storage.k8s.io/pvc/name";
/// CreateVolume parameter naming the PVC's namespace.
pub const PVC_NAMESPACE_PARAMETER: &str = "csi.storage.k8s.io/pvc/namespace";

/// Most bytes of an Event's note: the API refuses longer ones.
const MAX_NOTE: usize = 1000;

/// A PersistentVolumeClaim by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

/// Publishes Events about volumes.
#[derive(Clone)]
pub struct VolumeEvents {
    client: Client,
    recorder: Recorder,
}

// === impl ClaimRef ===

impl ClaimRef {
    /// The PVC named in CreateVolume parameters, when the provisioner runs
    /// with `--extra-create-metadata`.
    pub fn from_create_parameters(parameters: &HashMap<String, String>) -> Option<Self> {
        let name = parameters
            .get(PVC_NAME_PARAMETER)
            .filter(|s| !s.is_empty())?;
        let namespace = parameters
            .get(PVC_NAMESPACE_PARAMETER)
            .filter(|s| !s.is_empty())?;
        Some(Self {
            namespace: namespace.clone(),
            name: name.clone(),
        })
    }
}

// === impl VolumeEvents ===

impl VolumeEvents {
    /// Events reported as `controller` (the driver name), from `instance`
    /// (this pod's name).
    pub fn new(client: Client, controller: &str, instance: Option<String>) -> Self {
        let reporter = Reporter {
            controller: controller.to_owned(),
            instance,
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
        }
    }

    /// CreateVolume found no Available LUN for the claim.
    pub async fn no_device_fits(&self, claim: &ClaimRef, detail: &str) {
        let note = format!(
            "no free SCSI LUN fits this claim: {detail}. Add LUNs on the array or loosen the StorageClass deviceSelector."
        );
        self.on_claim(
            claim,
            EventType::Warning,
            "NoDeviceFits",
            "Provision",
            note,
            None,
        )
        .await;
    }

    /// The claim wants more bytes than its LUN has; the administrator must
    /// grow the LUN (a PendingResizeRequest records it).
    pub async fn resize_pending(
        &self,
        claim: &ClaimRef,
        wwid: &str,
        have: u64,
        want: u64,
        request: &str,
    ) {
        let note = format!(
            "LUN {wwid} has {have} bytes, the claim asks for {want}: grow the LUN on the array; expansion completes after a rescan (PendingResizeRequest {request})"
        );
        self.on_claim(
            claim,
            EventType::Warning,
            "ResizePending",
            "Expand",
            note,
            Some(device_ref(wwid)),
        )
        .await;
    }

    /// The LUN grew and the pending resize is done.
    pub async fn resize_completed(&self, claim: &ClaimRef, wwid: &str, size: u64) {
        let note = format!("LUN {wwid} now has {size} bytes: expansion continues");
        self.on_claim(
            claim,
            EventType::Normal,
            "ResizeCompleted",
            "Expand",
            note,
            Some(device_ref(wwid)),
        )
        .await;
    }

    /// Wiping a released LUN failed: it stays Failed, retried with backoff,
    /// until a wipe succeeds (or an operator asks for one, or retires it).
    /// Reported on the PersistentVolume `volume` (the PVC is usually gone).
    pub async fn wipe_failed(&self, volume: &str, wwid: &str, reason: &str) {
        let note = format!(
            "wiping LUN {wwid} failed; it is not offered again, and the wipe is retried with backoff. Fix the cause, then set the SCSIDevice's spec.retryWipe to retry now, or spec.retired to take the LUN out of service (docs/troubleshooting.md): {reason}"
        );
        self.on_volume(volume, "WipeFailed", "Delete", note, wwid)
            .await;
    }

    /// Someone asked to delete the SCSIDevice the volume lives on: it stays
    /// (a finalizer) and stays bound until the volume is deleted and the
    /// LUN released. Reported on the PersistentVolume `volume`.
    pub async fn bound_device_delete_requested(&self, volume: &str, wwid: &str) {
        let note = format!(
            "deletion of SCSIDevice for LUN {wwid} was requested while this volume lives on it: the device stays bound until the volume is deleted and the LUN wiped, then the deletion completes"
        );
        self.on_volume(volume, "BoundDeviceDeleteRequested", "Delete", note, wwid)
            .await;
    }

    /// A target of another array reported the LUN's WWID: its report was
    /// not merged. Reported on the SCSIDevice itself (`uid`: its UID).
    pub async fn target_conflict(&self, wwid: &str, uid: Option<String>, note: String) {
        let regarding = ObjectReference {
            uid,
            ..device_ref(wwid)
        };
        self.publish(
            EventType::Warning,
            "TargetConflict",
            "Discover",
            note,
            &regarding,
            None,
        )
        .await;
    }

    /// A probe found data on a LUN the inventory had not seen before: it
    /// is held (HoldsData), never offered until it reads blank or its
    /// target wipes it. Reported on the SCSIDevice itself (`uid`: its UID).
    pub async fn lun_holds_data(&self, wwid: &str, uid: Option<String>, reason: &str) {
        let regarding = ObjectReference {
            uid,
            ..device_ref(wwid)
        };
        let note = format!("LUN {wwid} is new and holds data, so it is not offered: {reason}");
        self.publish(
            EventType::Warning,
            "HoldsData",
            "Probe",
            note,
            &regarding,
            None,
        )
        .await;
    }

    async fn on_volume(&self, volume: &str, reason: &str, action: &str, note: String, wwid: &str) {
        let uid = match Api::<PersistentVolume>::all(self.client.clone())
            .get_opt(volume)
            .await
        {
            Ok(pv) => pv.and_then(|pv| pv.metadata.uid),
            Err(e) => {
                tracing::debug!(%volume, error = %e, "cannot read the PersistentVolume for its Event");
                None
            }
        };
        let regarding = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolume".into()),
            name: Some(volume.to_owned()),
            uid,
            ..ObjectReference::default()
        };
        self.publish(
            EventType::Warning,
            reason,
            action,
            note,
            &regarding,
            Some(device_ref(wwid)),
        )
        .await;
    }

    async fn on_claim(
        &self,
        claim: &ClaimRef,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
        related: Option<ObjectReference>,
    ) {
        // `kubectl describe pvc` selects Events by the claim's UID too.
        let api = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &claim.namespace);
        let uid = match api.get_opt(&claim.name).await {
            Ok(pvc) => pvc.and_then(|p| p.metadata.uid),
            Err(e) => {
                tracing::debug!(claim = %claim.name, error = %e, "cannot read the PVC for its Event");
                None
            }
        };
        let regarding = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolumeClaim".into()),
            name: Some(claim.name.clone()),
            namespace: Some(claim.namespace.clone()),
            uid,
            ..ObjectReference::default()
        };
        self.publish(type_, reason, action, note, &regarding, related)
            .await;
    }

    async fn publish(
        &self,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
        regarding: &ObjectReference,
        related: Option<ObjectReference>,
    ) {
        let note = text::bounded(&note, MAX_NOTE).into_owned();
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: action.to_owned(),
            secondary: related,
        };
        if let Err(e) = self.recorder.publish(&event, regarding).await {
            tracing::warn!(reason, object = ?regarding.name, error = %e, "could not publish an Event");
        }
    }
}

/// A reference to the SCSIDevice of `wwid`.
fn device_ref(wwid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some(format!("{GROUP}/{VERSION}")),
        kind: Some("SCSIDevice".into()),
        name: Some(object_name(wwid)),
        ..ObjectReference::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_comes_from_the_provisioner_parameters() {
        let p = HashMap::from([
            (PVC_NAME_PARAMETER.to_owned(), "data".to_owned()),
            (PVC_NAMESPACE_PARAMETER.to_owned(), "apps".to_owned()),
            ("fsType".to_owned(), "xfs".to_owned()),
        ]);
        assert_eq!(
            ClaimRef::from_create_parameters(&p),
            Some(ClaimRef {
                namespace: "apps".into(),
                name: "data".into()
            })
        );
        assert_eq!(ClaimRef::from_create_parameters(&HashMap::new()), None);
    }
}
