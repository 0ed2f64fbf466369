//! What only the embedded store does: it is a plain SQLite file the
//! `sqlite3` tool reads, and a store an older release wrote is migrated
//! in place.

use std::path::Path;
use std::sync::Arc;

use csi_scsi_proxy::device::{DiscoveryRound, NewLuns, Phase};
use csi_scsi_proxy::inventory::{EmbeddedInventory, Inventory, InventoryError};

use crate::devices::{bind_req, lun, round, wwid};

const SCHEMA_VERSION: u32 = 6;

/// Runs `sql` through the sqlite3 tool; its output.
fn sqlite3(db: &Path, sql: &str) -> String {
    let Ok(out) = std::process::Command::new("sqlite3")
        .arg(db)
        .arg(sql)
        .output()
    else {
        panic!("sqlite3 is not installed: .ci/run installs it");
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn the_store_is_a_plain_sqlite_file_the_sqlite3_tool_can_read() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("inventory.db");
    let store = EmbeddedInventory::open(&db).unwrap();
    assert_eq!(store.path(), db);
    assert!(store.is_open());
    let inv = Inventory::new(Arc::new(store));
    inv.apply_discovery(round("t1", &[("node-a", vec![lun(7, 1 << 30)])], &[]))
        .await
        .unwrap();
    inv.bind(bind_req("pv-1", &[], "")).await.unwrap();
    let text = sqlite3(
        &db,
        "PRAGMA user_version; PRAGMA journal_mode; SELECT wwid, phase, volume_name, wipe_failures FROM devices;",
    );
    assert_eq!(
        text,
        format!("{SCHEMA_VERSION}\nwal\n{}|Bound|pv-1|0\n", wwid(7)),
    );
    // Reopening runs no migration twice.
    drop(inv);
    let again = Inventory::new(Arc::new(EmbeddedInventory::open(&db).unwrap()));
    assert_eq!(again.devices(None, 10).await.unwrap().len(), 1);
    assert_eq!(
        sqlite3(&db, "PRAGMA user_version;"),
        format!("{SCHEMA_VERSION}\n")
    );
}

/// A store as the first release wrote it, with one Available device.
const V1: &str = "PRAGMA journal_mode=WAL;
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

/// What the second release added: the node index carries phase and size.
const V2: &str = "ALTER TABLE device_nodes ADD COLUMN phase TEXT NOT NULL DEFAULT '';
    ALTER TABLE device_nodes ADD COLUMN size_bytes INTEGER NOT NULL DEFAULT 0;
    UPDATE device_nodes SET
        phase = (SELECT d.phase FROM devices d WHERE d.wwid = device_nodes.wwid),
        size_bytes = (SELECT d.size_bytes FROM devices d WHERE d.wwid = device_nodes.wwid);
    CREATE INDEX device_nodes_free ON device_nodes (node, phase, size_bytes, wwid);
    PRAGMA user_version = 2;";

#[tokio::test]
async fn a_version_1_or_2_store_is_migrated_and_keeps_its_devices_with_no_wipe_failures() {
    for (version, script) in [(1, V1.to_owned()), (2, format!("{V1}\n{V2}"))] {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("inventory.db");
        sqlite3(&db, &script);
        assert_eq!(sqlite3(&db, "PRAGMA user_version;"), format!("{version}\n"));
        let inv = Inventory::new(Arc::new(EmbeddedInventory::open(&db).unwrap()));
        assert_eq!(
            sqlite3(
                &db,
                "PRAGMA user_version; SELECT wwid, wipe_failures FROM devices;"
            ),
            format!("{SCHEMA_VERSION}\n{}|0\n", wwid(1)),
            "from version {version}"
        );
        let d = inv.device(&wwid(1)).await.unwrap().unwrap();
        assert_eq!(d.wipe_failures, 0);
        assert!(d.conflicts.is_empty(), "from version {version}");
        assert_eq!(d.node_names(), ["node-a"]);
        // Bindable through the node index.
        let d = inv.bind(bind_req("pv-1", &["node-a"], "")).await.unwrap();
        assert_eq!(d.wwid, wwid(1), "from version {version}");
        assert_eq!(d.generation, 2);
        // The phases added since (a new LUN of a probing target is
        // Unverified) are stored, and the rebuilt node index still
        // references the devices: a device's removal takes its rows along.
        inv.apply_discovery(DiscoveryRound {
            new_luns: NewLuns::Probe,
            ..round(
                "t1",
                &[("node-a", vec![lun(1, 1 << 30), lun(2, 1 << 30)])],
                &[],
            )
        })
        .await
        .unwrap();
        assert_eq!(
            inv.device(&wwid(2)).await.unwrap().unwrap().phase,
            Phase::Unverified
        );
        assert_eq!(
            sqlite3(
                &db,
                &format!(
                    "PRAGMA foreign_keys = ON; PRAGMA foreign_key_check;
                     DELETE FROM devices WHERE wwid = '{}';
                     SELECT count(*) FROM device_nodes;",
                    wwid(2)
                )
            ),
            "1\n",
            "from version {version}"
        );
    }
}

#[tokio::test]
async fn a_device_changed_under_the_read_cache_is_read_again_by_the_next_write() {
    // Reads by WWID come from memory; the file stays the truth. A row
    // changed behind the proxy's back (here by sqlite3) makes the next
    // write lose its compare-and-swap, which drops the remembered copy:
    // the retry applies the change to what the file holds, keeping both.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("inventory.db");
    let inv = Inventory::new(Arc::new(EmbeddedInventory::open(&db).unwrap()));
    inv.apply_discovery(round("t1", &[("node-a", vec![lun(7, 1 << 30)])], &[]))
        .await
        .unwrap();
    let w = wwid(7);
    let before = inv.device(&w).await.unwrap().expect("discovered");
    sqlite3(
        &db,
        &format!(
            "UPDATE devices SET reason = 'set outside', generation = generation + 1 WHERE wwid = '{w}';"
        ),
    );
    let after = inv
        .modify(&w, |d| {
            d.wipe_failures += 1;
            true
        })
        .await
        .unwrap()
        .expect("still there");
    assert_eq!(after.reason, "set outside", "the write saw the file");
    assert_eq!(after.wipe_failures, before.wipe_failures + 1);
    assert_eq!(after.generation, before.generation + 2);
    // The remembered copy is the written one, and so is the file.
    let read = inv.device(&w).await.unwrap().expect("there");
    assert_eq!(
        (read.reason.as_str(), read.generation),
        ("set outside", after.generation)
    );
    assert_eq!(
        sqlite3(
            &db,
            &format!("SELECT reason, wipe_failures, generation FROM devices WHERE wwid = '{w}';")
        ),
        format!("set outside|{}|{}\n", after.wipe_failures, after.generation)
    );
}

#[tokio::test]
async fn a_lun_retired_with_sqlite3_while_the_proxy_is_stopped_is_never_bound() {
    // docs/troubleshooting.md, embedded: stop the proxy, set `retired`,
    // start it again.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("inventory.db");
    let inv = Inventory::new(Arc::new(EmbeddedInventory::open(&db).unwrap()));
    inv.apply_discovery(round(
        "t1",
        &[("node-a", vec![lun(1, 1 << 30), lun(2, 2 << 30)])],
        &[],
    ))
    .await
    .unwrap();
    drop(inv);
    let w = wwid(1);
    sqlite3(
        &db,
        &format!("UPDATE devices SET retired = 1 WHERE wwid = '{w}';"),
    );
    assert_eq!(
        sqlite3(
            &db,
            "SELECT wwid, phase, retired FROM devices WHERE retired = 1;"
        ),
        format!("{w}|Available|1\n")
    );
    let inv = Inventory::new(Arc::new(EmbeddedInventory::open(&db).unwrap()));
    assert!(inv.device(&w).await.unwrap().unwrap().retired);
    let d = inv.bind(bind_req("pv-1", &["node-a"], "")).await.unwrap();
    assert_eq!(
        d.wwid,
        wwid(2),
        "the retired LUN, though smaller, is passed over"
    );
    let none = inv.bind(bind_req("pv-2", &[], "")).await.unwrap_err();
    assert!(
        matches!(none, InventoryError::NoFit(_)),
        "and never bound: {none}"
    );
    // The proxy's own writes of it keep the column.
    inv.apply_discovery(round(
        "t1",
        &[
            ("node-a", vec![lun(1, 1 << 30), lun(2, 2 << 30)]),
            ("node-b", vec![lun(1, 1 << 30)]),
        ],
        &[],
    ))
    .await
    .unwrap();
    assert_eq!(
        sqlite3(
            &db,
            &format!("SELECT retired FROM devices WHERE wwid = '{w}';")
        ),
        "1\n"
    );
    assert_eq!(
        inv.device(&w).await.unwrap().unwrap().node_names(),
        ["node-a", "node-b"]
    );
}
