//! The Kubernetes inventory: SCSITarget, SCSIDevice and PendingResizeRequest
//! objects in the API server (etcd is the store). Reads come from
//! kube-runtime reflector caches, never a LIST per call. Writes carry the
//! resourceVersion the caller read, so every device write is a
//! compare-and-swap: the API server answers 409 when another write came
//! first. A device's facts (size, vendor, labels) are its spec; its state
//! (phase, binding, nodes) is its status, written through the status
//! subresource, so a bind is one status replace.
//!
//! `Device::generation` carries the resourceVersion. The API server's
//! resourceVersions are decimal etcd revisions; one that is not is
//! refused as a store error rather than guessed at.
//!
//! Finalizers keep what holds live data: `csi-scsi.io/bound-volume` on a
//! device a volume lives on, `csi-scsi.io/target-in-use` on a target such a
//! device is reached through. A `kubectl delete` of either only marks it
//! until the volume is released.
//!
//! The cache lags the API server by one watch event. So that a caller
//! reads its own writes (bind, then publish), every object this backend
//! writes or re-reads after a 409 is kept in a small overlay until the
//! watch delivers that version or a newer one.

use crate::reflect::Wake;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ObjectMeta, Patch, Preconditions};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{InventoryError, Summary, Write};
use crate::device::policy::{self, PreferenceKey, preference, preference_key};
use crate::device::{Device, DiscoveryRound, Phase, ResizeRequest, Target, TargetRefused};
use crate::events::{ClaimRef, VolumeEvents};
use crate::kube_wiring::{patch_params, post_params};
use crate::leader::LeaderHandle;
use crate::reflect;
use crate::resources::{
    DEVICE_FINALIZER, PendingResizeRequest, PendingResizeRequestSpec, PendingResizeRequestStatus,
    SCSIDevice, SCSIDeviceSpec, SCSIDeviceStatus, SCSITarget, SCSITargetSpec, SCSITargetStatus,
    TARGET_FINALIZER, TargetNodeStatus, conflict_message, object_name,
};

/// Tries of a target write against a stale cache.
const ATTEMPTS: usize = 8;
/// How long an overlay entry may wait for the watch before it is dropped
/// (the object was deleted, or the watch is down and will relist).
const OVERLAY_TTL: Duration = Duration::from_secs(60);
/// The reflectors a ready inventory has listed with.
const CACHES: usize = 3;
/// Annotation keeping a resize request's own name when the object name had
/// to be mapped.
const REQUEST_NAME_ANNOTATION: &str = "csi-scsi.io/request-name";

/// How the backend is set up.
#[derive(Clone)]
pub struct KubeInventoryConfig {
    /// Namespace for a PendingResizeRequest whose PVC cannot be found.
    pub namespace: String,
    /// How long a read waits for the caches' first list.
    pub sync_timeout: Duration,
    /// When set, writes are refused unless it leads (a fence behind the
    /// gRPC gate).
    pub leader: Option<LeaderHandle>,
    /// When set, Events for the transitions it writes (wipe failed, resize
    /// pending, resize completed).
    pub events: Option<VolumeEvents>,
}

/// The Kubernetes-backed inventory. Cheap to clone.
#[derive(Clone)]
pub struct KubeInventory {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    config: KubeInventoryConfig,
    devices: Api<SCSIDevice>,
    targets: Api<SCSITarget>,
    device_cache: Cache<SCSIDevice>,
    target_cache: Store<SCSITarget>,
    resize_cache: Store<PendingResizeRequest>,
    targets_changed: Arc<Notify>,
    /// How many of the three caches have listed once.
    synced: watch::Sender<usize>,
    leader: Option<LeaderHandle>,
    events: Option<VolumeEvents>,
    /// UIDs of bound devices whose deletion request was reported already.
    delete_reported: Mutex<HashSet<String>>,
    tasks: Vec<JoinHandle<()>>,
}

/// A reflector store plus the objects written since the watch last caught up.
struct Cache<K: Resource<DynamicType = ()> + Clone + 'static> {
    store: Store<K>,
    recent: Mutex<HashMap<String, (Arc<K>, Instant)>>,
}

// === impl KubeInventory ===

impl KubeInventory {
    /// Starts the three reflectors and returns at once; reads wait for the
    /// first list (up to `sync_timeout`).
    pub fn start(client: Client, config: KubeInventoryConfig) -> Self {
        let devices: Api<SCSIDevice> = Api::all(client.clone());
        let targets: Api<SCSITarget> = Api::all(client.clone());
        let resizes: Api<PendingResizeRequest> = Api::all(client.clone());
        let (device_store, device_writer) = reflector::store();
        let (target_store, target_writer) = reflector::store();
        let (resize_store, resize_writer) = reflector::store();
        let targets_changed = Arc::new(Notify::new());
        let (leader, events) = (config.leader.clone(), config.events.clone());
        // How many caches have listed once. A watch channel, not the
        // stores' own `wait_until_ready`: that one wakes only the last of
        // several concurrent waiters.
        let (synced, _) = watch::channel(0usize);
        let all = watcher::Config::default;
        let tasks = vec![
            reflect::spawn(
                devices.clone(),
                all(),
                device_writer,
                drop_managed_fields,
                Wake::Nobody,
                synced.clone(),
            ),
            reflect::spawn(
                targets.clone(),
                all(),
                target_writer,
                drop_managed_fields,
                Wake::SpecChange(targets_changed.clone()),
                synced.clone(),
            ),
            reflect::spawn(
                resizes,
                all(),
                resize_writer,
                drop_managed_fields,
                Wake::Nobody,
                synced.clone(),
            ),
        ];
        Self {
            inner: Arc::new(Inner {
                client,
                config,
                devices,
                targets,
                device_cache: Cache {
                    store: device_store,
                    recent: Mutex::new(HashMap::new()),
                },
                target_cache: target_store,
                resize_cache: resize_store,
                targets_changed,
                synced,
                leader,
                events,
                delete_reported: Mutex::new(HashSet::new()),
                tasks,
            }),
        }
    }

    /// Notified whenever an SCSITarget is added, changed or removed, and
    /// after each (re)list: the trigger for a discovery pass.
    pub fn targets_changed(&self) -> Arc<Notify> {
        self.inner.targets_changed.clone()
    }

    /// Whether every cache has listed once (a readiness check).
    pub fn is_synced(&self) -> bool {
        *self.inner.synced.borrow() >= CACHES
    }

    /// Waits until every cache has listed once.
    pub async fn wait_until_ready(&self) -> Result<(), InventoryError> {
        let i = &self.inner;
        let mut rx = i.synced.subscribe();
        match tokio::time::timeout(i.config.sync_timeout, rx.wait_for(|n| *n >= CACHES)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(store("the watch caches stopped")),
            Err(_) => Err(store(format!(
                "the csi-scsi.io watch caches did not sync within {:?}: are the CRDs installed (kubectl apply -k deploy/crds) and may the proxy list them?",
                i.config.sync_timeout
            ))),
        }
    }

    fn fence(&self) -> Result<(), InventoryError> {
        match &self.inner.leader {
            Some(l) if !l.is_leader() => Err(store(
                "this csi-scsi-proxy replica is not the leader; only the leader writes",
            )),
            _ => Ok(()),
        }
    }

    /// Every device, cache and overlay merged.
    fn all_devices(&self) -> Vec<Arc<SCSIDevice>> {
        self.inner.device_cache.all()
    }

    /// The current object of `wwid`, if any (checked against a name collision).
    fn device_object(&self, wwid: &str) -> Result<Option<Arc<SCSIDevice>>, InventoryError> {
        match self.inner.device_cache.get(&object_name(wwid)) {
            Some(obj) if obj.spec.wwid != wwid => Err(store(format!(
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
        let name = object_name(&dev.wwid);
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
            let sent = want.clone();
            latest = match self
                .inner
                .devices
                .replace(&name, &post_params(), &sent)
                .await
            {
                Ok(o) => self.inner.device_cache.remember(strip(o)),
                Err(e) => return Err(self.write_failed(&name, &dev.wwid, e).await),
            };
        }
        if want.status != latest.status {
            let mut sent = (*latest).clone();
            sent.status = want.status.clone();
            latest = match self
                .inner
                .devices
                .replace_status(&name, &post_params(), &sent)
                .await
            {
                Ok(o) => self.inner.device_cache.remember(strip(o)),
                Err(e) => return Err(self.write_failed(&name, &dev.wwid, e).await),
            };
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
    async fn write_failed(&self, name: &str, wwid: &str, e: kube::Error) -> InventoryError {
        match &e {
            kube::Error::Api(s) if s.code == 409 => {
                if let Err(re) = self.refresh(name).await {
                    tracing::warn!(%wwid, error = %re, "re-read after a conflict failed");
                }
                InventoryError::Conflict(wwid.to_owned())
            }
            kube::Error::Api(s) if s.code == 404 => InventoryError::NotFound(wwid.to_owned()),
            _ => api_error(e),
        }
    }

    /// Creates the object of a device first seen, then writes its status.
    async fn create_device(&self, dev: &Device) -> Result<Device, InventoryError> {
        let name = object_name(&dev.wwid);
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
        match self
            .inner
            .devices
            .replace_status(&name, &post_params(), &with_status)
            .await
        {
            Ok(o) => self
                .inner
                .device_cache
                .remember(strip(o))
                .to_device()
                .map_err(|e| store(e.to_string())),
            Err(e) => Err(self.write_failed(&name, &dev.wwid, e).await),
        }
    }

    /// Takes the bound-volume finalizer off a device that holds no volume
    /// (best effort: the sweep after each discovery round retries). The
    /// new version, unless the object is now deleted.
    async fn drop_device_finalizer(&self, obj: &SCSIDevice) -> Option<Arc<SCSIDevice>> {
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
    async fn sync_target_finalizer(&self, target: &str) {
        let in_use = self
            .all_devices()
            .iter()
            .filter(|o| device_targets(o).contains(target))
            .any(|o| o.to_device().is_ok_and(|d| policy::holds_volume(&d)));
        let key = reflector::ObjectRef::new(target);
        let mut current = self.inner.target_cache.get(&key);
        for _ in 0..ATTEMPTS {
            let object = match current.take() {
                Some(o) => o,
                None => match self.inner.targets.get_opt(target).await {
                    Ok(Some(o)) => Arc::new(o),
                    Ok(None) => return,
                    Err(e) => {
                        tracing::warn!(%target, error = %e, "could not read the SCSITarget for its finalizer");
                        return;
                    }
                },
            };
            let has = has_finalizer(&*object, TARGET_FINALIZER);
            // No new finalizer on a target being deleted (the server
            // refuses it); one kept from before stays while in use.
            let want = in_use && (has || object.meta().deletion_timestamp.is_none());
            if want == has {
                return;
            }
            let mut next = (*object).clone();
            set_finalizer(&mut next.metadata, TARGET_FINALIZER, want);
            match self
                .inner
                .targets
                .replace(target, &post_params(), &next)
                .await
            {
                Ok(_) => {
                    tracing::info!(%target, in_use, "SCSITarget in-use finalizer updated");
                    return;
                }
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(kube::Error::Api(s)) if s.code == 404 => return,
                Err(e) => {
                    tracing::warn!(%target, error = %e, "could not update the SCSITarget's in-use finalizer");
                    return;
                }
            }
        }
        tracing::warn!(%target, "SCSITarget finalizer not updated: it kept changing");
    }

    /// After a round: every device of the target carries the finalizer
    /// exactly while it holds a volume (records from before finalizers,
    /// removals that failed), the target its own; and a deletion asked of
    /// a bound device is reported once.
    async fn sweep_finalizers(&self, target: &str) {
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
            tokio::spawn(async move { events.bound_device_delete_requested(&volume, &wwid).await });
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
        tokio::spawn(async move { events.target_conflict(&wwid, uid, note).await });
    }

    /// A probe found data on a new LUN: an Event on the SCSIDevice (its
    /// reason says how to release it).
    fn spawn_holds_data(&self, dev: &Device, uid: Option<String>) {
        let Some(events) = self.inner.events.clone() else {
            return;
        };
        let (wwid, reason) = (dev.wwid.clone(), dev.reason.clone());
        tokio::spawn(async move { events.lun_holds_data(&wwid, uid, &reason).await });
    }

    fn spawn_wipe_failed(&self, dev: &Device) {
        let (Some(events), Some(binding)) = (self.inner.events.clone(), dev.binding.clone()) else {
            return;
        };
        let (wwid, reason) = (dev.wwid.clone(), dev.reason.clone());
        tokio::spawn(async move {
            events
                .wipe_failed(&binding.volume_name, &wwid, &reason)
                .await
        });
    }

    /// Writes what the round saw into the target's status (best effort).
    async fn write_target_status(&self, round: &DiscoveryRound, mut conflicts: Vec<String>) {
        let mut nodes: Vec<TargetNodeStatus> = round
            .answered
            .iter()
            .map(|(node, luns)| TargetNodeStatus {
                node: node.clone(),
                answered: true,
                luns: u32::try_from(luns.len()).unwrap_or(u32::MAX),
            })
            .chain(round.unanswered.iter().map(|node| TargetNodeStatus {
                node: node.clone(),
                answered: false,
                luns: 0,
            }))
            .collect();
        nodes.sort_by(|a, b| a.node.cmp(&b.node));
        conflicts.sort();
        conflicts.dedup();
        let answered = u32::try_from(round.answered.len()).unwrap_or(u32::MAX);
        let phase = match (round.answered.is_empty(), round.unanswered.is_empty()) {
            (false, true) => "Ready",
            (false, false) => "Degraded",
            (true, _) => "Unreachable",
        };
        let now = Timestamp::now();
        let previous = self
            .inner
            .target_cache
            .get(&reflector::ObjectRef::new(&round.target))
            .and_then(|t| t.status.clone());
        let discovered = answered > 0;
        let status = SCSITargetStatus {
            phase: Some(phase.into()),
            reachable_nodes: answered,
            nodes,
            label_conflicts: conflicts,
            last_discovery: Some(Time(now)),
            conditions: vec![condition(
                previous
                    .as_ref()
                    .map(|s| s.conditions.as_slice())
                    .unwrap_or_default(),
                "Discovered",
                discovered,
                if discovered {
                    "AgentsAnswered"
                } else {
                    "NoAgentAnswered"
                },
                format!(
                    "{answered} of {} nodes answered",
                    round.answered.len() + round.unanswered.len()
                ),
                now,
            )],
        };
        self.replace_target_status(&round.target, status).await;
    }

    /// Says in the target's status that it was refused: phase
    /// `Refused`, condition `Discovered` False with the reason. What the
    /// last pass saw (nodes, LUN counts) stays as it was.
    async fn write_target_refused(&self, refused: &TargetRefused) {
        let now = Timestamp::now();
        let mut status = self
            .inner
            .target_cache
            .get(&reflector::ObjectRef::new(refused.target()))
            .and_then(|t| t.status.clone())
            .unwrap_or_default();
        let discovered = condition(
            &status.conditions,
            "Discovered",
            false,
            refused.reason(),
            refused.to_string(),
            now,
        );
        status.phase = Some("Refused".into());
        status.conditions.retain(|c| c.type_ != "Discovered");
        status.conditions.push(discovered);
        self.replace_target_status(refused.target(), status).await;
    }

    /// Replaces target `name`'s status with `status` (best effort).
    async fn replace_target_status(&self, name: &str, status: SCSITargetStatus) {
        // The whole status replaces the stored one: the empty fields it
        // skips (no conflicts left, no nodes) must clear, and a JSON merge
        // patch would leave them as they were.
        let mut current = self
            .inner
            .target_cache
            .get(&reflector::ObjectRef::new(name));
        for _ in 0..ATTEMPTS {
            let object = match current.take() {
                Some(o) => o,
                None => match self.inner.targets.get_opt(name).await {
                    Ok(Some(o)) => Arc::new(o),
                    // Removed meanwhile: nothing to report on.
                    Ok(None) => return,
                    Err(e) => {
                        tracing::warn!(target = %name, error = %e, "could not read the SCSITarget to write its status");
                        return;
                    }
                },
            };
            let mut next = (*object).clone();
            next.status = Some(status.clone());
            match self
                .inner
                .targets
                .replace_status(name, &post_params(), &next)
                .await
            {
                Ok(_) => return,
                // The cache was behind: read the object afresh and retry.
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(kube::Error::Api(s)) if s.code == 404 => return,
                Err(e) => {
                    tracing::warn!(target = %name, error = %e, "could not write the SCSITarget status");
                    return;
                }
            }
        }
        tracing::warn!(target = %name, "SCSITarget status not written: it kept changing");
    }

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
}

#[async_trait::async_trait]
impl super::Store for KubeInventory {
    async fn put_target(&self, target: Target) -> Result<(), InventoryError> {
        self.fence()?;
        self.wait_until_ready().await?;
        let spec = SCSITargetSpec::from_target(&target);
        for _ in 0..ATTEMPTS {
            let current = self
                .inner
                .target_cache
                .get(&reflector::ObjectRef::new(&target.name));
            let result = match current {
                Some(obj) if obj.spec == spec => return Ok(()),
                Some(obj) => {
                    let mut next = (*obj).clone();
                    next.spec = spec.clone();
                    self.inner
                        .targets
                        .replace(&target.name, &post_params(), &next)
                        .await
                }
                None => {
                    let obj = SCSITarget::new(&target.name, spec.clone());
                    self.inner.targets.create(&post_params(), &obj).await
                }
            };
            match result {
                Ok(_) => return Ok(()),
                // A stale cache: wait for the watch and try again.
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    tokio::time::sleep(Duration::from_millis(200)).await
                }
                Err(e) => return Err(api_error(e)),
            }
        }
        Err(InventoryError::Conflict(target.name))
    }

    async fn remove_target(&self, name: &str) -> Result<(), InventoryError> {
        self.fence()?;
        match self
            .inner
            .targets
            .delete(name, &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(api_error(e)),
        }
    }

    async fn targets(&self) -> Result<Vec<Target>, InventoryError> {
        self.wait_until_ready().await?;
        let mut all: Vec<Target> = self
            .inner
            .target_cache
            .state()
            .iter()
            .filter_map(|t| {
                t.to_target()
                    .inspect_err(|e| tracing::warn!(error = %e, "SCSITarget skipped"))
                    .ok()
            })
            .collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }

    async fn device(&self, wwid: &str) -> Result<Option<Device>, InventoryError> {
        self.wait_until_ready().await?;
        self.device_object(wwid)?
            .map(|o| o.to_device().map_err(|e| store(e.to_string())))
            .transpose()
    }

    async fn bound_to_name(&self, name: &str) -> Result<Option<Device>, InventoryError> {
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

    async fn devices(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Device>, InventoryError> {
        self.wait_until_ready().await?;
        let after = after.unwrap_or("");
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

    async fn available(
        &self,
        node: Option<&str>,
        min: u64,
        max: u64,
        after: Option<PreferenceKey>,
        limit: usize,
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
                        && node.is_none_or(|n| s.nodes.iter().any(|v| v.node == n))
                }) && (min..=max).contains(&o.spec.size_bytes)
            })
            .filter_map(|o| o.to_device().ok())
            .filter(|d| after.as_ref().is_none_or(|a| preference_key(d) > *a))
            .collect();
        if free.len() > limit && limit > 0 {
            free.select_nth_unstable_by(limit - 1, preference);
        }
        free.truncate(limit);
        free.sort_by(preference);
        Ok(free)
    }

    async fn of_target(&self, target: &str) -> Result<Vec<Device>, InventoryError> {
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

    async fn put(
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

    async fn delete(&self, dev: &Device) -> Result<(), InventoryError> {
        self.fence()?;
        self.wait_until_ready().await?;
        let name = object_name(&dev.wwid);
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

    async fn summary(&self) -> Result<Summary, InventoryError> {
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

    async fn discovery_done(&self, round: &DiscoveryRound, label_conflicts: Vec<String>) {
        self.write_target_status(round, label_conflicts).await;
        if self.fence().is_ok() {
            self.sweep_finalizers(&round.target).await;
        }
    }

    async fn target_refused(&self, refused: &TargetRefused) {
        self.write_target_refused(refused).await;
    }

    async fn put_resize(&self, r: ResizeRequest) -> Result<(), InventoryError> {
        self.fence()?;
        self.wait_until_ready().await?;
        let volume_name = self
            .device_object(&r.wwid)?
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

    async fn resizes(&self) -> Result<Vec<ResizeRequest>, InventoryError> {
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

impl Drop for Inner {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

// === impl Cache ===

impl<K> Cache<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    /// The newest version of `name` known to this process.
    fn get(&self, name: &str) -> Option<Arc<K>> {
        let cached = self.store.get(&reflector::ObjectRef::new(name));
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        match (cached, recent.get(name)) {
            (cached, Some((mine, at))) => {
                if at.elapsed() > OVERLAY_TTL
                    || cached
                        .as_ref()
                        .is_some_and(|c| version(&**c) >= version(&**mine))
                {
                    recent.remove(name);
                    cached
                } else {
                    Some(mine.clone())
                }
            }
            (cached, None) => cached,
        }
    }

    /// Every object, the overlay's versions where newer.
    fn all(&self) -> Vec<Arc<K>> {
        let mut by_name: HashMap<String, Arc<K>> = self
            .store
            .state()
            .into_iter()
            .map(|o| (o.name_any(), o))
            .collect();
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent.retain(|name, (mine, at)| {
            let stale = at.elapsed() > OVERLAY_TTL
                || by_name
                    .get(name)
                    .is_some_and(|c| version(&**c) >= version(&**mine));
            if !stale {
                by_name.insert(name.clone(), mine.clone());
            }
            !stale
        });
        by_name.into_values().collect()
    }

    /// Drops the overlay's version of `name` (the object is being deleted).
    fn forget(&self, name: &str) {
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent.remove(name);
    }

    /// Keeps a version this process wrote or re-read.
    fn remember(&self, obj: K) -> Arc<K> {
        let obj = Arc::new(obj);
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent.insert(obj.name_any(), (obj.clone(), Instant::now()));
        obj
    }
}

// === helpers ===

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

/// The targets a device is reached through: those of its node views (what
/// `targets_for` hands attach and detach) and the one that first reported it.
fn device_targets(obj: &SCSIDevice) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = obj
        .status
        .iter()
        .flat_map(|s| s.nodes.iter().map(|v| v.target.clone()))
        .collect();
    names.insert(obj.spec.target.clone());
    names
}

fn has_finalizer<K: Resource>(obj: &K, finalizer: &str) -> bool {
    obj.meta()
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == finalizer))
}

/// Adds or removes `finalizer`, leaving any other's in place.
fn set_finalizer(meta: &mut ObjectMeta, finalizer: &str, present: bool) {
    let mut list = meta.finalizers.take().unwrap_or_default();
    list.retain(|f| f != finalizer);
    if present {
        list.push(finalizer.to_owned());
    }
    meta.finalizers = (!list.is_empty()).then_some(list);
}

/// What no reader of the caches needs (and a large share of each object).
fn drop_managed_fields<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

fn strip<K: Resource>(mut obj: K) -> K {
    obj.meta_mut().managed_fields = None;
    obj
}

/// The resourceVersion as a number (0 when absent or opaque: never newer).
fn version<K: Resource>(obj: &K) -> u64 {
    obj.meta()
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn store(msg: impl Into<String>) -> InventoryError {
    InventoryError::Store(msg.into())
}

fn api_error(e: kube::Error) -> InventoryError {
    InventoryError::Store(format!("Kubernetes API: {e}"))
}

/// A condition that keeps its transition time while its status holds.
fn condition(
    previous: &[Condition],
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    now: Timestamp,
) -> Condition {
    let status = if ok { "True" } else { "False" };
    let transition = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time: transition,
        observed_generation: None,
    }
}
