//! What a backing store does: read and write device records with
//! compare-and-swap, and keep targets and resize requests. No policy: a
//! store never decides a phase, a fit or a merge (that is
//! `crate::device::policy`, applied by the inventory).

use async_trait::async_trait;
use csi_scsi_contract::{NodeName, Wwid};

use super::InventoryError;
use crate::device::policy::PreferenceKey;
use crate::device::{Device, DiscoveryRound, Phase, ResizeRequest, Target, TargetRefused};

/// A device record to write.
#[derive(Clone, Debug)]
pub enum Write {
    /// A device seen for the first time (refused as a conflict if a record
    /// exists already).
    Create(Device),
    /// Replaces the record if it still has `generation` (compare-and-swap).
    Replace(Device),
}

/// Which Available devices [`Store::available`] lists.
#[derive(Clone, Debug)]
pub struct AvailableQuery<'a> {
    /// Visible from this node (`None`: from anywhere).
    pub node: Option<&'a NodeName>,
    /// At least this many bytes.
    pub min: u64,
    /// At most this many bytes.
    pub max: u64,
    /// After this place in the bind order (`None`: from the start).
    pub after: Option<PreferenceKey>,
    /// At most this many devices.
    pub limit: usize,
}

/// Counts over every device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// How many devices are in each phase (phases with none left out).
    pub phases: Vec<(Phase, u64)>,
    /// The largest size of any device, any phase.
    pub largest: u64,
}

/// A backing store. Implementations are safe to call concurrently; each
/// write is atomic.
#[async_trait]
pub trait Store: Send + Sync {
    /// One device by WWID.
    async fn device(&self, wwid: &Wwid) -> Result<Option<Device>, InventoryError>;
    /// The device whose binding has volume name `name`, if any.
    async fn bound_to_name(&self, name: &str) -> Result<Option<Device>, InventoryError>;
    /// Devices in WWID order after `after`, at most `limit`.
    async fn devices(
        &self,
        after: Option<&Wwid>,
        limit: usize,
    ) -> Result<Vec<Device>, InventoryError>;
    /// Available devices as `query` asks, in bind-preference order
    /// (ascending `policy::preference_key`; an index range scan in the
    /// embedded store).
    async fn available(&self, query: AvailableQuery<'_>) -> Result<Vec<Device>, InventoryError>;
    /// Devices first reported by `target`, seen through it, or whose WWID
    /// it reported in conflict.
    async fn of_target(&self, target: &str) -> Result<Vec<Device>, InventoryError>;
    /// Writes each record; one result per write, in order (the stored
    /// device with its new generation, or why not).
    async fn put(
        &self,
        writes: Vec<Write>,
    ) -> Result<Vec<Result<Device, InventoryError>>, InventoryError>;
    /// Removes the record of `device` if it still has `device.generation`
    /// (compare-and-swap: `Conflict` when it changed or is gone).
    async fn delete(&self, device: &Device) -> Result<(), InventoryError>;
    /// Counts over every device.
    async fn summary(&self) -> Result<Summary, InventoryError>;

    /// All targets, by name.
    async fn targets(&self) -> Result<Vec<Target>, InventoryError>;
    /// Adds or replaces a target.
    async fn put_target(&self, target: Target) -> Result<(), InventoryError>;
    /// Removes a target (its devices stay; discovery marks them Lost).
    async fn remove_target(&self, name: &str) -> Result<(), InventoryError>;

    /// All resize requests, by name.
    async fn resizes(&self) -> Result<Vec<ResizeRequest>, InventoryError>;
    /// Records or updates a resize request.
    async fn put_resize(&self, request: ResizeRequest) -> Result<(), InventoryError>;

    /// What a discovery round saw, after its devices were written (the
    /// Kubernetes store writes it into the target's status).
    async fn discovery_done(&self, round: &DiscoveryRound, label_conflicts: Vec<String>);
    /// A target left out of discovery because its selector or its
    /// transport was refused (the Kubernetes store says so in the target's
    /// status; best effort).
    async fn target_refused(&self, refused: &TargetRefused);
}
