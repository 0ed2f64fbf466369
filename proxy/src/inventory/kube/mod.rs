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
//! One file per concern: `cache` (the read-your-writes overlay over the
//! reflector caches), `devices` (SCSIDevice reads and compare-and-swap
//! writes), `finalizers` (what keeps objects holding live data), `targets`
//! (SCSITarget spec and the status each discovery round writes) and
//! `resizes` (PendingResizeRequest objects).

mod cache;
mod devices;
mod finalizers;
mod resizes;
mod targets;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use self::cache::Cache;
use super::{AvailableQuery, InventoryError, Summary, Write};
use csi_scsi_contract::Wwid;

use crate::device::{Device, DiscoveryRound, ResizeRequest, Target, TargetRefused};
use crate::events::VolumeEvents;
use crate::leader::LeaderHandle;
use crate::reflect::{self, Wake};
use crate::resources::{PendingResizeRequest, SCSIDevice, SCSITarget};

/// Tries of one write against a stale cache before it gives up.
const ATTEMPTS: usize = 8;
/// The reflectors a ready inventory has listed with.
const CACHES: usize = 3;

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
                device_cache: Cache::new(device_store),
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

    /// Refuses a write unless this replica leads (when a leader is set).
    fn fence(&self) -> Result<(), InventoryError> {
        match &self.inner.leader {
            Some(l) if !l.is_leader() => Err(store(
                "this csi-scsi-proxy replica is not the leader; only the leader writes",
            )),
            _ => Ok(()),
        }
    }
}

#[async_trait::async_trait]
impl super::Store for KubeInventory {
    async fn device(&self, wwid: &Wwid) -> Result<Option<Device>, InventoryError> {
        self.read_device(wwid).await
    }

    async fn bound_to_name(&self, name: &str) -> Result<Option<Device>, InventoryError> {
        self.find_bound_to_name(name).await
    }

    async fn devices(
        &self,
        after: Option<&Wwid>,
        limit: usize,
    ) -> Result<Vec<Device>, InventoryError> {
        self.page_devices(after, limit).await
    }

    async fn available(&self, query: AvailableQuery<'_>) -> Result<Vec<Device>, InventoryError> {
        self.page_available(query).await
    }

    async fn of_target(&self, target: &str) -> Result<Vec<Device>, InventoryError> {
        self.devices_of_target(target).await
    }

    async fn put(
        &self,
        writes: Vec<Write>,
    ) -> Result<Vec<Result<Device, InventoryError>>, InventoryError> {
        self.write_devices(writes).await
    }

    async fn delete(&self, device: &Device) -> Result<(), InventoryError> {
        self.delete_device(device).await
    }

    async fn summary(&self) -> Result<Summary, InventoryError> {
        self.count_devices().await
    }

    async fn targets(&self) -> Result<Vec<Target>, InventoryError> {
        self.list_targets().await
    }

    async fn put_target(&self, target: Target) -> Result<(), InventoryError> {
        self.apply_target(target).await
    }

    async fn remove_target(&self, name: &str) -> Result<(), InventoryError> {
        self.delete_target(name).await
    }

    async fn resizes(&self) -> Result<Vec<ResizeRequest>, InventoryError> {
        self.list_resizes().await
    }

    async fn put_resize(&self, request: ResizeRequest) -> Result<(), InventoryError> {
        self.write_resize(request).await
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
}

impl Drop for Inner {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// What no reader of the caches needs (and a large share of each object).
fn drop_managed_fields<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

fn strip<K: Resource>(mut obj: K) -> K {
    obj.meta_mut().managed_fields = None;
    obj
}

fn store(msg: impl Into<String>) -> InventoryError {
    InventoryError::Store(msg.into())
}

/// Says whether a failed API request may succeed when retried.
fn api_error(e: kube::Error) -> InventoryError {
    match &e {
        kube::Error::Api(s) if s.code == 429 || s.code >= 500 => InventoryError::ApiUnavailable(e),
        kube::Error::Api(_) => InventoryError::ApiRefused(e),
        // No answer: the connection failed or broke off.
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
            InventoryError::ApiUnavailable(e)
        }
        // An answer this client could not read, or a request it could
        // not build: a defect.
        _ => InventoryError::ApiRefused(e),
    }
}

/// Runs `attempt` until the API server answers it with anything but 409
/// Conflict (a stale read: `attempt` reads afresh on its next try), at
/// most [`ATTEMPTS`] times, pausing `pause` after each conflict. `None`
/// when every try met a conflict.
async fn retry_on_conflict<T, Try>(
    pause: Duration,
    mut attempt: impl FnMut(usize) -> Try,
) -> Option<Result<T, kube::Error>>
where
    Try: Future<Output = Result<T, kube::Error>>,
{
    for n in 0..ATTEMPTS {
        match attempt(n).await {
            Err(kube::Error::Api(s)) if s.code == 409 => {
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
            outcome => return Some(outcome),
        }
    }
    None
}
