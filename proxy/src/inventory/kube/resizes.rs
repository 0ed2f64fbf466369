//! PendingResizeRequest objects: an expansion the LUN cannot take yet,
//! kept in the claim's namespace (owned by the claim) until it is done.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch};
use kube::{Api, ResourceExt};

use super::{KubeInventory, api_error};
use crate::device::{ResizeRequest, canonical_wwid};
use crate::events::ClaimRef;
use crate::inventory::InventoryError;
use crate::kube_wiring::{patch_params, post_params};
use crate::resources::{
    PendingResizeRequest, PendingResizeRequestSpec, PendingResizeRequestStatus, object_name,
};

/// Annotation keeping a resize request's own name when the object name had
/// to be mapped.
const REQUEST_NAME_ANNOTATION: &str = "csi-scsi.io/request-name";

impl KubeInventory {
    /// The PVC bound to the PersistentVolume `volume`, from its claimRef,
    /// with the claim's UID when the claimRef carries one.
    async fn claim_of(&self, volume: &str) -> Option<(ClaimRef, Option<String>)> {
        let pv = Api::<PersistentVolume>::all(self.inner.client.clone())
            .get_opt(volume)
            .await;
        match pv {
            Ok(Some(pv)) => {
                let r = pv.spec?.claim_ref?;
                Some((
                    ClaimRef {
                        namespace: r.namespace?,
                        name: r.name?,
                    },
                    r.uid,
                ))
            }
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(%volume, error = %e, "cannot read the PersistentVolume to find its claim");
                None
            }
        }
    }

    fn resize_object(&self, name: &str) -> Option<Arc<PendingResizeRequest>> {
        let object = object_name(name);
        self.inner
            .resize_cache
            .find(|r| r.metadata.name.as_deref() == Some(object.as_str()))
    }

    pub(super) async fn write_resize(&self, r: ResizeRequest) -> Result<(), InventoryError> {
        self.fence()?;
        self.wait_until_ready().await?;
        // A request names its LUN as the device it was made for spells it:
        // canonical. Another spelling names no device.
        let device = match canonical_wwid(&r.wwid) {
            Ok(wwid) => self.device_object(&wwid)?,
            Err(_) => None,
        };
        let volume_name = device
            .and_then(|o| {
                o.status
                    .as_ref()?
                    .binding
                    .as_ref()
                    .map(|b| b.volume_name.clone())
            })
            .unwrap_or_default();
        let spec = PendingResizeRequestSpec {
            claim_name: String::new(),
            volume_name: volume_name.clone(),
            volume_id: r.volume_id.clone(),
            wwid: r.wwid.clone(),
            requested_bytes: r.requested_bytes,
        };
        let status = PendingResizeRequestStatus {
            current_bytes: r.current_bytes,
            done: r.done,
            last_update: Some(Time(Timestamp::now())),
        };
        let (object, namespace, claim, was) = match self.resize_object(&r.name) {
            Some(existing) => {
                let ns = existing.namespace().unwrap_or_default();
                let claim = (!existing.spec.claim_name.is_empty()).then(|| ClaimRef {
                    namespace: ns.clone(),
                    name: existing.spec.claim_name.clone(),
                });
                let api: Api<PendingResizeRequest> =
                    Api::namespaced(self.inner.client.clone(), &ns);
                let name = existing.name_any();
                update_resize_spec(&api, &name, &existing, &r).await?;
                (
                    name,
                    ns,
                    claim,
                    Some((
                        existing.spec.requested_bytes,
                        existing.status.clone().unwrap_or_default().done,
                    )),
                )
            }
            None => {
                let (claim, claim_uid) = if volume_name.is_empty() {
                    (None, None)
                } else {
                    match self.claim_of(&volume_name).await {
                        Some((c, uid)) => (Some(c), uid),
                        None => (None, None),
                    }
                };
                let ns = claim
                    .as_ref()
                    .map(|c| c.namespace.clone())
                    .unwrap_or_else(|| self.inner.config.namespace.clone());
                let object = object_name(&r.name);
                let mut obj = PendingResizeRequest::new(
                    &object,
                    PendingResizeRequestSpec {
                        claim_name: claim.as_ref().map(|c| c.name.clone()).unwrap_or_default(),
                        ..spec
                    },
                );
                obj.metadata.namespace = Some(ns.clone());
                obj.metadata.labels = Some(BTreeMap::from([(
                    "app.kubernetes.io/managed-by".to_owned(),
                    "csi-scsi".to_owned(),
                )]));
                obj.metadata.annotations = Some(BTreeMap::from([(
                    REQUEST_NAME_ANNOTATION.to_owned(),
                    r.name.clone(),
                )]));
                // Owned by its PVC, so it goes with the claim (garbage
                // collection). Without the claim's UID (PV unreadable, no
                // claimRef, or one without a UID) there is no owner to
                // name: an ownerReference must carry the UID, and a wrong
                // one would have the request collected at once.
                if let (Some(c), Some(uid)) = (&claim, claim_uid) {
                    obj.metadata.owner_references = Some(vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "PersistentVolumeClaim".into(),
                        name: c.name.clone(),
                        uid,
                        controller: None,
                        // Blocking the claim's deletion would need update
                        // on persistentvolumeclaims/finalizers; not wanted.
                        block_owner_deletion: None,
                    }]);
                }
                let api: Api<PendingResizeRequest> =
                    Api::namespaced(self.inner.client.clone(), &ns);
                let was = match api.create(&post_params(), &obj).await {
                    Ok(_) => None,
                    // Created already; the cache has not caught up with it.
                    // Its spec may be older than this request: update it.
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        let existing = api.get(&object).await.map_err(api_error)?;
                        update_resize_spec(&api, &object, &existing, &r).await?;
                        Some((
                            existing.spec.requested_bytes,
                            existing.status.unwrap_or_default().done,
                        ))
                    }
                    Err(e) => return Err(api_error(e)),
                };
                (object, ns, claim, was)
            }
        };
        let api: Api<PendingResizeRequest> = Api::namespaced(self.inner.client.clone(), &namespace);
        let patch = serde_json::json!({ "status": status });
        api.patch_status(&object, &patch_params(), &Patch::Merge(&patch))
            .await
            .map_err(api_error)?;
        if let (Some(events), Some(claim)) = (self.inner.events.clone(), claim) {
            let newly_pending =
                !r.done && was.is_none_or(|(bytes, done)| bytes != r.requested_bytes || done);
            let newly_done = r.done && was.is_some_and(|(_, done)| !done);
            let (wwid, have, want, name) = (
                r.wwid.clone(),
                r.current_bytes,
                r.requested_bytes,
                object.clone(),
            );
            if newly_pending {
                tokio::spawn(async move {
                    events
                        .resize_pending(&claim, &wwid, have, want, &name)
                        .await
                });
            } else if newly_done {
                tokio::spawn(async move { events.resize_completed(&claim, &wwid, have).await });
            }
        }
        // Done: nothing is left for the administrator to act on (the Event
        // tells the claim), so the request goes rather than accumulate.
        if r.done {
            match api.delete(&object, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(api_error(e)),
            }
        }
        Ok(())
    }

    pub(super) async fn list_resizes(&self) -> Result<Vec<ResizeRequest>, InventoryError> {
        self.wait_until_ready().await?;
        let mut all: Vec<ResizeRequest> = self
            .inner
            .resize_cache
            .state()
            .iter()
            .map(|o| {
                let mut r = o.to_request();
                if let Some(name) = o.annotations().get(REQUEST_NAME_ANNOTATION) {
                    r.name = name.clone();
                }
                r
            })
            .collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }
}

/// Brings a stored resize request's spec up to `r` when it asks for
/// another size or names another volume.
async fn update_resize_spec(
    api: &Api<PendingResizeRequest>,
    object: &str,
    existing: &PendingResizeRequest,
    r: &ResizeRequest,
) -> Result<(), InventoryError> {
    if existing.spec.requested_bytes == r.requested_bytes && existing.spec.volume_id == r.volume_id
    {
        return Ok(());
    }
    let patch = serde_json::json!({ "spec": { "requestedBytes": r.requested_bytes, "volumeId": r.volume_id, "wwid": r.wwid } });
    api.patch(object, &patch_params(), &Patch::Merge(&patch))
        .await
        .map_err(api_error)?;
    Ok(())
}
