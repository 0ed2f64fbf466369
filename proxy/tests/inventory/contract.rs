//! What every store must do, as seen through [`Inventory`]: each test
//! below is written once, over a [`Fixture`], and the `contract!` macro at
//! the end runs it twice, in `embedded::` (a SQLite file in a temporary
//! directory) and in `kube::` (custom resources in a real kube-apiserver,
//! `support/real_kube.rs`, one per test binary; these runs take turns, each
//! on an emptied inventory). A store-specific test (request shapes, schema,
//! caches) does not belong here; it lives beside its store (`sqlite.rs`,
//! `kube_backends/`).
//!
//! Where the Kubernetes store is only eventually consistent (targets and
//! resize requests are read from watch caches) a test waits with
//! [`settle`]; device reads must see the caller's own writes at once.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use csi_scsi_contract::{NodeName, Wwid};
use csi_scsi_proxy::device::{
    BindRequest, Device, DiscoveryRound, FcTarget, IscsiTarget, LunReport, NewLuns, Phase,
    ResizeRequest, SecretRef, Target, Transport, policy,
};
use csi_scsi_proxy::inventory::{EmbeddedInventory, Inventory, InventoryError};
use csi_scsi_proxy::selector::Selector;

use crate::devices::{bind_req, labels, lun, node, publication, round, wwid};
use crate::real_kube;

const GIB: u64 = 1 << 30;

/// One store, fresh and empty, and the inventory over it.
pub struct Fixture {
    pub inv: Arc<Inventory>,
    backing: Backing,
}

enum Backing {
    Sqlite(tempfile::TempDir),
    /// The real API server, to this test alone.
    Kube {
        _exclusive: real_kube::Exclusive,
    },
}

impl Fixture {
    /// The embedded store on a new SQLite file.
    pub async fn embedded() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = EmbeddedInventory::open(&dir.path().join("inventory.db")).expect("open");
        Self {
            inv: Arc::new(Inventory::new(Arc::new(store))),
            backing: Backing::Sqlite(dir),
        }
    }

    /// The Kubernetes store on the real API server, emptied, its caches listed.
    pub async fn kube() -> Self {
        let exclusive = real_kube::exclusive().await;
        let inv = real_kube::inventory(real_kube::admin().await).await;
        Self {
            inv: Arc::new(inv),
            backing: Backing::Kube {
                _exclusive: exclusive,
            },
        }
    }

    /// A second inventory over the same backing store that reads it afresh
    /// (a second SQLite connection; a second client that lists).
    pub async fn reopen(&self) -> Inventory {
        match &self.backing {
            Backing::Sqlite(dir) => Inventory::new(Arc::new(
                EmbeddedInventory::open(&dir.path().join("inventory.db")).expect("reopen"),
            )),
            Backing::Kube { .. } => real_kube::inventory(real_kube::admin().await).await,
        }
    }
}

/// Polls `read` until it returns what `want` accepts, for up to 30 s
/// (immediately, for a store that reads its own writes).
async fn settle<T, F, Fut>(what: &str, mut read: F, want: impl Fn(&T) -> bool) -> T
where
    T: std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = T>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let got = read().await;
        if want(&got) {
            return got;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: still {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn get(inv: &Inventory, wwid: &Wwid) -> Device {
    inv.device(wwid).await.unwrap().expect("device")
}

fn sized(min: u64, max: u64, req: BindRequest) -> BindRequest {
    BindRequest {
        min_bytes: min,
        max_bytes: max,
        ..req
    }
}

// === the contract ===

pub async fn discovery_merges_reports_by_wwid_and_records_topology(f: &Fixture) {
    let inv = &f.inv;
    let out = inv
        .apply_discovery(round(
            "t1",
            &[
                ("node-a", vec![lun(1, GIB)]),
                ("node-b", vec![lun(1, GIB), lun(2, 2 * GIB)]),
            ],
            &[],
        ))
        .await
        .unwrap();
    assert_eq!(out.added, vec![wwid(1), wwid(2)]);
    assert!(out.lost.is_empty() && out.found.is_empty(), "{out:?}");
    let d1 = get(inv, &wwid(1)).await;
    assert_eq!(d1.phase, Phase::Available);
    assert_eq!(d1.node_names(), vec!["node-a", "node-b"]);
    assert_eq!(d1.target, "t1");
    assert_eq!((d1.size_bytes, d1.lun), (GIB, 1));
    assert_eq!((d1.vendor.as_str(), d1.serial.as_str()), ("LIO-ORG", "sn1"));
    assert_eq!(d1.labels, labels(&[("tier", "fast")]));
    assert_eq!(d1.wipe_failures, 0);
    assert!(d1.binding.is_none() && d1.published.is_empty());
    assert!(d1.last_seen > 0);
    // The same LUN through a second target of the same array is a second
    // path, not a second device; that target's labels add to the
    // device's, never overwrite.
    let out = inv
        .apply_discovery(DiscoveryRound {
            device_labels: labels(&[("tier", "slow"), ("zone", "b")]),
            same_array: ["t1".to_owned()].into(),
            ..round("t2", &[("node-c", vec![lun(1, GIB)])], &[])
        })
        .await
        .unwrap();
    assert!(out.added.is_empty(), "{out:?}");
    let d1 = get(inv, &wwid(1)).await;
    assert_eq!(d1.node_names(), vec!["node-a", "node-b", "node-c"]);
    assert_eq!(d1.target, "t1", "the first target that reported it");
    assert_eq!(d1.labels, labels(&[("tier", "fast"), ("zone", "b")]));
    let via: Vec<_> = d1
        .nodes
        .iter()
        .map(|v| (v.node.as_str(), v.target.as_str()))
        .collect();
    assert_eq!(via, [("node-a", "t1"), ("node-b", "t1"), ("node-c", "t2")]);
    assert_eq!(inv.devices(None, 100).await.unwrap().len(), 2);
    // A LUN that grew is recorded at its new size.
    inv.apply_discovery(round(
        "t1",
        &[
            ("node-a", vec![lun(1, GIB)]),
            ("node-b", vec![lun(1, GIB), lun(2, 3 * GIB)]),
        ],
        &[],
    ))
    .await
    .unwrap();
    assert_eq!(get(inv, &wwid(2)).await.size_bytes, 3 * GIB);
}

pub async fn a_device_no_node_reports_goes_lost_keeps_its_binding_and_comes_back_bound(
    f: &Fixture,
) {
    let inv = &f.inv;
    inv.apply_discovery(round(
        "t1",
        &[("node-a", vec![lun(1, GIB), lun(2, GIB)])],
        &[],
    ))
    .await
    .unwrap();
    let bound = inv
        .bind(sized(GIB, GIB, bind_req("pv-1", &[], "")))
        .await
        .unwrap();
    assert_eq!(bound.wwid, wwid(1));
    // node-a silent: its earlier report stands.
    let out = inv
        .apply_discovery(round("t1", &[], &["node-a"]))
        .await
        .unwrap();
    assert!(out.lost.is_empty(), "{out:?}");
    assert_eq!(get(inv, &wwid(1)).await.phase, Phase::Bound);
    // node-a answers without the LUNs: both Lost, the binding kept.
    let out = inv
        .apply_discovery(round("t1", &[("node-a", vec![])], &[]))
        .await
        .unwrap();
    assert_eq!(out.lost, vec![wwid(1), wwid(2)]);
    let lost = get(inv, &wwid(1)).await;
    assert_eq!(lost.phase, Phase::Lost);
    assert!(!lost.reason.is_empty());
    assert!(lost.nodes.is_empty());
    assert_eq!(lost.binding.as_ref().unwrap().volume_name, "pv-1");
    assert_eq!(
        inv.bound_to_name("pv-1").await.unwrap().unwrap().wwid,
        wwid(1)
    );
    // A Lost device is never bound.
    let err = inv.bind(bind_req("pv-2", &[], "")).await.unwrap_err();
    assert!(matches!(err, InventoryError::NoFit(_)), "{err}");
    // They come back: Bound again, and Available again.
    let out = inv
        .apply_discovery(round(
            "t1",
            &[("node-a", vec![lun(1, GIB), lun(2, GIB)])],
            &[],
        ))
        .await
        .unwrap();
    assert_eq!(out.found, vec![wwid(1), wwid(2)]);
    let back = get(inv, &wwid(1)).await;
    assert_eq!(back.phase, Phase::Bound);
    assert!(back.reason.is_empty());
    assert_eq!(back.binding, bound.binding);
    assert_eq!(get(inv, &wwid(2)).await.phase, Phase::Available);
}

pub async fn bind_picks_the_smallest_fit_matching_labels_and_topology(f: &Fixture) {
    let inv = &f.inv;
    inv.apply_discovery(round(
        "t1",
        &[
            ("node-a", vec![lun(1, 4 * GIB), lun(2, GIB)]),
            ("node-b", vec![lun(3, 2 * GIB)]),
        ],
        &[],
    ))
    .await
    .unwrap();
    let d = inv
        .bind(sized(GIB, u64::MAX, bind_req("pv-1", &[], "")))
        .await
        .unwrap();
    assert_eq!(d.wwid, wwid(2), "smallest fit");
    assert_eq!(d.phase, Phase::Bound);
    assert_eq!(d.binding.as_ref().unwrap().volume_name, "pv-1");
    assert_eq!(get(inv, &wwid(2)).await, d, "what bind returns is stored");
    let d = inv
        .bind(sized(
            GIB,
            u64::MAX,
            bind_req("pv-2", &["node-b", "node-a"], "tier=fast"),
        ))
        .await
        .unwrap();
    assert_eq!(d.wwid, wwid(3), "preferred node first");
    for (what, req) in [
        ("no label match", bind_req("pv-3", &[], "tier=slow")),
        ("no node sees one", bind_req("pv-3", &["node-c"], "")),
        (
            "none small enough",
            sized(3 * GIB, 3 * GIB, bind_req("pv-3", &[], "")),
        ),
    ] {
        let err = inv.bind(req).await.unwrap_err();
        assert!(matches!(err, InventoryError::NoFit(_)), "{what}: {err}");
    }
    assert!(inv.bound_to_name("pv-3").await.unwrap().is_none());
    // A retry of a bound name returns its device, whatever it asks for.
    let again = inv
        .bind(sized(3 * GIB, u64::MAX, bind_req("pv-1", &["node-b"], "")))
        .await
        .unwrap();
    assert_eq!(again.wwid, wwid(2));
    let d = inv
        .bind(sized(3 * GIB, u64::MAX, bind_req("pv-3", &["node-a"], "")))
        .await
        .unwrap();
    assert_eq!(d.wwid, wwid(1));
    let err = inv.bind(bind_req("pv-4", &[], "")).await.unwrap_err();
    assert!(matches!(err, InventoryError::NoFit(_)), "all bound: {err}");
}

pub async fn among_equal_sizes_bind_prefers_the_fewest_past_wipe_failures(f: &Fixture) {
    let inv = &f.inv;
    inv.apply_discovery(round(
        "t1",
        &[(
            "node-a",
            vec![
                lun(1, 2 * GIB),
                lun(2, 2 * GIB),
                lun(3, 2 * GIB),
                lun(4, GIB),
                lun(5, 4 * GIB),
            ],
        )],
        &[],
    ))
    .await
    .unwrap();
    // WWID order is the opposite of the order of failures.
    for (i, failures) in [(1, 2), (2, 1), (3, 0), (4, 5)] {
        let mut d = get(inv, &wwid(i)).await;
        d.wipe_failures = failures;
        let written = inv.update(d).await.unwrap();
        assert_eq!(written.wipe_failures, failures);
        assert_eq!(get(inv, &wwid(i)).await.wipe_failures, failures);
    }
    let mut order = Vec::new();
    for n in 0..5 {
        let d = inv
            .bind(bind_req(&format!("pv-{n}"), &["node-a"], ""))
            .await
            .unwrap();
        order.push(d.wwid);
    }
    assert_eq!(
        order,
        [wwid(4), wwid(3), wwid(2), wwid(1), wwid(5)],
        "size first, then the fewest failures"
    );
}

/// Devices, and binds racing for them (twice as many).
const RACE_DEVICES: u32 = 100;

pub async fn concurrent_binds_over_fewer_devices_bind_each_device_at_most_once(f: &Fixture) {
    let inv = &f.inv;
    let luns: Vec<_> = (0..RACE_DEVICES).map(|i| lun(i, GIB)).collect();
    inv.apply_discovery(round("t1", &[("node-a", luns)], &[]))
        .await
        .unwrap();
    // Two writers over one store, as two proxies would be: each serialises
    // its own binds, so only the store's compare-and-swap keeps them apart.
    let writers = [inv.clone(), Arc::new(f.reopen().await)];
    let tasks: Vec<_> = (0..2 * RACE_DEVICES)
        .map(|i| {
            let inv = writers[i as usize % 2].clone();
            tokio::spawn(async move {
                let nodes: &[&str] = if i % 3 == 0 { &["node-a"] } else { &[] };
                // A bind that lost every race is retried, as the CO would.
                loop {
                    match inv.bind(bind_req(&format!("pv-{i}"), nodes, "")).await {
                        Err(InventoryError::Conflict(_)) => tokio::task::yield_now().await,
                        other => return other,
                    }
                }
            })
        })
        .collect();
    let mut bound = Vec::new();
    for r in futures::future::join_all(tasks).await {
        match r.unwrap() {
            Ok(d) => bound.push(d),
            Err(InventoryError::NoFit(_)) => {}
            Err(e) => panic!("a bind failed otherwise: {e}"),
        }
    }
    assert_eq!(bound.len(), RACE_DEVICES as usize);
    let mut wwids: Vec<_> = bound.iter().map(|d| d.wwid.clone()).collect();
    wwids.sort();
    wwids.dedup();
    assert_eq!(wwids.len(), RACE_DEVICES as usize, "no device bound twice");
    // And the store agrees, read afresh: every bind that succeeded holds.
    let check = f.reopen().await;
    let all = check.devices(None, 1000).await.unwrap();
    assert_eq!(all.len(), RACE_DEVICES as usize);
    assert!(all.iter().all(|d| d.phase == Phase::Bound));
    for d in &bound {
        let stored = all.iter().find(|s| s.wwid == d.wwid).unwrap();
        assert_eq!(stored.binding, d.binding, "{}", d.wwid);
    }
}

pub async fn a_stale_update_is_refused_as_a_conflict(f: &Fixture) {
    let inv = &f.inv;
    inv.apply_discovery(round("t1", &[("node-a", vec![lun(1, GIB)])], &[]))
        .await
        .unwrap();
    let d = inv.bind(bind_req("pv-1", &[], "")).await.unwrap();
    let mut first = d.clone();
    first.published = vec![publication("node-a")];
    let written = inv.update(first).await.unwrap();
    assert!(written.generation > d.generation);
    assert_eq!(get(inv, &d.wwid).await, written);
    let mut stale = d;
    stale.published = vec![publication("node-b")];
    let err = inv.update(stale).await.unwrap_err();
    assert!(
        matches!(err, InventoryError::Conflict(ref w) if *w == wwid(1)),
        "{err}"
    );
    assert_eq!(get(inv, &wwid(1)).await.published_nodes(), ["node-a"]);
    // Re-read, change again: accepted.
    let mut fresh = get(inv, &wwid(1)).await;
    fresh.published.push(publication("node-b"));
    let written = inv.update(fresh).await.unwrap();
    assert_eq!(written.published_nodes(), ["node-a", "node-b"]);
    assert_eq!(written.published[0], publication("node-a"));
}

pub async fn modify_re_applies_its_change_after_a_conflict(f: &Fixture) {
    let inv = &f.inv;
    inv.apply_discovery(round("t1", &[("node-a", vec![lun(1, GIB)])], &[]))
        .await
        .unwrap();
    let bound = inv.bind(bind_req("pv-1", &[], "")).await.unwrap();
    let calls = AtomicUsize::new(0);
    let runtime = tokio::runtime::Handle::current();
    let modified = inv
        .modify(&wwid(1), |d| {
            if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                // Another writer gets in between this read and its write.
                let mut other = d.clone();
                other.published.push(publication("node-b"));
                tokio::task::block_in_place(|| runtime.block_on(inv.update(other)))
                    .expect("the other write");
            }
            d.published.push(publication("node-a"));
            true
        })
        .await
        .unwrap()
        .expect("the device");
    assert_eq!(calls.load(Ordering::SeqCst), 2, "read again and re-applied");
    assert_eq!(modified.published_nodes(), ["node-b", "node-a"]);
    assert_eq!(get(inv, &wwid(1)).await, modified);
    assert_eq!(modified.binding, bound.binding);
    // Nothing to change: nothing written.
    let same = inv.modify(&wwid(1), |_| false).await.unwrap().unwrap();
    assert_eq!(same.generation, modified.generation);
    // No such device.
    assert!(inv.modify(&wwid(9), |_| true).await.unwrap().is_none());
}

pub async fn capacity_counts_each_available_device_visible_from_the_nodes_once(f: &Fixture) {
    let inv = &f.inv;
    let all = Selector::default();
    assert_eq!(inv.capacity(&[], &all, 0).await.unwrap(), (0, 0));
    inv.apply_discovery(round(
        "t1",
        &[
            ("node-a", vec![lun(1, GIB), lun(2, 2 * GIB)]),
            ("node-b", vec![lun(2, 2 * GIB), lun(3, 4 * GIB)]),
        ],
        &[],
    ))
    .await
    .unwrap();
    inv.apply_discovery(DiscoveryRound {
        device_labels: labels(&[("tier", "slow")]),
        ..round("t2", &[("node-b", vec![lun(4, 8 * GIB)])], &[])
    })
    .await
    .unwrap();
    let nodes = |n: &[&str]| n.iter().map(|s| node(s)).collect::<Vec<_>>();
    let fast = Selector::parse("tier=fast").unwrap();
    let slow = Selector::parse("tier=slow").unwrap();
    assert_eq!(
        inv.capacity(&[], &all, 0).await.unwrap(),
        (15 * GIB, 8 * GIB)
    );
    assert_eq!(
        inv.capacity(&nodes(&["node-a"]), &all, 0).await.unwrap(),
        (3 * GIB, 2 * GIB)
    );
    assert_eq!(
        inv.capacity(&nodes(&["node-a", "node-b"]), &all, 0)
            .await
            .unwrap(),
        (15 * GIB, 8 * GIB),
        "a device both nodes see counts once"
    );
    assert_eq!(
        inv.capacity(&[], &fast, 0).await.unwrap(),
        (7 * GIB, 4 * GIB)
    );
    // A volume that needs 2 GiB or more (a filesystem's minimum) counts
    // only the LUNs it could be bound to.
    assert_eq!(
        inv.capacity(&[], &all, 2 * GIB).await.unwrap(),
        (14 * GIB, 8 * GIB)
    );
    assert_eq!(
        inv.capacity(&nodes(&["node-a"]), &all, 4 * GIB)
            .await
            .unwrap(),
        (0, 0)
    );
    assert_eq!(
        inv.capacity(&nodes(&["node-a"]), &slow, 0).await.unwrap(),
        (0, 0)
    );
    assert_eq!(
        inv.capacity(&nodes(&["node-c"]), &all, 0).await.unwrap(),
        (0, 0)
    );
    // Bound devices are not capacity.
    let d = inv.bind(bind_req("pv-1", &[], "tier=slow")).await.unwrap();
    assert_eq!(d.wwid, wwid(4));
    assert_eq!(
        inv.capacity(&[], &all, 0).await.unwrap(),
        (7 * GIB, 4 * GIB)
    );
    assert_eq!(inv.capacity(&[], &slow, 0).await.unwrap(), (0, 0));
}

/// GetCapacity's numbers are what a bind could take: a LUN in a target
/// conflict (never bound) is neither capacity nor the largest free LUN, or
/// the scheduler would send a claim where CreateVolume finds nothing.
pub async fn capacity_counts_no_lun_a_bind_could_not_take(f: &Fixture) {
    let inv = &f.inv;
    inv.apply_discovery(round(
        "t1",
        &[("node-a", vec![lun(1, GIB), lun(2, 4 * GIB)])],
        &[],
    ))
    .await
    .unwrap();
    let all = Selector::default();
    let node_a = [node("node-a")];
    assert_eq!(
        inv.capacity(&node_a, &all, 0).await.unwrap(),
        (5 * GIB, 4 * GIB)
    );
    // t2, of no array in common, reports LUN 2's WWID too.
    let out = inv
        .apply_discovery(round("t2", &[("node-b", vec![lun(2, 4 * GIB)])], &[]))
        .await
        .unwrap();
    assert_eq!(out.conflicts, [wwid(2)], "{out:?}");
    assert_eq!(get(inv, &wwid(2)).await.phase, Phase::Available);
    assert_eq!(
        inv.capacity(&node_a, &all, 0).await.unwrap(),
        (GIB, GIB),
        "the disputed LUN is not capacity"
    );
    assert_eq!(inv.capacity(&[], &all, 0).await.unwrap(), (GIB, GIB));
    // And indeed no bind takes it.
    let err = inv
        .bind(sized(2 * GIB, u64::MAX, bind_req("pv-1", &["node-a"], "")))
        .await
        .unwrap_err();
    assert!(matches!(err, InventoryError::NoFit(_)), "{err:?}");
}

/// An operator's `retired` (Kubernetes: `spec.retired`; embedded: the
/// `retired` column) takes a LUN out of every bind and every capacity
/// figure, and out of the release scan; the proxy's own writes keep it,
/// and the retry request beside it, as they were.
pub async fn a_retired_device_is_never_bound_counted_or_scanned_for_a_wipe(f: &Fixture) {
    let inv = &f.inv;
    inv.apply_discovery(round(
        "t1",
        &[("node-a", vec![lun(1, GIB), lun(2, 2 * GIB), lun(3, GIB)])],
        &[],
    ))
    .await
    .unwrap();
    let all = Selector::default();
    let node_a = [node("node-a")];
    // LUN 1, the one a bind would take first, retired with a retry request.
    let mut d = get(inv, &wwid(1)).await;
    d.retired = true;
    d.retry_wipe = "r1".into();
    let written = inv.update(d).await.unwrap();
    assert!(written.retired);
    let stored = get(inv, &wwid(1)).await;
    assert!(stored.retired, "kept by the store");
    assert_eq!(stored.retry_wipe, "r1");
    assert_eq!(
        inv.capacity(&node_a, &all, 0).await.unwrap(),
        (3 * GIB, 2 * GIB),
        "the retired LUN is not capacity"
    );
    assert_eq!(
        inv.capacity(&[], &all, 0).await.unwrap(),
        (3 * GIB, 2 * GIB)
    );
    let first = inv.bind(bind_req("pv-1", &["node-a"], "")).await.unwrap();
    assert_eq!(first.wwid, wwid(3), "the smallest LUN not retired");
    let second = inv.bind(bind_req("pv-2", &[], "")).await.unwrap();
    assert_eq!(second.wwid, wwid(2));
    let err = inv.bind(bind_req("pv-3", &[], "")).await.unwrap_err();
    assert!(matches!(err, InventoryError::NoFit(_)), "{err:?}");

    // Discovery's writes of it (a new node, a new path) keep both fields.
    let mut again = lun(1, GIB);
    again.paths.push("another-path".into());
    inv.apply_discovery(round(
        "t1",
        &[
            ("node-a", vec![again, lun(2, 2 * GIB), lun(3, GIB)]),
            ("node-b", vec![lun(1, GIB)]),
        ],
        &[],
    ))
    .await
    .unwrap();
    let seen = get(inv, &wwid(1)).await;
    assert_eq!(seen.node_names(), ["node-a", "node-b"]);
    assert!(seen.retired && seen.retry_wipe == "r1", "{seen:?}");

    // A deleted volume's LUN is in the release scan, with its request,
    // until an operator retires it.
    inv.modify(&wwid(2), policy::start_release).await.unwrap();
    let mut d = get(inv, &wwid(2)).await;
    d.retry_wipe = "r2".into();
    inv.update(d).await.unwrap();
    let scan = inv.releasing().await.unwrap();
    assert_eq!(
        scan.into_iter().collect::<Vec<_>>(),
        [(wwid(2), "r2".to_owned())]
    );
    inv.modify(&wwid(2), |d| {
        d.retired = true;
        true
    })
    .await
    .unwrap();
    assert!(
        inv.releasing().await.unwrap().is_empty(),
        "retired: not wiped"
    );
    assert_eq!(
        get(inv, &wwid(2)).await.phase,
        Phase::Releasing,
        "nothing else changed"
    );

    // Back in service: bound again.
    inv.modify(&wwid(1), |d| {
        d.retired = false;
        true
    })
    .await
    .unwrap();
    let third = inv.bind(bind_req("pv-3", &[], "")).await.unwrap();
    assert_eq!(third.wwid, wwid(1));
    assert_eq!(third.retry_wipe, "r1");
}

pub async fn bound_to_name_finds_a_volume_s_device_until_it_is_released(f: &Fixture) {
    let inv = &f.inv;
    inv.apply_discovery(round(
        "t1",
        &[("node-a", vec![lun(1, GIB), lun(2, 2 * GIB)])],
        &[],
    ))
    .await
    .unwrap();
    assert!(inv.bound_to_name("pv-1").await.unwrap().is_none());
    let d = inv.bind(bind_req("pv-1", &[], "")).await.unwrap();
    inv.bind(bind_req("pv-2", &[], "")).await.unwrap();
    let found = inv.bound_to_name("pv-1").await.unwrap().unwrap();
    assert_eq!(found, d);
    assert_eq!(
        inv.bound_to_name("pv-2").await.unwrap().unwrap().wwid,
        wwid(2)
    );
    assert!(inv.bound_to_name("pv").await.unwrap().is_none());
    // Releasing keeps the binding (the wipe is still to come).
    inv.modify(&d.wwid, policy::start_release).await.unwrap();
    let releasing = inv.bound_to_name("pv-1").await.unwrap().unwrap();
    assert_eq!(releasing.phase, Phase::Releasing);
    // Released: the name is free, the device offered again.
    inv.modify(&d.wwid, |d| {
        policy::released(d);
        true
    })
    .await
    .unwrap();
    assert!(inv.bound_to_name("pv-1").await.unwrap().is_none());
    let again = inv.bind(bind_req("pv-3", &[], "")).await.unwrap();
    assert_eq!(again.wwid, d.wwid);
    assert_ne!(again.binding.unwrap().uid, d.binding.unwrap().uid);
}

pub async fn devices_pages_in_wwid_order(f: &Fixture) {
    let inv = &f.inv;
    assert!(inv.devices(None, 10).await.unwrap().is_empty());
    // Reported out of order, by two nodes.
    let luns: Vec<_> = (0..25).rev().map(|i| lun(i, GIB)).collect();
    inv.apply_discovery(round(
        "t1",
        &[("node-a", luns.clone()), ("node-b", luns[..5].to_vec())],
        &[],
    ))
    .await
    .unwrap();
    let mut pages = Vec::new();
    let mut after: Option<Wwid> = None;
    loop {
        let page = inv.devices(after.as_ref(), 10).await.unwrap();
        after = page.last().map(|d| d.wwid.clone());
        let n = page.len();
        pages.push(page);
        if n < 10 {
            break;
        }
    }
    let sizes: Vec<_> = pages.iter().map(Vec::len).collect();
    assert_eq!(sizes, [10, 10, 5]);
    let seen: Vec<Wwid> = pages.into_iter().flatten().map(|d| d.wwid).collect();
    let want: Vec<Wwid> = (0..25).map(wwid).collect();
    assert_eq!(seen, want);
    let tail = inv.devices(Some(&wwid(22)), 10).await.unwrap();
    let tail: Vec<_> = tail.into_iter().map(|d| d.wwid).collect();
    assert_eq!(tail, [wwid(23), wwid(24)]);
    assert!(inv.devices(Some(&wwid(24)), 10).await.unwrap().is_empty());
}

pub async fn phase_counts_and_the_largest_size_cover_every_device(f: &Fixture) {
    let inv = &f.inv;
    assert!(inv.phase_counts().await.unwrap().is_empty());
    assert_eq!(inv.largest_size().await.unwrap(), 0);
    let luns = |without: u32| {
        (1..=5)
            .filter(|i| *i != without)
            .map(|i| lun(i, u64::from(i) * GIB))
            .collect::<Vec<_>>()
    };
    inv.apply_discovery(round("t1", &[("node-a", luns(0))], &[]))
        .await
        .unwrap();
    // 5 GiB: bound; 1 GiB: its wipe failed; 2 GiB: releasing; 3 GiB: lost.
    inv.bind(sized(5 * GIB, u64::MAX, bind_req("pv-5", &[], "")))
        .await
        .unwrap();
    for (name, i) in [("pv-1", 1), ("pv-2", 2)] {
        let d = inv
            .bind(sized(
                u64::from(i) * GIB,
                u64::from(i) * GIB,
                bind_req(name, &[], ""),
            ))
            .await
            .unwrap();
        assert_eq!(d.wwid, wwid(i));
        inv.modify(&d.wwid, policy::start_release).await.unwrap();
    }
    let failed = inv
        .modify(&wwid(1), |d| {
            policy::wipe_failed(d, "wipe on node-a failed".into());
            true
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!((failed.phase, failed.wipe_failures), (Phase::Failed, 1));
    inv.apply_discovery(round("t1", &[("node-a", luns(3))], &[]))
        .await
        .unwrap();
    let counts: BTreeMap<Phase, u64> = inv.phase_counts().await.unwrap().into_iter().collect();
    assert_eq!(
        counts,
        BTreeMap::from([
            (Phase::Available, 1),
            (Phase::Bound, 1),
            (Phase::Releasing, 1),
            (Phase::Failed, 1),
            (Phase::Lost, 1),
        ])
    );
    assert_eq!(inv.largest_size().await.unwrap(), 5 * GIB, "any phase");
    // The largest device goes Lost: still the largest.
    inv.apply_discovery(round("t1", &[("node-a", luns(5))], &[]))
        .await
        .unwrap();
    assert_eq!(inv.largest_size().await.unwrap(), 5 * GIB);
}

pub async fn resize_requests_round_trip_and_update_in_place(f: &Fixture) {
    let inv = &f.inv;
    assert!(inv.resizes().await.unwrap().is_empty());
    inv.apply_discovery(round(
        "t1",
        &[("node-a", vec![lun(1, GIB), lun(2, GIB)])],
        &[],
    ))
    .await
    .unwrap();
    let mut requests = Vec::new();
    for name in ["pv-2", "pv-1"] {
        let d = inv.bind(bind_req(name, &[], "")).await.unwrap();
        let r = ResizeRequest {
            name: format!("resize-{name}"),
            volume_id: d.volume_id().unwrap(),
            wwid: d.wwid.to_string(),
            requested_bytes: 2 * GIB,
            current_bytes: GIB,
            created: 0,
            done: false,
        };
        inv.put_resize(r.clone()).await.unwrap();
        requests.push(r);
    }
    // Asked for more at once (a second ControllerExpandVolume): the same
    // request, updated in place, not lost.
    requests[0].requested_bytes = 3 * GIB;
    inv.put_resize(requests[0].clone()).await.unwrap();
    requests.reverse();
    // `created` is the store's to set (the Kubernetes store takes the
    // object's creation time), so it is left out of the comparison.
    let read = || async {
        let mut all = inv.resizes().await.unwrap();
        for r in &mut all {
            r.created = 0;
        }
        all
    };
    settle("both requests, by name", read, |all| *all == requests).await;
    // Grown: done.
    let done = ResizeRequest {
        current_bytes: 3 * GIB,
        done: true,
        ..requests[1].clone()
    };
    inv.put_resize(done.clone()).await.unwrap();
    // The embedded store keeps it, marked done; the Kubernetes store
    // deletes it (nothing is left for the administrator to act on).
    let kept = vec![requests[0].clone(), done];
    let deleted = vec![requests[0].clone()];
    let outcome = match f.backing {
        Backing::Sqlite(_) => kept,
        Backing::Kube { .. } => deleted,
    };
    settle("the request done", read, |all| *all == outcome).await;
}

pub async fn targets_are_put_listed_and_removed(f: &Fixture) {
    let inv = &f.inv;
    assert!(inv.targets().await.unwrap().is_empty());
    let iscsi = Target {
        name: "t-iscsi".into(),
        transport: Transport::Iscsi(IscsiTarget {
            portals: vec!["198.18.0.1:3260".into(), "198.18.0.2:3260".into()],
            iqn: "iqn.2026-01.io.csi-scsi:a".into(),
            chap_secret_ref: Some(SecretRef {
                name: "chap-a".into(),
                namespace: "csi-scsi".into(),
            }),
        }),
        node_selector: labels(&[("rack", "r1")]),
        nodes: vec![],
        device_labels: labels(&[("tier", "fast")]),
        array: Some("array-a".into()),
        new_luns: NewLuns::Wipe,
    };
    let fc = Target {
        name: "t-fc".into(),
        transport: Transport::FibreChannel(FcTarget {
            wwpns: vec!["50:01:43:80:12:34:56:78".into()],
        }),
        node_selector: BTreeMap::new(),
        nodes: vec!["node-a".into(), "node-b".into()],
        device_labels: BTreeMap::new(),
        array: None,
        new_luns: NewLuns::Probe,
    };
    inv.put_target(iscsi.clone()).await.unwrap();
    inv.put_target(fc.clone()).await.unwrap();
    let want = vec![fc.clone(), iscsi.clone()];
    let list = || async { inv.targets().await.unwrap() };
    settle("both targets, by name", list, |t| *t == want).await;
    // Replaced: one target, its new spec.
    let moved = Target {
        transport: Transport::Iscsi(IscsiTarget {
            portals: vec!["198.18.0.3:3260".into()],
            iqn: "iqn.2026-01.io.csi-scsi:a".into(),
            chap_secret_ref: None,
        }),
        ..iscsi
    };
    inv.put_target(moved.clone()).await.unwrap();
    let want = vec![fc, moved.clone()];
    settle("the iSCSI target replaced", list, |t| *t == want).await;
    inv.remove_target("t-fc").await.unwrap();
    let want = vec![moved];
    settle("the FC target removed", list, |t| *t == want).await;
    // Removing what is not there is no error.
    inv.remove_target("t-fc").await.unwrap();
    inv.remove_target("never").await.unwrap();
}

pub async fn a_wwid_another_array_s_target_reports_is_flagged_and_never_merged(f: &Fixture) {
    let inv = &f.inv;
    inv.apply_discovery(round("t1", &[("node-a", vec![lun(1, GIB)])], &[]))
        .await
        .unwrap();
    let bound = inv
        .bind(sized(GIB, GIB, bind_req("pv-1", &[], "")))
        .await
        .unwrap();
    // t2, of no array in common, reports the same WWID from node-c, larger
    // and labelled otherwise.
    let out = inv
        .apply_discovery(DiscoveryRound {
            device_labels: labels(&[("zone", "b")]),
            ..round("t2", &[("node-c", vec![lun(1, 4 * GIB)])], &[])
        })
        .await
        .unwrap();
    assert_eq!(out.conflicts, [wwid(1)], "{out:?}");
    assert!(out.added.is_empty() && out.failed.is_empty(), "{out:?}");
    let d = get(inv, &wwid(1)).await;
    assert_eq!(d.target, "t1");
    assert_eq!(d.node_names(), ["node-a"], "no view through t2");
    assert_eq!((d.size_bytes, d.phase), (GIB, Phase::Bound));
    assert_eq!(d.labels, labels(&[("tier", "fast")]));
    assert_eq!(d.binding, bound.binding);
    let [c] = d.conflicts.as_slice() else {
        panic!("one conflict: {d:?}");
    };
    assert_eq!(
        (c.target.as_str(), c.nodes.as_slice()),
        ("t2", &[node("node-c")][..])
    );
    // t1's node answers without it: Lost, whatever t2 says.
    let out = inv
        .apply_discovery(round("t1", &[("node-a", vec![])], &[]))
        .await
        .unwrap();
    assert_eq!(out.lost, [wwid(1)]);
    // node-c answers t2 without it: the conflict clears (found through
    // the target it names, not only through t1).
    inv.apply_discovery(round("t2", &[("node-c", vec![])], &[]))
        .await
        .unwrap();
    let d = get(inv, &wwid(1)).await;
    assert!(d.conflicts.is_empty(), "{d:?}");
    assert_eq!((d.target.as_str(), d.phase), ("t1", Phase::Lost));
    assert!(d.nodes.is_empty());
}

pub async fn a_phantom_is_forgotten_only_after_a_clean_round_past_the_forget_time(f: &Fixture) {
    let inv = &f.inv;
    let forget = Some(3_600);
    let aged = |mut d: Device| {
        d.last_seen -= 3_600 + policy::LAST_SEEN_RESOLUTION;
        d
    };
    inv.apply_discovery(round(
        "t1",
        &[("node-a", vec![lun(1, GIB), lun(2, GIB), lun(3, GIB)])],
        &[],
    ))
    .await
    .unwrap();
    // 1 holds a volume; 1 and 2 are not seen for longer than the forget
    // time; 3 was seen just now.
    inv.bind(sized(GIB, GIB, bind_req("pv-1", &[], "")))
        .await
        .unwrap();
    for i in [1, 2] {
        inv.update(aged(get(inv, &wwid(i)).await)).await.unwrap();
    }
    let never = |_: &NodeName| false;
    let apply = |answered: Vec<(&'static str, Vec<LunReport>)>,
                 unanswered: &'static [&'static str]| {
        inv.apply_discovery_pruning(round("t1", &answered, unanswered), &never, forget)
    };
    // Still reported: kept, however old its last_seen.
    let out = apply(vec![("node-a", vec![lun(1, GIB), lun(2, GIB)])], &[])
        .await
        .unwrap();
    assert!(out.forgotten.is_empty(), "{out:?}");
    for i in [1, 2] {
        inv.update(aged(get(inv, &wwid(i)).await)).await.unwrap();
    }
    // node-a answers without any; node-b, asked too, does not answer:
    // doubt, nothing forgotten.
    let out = apply(vec![("node-a", vec![])], &["node-b"]).await.unwrap();
    assert!(out.forgotten.is_empty(), "{out:?}");
    // Every node answered: 2 goes; 1 (bound) and 3 (seen now) stay.
    let out = apply(vec![("node-a", vec![]), ("node-b", vec![])], &[])
        .await
        .unwrap();
    assert_eq!(out.forgotten, [wwid(2)], "{out:?}");
    assert!(inv.device(&wwid(2)).await.unwrap().is_none());
    assert_eq!(get(inv, &wwid(1)).await.phase, Phase::Lost);
    assert_eq!(get(inv, &wwid(3)).await.phase, Phase::Lost);
    // Forgotten, then reported again: a new device.
    let out = apply(vec![("node-a", vec![lun(2, GIB)])], &[])
        .await
        .unwrap();
    assert_eq!(out.added, [wwid(2)], "{out:?}");
    // Without a forget time nothing is ever forgotten.
    inv.update(aged(get(inv, &wwid(3)).await)).await.unwrap();
    let out = inv
        .apply_discovery(round("t1", &[("node-a", vec![lun(2, GIB)])], &[]))
        .await
        .unwrap();
    assert!(out.forgotten.is_empty(), "{out:?}");
    assert!(inv.device(&wwid(3)).await.unwrap().is_some());
}

/// Runs each named test above over both stores.
macro_rules! contract {
    ($($test:ident),* $(,)?) => {
        /// The contract over the SQLite store.
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(&super::Fixture::embedded().await).await;
                }
            )*
        }
        /// The contract over the Kubernetes store on a real API server.
        mod kube {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(&super::Fixture::kube().await).await;
                }
            )*
        }
    };
}

contract! {
    discovery_merges_reports_by_wwid_and_records_topology,
    a_wwid_another_array_s_target_reports_is_flagged_and_never_merged,
    a_phantom_is_forgotten_only_after_a_clean_round_past_the_forget_time,
    a_device_no_node_reports_goes_lost_keeps_its_binding_and_comes_back_bound,
    bind_picks_the_smallest_fit_matching_labels_and_topology,
    among_equal_sizes_bind_prefers_the_fewest_past_wipe_failures,
    concurrent_binds_over_fewer_devices_bind_each_device_at_most_once,
    a_stale_update_is_refused_as_a_conflict,
    modify_re_applies_its_change_after_a_conflict,
    capacity_counts_each_available_device_visible_from_the_nodes_once,
    capacity_counts_no_lun_a_bind_could_not_take,
    a_retired_device_is_never_bound_counted_or_scanned_for_a_wipe,
    bound_to_name_finds_a_volume_s_device_until_it_is_released,
    devices_pages_in_wwid_order,
    phase_counts_and_the_largest_size_cover_every_device,
    resize_requests_round_trip_and_update_in_place,
    targets_are_put_listed_and_removed,
}
