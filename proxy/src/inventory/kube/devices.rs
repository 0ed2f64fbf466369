//! SCSIDevice objects: reads from the cache overlay, and compare-and-swap
//! writes of a device's spec and status (the resourceVersion the caller
//! read is `Device::generation`), with the Events a transition raises.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use csi_scsi_contract::Wwid;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ObjectMeta, Preconditions};
use kube::{Resource, ResourceExt};

use super::finalizers::{device_targets, has_finalizer, set_finalizer};
use super::{KubeInventory, api_error, store, strip};
use crate::device::policy::{self, preference, preference_key};
use crate::device::{Device, Phase};
use crate::inventory::{AvailableQuery, InventoryError, Summary, Write};
use crate::kube_wiring::post_params;
use crate::resources::{
    DEVICE_FINALIZER, SCSIDevice, SCSIDeviceSpec, SCSIDeviceStatus, conflict_message, object_name,
};

/// Which part of a device object a write replaces.
#[derive(Clone, Copy, Debug)]
enum Part {
    /// Spec and metadata (finalizers).
    Object,
    /// The status subresource.
    Status,
}

impl KubeInventory {
    /// Every device, cache and overlay merged.
    pub(super) fn all_devices(&self) -> Vec<Arc<SCSIDevice>> {
        self.inner.device_cache.all()
    }

    /// The current object of `wwid`, if any (checked against a name collision).
    pub(super) fn device_object(
        &self,
        wwid: &Wwid,
    ) -> Result<Option<Arc<SCSIDevice>>, InventoryError> {
        match self.inner.device_cache.get(&object_name(wwid.as_str())) {
            Some(obj) if obj.spec.wwid != wwid.as_str() => Err(store(format!(
                "SCSIDevice {} holds WWID {}, not {wwid}",
                obj.name_any(),
                obj.spec.wwid
            ))),
            other => Ok(other),
        }
    }

    /// Reads the object from the API server into the overlay (after a 409).
    async fn refresh(&self, name: &str) -> Result<Option<Arc<SCSIDevice>>, InventoryError> {
        let fresh = self.inner.devices.get_opt(name).await.map_err(api_error)?;
        Ok(fresh.map(|o| self.inner.device_cache.remember(strip(o))))
    }

    /// Writes `dev` if its generation is still the stored resourceVersion:
    /// the spec (when changed) by replace, then the status (when changed)
    /// through the status subresource, each with the version just read.
    async fn write_device(&self, dev: &Device) -> Result<Device, InventoryError> {
        let known = self
            .device_object(&dev.wwid)?
            .ok_or_else(|| InventoryError::NotFound(dev.wwid.clone()))?;
        if known.resource_version().as_deref() != Some(dev.generation.to_string().as_str()) {
            // The caller read an older version; the cache already has a newer one.
            return Err(InventoryError::Conflict(dev.wwid.clone()));
        }
        let mut want = (*known).clone();
        want.spec = SCSIDeviceSpec::from_device(dev);
        want.status = Some(SCSIDeviceStatus::from_device(
            dev,
            known.status.as_ref(),
            Timestamp::now(),
        ));
        let holds = policy::holds_volume(dev);
        let was_holding = known.to_device().is_ok_and(|d| policy::holds_volume(&d));
        // A volume coming onto the device: the finalizer goes on with (or
        // before) the status that says so. The server refuses a new
        // finalizer on an object marked for deletion; such a device is
        // never bound (`available`), so only a record from before
        // finalizers can get here, and it is written without one.
        if holds && known.meta().deletion_timestamp.is_none() {
            set_finalizer(&mut want.metadata, DEVICE_FINALIZER, true);
        }
        let mut latest = known.clone();
        if want.spec != known.spec || want.metadata.finalizers != known.metadata.finalizers {
            latest = self.send(&dev.wwid, &want, Part::Object).await?;
        }
        if want.status != latest.status {
            let mut sent = (*latest).clone();
            sent.status = want.status.clone();
            latest = self.send(&dev.wwid, &sent, Part::Status).await?;
        }
        // Free again: the finalizer comes off only once the status says
        // so, and a deletion asked for meanwhile then completes.
        if !holds
            && has_finalizer(&*latest, DEVICE_FINALIZER)
            && let Some(next) = self.drop_device_finalizer(&latest).await
        {
            latest = next;
        }
        let written = latest.to_device().map_err(|e| store(e.to_string()))?;
        if holds != was_holding {
            for target in device_targets(&latest) {
                self.sync_target_finalizer(&target).await;
            }
        }
        let was = known.status.as_ref().map(|s| s.phase);
        if written.phase == Phase::Failed && was != Some(Phase::Failed) {
            self.spawn_wipe_failed(&written);
        }
        if written.phase == Phase::HoldsData && was != Some(Phase::HoldsData) {
            self.spawn_holds_data(&written, latest.uid());
        }
        let had: BTreeSet<&str> = known
            .status
            .iter()
            .flat_map(|s| s.conflicts.iter().map(|c| c.target.as_str()))
            .collect();
        if written
            .conflicts
            .iter()
            .any(|c| !had.contains(c.target.as_str()))
        {
            self.spawn_target_conflict(&written, latest.uid());
        }
        Ok(written)
    }

    /// Maps a failed write; a 409 re-reads the object so the caller's next
    /// read sees what won.
    async fn write_failed(&self, name: &str, wwid: &Wwid, e: kube::Error) -> InventoryError {
        match &e {
            kube::Error::Api(s) if s.code == 409 => {
                if let Err(re) = self.refresh(name).await {
                    tracing::warn!(%wwid, error = %re, "re-read after a conflict failed");
                }
                InventoryError::Conflict(wwid.clone())
            }
            kube::Error::Api(s) if s.code == 404 => InventoryError::NotFound(wwid.clone()),
            _ => api_error(e),
        }
    }

    /// Creates the object of a device first seen, then writes its status.
    async fn create_device(&self, dev: &Device) -> Result<Device, InventoryError> {
        let name = object_name(dev.wwid.as_str());
        let mut metadata = ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        };
        set_finalizer(&mut metadata, DEVICE_FINALIZER, policy::holds_volume(dev));
        let obj = SCSIDevice {
            metadata,
            spec: SCSIDeviceSpec::from_device(dev),
            status: None,
        };
        let created = match self.inner.devices.create(&post_params(), &obj).await {
            Ok(o) => self.inner.device_cache.remember(strip(o)),
            Err(e) => return Err(self.write_failed(&name, &dev.wwid, e).await),
        };
        let mut with_status = (*created).clone();
        with_status.status = Some(SCSIDeviceStatus::from_device(dev, None, Timestamp::now()));
        self.send(&dev.wwid, &with_status, Part::Status)
            .await?
            .to_device()
            .map_err(|e| store(e.to_string()))
    }

    /// Replaces `sent`'s object (spec and metadata) or its status, with the
    /// resourceVersion it carries; keeps the answer in the overlay.
    async fn send(
        &self,
        wwid: &Wwid,
        sent: &SCSIDevice,
        part: Part,
    ) -> Result<Arc<SCSIDevice>, InventoryError> {
        let name = sent.name_any();
        let api = &self.inner.devices;
        let answer = match part {
            Part::Object => api.replace(&name, &post_params(), sent).await,
            Part::Status => api.replace_status(&name, &post_params(), sent).await,
        };
        match answer {
            Ok(o) => Ok(self.inner.device_cache.remember(strip(o))),
            Err(e) => Err(self.write_failed(&name, wwid, e).await),
        }
    }

    /// Another array's target reports the device's WWID: an Event on the
    /// SCSIDevice (the condition is in its status already).
    fn spawn_target_conflict(&self, dev: &Device, uid: Option<String>) {
        tracing::warn!(wwid = %dev.wwid, conflict = %conflict_message(dev), "SCSIDevice target conflict");
        let Some(events) = self.inner.events.clone() else {
            return;
        };
        let (wwid, note) = (dev.wwid.clone(), conflict_message(dev));
        tokio::spawn(async move { events.target_conflict(wwid.as_str(), uid, note).await });
    }

    /// A probe found data on a new LUN: an Event on the SCSIDevice (its
    /// reason says how to release it).
    fn spawn_holds_data(&self, dev: &Device, uid: Option<String>) {
        let Some(events) = self.inner.events.clone() else {
            return;
        };
        let (wwid, reason) = (dev.wwid.clone(), dev.reason.clone());
        tokio::spawn(async move { events.lun_holds_data(wwid.as_str(), uid, &reason).await });
    }

    fn spawn_wipe_failed(&self, dev: &Device) {
        let (Some(events), Some(binding)) = (self.inner.events.clone(), dev.binding.clone()) else {
            return;
        };
        let (wwid, reason) = (dev.wwid.clone(), dev.reason.clone());
        tokio::spawn(async move {
            events
                .wipe_failed(&binding.volume_name, wwid.as_str(), &reason)
                .await
        });
    }

    pub(super) async fn read_device(&self, wwid: &Wwid) -> Result<Option<Device>, InventoryError> {
        self.wait_until_ready().await?;
        self.device_object(wwid)?
            .map(|o| o.to_device().map_err(|e| store(e.to_string())))
            .transpose()
    }

    pub(super) async fn find_bound_to_name(
        &self,
        name: &str,
    ) -> Result<Option<Device>, InventoryError> {
        self.wait_until_ready().await?;
        self.all_devices()
            .iter()
            .find(|o| {
                o.status
                    .as_ref()
                    .and_then(|s| s.binding.as_ref())
                    .is_some_and(|b| b.volume_name == name)
            })
            .map(|o| o.to_device().map_err(|e| store(e.to_string())))
            .transpose()
    }

    pub(super) async fn page_devices(
        &self,
        after: Option<&Wwid>,
        limit: usize,
    ) -> Result<Vec<Device>, InventoryError> {
        self.wait_until_ready().await?;
        let after = after.map_or("", Wwid::as_str);
        let mut page: Vec<Arc<SCSIDevice>> = self
            .all_devices()
            .into_iter()
            .filter(|o| o.spec.wwid.as_str() > after)
            .collect();
        if page.len() > limit && limit > 0 {
            page.select_nth_unstable_by(limit - 1, |a, b| a.spec.wwid.cmp(&b.spec.wwid));
        }
        page.truncate(limit);
        page.sort_by(|a, b| a.spec.wwid.cmp(&b.spec.wwid));
        page.iter()
            .map(|o| o.to_device().map_err(|e| store(e.to_string())))
            .collect()
    }

    pub(super) async fn page_available(
        &self,
        query: AvailableQuery<'_>,
    ) -> Result<Vec<Device>, InventoryError> {
        self.wait_until_ready().await?;
        let leaving: BTreeSet<String> = self
            .inner
            .target_cache
            .state()
            .iter()
            .filter(|t| t.meta().deletion_timestamp.is_some())
            .map(|t| t.name_any())
            .collect();
        let mut free: Vec<Device> = self
            .all_devices()
            .iter()
            // Marked for deletion, or reached only through targets being
            // deleted: never a new volume's home.
            .filter(|o| {
                o.meta().deletion_timestamp.is_none() && !device_targets(o).is_subset(&leaving)
            })
            .filter(|o| {
                o.status.as_ref().is_some_and(|s| {
                    s.phase == Phase::Available
                        && query
                            .node
                            .is_none_or(|n| s.nodes.iter().any(|v| &v.node == n))
                }) && (query.min..=query.max).contains(&o.spec.size_bytes)
            })
            .filter_map(|o| o.to_device().ok())
            .filter(|d| query.after.as_ref().is_none_or(|a| preference_key(d) > *a))
            .collect();
        if free.len() > query.limit && query.limit > 0 {
            free.select_nth_unstable_by(query.limit - 1, preference);
        }
        free.truncate(query.limit);
        free.sort_by(preference);
        Ok(free)
    }

    pub(super) async fn devices_of_target(
        &self,
        target: &str,
    ) -> Result<Vec<Device>, InventoryError> {
        self.wait_until_ready().await?;
        self.all_devices()
            .iter()
            .filter(|o| {
                o.spec.target == target
                    || o.status.as_ref().is_some_and(|s| {
                        s.nodes.iter().any(|n| n.target == target)
                            || s.conflicts.iter().any(|c| c.target == target)
                    })
            })
            .map(|o| o.to_device().map_err(|e| store(e.to_string())))
            .collect()
    }

    pub(super) async fn write_devices(
        &self,
        writes: Vec<Write>,
    ) -> Result<Vec<Result<Device, InventoryError>>, InventoryError> {
        self.fence()?;
        self.wait_until_ready().await?;
        let mut results = Vec::with_capacity(writes.len());
        for w in writes {
            results.push(match w {
                Write::Create(d) => self.create_device(&d).await,
                Write::Replace(d) => self.write_device(&d).await,
            });
        }
        Ok(results)
    }

    pub(super) async fn delete_device(&self, dev: &Device) -> Result<(), InventoryError> {
        self.fence()?;
        self.wait_until_ready().await?;
        let name = object_name(dev.wwid.as_str());
        // The version read, so a device written since (seen, bound) stays.
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: Some(dev.generation.to_string()),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        match self.inner.devices.delete(&name, &params).await {
            Ok(_) => {
                self.inner.device_cache.forget(&name);
                Ok(())
            }
            Err(e) => Err(self.write_failed(&name, &dev.wwid, e).await),
        }
    }

    pub(super) async fn count_devices(&self) -> Result<Summary, InventoryError> {
        self.wait_until_ready().await?;
        let mut phases: BTreeMap<Phase, u64> = BTreeMap::new();
        let mut largest = 0;
        for obj in self.all_devices() {
            // An object whose status was never written counts as Lost, as it reads.
            let phase = obj.status.as_ref().map_or(Phase::Lost, |s| s.phase);
            *phases.entry(phase).or_default() += 1;
            largest = largest.max(obj.spec.size_bytes);
        }
        Ok(Summary {
            phases: phases.into_iter().collect(),
            largest,
        })
    }
}
