//! The device inventory: which LUN is free and which is bound to which
//! volume. [`Inventory`] applies the life cycle (`crate::device::policy`)
//! over a thin [`Store`]: `embedded` (SQLite) or `kube` (custom
//! resources), which only read and write. The proxy is its only writer;
//! every write is a compare-and-swap on the device's generation, and a lost
//! race re-reads and applies the same policy again.

mod embedded;
mod kube;
mod store;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use csi_scsi_contract::{NodeName, Wwid};

pub use embedded::EmbeddedInventory;
pub use kube::{KubeInventory, KubeInventoryConfig};
pub use store::{AvailableQuery, Store, Summary, Write};

use crate::device::policy::{self, Change};
use crate::device::{
    BindRequest, Device, DiscoveryOutcome, DiscoveryRound, Phase, ResizeRequest, Target,
    TargetRefused,
};
use crate::selector::Selector;

/// Tries of one write against fresh state before it reports a conflict.
const ATTEMPTS: usize = 8;
/// How many candidates one store read returns.
const PAGE: usize = 64;

/// Why an inventory operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InventoryError {
    /// No Available device satisfies the request.
    #[error("no available device fits: {0}")]
    NoFit(String),
    /// The device changed since it was read (another writer won); re-read.
    #[error("device {0} changed concurrently")]
    Conflict(Wwid),
    /// A target kept changing under a write (another writer won each try).
    #[error("target {0} changed concurrently")]
    TargetConflict(String),
    /// No such device, or not bound to the given binding.
    #[error("no device {0}")]
    NotFound(Wwid),
    /// The backing store failed: a defect, or a record it cannot read.
    #[error("inventory store: {0}")]
    Store(String),
    /// SQLite failed in a way that is neither a full nor an unwritable file
    /// system (see `StoreFull`, `StoreUnwritable`).
    #[error("inventory store: {0}")]
    Sqlite(#[source] rusqlite::Error),
    /// The Kubernetes API server refused the request (403 Forbidden: the
    /// proxy's RBAC; 422: an object it will not take): retrying does not
    /// help until the deployment or the code changes.
    #[error("inventory store: Kubernetes API: {0}")]
    ApiRefused(#[source] ::kube::Error),
    /// The Kubernetes API server did not answer, or answered that it cannot
    /// serve now (429, 5xx): a retry may succeed.
    #[error("inventory store: Kubernetes API: {0}")]
    ApiUnavailable(#[source] ::kube::Error),
    /// The store's file system is full: writes fail until space is freed.
    #[error("inventory store is full (no space left on its file system): {0}")]
    StoreFull(String),
    /// The store refuses writes: its file system is read-only or failing.
    #[error("inventory store cannot be written (read-only or failing file system): {0}")]
    StoreUnwritable(String),
}

/// The inventory over one store. Safe to share; binds of this process are
/// serialised (other writers are kept out by the compare-and-swap).
pub struct Inventory {
    store: Arc<dyn Store>,
    bind_lock: tokio::sync::Mutex<()>,
    /// Bumped when discovery writes a LUN that awaits proof or a wipe of
    /// its target's policy, so the workers need not wait for their scan.
    lun_work: tokio::sync::watch::Sender<u64>,
}

// === impl Inventory ===

impl Inventory {
    /// The inventory kept in `store`.
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            bind_lock: tokio::sync::Mutex::new(()),
            lun_work: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Changes whenever discovery wrote a LUN that awaits a probe
    /// (`policy::await_proof`) or a wipe its target asks for.
    pub fn lun_work(&self) -> tokio::sync::watch::Receiver<u64> {
        self.lun_work.subscribe()
    }

    /// All targets.
    pub async fn targets(&self) -> Result<Vec<Target>, InventoryError> {
        self.store.targets().await
    }

    /// Adds or replaces a target.
    pub async fn put_target(&self, target: Target) -> Result<(), InventoryError> {
        self.store.put_target(target).await
    }

    /// Removes a target (its devices stay; discovery marks them Lost).
    pub async fn remove_target(&self, name: &str) -> Result<(), InventoryError> {
        self.store.remove_target(name).await
    }

    /// One device by WWID.
    pub async fn device(&self, wwid: &Wwid) -> Result<Option<Device>, InventoryError> {
        self.store.device(wwid).await
    }

    /// The device bound to volume `name` (the CreateVolume name), if any.
    pub async fn bound_to_name(&self, name: &str) -> Result<Option<Device>, InventoryError> {
        self.store.bound_to_name(name).await
    }

    /// Devices in WWID order after `after`, at most `limit`.
    pub async fn devices(
        &self,
        after: Option<&Wwid>,
        limit: usize,
    ) -> Result<Vec<Device>, InventoryError> {
        self.store.devices(after, limit).await
    }

    /// Every device a release worker is to wipe (`policy::wipe_due`:
    /// releasing, not retired), by WWID, with its operator's retry request
    /// (`Device::retry_wipe`).
    pub async fn releasing(&self) -> Result<BTreeMap<Wwid, String>, InventoryError> {
        let mut out = BTreeMap::new();
        let mut after: Option<Wwid> = None;
        loop {
            let page = self.store.devices(after.as_ref(), 500).await?;
            out.extend(
                page.iter()
                    .filter(|d| policy::wipe_due(d))
                    .map(|d| (d.wwid.clone(), d.retry_wipe.clone())),
            );
            match page.last() {
                Some(last) if page.len() == 500 => after = Some(last.wwid.clone()),
                _ => return Ok(out),
            }
        }
    }

    /// The WWIDs of every device that awaits a probe proving it blank
    /// (`policy::await_proof`), in WWID order.
    pub async fn awaiting_proof(&self) -> Result<Vec<Wwid>, InventoryError> {
        self.wwids_where(policy::await_proof).await
    }

    async fn wwids_where(&self, pick: fn(&Device) -> bool) -> Result<Vec<Wwid>, InventoryError> {
        let mut out = Vec::new();
        let mut after: Option<Wwid> = None;
        loop {
            let page = self.store.devices(after.as_ref(), 500).await?;
            out.extend(page.iter().filter(|d| pick(d)).map(|d| d.wwid.clone()));
            match page.last() {
                Some(last) if page.len() == 500 => after = Some(last.wwid.clone()),
                _ => return Ok(out),
            }
        }
    }

    /// Count of devices per phase.
    pub async fn phase_counts(&self) -> Result<Vec<(Phase, u64)>, InventoryError> {
        Ok(self.store.summary().await?.phases)
    }

    /// The largest size of any device, any phase (for OUT_OF_RANGE).
    pub async fn largest_size(&self) -> Result<u64, InventoryError> {
        Ok(self.store.summary().await?.largest)
    }

    /// All resize requests.
    pub async fn resizes(&self) -> Result<Vec<ResizeRequest>, InventoryError> {
        self.store.resizes().await
    }

    /// Records or updates a resize request.
    pub async fn put_resize(&self, request: ResizeRequest) -> Result<(), InventoryError> {
        self.store.put_resize(request).await
    }

    /// The bytes of every device [`policy::free_for`] `selector` from any
    /// of `nodes` (empty: anywhere) of `min_bytes` or more, and the size of
    /// the largest: what a bind could take (one LUN per volume, so a claim
    /// fits when the largest does, not the sum).
    pub async fn capacity(
        &self,
        nodes: &[NodeName],
        selector: &Selector,
        min_bytes: u64,
    ) -> Result<(u64, u64), InventoryError> {
        let mut seen = BTreeSet::new();
        let (mut total, mut largest) = (0u64, 0u64);
        for scope in scopes(nodes.iter()) {
            let mut after = None;
            loop {
                let page = self
                    .store
                    .available(AvailableQuery {
                        node: scope,
                        min: min_bytes,
                        max: u64::MAX,
                        after,
                        limit: PAGE,
                    })
                    .await?;
                for d in &page {
                    if policy::free_for(d, selector, scope) && seen.insert(d.wwid.clone()) {
                        total = total.saturating_add(d.size_bytes);
                        largest = largest.max(d.size_bytes);
                    }
                }
                after = page.last().map(policy::preference_key);
                if page.len() < PAGE {
                    break;
                }
            }
        }
        Ok((total, largest))
    }

    /// Binds the device the policy prefers for `request`, trying the
    /// preferred nodes in order. A binding of the same name that exists
    /// already is returned instead (the caller re-checks its parameters).
    pub async fn bind(&self, request: BindRequest) -> Result<Device, InventoryError> {
        let serial = self.bind_lock.lock().await;
        // The last try's conflict is the answer.
        let mut attempt = 0;
        loop {
            attempt += 1;
            if let Some(existing) = self
                .store
                .bound_to_name(&request.binding.volume_name)
                .await?
            {
                return Ok(existing);
            }
            let Some(mut dev) = self.pick(&request).await? else {
                return Err(InventoryError::NoFit(policy::no_fit(&request)));
            };
            if crate::fault::injected(crate::fault::Fault::SkipCas) {
                drop(serial);
                return self.bind_without_cas(dev, request).await;
            }
            policy::bind(&mut dev, request.binding.clone());
            match self.write(Write::Replace(dev)).await {
                Err(InventoryError::Conflict(w)) if attempt < ATTEMPTS => {
                    tracing::info!(wwid = %w, volume = %request.binding.volume_name, "bind lost a race; picking again");
                }
                other => return other,
            }
        }
    }

    /// Writes `device` if its generation is still `device.generation`;
    /// returns the stored result (generation bumped).
    pub async fn update(&self, device: Device) -> Result<Device, InventoryError> {
        self.write(Write::Replace(device)).await
    }

    /// Reads device `wwid`, applies `change` and writes it with
    /// compare-and-swap; a lost race re-reads and applies `change` again.
    /// `change` returns whether there is anything to write. `Ok(None)`: no
    /// such device.
    pub async fn modify(
        &self,
        wwid: &Wwid,
        mut change: impl FnMut(&mut Device) -> bool + Send,
    ) -> Result<Option<Device>, InventoryError> {
        self.try_modify(wwid, |d| Ok::<_, InventoryError>(change(d)))
            .await
    }

    /// As [`Self::modify`], where `change` may refuse: it judges the state
    /// each attempt read, which is the state that attempt writes, so a
    /// check made there cannot go stale before the write. A refusal ends
    /// the edit with nothing written.
    pub async fn try_modify<E: From<InventoryError>>(
        &self,
        wwid: &Wwid,
        mut change: impl FnMut(&mut Device) -> Result<bool, E> + Send,
    ) -> Result<Option<Device>, E> {
        for _ in 0..ATTEMPTS {
            let Some(mut dev) = self.store.device(wwid).await? else {
                return Ok(None);
            };
            if !change(&mut dev)? {
                return Ok(Some(dev));
            }
            match self.write(Write::Replace(dev)).await {
                Err(InventoryError::Conflict(_)) => continue,
                other => return Ok(other.map(Some)?),
            }
        }
        Err(InventoryError::Conflict(wwid.clone()).into())
    }

    /// Merges one target's discovery round by WWID, no node known gone,
    /// forgetting nothing.
    pub async fn apply_discovery(
        &self,
        round: DiscoveryRound,
    ) -> Result<DiscoveryOutcome, InventoryError> {
        self.apply_discovery_pruning(round, &|_| false, None).await
    }

    /// As [`Self::apply_discovery`], and drops the views of every node
    /// `gone` says has left the cluster (the directory's verdict: only a
    /// deleted Node is gone, an unreachable one is not), and removes the
    /// devices `policy::forgettable` after `forget_after` seconds (`None`:
    /// never).
    ///
    /// Each device is read and written on its own account: one that fails
    /// is in the outcome's `failed` (and logged), and the others are merged
    /// all the same. `Err` only when the target's devices cannot be listed,
    /// so nothing of the round can be told apart from a new device.
    pub async fn apply_discovery_pruning(
        &self,
        round: DiscoveryRound,
        gone: &(dyn Fn(&NodeName) -> bool + Send + Sync),
        forget_after: Option<i64>,
    ) -> Result<DiscoveryOutcome, InventoryError> {
        let by_wwid = policy::reports_by_wwid(&round);
        let mut known: BTreeMap<Wwid, Device> = self
            .store
            .of_target(&round.target)
            .await?
            .into_iter()
            .map(|d| (d.wwid.clone(), d))
            .collect();
        let mut out = DiscoveryOutcome::default();
        // Reported WWIDs whose record could not be read: never taken for new.
        let mut unread = BTreeSet::new();
        for wwid in by_wwid.keys() {
            if known.contains_key(*wwid) {
                continue;
            }
            match self.store.device(wwid).await {
                Ok(Some(d)) => {
                    known.insert(d.wwid.clone(), d);
                }
                Ok(None) => {}
                Err(e) => {
                    unread.insert((*wwid).clone());
                    failed(&mut out, &round, wwid, &e);
                }
            }
        }
        let viewing: BTreeSet<&NodeName> = known
            .values()
            .flat_map(|d| d.nodes.iter().map(|v| &v.node))
            .filter(|n| !round.answered.contains_key(*n))
            .collect();
        let departed: BTreeSet<NodeName> =
            viewing.into_iter().filter(|n| gone(n)).cloned().collect();
        let mut pending: BTreeSet<Wwid> = known.keys().cloned().collect();
        pending.extend(
            by_wwid
                .keys()
                .map(|w| (*w).clone())
                .filter(|w| !unread.contains(w)),
        );
        let now = unix_now();
        let mut conflicts = Vec::new();
        for _ in 0..ATTEMPTS {
            let mut writes = Vec::new();
            let mut changes = Vec::new();
            let mut forget = Vec::new();
            for wwid in &pending {
                let reports = by_wwid.get(wwid).map(Vec::as_slice).unwrap_or_default();
                let existing = known.get(wwid);
                let merged = policy::merge(
                    existing,
                    wwid,
                    reports,
                    &round,
                    &departed,
                    now,
                    &mut conflicts,
                );
                if let (Some(stored), Some(after)) =
                    (existing, merged.as_ref().map(|m| &m.device).or(existing))
                    && forget_after.is_some_and(|secs| {
                        policy::forgettable(after, &round, !reports.is_empty(), now, secs)
                    })
                {
                    forget.push(stored.clone());
                    continue;
                }
                if let Some(m) = merged {
                    writes.push(match existing {
                        None => Write::Create(m.device),
                        Some(_) => Write::Replace(m.device),
                    });
                    changes.push((wwid.clone(), m.change));
                }
            }
            if writes.is_empty() && forget.is_empty() {
                pending.clear();
                break;
            }
            let mut again = BTreeSet::new();
            for ((wwid, change), result) in changes.into_iter().zip(self.put_each(writes).await) {
                match result {
                    Ok(written) => {
                        if policy::await_proof(&written)
                            || (policy::releasing(&written) && written.binding.is_none())
                        {
                            self.lun_work.send_modify(|n| *n = n.wrapping_add(1));
                        }
                        match change {
                            Change::Added => out.added.push(wwid),
                            Change::Lost => out.lost.push(wwid),
                            Change::Found => out.found.push(wwid),
                            Change::Conflict => out.conflicts.push(wwid),
                            Change::Updated => {}
                        }
                    }
                    Err(InventoryError::Conflict(_)) => {
                        again.insert(wwid);
                    }
                    Err(e) => failed(&mut out, &round, &wwid, &e),
                }
            }
            for dev in forget {
                match self.store.delete(&dev).await {
                    Ok(()) => out.forgotten.push(dev.wwid),
                    // Changed or gone since read: read again and decide anew.
                    Err(InventoryError::Conflict(_) | InventoryError::NotFound(_)) => {
                        again.insert(dev.wwid);
                    }
                    Err(e) => failed(&mut out, &round, &dev.wwid, &e),
                }
            }
            let mut retry = BTreeSet::new();
            for wwid in again {
                match self.store.device(&wwid).await {
                    Ok(found) => {
                        match found {
                            Some(d) => known.insert(wwid.clone(), d),
                            None => known.remove(&wwid),
                        };
                        retry.insert(wwid);
                    }
                    Err(e) => failed(&mut out, &round, &wwid, &e),
                }
            }
            pending = retry;
        }
        for wwid in pending {
            failed(
                &mut out,
                &round,
                &wwid,
                &InventoryError::Conflict(wwid.clone()),
            );
        }
        conflicts.sort();
        conflicts.dedup();
        self.store.discovery_done(&round, conflicts).await;
        Ok(out)
    }

    /// Records that discovery left a target out because its selector or
    /// its transport was refused (best effort: where the store can show it).
    pub async fn target_refused(&self, refused: &TargetRefused) {
        self.store.target_refused(refused).await;
    }

    /// Writes `writes` in one batch; should the batch fail as a whole (one
    /// transaction, undone by one bad record), each is written on its own,
    /// so one device's failure is its own.
    async fn put_each(&self, writes: Vec<Write>) -> Vec<Result<Device, InventoryError>> {
        if writes.is_empty() {
            return Vec::new();
        }
        let batch = match self.store.put(writes.clone()).await {
            Ok(results) if results.len() == writes.len() => return results,
            Ok(results) => InventoryError::Store(format!(
                "the store answered {} results for {} writes",
                results.len(),
                writes.len()
            )),
            Err(e) => e,
        };
        if writes.len() == 1 {
            return vec![Err(batch)];
        }
        tracing::warn!(error = %batch, writes = writes.len(), "a batch of device writes failed; writing each alone");
        let mut results = Vec::with_capacity(writes.len());
        for w in writes {
            results.push(self.write(w).await);
        }
        results
    }

    /// The first fitting device in preference order, from the first node
    /// in the placement's order that sees any.
    async fn pick(&self, req: &BindRequest) -> Result<Option<Device>, InventoryError> {
        for scope in scopes(req.placement.order().iter()) {
            let mut after = None;
            loop {
                let page = self
                    .store
                    .available(AvailableQuery {
                        node: scope,
                        min: policy::smallest(req),
                        max: req.max_bytes,
                        after,
                        limit: PAGE,
                    })
                    .await?;
                if let Some(hit) = policy::choose(&page, req, scope) {
                    return Ok(Some(hit.clone()));
                }
                after = page.last().map(policy::preference_key);
                if page.len() < PAGE {
                    break;
                }
            }
        }
        Ok(None)
    }

    /// The deliberate defect `Fault::SkipCas`: decide on what was read, let
    /// other binds run, then overwrite whatever the device holds by then.
    async fn bind_without_cas(
        &self,
        picked: Device,
        request: BindRequest,
    ) -> Result<Device, InventoryError> {
        // Wait for a second bind to pick the same LUN (or give up after a
        // while), so the defect shows on every run with concurrent creates,
        // not only when two happen to land within a few milliseconds.
        crate::fault::meet_another_bind().await;
        let mut dev = self
            .store
            .device(&picked.wwid)
            .await?
            .ok_or(InventoryError::NotFound(picked.wwid))?;
        policy::bind(&mut dev, request.binding);
        self.write(Write::Replace(dev)).await
    }

    async fn write(&self, write: Write) -> Result<Device, InventoryError> {
        self.store
            .put(vec![write])
            .await?
            .pop()
            .unwrap_or_else(|| Err(InventoryError::Store("the store answered no write".into())))
    }
}

/// Each node in turn, or anywhere when there are none.
fn scopes<'a>(nodes: impl Iterator<Item = &'a NodeName>) -> Vec<Option<&'a NodeName>> {
    let scopes: Vec<Option<&NodeName>> = nodes.map(Some).collect();
    if scopes.is_empty() {
        vec![None]
    } else {
        scopes
    }
}

/// Records and logs a device that could not be merged this round.
fn failed(out: &mut DiscoveryOutcome, round: &DiscoveryRound, wwid: &Wwid, e: &InventoryError) {
    tracing::warn!(%wwid, target = %round.target, error = %e, "device not merged");
    out.failed.push((wwid.clone(), e.to_string()));
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}
