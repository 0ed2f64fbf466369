//! The embedded inventory on a real SQLite file: discovery merges, binds as
//! compare-and-swap, Lost handling, schema inspection with the sqlite3 tool;
//! and ControllerUnpublish with the agents file as the list of nodes.
#![allow(clippy::unwrap_used)]

#[path = "support/lifecycle.rs"]
mod lifecycle_support;

use std::collections::BTreeMap;
use std::sync::Arc;

use csi_scsi_proxy::directory::FileDirectory;
use csi_scsi_proxy::inventory::{
    BindRequest, Binding, DiscoveryRound, EmbeddedInventory, Inventory, InventoryError, LunReport,
    Phase, Publication,
};
use csi_scsi_proxy::selector::Selector;
use tonic::{Code, Status};

fn lun(i: u32, size: u64) -> LunReport {
    LunReport {
        wwid: format!("naa.6001405{i:025x}"),
        lun: i,
        size_bytes: size,
        vendor: "LIO-ORG".into(),
        model: "disk".into(),
        serial: format!("sn{i}"),
        paths: vec![format!(
            "ip-198.18.0.1:3260-iscsi-iqn.2026-01.io.csi-scsi:a-lun-{i}"
        )],
    }
}

fn round(target: &str, answered: &[(&str, Vec<LunReport>)], unanswered: &[&str]) -> DiscoveryRound {
    DiscoveryRound {
        target: target.into(),
        device_labels: BTreeMap::from([("tier".into(), "fast".into())]),
        answered: answered
            .iter()
            .map(|(n, l)| (n.to_string(), l.clone()))
            .collect(),
        unanswered: unanswered.iter().map(|s| s.to_string()).collect(),
    }
}

fn binding(name: &str) -> Binding {
    Binding {
        uid: uuid_like(name),
        volume_name: name.into(),
        required_bytes: 1,
        limit_bytes: 0,
        capabilities: vec!["mount:ext4:SINGLE_NODE_WRITER".into()],
        parameters: BTreeMap::new(),
        cleanup: "zero".into(),
    }
}

fn uuid_like(name: &str) -> String {
    format!(
        "uid-{}",
        name.replace(|c: char| !c.is_ascii_alphanumeric(), "-")
    )
}

fn bind_req(name: &str, nodes: &[&str], selector: &str) -> BindRequest {
    BindRequest {
        binding: binding(name),
        topology: nodes.iter().map(|n| vec![n.to_string()]).collect(),
        selector: Selector::parse(selector).unwrap(),
    }
}

fn open(dir: &tempfile::TempDir) -> EmbeddedInventory {
    EmbeddedInventory::open(&dir.path().join("inventory.db")).unwrap()
}

#[tokio::test]
async fn discovery_merges_reports_by_wwid_and_records_topology() {
    let dir = tempfile::tempdir().unwrap();
    let inv = open(&dir);
    let out = inv
        .apply_discovery(round(
            "t1",
            &[
                ("node-a", vec![lun(1, 1 << 30)]),
                ("node-b", vec![lun(1, 1 << 30), lun(2, 2 << 30)]),
            ],
            &[],
        ))
        .await
        .unwrap();
    assert_eq!(out.added.len(), 2);
    let d1 = inv.device(&lun(1, 0).wwid).await.unwrap().unwrap();
    assert_eq!(d1.phase, Phase::Available);
    assert_eq!(d1.node_names(), vec!["node-a", "node-b"]);
    assert_eq!(d1.labels.get("tier").map(String::as_str), Some("fast"));
    // The same LUN through a second target is a second path, not a second device.
    inv.apply_discovery(round("t2", &[("node-c", vec![lun(1, 1 << 30)])], &[]))
        .await
        .unwrap();
    let d1 = inv.device(&lun(1, 0).wwid).await.unwrap().unwrap();
    assert_eq!(d1.node_names(), vec!["node-a", "node-b", "node-c"]);
    assert_eq!(inv.devices(None, 100).await.unwrap().len(), 2);
}

#[tokio::test]
async fn a_device_no_node_reports_goes_lost_and_keeps_its_binding() {
    let dir = tempfile::tempdir().unwrap();
    let inv = open(&dir);
    inv.apply_discovery(round("t1", &[("node-a", vec![lun(1, 1 << 30)])], &[]))
        .await
        .unwrap();
    let bound = inv
        .bind(bind_req("pv-1", &[], ""), 1, u64::MAX)
        .await
        .unwrap();
    // node-a silent: its earlier report stands.
    inv.apply_discovery(round("t1", &[], &["node-a"]))
        .await
        .unwrap();
    assert_eq!(
        inv.device(&bound.wwid).await.unwrap().unwrap().phase,
        Phase::Bound
    );
    // node-a answers without the LUN: Lost, binding kept.
    let out = inv
        .apply_discovery(round("t1", &[("node-a", vec![])], &[]))
        .await
        .unwrap();
    assert_eq!(out.lost, vec![bound.wwid.clone()]);
    let lost = inv.device(&bound.wwid).await.unwrap().unwrap();
    assert_eq!(lost.phase, Phase::Lost);
    assert_eq!(lost.binding.as_ref().unwrap().volume_name, "pv-1");
    // It comes back: Bound again.
    let out = inv
        .apply_discovery(round("t1", &[("node-a", vec![lun(1, 1 << 30)])], &[]))
        .await
        .unwrap();
    assert_eq!(out.found, vec![bound.wwid.clone()]);
    assert_eq!(
        inv.device(&bound.wwid).await.unwrap().unwrap().phase,
        Phase::Bound
    );
}

#[tokio::test]
async fn bind_picks_the_smallest_fit_matching_labels_and_topology() {
    let dir = tempfile::tempdir().unwrap();
    let inv = open(&dir);
    inv.apply_discovery(round(
        "t1",
        &[
            ("node-a", vec![lun(1, 4 << 30), lun(2, 1 << 30)]),
            ("node-b", vec![lun(3, 2 << 30)]),
        ],
        &[],
    ))
    .await
    .unwrap();
    let d = inv
        .bind(bind_req("pv-1", &[], ""), 1 << 30, u64::MAX)
        .await
        .unwrap();
    assert_eq!(d.wwid, lun(2, 0).wwid, "smallest fit");
    let d = inv
        .bind(
            bind_req("pv-2", &["node-b", "node-a"], ""),
            1 << 30,
            u64::MAX,
        )
        .await
        .unwrap();
    assert_eq!(d.wwid, lun(3, 0).wwid, "preferred node first");
    let err = inv
        .bind(bind_req("pv-3", &[], "tier=slow"), 1, u64::MAX)
        .await
        .unwrap_err();
    assert!(matches!(err, InventoryError::NoFit(_)), "{err}");
    let err = inv
        .bind(bind_req("pv-3", &["node-c"], ""), 1, u64::MAX)
        .await
        .unwrap_err();
    assert!(matches!(err, InventoryError::NoFit(_)), "{err}");
    // A retry of a bound name returns the same device.
    let again = inv
        .bind(bind_req("pv-1", &[], ""), 1 << 30, u64::MAX)
        .await
        .unwrap();
    assert_eq!(again.wwid, lun(2, 0).wwid);
}

#[tokio::test]
async fn two_hundred_concurrent_binds_over_one_hundred_devices_bind_each_at_most_once() {
    let dir = tempfile::tempdir().unwrap();
    let inv = Arc::new(open(&dir));
    let luns: Vec<_> = (0..100).map(|i| lun(i, 1 << 30)).collect();
    inv.apply_discovery(round("t1", &[("node-a", luns)], &[]))
        .await
        .unwrap();
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let inv = inv.clone();
            tokio::spawn(async move {
                inv.bind(bind_req(&format!("pv-{i}"), &[], ""), 1, u64::MAX)
                    .await
            })
        })
        .collect();
    let results = futures::future::join_all(tasks).await;
    let bound: Vec<_> = results
        .into_iter()
        .map(|r| r.unwrap())
        .filter_map(Result::ok)
        .collect();
    assert_eq!(bound.len(), 100);
    let mut wwids: Vec<_> = bound.iter().map(|d| d.wwid.clone()).collect();
    wwids.sort();
    wwids.dedup();
    assert_eq!(wwids.len(), 100, "no device bound twice");
    // And the store agrees, through a second connection.
    let check = open(&dir);
    let all = check.devices(None, 1000).await.unwrap();
    assert!(all.iter().all(|d| d.phase == Phase::Bound));
    let mut names: Vec<_> = all
        .iter()
        .map(|d| d.binding.as_ref().unwrap().volume_name.clone())
        .collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 100, "one name per device");
}

#[tokio::test]
async fn a_stale_update_is_refused_as_a_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let inv = open(&dir);
    inv.apply_discovery(round("t1", &[("node-a", vec![lun(1, 1 << 30)])], &[]))
        .await
        .unwrap();
    let d = inv
        .bind(bind_req("pv-1", &[], ""), 1, u64::MAX)
        .await
        .unwrap();
    let mut first = d.clone();
    first.published = vec![publication("node-a")];
    inv.update(first).await.unwrap();
    let mut stale = d;
    stale.published = vec![publication("node-b")];
    let err = inv.update(stale).await.unwrap_err();
    assert!(matches!(err, InventoryError::Conflict(_)), "{err}");
}

#[tokio::test]
async fn the_store_is_a_plain_sqlite_file_the_sqlite3_tool_can_read() {
    let dir = tempfile::tempdir().unwrap();
    let inv = open(&dir);
    inv.apply_discovery(round("t1", &[("node-a", vec![lun(7, 1 << 30)])], &[]))
        .await
        .unwrap();
    let out = std::process::Command::new("sqlite3")
        .arg(inv.path())
        .arg("PRAGMA user_version; PRAGMA journal_mode; SELECT wwid, phase FROM devices;")
        .output();
    let Ok(out) = out else {
        panic!("sqlite3 is not installed: .ci/run installs it");
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("2\nwal\n"), "{text}");
    assert!(
        text.contains(&format!("{}|Available", lun(7, 0).wwid)),
        "{text}"
    );
    // Reopening runs no migration twice.
    drop(inv);
    let again = open(&dir);
    assert_eq!(again.devices(None, 10).await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_version_1_store_is_migrated_and_keeps_its_devices() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("inventory.db");
    // A store as the first release wrote it.
    let v1 = "PRAGMA journal_mode=WAL;
        CREATE TABLE targets (name TEXT PRIMARY KEY, spec TEXT NOT NULL);
        CREATE TABLE devices (wwid TEXT PRIMARY KEY, target TEXT NOT NULL, lun INTEGER NOT NULL,
            size_bytes INTEGER NOT NULL, vendor TEXT NOT NULL, model TEXT NOT NULL, serial TEXT NOT NULL,
            labels TEXT NOT NULL, phase TEXT NOT NULL CHECK (phase IN ('Available','Bound','Releasing','Failed','Lost')),
            binding_uid TEXT, volume_name TEXT, binding TEXT, nodes TEXT NOT NULL, published TEXT NOT NULL,
            last_seen INTEGER NOT NULL, reason TEXT NOT NULL, generation INTEGER NOT NULL);
        CREATE UNIQUE INDEX devices_volume_name ON devices (volume_name) WHERE volume_name IS NOT NULL;
        CREATE INDEX devices_free ON devices (phase, size_bytes, wwid);
        CREATE INDEX devices_target ON devices (target);
        CREATE TABLE device_nodes (node TEXT NOT NULL, wwid TEXT NOT NULL REFERENCES devices (wwid) ON DELETE CASCADE,
            target TEXT NOT NULL, PRIMARY KEY (node, wwid, target)) WITHOUT ROWID;
        CREATE INDEX device_nodes_wwid ON device_nodes (wwid);
        CREATE INDEX device_nodes_target ON device_nodes (target, wwid);
        CREATE TABLE resize_requests (name TEXT PRIMARY KEY, volume_id TEXT NOT NULL, wwid TEXT NOT NULL,
            requested_bytes INTEGER NOT NULL, current_bytes INTEGER NOT NULL, created INTEGER NOT NULL, done INTEGER NOT NULL);
        INSERT INTO devices VALUES ('naa.60014050000000000000000000000001','t1',1,1073741824,'LIO','disk','sn','{}',
            'Available',NULL,NULL,NULL,'[{\"node\":\"node-a\",\"target\":\"t1\",\"paths\":[]}]','[]',0,'',1);
        INSERT INTO device_nodes VALUES ('node-a','naa.60014050000000000000000000000001','t1');
        PRAGMA user_version = 1;";
    let out = std::process::Command::new("sqlite3")
        .arg(&db)
        .arg(v1)
        .output()
        .expect("sqlite3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let inv = EmbeddedInventory::open(&db).unwrap();
    let d = inv
        .bind(bind_req("pv-1", &["node-a"], ""), 1, u64::MAX)
        .await
        .unwrap();
    assert_eq!(d.wwid, "naa.60014050000000000000000000000001");
}

/// A publication on `node` (single-node writer, on a filesystem).
fn publication(node: &str) -> Publication {
    Publication {
        node: node.to_owned(),
        access: "mount:ext4:SINGLE_NODE_WRITER".to_owned(),
        readonly: false,
    }
}

#[tokio::test]
async fn unpublish_waits_for_a_listed_agent_that_does_not_answer_and_forgets_a_node_removed_from_the_file()
 {
    let dir = tempfile::tempdir().unwrap();
    let inv = open(&dir);
    inv.apply_discovery(round("t1", &[("node-a", vec![lun(1, 1 << 30)])], &[]))
        .await
        .unwrap();
    let mut dev = inv
        .bind(bind_req("pv-1", &[], ""), 1, u64::MAX)
        .await
        .unwrap();
    dev.published = vec![publication("node-a")];
    inv.update(dev.clone()).await.unwrap();
    let id = format!("{}:{}", dev.wwid, uuid_like("pv-1"));
    // node-a is listed, at an address where nothing listens any more.
    let silent = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let agents_file = dir.path().join("agents");
    std::fs::write(&agents_file, format!("node-a {silent}\n")).unwrap();
    let agents = FileDirectory::load(&agents_file).unwrap();
    let life = lifecycle_support::lifecycle(Arc::new(inv.clone()), agents.clone(), dir.path());
    let published_to = || async {
        inv.device(&dev.wwid)
            .await
            .unwrap()
            .unwrap()
            .published_nodes()
    };

    let refused = Status::from(life.unpublish(&id, "node-a", "t").await.unwrap_err());
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("node-a"), "{refused:?}");
    assert_eq!(published_to().await, ["node-a"], "the record is kept");
    let delete = Status::from(life.delete(&id, "t").await.unwrap_err());
    assert_eq!(delete.code(), Code::FailedPrecondition, "{delete:?}");

    // Removed from the file: the node is gone, nothing is attached there.
    std::fs::write(&agents_file, "# node-a decommissioned\n").unwrap();
    assert!(agents.reload().unwrap());
    life.unpublish(&id, "node-a", "t").await.unwrap();
    assert!(published_to().await.is_empty(), "the record is dropped");
}
