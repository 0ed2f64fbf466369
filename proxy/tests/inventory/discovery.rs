//! Discovery's isolation over the embedded store: one device whose write
//! fails, or one target whose devices cannot be listed, does not stop the
//! others. The faults come from a store that passes every call to a real
//! SQLite store but fails the ones it is told to, as a failing file would.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use csi_scsi_proxy::device::policy::PreferenceKey;
use csi_scsi_proxy::device::{
    Device, DiscoveryRound, IscsiTarget, Phase, ResizeRequest, Target, Transport,
};
use csi_scsi_proxy::directory::FileDirectory;
use csi_scsi_proxy::inventory::{
    EmbeddedInventory, Inventory, InventoryError, Store, Summary, Write,
};
use csi_scsi_proxy::reconcile::discovery::{PassSettings, reconcile_once};

use crate::devices::{lun, round, wwid};
use crate::lifecycle_support;

const GIB: u64 = 1 << 30;

/// The embedded store, but writes of `wwid` fail (a batch holding one
/// fails whole, as the store's one transaction does) and listing the
/// devices of `target` fails.
struct Faulty {
    inner: EmbeddedInventory,
    wwid: Option<String>,
    target: Option<String>,
}

fn injected(what: &str) -> InventoryError {
    InventoryError::StoreUnwritable(format!("injected: {what}"))
}

#[async_trait]
impl Store for Faulty {
    async fn device(&self, wwid: &str) -> Result<Option<Device>, InventoryError> {
        self.inner.device(wwid).await
    }
    async fn bound_to_name(&self, name: &str) -> Result<Option<Device>, InventoryError> {
        self.inner.bound_to_name(name).await
    }
    async fn devices(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Device>, InventoryError> {
        self.inner.devices(after, limit).await
    }
    async fn available(
        &self,
        node: Option<&str>,
        min: u64,
        max: u64,
        after: Option<PreferenceKey>,
        limit: usize,
    ) -> Result<Vec<Device>, InventoryError> {
        self.inner.available(node, min, max, after, limit).await
    }
    async fn of_target(&self, target: &str) -> Result<Vec<Device>, InventoryError> {
        if self.target.as_deref() == Some(target) {
            return Err(injected(target));
        }
        self.inner.of_target(target).await
    }
    async fn put(
        &self,
        writes: Vec<Write>,
    ) -> Result<Vec<Result<Device, InventoryError>>, InventoryError> {
        let bad = writes.iter().any(|w| {
            let (Write::Create(d) | Write::Replace(d)) = w;
            self.wwid.as_deref() == Some(d.wwid.as_str())
        });
        if bad {
            return Err(injected("a device write"));
        }
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
}

fn faulty(dir: &tempfile::TempDir, wwid: Option<String>, target: Option<&str>) -> Arc<Inventory> {
    let inner = EmbeddedInventory::open(&dir.path().join("inventory.db")).unwrap();
    Arc::new(Inventory::new(Arc::new(Faulty {
        inner,
        wwid,
        target: target.map(str::to_owned),
    })))
}

fn iscsi(name: &str) -> Target {
    Target {
        name: name.into(),
        transport: Transport::Iscsi(IscsiTarget {
            portals: vec!["198.18.0.1:3260".into()],
            iqn: format!("iqn.2026-01.io.csi-scsi:{name}"),
            chap_secret_ref: None,
        }),
        node_selector: BTreeMap::new(),
        nodes: Vec::new(),
        device_labels: BTreeMap::new(),
        array: None,
    }
}

#[tokio::test]
async fn a_device_whose_write_fails_does_not_keep_the_others_of_its_round_out() {
    let dir = tempfile::tempdir().unwrap();
    let inv = faulty(&dir, Some(wwid(2)), None);
    let out = inv
        .apply_discovery(round(
            "t1",
            &[("node-a", vec![lun(1, GIB), lun(2, GIB), lun(3, GIB)])],
            &[],
        ))
        .await
        .expect("the round is merged");
    assert_eq!(out.added, [wwid(1), wwid(3)], "{out:?}");
    let [(failed, why)] = out.failed.as_slice() else {
        panic!("one device failed: {out:?}");
    };
    assert_eq!(*failed, wwid(2));
    assert!(why.contains("injected"), "{why}");
    for i in [1, 3] {
        let d = inv.device(&wwid(i)).await.unwrap().expect("written");
        assert_eq!(d.phase, Phase::Available);
    }
    assert!(inv.device(&wwid(2)).await.unwrap().is_none());
}

#[tokio::test]
async fn a_target_whose_devices_cannot_be_listed_does_not_end_the_pass() {
    let dir = tempfile::tempdir().unwrap();
    // Before: t2's LUN seen from node-x, and the targets t1 and t2.
    let inv = faulty(&dir, None, None);
    inv.put_target(iscsi("t1")).await.unwrap();
    inv.put_target(iscsi("t2")).await.unwrap();
    inv.apply_discovery(round("t2", &[("node-x", vec![lun(7, GIB)])], &[]))
        .await
        .unwrap();
    drop(inv);
    // node-x has left the agents file and stayed out past the (here
    // zero) grace period: gone. Listing t1's devices fails.
    let inv = faulty(&dir, None, Some("t1"));
    let agents_file = dir.path().join("agents");
    std::fs::write(&agents_file, "# no node\n").unwrap();
    let agents = FileDirectory::load_with_grace(&agents_file, Duration::ZERO).unwrap();
    let life = lifecycle_support::lifecycle(inv.clone(), agents, dir.path());
    let summary = reconcile_once(
        &life,
        &PassSettings {
            concurrency: 4,
            forget_after: Some(Duration::from_secs(3_600)),
        },
    )
    .await
    .expect("the pass goes on past t1");
    assert_eq!(
        (summary.targets, summary.failed_targets),
        (2, 1),
        "{summary:?}"
    );
    // t2 was discovered: the departed node's view went, the LUN is Lost.
    let d = inv.device(&wwid(7)).await.unwrap().unwrap();
    assert!(d.nodes.is_empty(), "{d:?}");
    assert_eq!(d.phase, Phase::Lost);
    assert_eq!(summary.lost, 1);
}
