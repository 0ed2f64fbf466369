//! A store for fault injection: every call goes to a real embedded store
//! (a SQLite file), after the test's [`Hooks`] had their say. A test
//! implements only the hooks it needs; the pass-through is written once.

use csi_scsi_contract::Wwid;
use std::path::Path;

use async_trait::async_trait;
use csi_scsi_proxy::device::{Device, DiscoveryRound, ResizeRequest, Target, TargetRefused};
use csi_scsi_proxy::inventory::{
    AvailableQuery, EmbeddedInventory, InventoryError, Store, Summary, Write,
};

/// What a test changes about the store's calls.
#[async_trait]
pub trait Hooks: Send + Sync + 'static {
    /// Before `writes` reach the store (the real store is `inner`, for a
    /// competing write); an error fails the whole batch, as a failed
    /// transaction would.
    async fn before_put(
        &self,
        _inner: &EmbeddedInventory,
        _writes: &[Write],
    ) -> Result<(), InventoryError> {
        Ok(())
    }

    /// Before the devices of `target` are listed; an error fails the
    /// listing.
    fn before_of_target(&self, _target: &str) -> Result<(), InventoryError> {
        Ok(())
    }
}

/// The embedded store at `db`, with `hooks`.
pub struct Hooked<H> {
    /// The real store.
    pub inner: EmbeddedInventory,
    /// The test's hooks.
    pub hooks: H,
}

impl<H: Hooks> Hooked<H> {
    /// Opens (or creates) the store file `db`.
    pub fn open(db: &Path, hooks: H) -> Self {
        Self {
            inner: EmbeddedInventory::open(db).expect("the store file"),
            hooks,
        }
    }
}

#[async_trait]
impl<H: Hooks> Store for Hooked<H> {
    async fn device(&self, wwid: &Wwid) -> Result<Option<Device>, InventoryError> {
        self.inner.device(wwid).await
    }
    async fn bound_to_name(&self, name: &str) -> Result<Option<Device>, InventoryError> {
        self.inner.bound_to_name(name).await
    }
    async fn devices(
        &self,
        after: Option<&Wwid>,
        limit: usize,
    ) -> Result<Vec<Device>, InventoryError> {
        self.inner.devices(after, limit).await
    }
    async fn available(&self, query: AvailableQuery<'_>) -> Result<Vec<Device>, InventoryError> {
        self.inner.available(query).await
    }
    async fn of_target(&self, target: &str) -> Result<Vec<Device>, InventoryError> {
        self.hooks.before_of_target(target)?;
        self.inner.of_target(target).await
    }
    async fn put(
        &self,
        writes: Vec<Write>,
    ) -> Result<Vec<Result<Device, InventoryError>>, InventoryError> {
        self.hooks.before_put(&self.inner, &writes).await?;
        self.inner.put(writes).await
    }
    async fn delete(&self, device: &Device) -> Result<(), InventoryError> {
        self.inner.delete(device).await
    }
    async fn summary(&self) -> Result<Summary, InventoryError> {
        self.inner.summary().await
    }
    async fn targets(&self) -> Result<Vec<Target>, InventoryError> {
        self.inner.targets().await
    }
    async fn put_target(&self, target: Target) -> Result<(), InventoryError> {
        self.inner.put_target(target).await
    }
    async fn remove_target(&self, name: &str) -> Result<(), InventoryError> {
        self.inner.remove_target(name).await
    }
    async fn resizes(&self) -> Result<Vec<ResizeRequest>, InventoryError> {
        self.inner.resizes().await
    }
    async fn put_resize(&self, request: ResizeRequest) -> Result<(), InventoryError> {
        self.inner.put_resize(request).await
    }
    async fn discovery_done(&self, round: &DiscoveryRound, label_conflicts: Vec<String>) {
        self.inner.discovery_done(round, label_conflicts).await
    }
    async fn target_refused(&self, refused: &TargetRefused) {
        self.inner.target_refused(refused).await
    }
}
