//! Discovery's isolation over the embedded store: one device whose write
//! fails, or one target whose devices cannot be listed, does not stop the
//! others. The faults come from a store that passes every call to a real
//! SQLite store but fails the ones it is told to, as a failing file would.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use csi_scsi_proxy::device::{IscsiTarget, NewLuns, Phase, Target, Transport};
use csi_scsi_proxy::directory::FileDirectory;
use csi_scsi_proxy::inventory::{EmbeddedInventory, Inventory, InventoryError, Write};
use csi_scsi_proxy::reconcile::discovery::{PassSettings, reconcile_once};

use crate::devices::{lun, round, wwid};
use crate::hooked_store::{Hooked, Hooks};
use crate::lifecycle_support;

const GIB: u64 = 1 << 30;

/// Writes of `wwid` fail (a batch holding one fails whole, as the
/// store's one transaction does) and listing the devices of `target`
/// fails.
struct Faulty {
    wwid: Option<String>,
    target: Option<String>,
}

fn injected(what: &str) -> InventoryError {
    InventoryError::StoreUnwritable(format!("injected: {what}"))
}

#[async_trait]
impl Hooks for Faulty {
    async fn before_put(
        &self,
        _inner: &EmbeddedInventory,
        writes: &[Write],
    ) -> Result<(), InventoryError> {
        let bad = writes.iter().any(|w| {
            let (Write::Create(d) | Write::Replace(d)) = w;
            self.wwid.as_deref() == Some(d.wwid.as_str())
        });
        match bad {
            true => Err(injected("a device write")),
            false => Ok(()),
        }
    }

    fn before_of_target(&self, target: &str) -> Result<(), InventoryError> {
        match self.target.as_deref() == Some(target) {
            true => Err(injected(target)),
            false => Ok(()),
        }
    }
}

fn faulty(dir: &tempfile::TempDir, wwid: Option<String>, target: Option<&str>) -> Arc<Inventory> {
    let hooks = Faulty {
        wwid,
        target: target.map(str::to_owned),
    };
    Arc::new(Inventory::new(Arc::new(Hooked::open(
        &dir.path().join("inventory.db"),
        hooks,
    ))))
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
        new_luns: NewLuns::Probe,
    }
}

#[tokio::test]
async fn a_device_whose_write_fails_does_not_keep_the_others_of_its_round_out() {
    let dir = tempfile::tempdir().unwrap();
    let inv = faulty(&dir, Some(wwid(2).to_string()), None);
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
