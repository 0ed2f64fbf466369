//! The device inventory: which LUN is free and which is bound to which
//! volume. A narrow async trait with two backends: `embedded` (SQLite) and,
//! later, Kubernetes custom resources. The proxy is its only writer; every
//! state change is a compare-and-swap on the device's current state.

mod embedded;
mod kube;
mod model;

use async_trait::async_trait;

pub use embedded::EmbeddedInventory;
pub use kube::{KubeInventory, KubeInventoryConfig};
pub use model::{
    BindRequest, Binding, Device, DiscoveryOutcome, DiscoveryRound, FcTarget, IscsiTarget,
    LunReport, NodeView, Phase, Publication, ResizeRequest, SecretRef, Target,
};

/// Why an inventory operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InventoryError {
    /// No Available device satisfies the request.
    #[error("no available device fits: {0}")]
    NoFit(String),
    /// The device changed since it was read (another writer won); re-read.
    #[error("device {0} changed concurrently")]
    Conflict(String),
    /// The device is not in the state the operation needs.
    #[error("device {wwid} is {phase:?}, not {wanted}")]
    WrongState {
        /// The device.
        wwid: String,
        /// Its phase.
        phase: Phase,
        /// What the operation needed.
        wanted: &'static str,
    },
    /// No such device, or not bound to the given binding.
    #[error("no device {0}")]
    NotFound(String),
    /// The backing store failed.
    #[error("inventory store: {0}")]
    Store(String),
    /// The store's file system is full: writes fail until space is freed.
    #[error("inventory store is full (no space left on its file system): {0}")]
    StoreFull(String),
    /// The store refuses writes: its file system is read-only or failing.
    #[error("inventory store cannot be written (read-only or failing file system): {0}")]
    StoreUnwritable(String),
}

/// The inventory's operations. Implementations are safe to call
/// concurrently; each write is atomic.
#[async_trait]
pub trait Inventory: Send + Sync {
    /// Adds or replaces a target.
    async fn put_target(&self, target: Target) -> Result<(), InventoryError>;
    /// Removes a target (its devices stay; discovery marks them Lost).
    async fn remove_target(&self, name: &str) -> Result<(), InventoryError>;
    /// All targets.
    async fn targets(&self) -> Result<Vec<Target>, InventoryError>;

    /// Merges one target's discovery round by WWID.
    async fn apply_discovery(
        &self,
        round: DiscoveryRound,
    ) -> Result<DiscoveryOutcome, InventoryError>;

    /// One device by WWID.
    async fn device(&self, wwid: &str) -> Result<Option<Device>, InventoryError>;
    /// The device bound to volume `name` (the CreateVolume name), if any.
    async fn bound_to_name(&self, name: &str) -> Result<Option<Device>, InventoryError>;
    /// Devices in WWID order after `after`, at most `limit`.
    async fn devices(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Device>, InventoryError>;
    /// Count of devices per phase.
    async fn phase_counts(&self) -> Result<Vec<(Phase, u64)>, InventoryError>;
    /// The largest size of any device, any phase (for OUT_OF_RANGE).
    async fn largest_size(&self) -> Result<u64, InventoryError>;
    /// Available bytes and the largest Available device visible from any
    /// of `nodes` (empty: anywhere) matching `selector`.
    async fn capacity(
        &self,
        nodes: &[String],
        selector: &crate::selector::Selector,
    ) -> Result<(u64, u64), InventoryError>;

    /// Picks the smallest fitting Available device and binds it, atomically.
    async fn bind(
        &self,
        request: BindRequest,
        min_bytes: u64,
        max_bytes: u64,
    ) -> Result<Device, InventoryError>;
    /// Writes `device` if its generation is still `device.generation`;
    /// returns the stored result (generation bumped).
    async fn update(&self, device: Device) -> Result<Device, InventoryError>;

    /// Records or updates a resize request.
    async fn put_resize(&self, request: ResizeRequest) -> Result<(), InventoryError>;
    /// All resize requests.
    async fn resizes(&self) -> Result<Vec<ResizeRequest>, InventoryError>;
}
