//! Finalizers keep what holds live data: `csi-scsi.io/bound-volume` on a
//! device a volume lives on, `csi-scsi.io/target-in-use` on a target such a
//! device is reached through. A `kubectl delete` of either only marks it
//! until the volume is released.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use kube::api::ObjectMeta;
use kube::{Resource, ResourceExt};

use super::{KubeInventory, retry_on_conflict, strip};
use crate::device::Device;
use crate::device::policy;
use crate::kube_wiring::post_params;
use crate::resources::{DEVICE_FINALIZER, SCSIDevice, TARGET_FINALIZER};

impl KubeInventory {
    /// Takes the bound-volume finalizer off a device that holds no volume
    /// (best effort: the sweep after each discovery round retries). The
    /// new version, unless the object is now deleted.
    pub(super) async fn drop_device_finalizer(&self, obj: &SCSIDevice) -> Option<Arc<SCSIDevice>> {
        let name = obj.name_any();
        let mut sent = obj.clone();
        set_finalizer(&mut sent.metadata, DEVICE_FINALIZER, false);
        let deleting = obj.meta().deletion_timestamp.is_some();
        match self
            .inner
            .devices
            .replace(&name, &post_params(), &sent)
            .await
        {
            // Marked for deletion: the server deletes it now, so the
            // overlay must not keep it alive for discovery's next look.
            Ok(_) if deleting => {
                tracing::info!(device = %name, "device released; its pending deletion completes");
                self.inner.device_cache.forget(&name);
                None
            }
            Ok(o) => Some(self.inner.device_cache.remember(strip(o))),
            Err(e) => {
                tracing::warn!(device = %name, error = %e, "could not remove the bound-volume finalizer; the next discovery round retries");
                None
            }
        }
    }

    /// Puts the target-in-use finalizer on `target` while a device that
    /// holds a volume is reached through it, and takes it off after.
    pub(super) async fn sync_target_finalizer(&self, target: &str) {
        let in_use = self
            .all_devices()
            .iter()
            .filter(|o| device_targets(o).contains(target))
            .any(|o| o.to_device().is_ok_and(|d| policy::holds_volume(&d)));
        let outcome = retry_on_conflict(Duration::ZERO, move |n| async move {
            let object = match self.target_for_try(target, n).await {
                Ok(Some(o)) => o,
                Ok(None) => return Ok(false),
                Err(e) => {
                    tracing::warn!(%target, error = %e, "could not read the SCSITarget for its finalizer");
                    return Ok(false);
                }
            };
            let has = has_finalizer(&*object, TARGET_FINALIZER);
            // No new finalizer on a target being deleted (the server
            // refuses it); one kept from before stays while in use.
            let want = in_use && (has || object.meta().deletion_timestamp.is_none());
            if want == has {
                return Ok(false);
            }
            let mut next = (*object).clone();
            set_finalizer(&mut next.metadata, TARGET_FINALIZER, want);
            self.inner
                .targets
                .replace(target, &post_params(), &next)
                .await
                .map(|_| true)
        })
        .await;
        match outcome {
            Some(Ok(true)) => {
                tracing::info!(%target, in_use, "SCSITarget in-use finalizer updated")
            }
            Some(Ok(false)) => {}
            Some(Err(kube::Error::Api(s))) if s.code == 404 => {}
            Some(Err(e)) => {
                tracing::warn!(%target, error = %e, "could not update the SCSITarget's in-use finalizer")
            }
            None => tracing::warn!(%target, "SCSITarget finalizer not updated: it kept changing"),
        }
    }

    /// After a round: every device of the target carries the finalizer
    /// exactly while it holds a volume (records from before finalizers,
    /// removals that failed), the target its own; and a deletion asked of
    /// a bound device is reported once.
    pub(super) async fn sweep_finalizers(&self, target: &str) {
        let objects: Vec<Arc<SCSIDevice>> = self
            .all_devices()
            .into_iter()
            .filter(|o| device_targets(o).contains(target))
            .collect();
        for obj in objects {
            let Ok(dev) = obj.to_device() else { continue };
            let holds = policy::holds_volume(&dev);
            let has = has_finalizer(&*obj, DEVICE_FINALIZER);
            if holds && obj.meta().deletion_timestamp.is_some() {
                self.report_delete_of_bound(&obj, &dev);
            } else if holds && !has {
                let mut sent = (*obj).clone();
                set_finalizer(&mut sent.metadata, DEVICE_FINALIZER, true);
                match self
                    .inner
                    .devices
                    .replace(&obj.name_any(), &post_params(), &sent)
                    .await
                {
                    Ok(o) => {
                        self.inner.device_cache.remember(strip(o));
                    }
                    Err(e) => {
                        tracing::warn!(wwid = %dev.wwid, error = %e, "could not add the bound-volume finalizer")
                    }
                }
            } else if !holds && has {
                let _ = self.drop_device_finalizer(&obj).await;
            }
        }
        self.sync_target_finalizer(target).await;
    }

    /// Someone asked to delete a device a volume lives on: it stays (the
    /// finalizer) and stays bound; say so once, in the log and on the PV.
    fn report_delete_of_bound(&self, obj: &SCSIDevice, dev: &Device) {
        let uid = obj.uid().unwrap_or_default();
        let first = self
            .inner
            .delete_reported
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(uid);
        if !first {
            return;
        }
        let volume = dev
            .binding
            .as_ref()
            .map(|b| b.volume_name.clone())
            .unwrap_or_default();
        tracing::warn!(wwid = %dev.wwid, %volume, phase = %dev.phase.as_str(), "deletion of SCSIDevice requested while a volume lives on it: it stays bound until the volume is deleted and the LUN released");
        if let Some(events) = self.inner.events.clone() {
            let wwid = dev.wwid.clone();
            tokio::spawn(async move {
                events
                    .bound_device_delete_requested(&volume, wwid.as_str())
                    .await
            });
        }
    }
}

/// The targets a device is reached through: those of its node views (what
/// `targets_for` hands attach and detach) and the one that first reported it.
pub(super) fn device_targets(obj: &SCSIDevice) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = obj
        .status
        .iter()
        .flat_map(|s| s.nodes.iter().map(|v| v.target.clone()))
        .collect();
    names.insert(obj.spec.target.clone());
    names
}

pub(super) fn has_finalizer<K: Resource>(obj: &K, finalizer: &str) -> bool {
    obj.meta()
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == finalizer))
}

/// Adds or removes `finalizer`, leaving any other's in place.
pub(super) fn set_finalizer(meta: &mut ObjectMeta, finalizer: &str, present: bool) {
    let mut list = meta.finalizers.take().unwrap_or_default();
    list.retain(|f| f != finalizer);
    if present {
        list.push(finalizer.to_owned());
    }
    meta.finalizers = (!list.is_empty()).then_some(list);
}
