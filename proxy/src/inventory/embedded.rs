//! The embedded inventory: one SQLite database (bundled build) in WAL mode
//! with full sync, so a committed bind survives a crash or `kill -9`.
//! One connection behind a mutex: every write is a short transaction, and
//! every bind selects and claims its device inside one `IMMEDIATE`
//! transaction. Lookups are indexed; CreateVolume never scans every device.
//! Inspect it with `sqlite3 <file> 'select wwid, phase, volume_name from devices'`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use csi_scsi_contract::{NodeName, Wwid};
use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, params};

use super::{AvailableQuery, InventoryError, Store, Summary, Write};
use crate::device::{
    Device, DiscoveryRound, Phase, ResizeRequest, Target, TargetRefused, canonical_wwid,
};

/// Schema migrations, applied in order; `PRAGMA user_version` records how
/// many have run. Never edit a released step: append a new one.
const MIGRATIONS: &[&str] = &[
    // 1: targets, devices, the node index, resize requests.
    "CREATE TABLE targets (name TEXT PRIMARY KEY, spec TEXT NOT NULL);
     CREATE TABLE devices (
         wwid TEXT PRIMARY KEY,
         target TEXT NOT NULL,
         lun INTEGER NOT NULL,
         size_bytes INTEGER NOT NULL,
         vendor TEXT NOT NULL,
         model TEXT NOT NULL,
         serial TEXT NOT NULL,
         labels TEXT NOT NULL,
         phase TEXT NOT NULL
             CHECK (phase IN ('Available', 'Bound', 'Releasing', 'Failed', 'Lost')),
         binding_uid TEXT,
         volume_name TEXT,
         binding TEXT,
         nodes TEXT NOT NULL,
         published TEXT NOT NULL,
         last_seen INTEGER NOT NULL,
         reason TEXT NOT NULL,
         generation INTEGER NOT NULL
     );
     CREATE UNIQUE INDEX devices_volume_name ON devices (volume_name)
         WHERE volume_name IS NOT NULL;
     CREATE INDEX devices_free ON devices (phase, size_bytes, wwid);
     CREATE INDEX devices_target ON devices (target);
     CREATE TABLE device_nodes (
         node TEXT NOT NULL,
         wwid TEXT NOT NULL REFERENCES devices (wwid) ON DELETE CASCADE,
         target TEXT NOT NULL,
         PRIMARY KEY (node, wwid, target)
     ) WITHOUT ROWID;
     CREATE INDEX device_nodes_wwid ON device_nodes (wwid);
     CREATE INDEX device_nodes_target ON device_nodes (target, wwid);
     CREATE TABLE resize_requests (
         name TEXT PRIMARY KEY,
         volume_id TEXT NOT NULL,
         wwid TEXT NOT NULL,
         requested_bytes INTEGER NOT NULL,
         current_bytes INTEGER NOT NULL,
         created INTEGER NOT NULL,
         done INTEGER NOT NULL
     );",
    // 2: the node index carries each device's phase and size, so picking the
    // smallest Available device visible from a node is an index range scan
    // (no sort of every device the node sees).
    "ALTER TABLE device_nodes ADD COLUMN phase TEXT NOT NULL DEFAULT '';
     ALTER TABLE device_nodes ADD COLUMN size_bytes INTEGER NOT NULL DEFAULT 0;
     UPDATE device_nodes SET
         phase = (SELECT d.phase FROM devices d WHERE d.wwid = device_nodes.wwid),
         size_bytes = (SELECT d.size_bytes FROM devices d WHERE d.wwid = device_nodes.wwid);
     CREATE INDEX device_nodes_free ON device_nodes (node, phase, size_bytes, wwid);",
    // 3: how many wipes of a device failed; bind prefers fewer, so both
    // free-device indexes order by (size, wipe failures, WWID), the order
    // of `policy::preference_key`.
    "ALTER TABLE devices ADD COLUMN wipe_failures INTEGER NOT NULL DEFAULT 0;
     ALTER TABLE device_nodes ADD COLUMN wipe_failures INTEGER NOT NULL DEFAULT 0;
     DROP INDEX devices_free;
     CREATE INDEX devices_free ON devices (phase, size_bytes, wipe_failures, wwid);
     DROP INDEX device_nodes_free;
     CREATE INDEX device_nodes_free ON device_nodes (node, phase, size_bytes, wipe_failures, wwid);",
    // 4: targets of another array that report a device's WWID (never
    // merged), as JSON; the few devices that have any are indexed, so a
    // round of such a target finds them without a scan.
    "ALTER TABLE devices ADD COLUMN conflicts TEXT NOT NULL DEFAULT '[]';
     CREATE INDEX devices_conflicted ON devices (wwid) WHERE conflicts <> '[]';",
    // 5: the phase list is no longer fixed in a CHECK (new LUNs added
    // Unverified and HoldsData): `Phase::parse` is the one place that
    // knows the phases, and refuses a row it does not. SQLite cannot drop
    // a CHECK, so both tables are rebuilt (device_nodes references
    // devices) with their rows and indexes.
    "CREATE TABLE devices_v5 (
         wwid TEXT PRIMARY KEY,
         target TEXT NOT NULL,
         lun INTEGER NOT NULL,
         size_bytes INTEGER NOT NULL,
         vendor TEXT NOT NULL,
         model TEXT NOT NULL,
         serial TEXT NOT NULL,
         labels TEXT NOT NULL,
         phase TEXT NOT NULL,
         binding_uid TEXT,
         volume_name TEXT,
         binding TEXT,
         nodes TEXT NOT NULL,
         published TEXT NOT NULL,
         last_seen INTEGER NOT NULL,
         reason TEXT NOT NULL,
         generation INTEGER NOT NULL,
         wipe_failures INTEGER NOT NULL DEFAULT 0,
         conflicts TEXT NOT NULL DEFAULT '[]'
     );
     INSERT INTO devices_v5 (wwid, target, lun, size_bytes, vendor, model, serial, labels, phase,
         binding_uid, volume_name, binding, nodes, published, last_seen, reason, generation,
         wipe_failures, conflicts)
     SELECT wwid, target, lun, size_bytes, vendor, model, serial, labels, phase,
         binding_uid, volume_name, binding, nodes, published, last_seen, reason, generation,
         wipe_failures, conflicts FROM devices;
     CREATE TABLE device_nodes_v5 (
         node TEXT NOT NULL,
         wwid TEXT NOT NULL REFERENCES devices_v5 (wwid) ON DELETE CASCADE,
         target TEXT NOT NULL,
         phase TEXT NOT NULL DEFAULT '',
         size_bytes INTEGER NOT NULL DEFAULT 0,
         wipe_failures INTEGER NOT NULL DEFAULT 0,
         PRIMARY KEY (node, wwid, target)
     ) WITHOUT ROWID;
     INSERT INTO device_nodes_v5 (node, wwid, target, phase, size_bytes, wipe_failures)
     SELECT node, wwid, target, phase, size_bytes, wipe_failures FROM device_nodes;
     DROP TABLE device_nodes;
     DROP TABLE devices;
     ALTER TABLE devices_v5 RENAME TO devices;
     ALTER TABLE device_nodes_v5 RENAME TO device_nodes;
     CREATE UNIQUE INDEX devices_volume_name ON devices (volume_name)
         WHERE volume_name IS NOT NULL;
     CREATE INDEX devices_free ON devices (phase, size_bytes, wipe_failures, wwid);
     CREATE INDEX devices_target ON devices (target);
     CREATE INDEX devices_conflicted ON devices (wwid) WHERE conflicts <> '[]';
     CREATE INDEX device_nodes_wwid ON device_nodes (wwid);
     CREATE INDEX device_nodes_target ON device_nodes (target, wwid);
     CREATE INDEX device_nodes_free ON device_nodes (node, phase, size_bytes, wipe_failures, wwid);",
    // 6: what an operator sets on a device (`Device::retired`,
    // `Device::retry_wipe`); the proxy writes back what it read.
    "ALTER TABLE devices ADD COLUMN retired INTEGER NOT NULL DEFAULT 0;
     ALTER TABLE devices ADD COLUMN retry_wipe TEXT NOT NULL DEFAULT '';",
];

/// The SQLite-backed inventory.
#[derive(Clone)]
pub struct EmbeddedInventory {
    conn: Arc<Mutex<Connection>>,
    path: PathBuf,
    cache: Arc<Mutex<ReadCache>>,
}

/// What the hot paths read (a publish reads its device and the targets)
/// served from memory. The database stays the only durable truth: an entry
/// is filled from a committed read and replaced only by a committed write,
/// so it never shows what is not on disk. This process is the store's only
/// writer; a write that finds the row changed under it (a lost
/// compare-and-swap) drops the entry, so the retry reads the file again.
#[derive(Default)]
struct ReadCache {
    targets: Option<Vec<Target>>,
    /// Devices read by WWID since start (not the whole inventory: discovery
    /// writes of devices nobody asked for do not fill it).
    devices: HashMap<Wwid, Device>,
}

/// The cache behind its lock; a poisoned lock is usable (every update is
/// one assignment or removal).
fn locked(cache: &Mutex<ReadCache>) -> MutexGuard<'_, ReadCache> {
    cache.lock().unwrap_or_else(|p| p.into_inner())
}

// === impl ReadCache ===

impl ReadCache {
    /// Takes in what a committed write left: the written devices replace
    /// their entries, a lost compare-and-swap drops its entry.
    fn committed(&mut self, results: &[Result<Device, InventoryError>]) {
        for r in results {
            match r {
                Ok(dev) => {
                    if let Some(entry) = self.devices.get_mut(&dev.wwid) {
                        *entry = dev.clone();
                    }
                }
                Err(InventoryError::Conflict(wwid)) => {
                    self.devices.remove(wwid);
                }
                Err(_) => {}
            }
        }
    }
}

// === impl EmbeddedInventory ===

impl EmbeddedInventory {
    /// Opens (creating if needed) the database at `path` and migrates it.
    pub fn open(path: &Path) -> Result<Self, InventoryError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| store(format!("{}: {e}", dir.display())))?;
        }
        let mut conn =
            Connection::open(path).map_err(|e| store(format!("{}: {e}", path.display())))?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(sql)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(sql)?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(sql)?;
        conn.busy_timeout(std::time::Duration::from_secs(10))
            .map_err(sql)?;
        migrate(&mut conn)?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            path: path.to_owned(),
            cache: Arc::default(),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the database answers a trivial query (readiness).
    pub fn is_open(&self) -> bool {
        self.conn
            .lock()
            .map(|c| c.query_row("SELECT 1", [], |r| r.get::<_, i64>(0)).is_ok())
            .unwrap_or(false)
    }

    /// The read cache.
    fn cache(&self) -> MutexGuard<'_, ReadCache> {
        locked(&self.cache)
    }

    /// Runs `f` on the connection off the async threads.
    async fn with<T, F>(&self, f: F) -> Result<T, InventoryError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, InventoryError> + Send + 'static,
    {
        let conn = self.conn.clone();
        let result = tokio::task::spawn_blocking(move || {
            // A panic while holding the lock leaves SQLite consistent (the
            // transaction rolls back on drop), so a poisoned lock is usable.
            let mut guard = conn.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut guard)
        })
        .await
        .map_err(|e| store(format!("store task failed: {e}")))?;
        // Name the file, so the operator knows which file system to look at.
        result.map_err(|e| match e {
            InventoryError::StoreFull(m) => {
                InventoryError::StoreFull(format!("{}: {m}", self.path.display()))
            }
            InventoryError::StoreUnwritable(m) => {
                InventoryError::StoreUnwritable(format!("{}: {m}", self.path.display()))
            }
            other => other,
        })
    }
}

fn migrate(conn: &mut Connection) -> Result<(), InventoryError> {
    let version: usize = conn
        .pragma_query_value(None, "user_version", |r| r.get::<_, i64>(0))
        .map_err(sql)?
        .try_into()
        .unwrap_or(0);
    if version > MIGRATIONS.len() {
        return Err(store(format!(
            "database schema version {version} is newer than this proxy ({}); refusing to touch it",
            MIGRATIONS.len()
        )));
    }
    for (i, step) in MIGRATIONS.iter().enumerate().skip(version) {
        let tx = conn.transaction().map_err(sql)?;
        tx.execute_batch(step).map_err(sql)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)
            .map_err(sql)?;
        tx.commit().map_err(sql)?;
        tracing::info!(version = i + 1, "inventory schema migrated");
    }
    Ok(())
}

fn store(msg: String) -> InventoryError {
    InventoryError::Store(msg)
}

/// Says what kind of failure an SQLite error is: a full or unwritable file
/// system clears by itself (the CO retries); anything else is a defect.
fn sql(e: rusqlite::Error) -> InventoryError {
    use rusqlite::ErrorCode;
    let extended = e.sqlite_error().map_or(0, |f| f.extended_code);
    match e.sqlite_error_code() {
        Some(ErrorCode::DiskFull) => InventoryError::StoreFull(e.to_string()),
        Some(ErrorCode::SystemIoFailure)
            if matches!(
                extended,
                rusqlite::ffi::SQLITE_IOERR_READ | rusqlite::ffi::SQLITE_IOERR_SHORT_READ
            ) =>
        {
            InventoryError::Store(format!("read failed: {e}"))
        }
        Some(ErrorCode::ReadOnly | ErrorCode::SystemIoFailure | ErrorCode::CannotOpen) => {
            InventoryError::StoreUnwritable(e.to_string())
        }
        _ => InventoryError::Sqlite(e),
    }
}

fn json<T: serde::Serialize>(v: &T) -> Result<String, InventoryError> {
    serde_json::to_string(v).map_err(|e| store(e.to_string()))
}

fn from_json<T: serde::de::DeserializeOwned>(s: &str) -> rusqlite::Result<T> {
    serde_json::from_str(s).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(e))
    })
}

/// Column `idx` as a WWID: only the canonical form the store writes reads
/// back (anything else is a row this proxy did not write, refused).
fn wwid_column(r: &Row<'_>, idx: usize) -> rusqlite::Result<Wwid> {
    let text: String = r.get(idx)?;
    canonical_wwid(&text).map_err(|reason| {
        rusqlite::Error::FromSqlConversionFailure(idx, rusqlite::types::Type::Text, reason.into())
    })
}

/// The devices `SELECT … FROM devices WHERE <condition>` finds.
fn devices_where(
    conn: &Connection,
    condition: &str,
    args: impl rusqlite::Params,
) -> Result<Vec<Device>, InventoryError> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {DEVICE_COLUMNS} FROM devices WHERE {condition}"
        ))
        .map_err(sql)?;
    stmt.query_map(args, device_from_row)
        .map_err(sql)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(sql)
}

const DEVICE_COLUMNS: &str = "wwid, target, lun, size_bytes, vendor, model, serial, labels, phase, binding, nodes, published, last_seen, reason, generation, wipe_failures, conflicts, retired, retry_wipe";

fn device_from_row(r: &Row<'_>) -> rusqlite::Result<Device> {
    let phase: String = r.get(8)?;
    let binding: Option<String> = r.get(9)?;
    Ok(Device {
        wwid: wwid_column(r, 0)?,
        target: r.get(1)?,
        lun: r.get(2)?,
        size_bytes: r.get::<_, i64>(3)? as u64,
        vendor: r.get(4)?,
        model: r.get(5)?,
        serial: r.get(6)?,
        labels: from_json(&r.get::<_, String>(7)?)?,
        phase: Phase::parse(&phase).ok_or_else(|| {
            rusqlite::Error::FromSqlConversionFailure(
                8,
                rusqlite::types::Type::Text,
                format!("unknown phase {phase}").into(),
            )
        })?,
        binding: binding.map(|b| from_json(&b)).transpose()?,
        nodes: from_json(&r.get::<_, String>(10)?)?,
        published: from_json(&r.get::<_, String>(11)?)?,
        last_seen: r.get(12)?,
        reason: r.get(13)?,
        generation: r.get(14)?,
        wipe_failures: r.get(15)?,
        conflicts: from_json(&r.get::<_, String>(16)?)?,
        retired: r.get(17)?,
        retry_wipe: r.get(18)?,
    })
}

fn load(conn: &Connection, wwid: &Wwid) -> Result<Option<Device>, InventoryError> {
    conn.query_row(
        &format!("SELECT {DEVICE_COLUMNS} FROM devices WHERE wwid = ?1"),
        [wwid.as_str()],
        device_from_row,
    )
    .optional()
    .map_err(sql)
}

/// Inserts a new device or overwrites one whose generation is still
/// `dev.generation`; maintains the node index. Returns the new generation.
fn write(conn: &Connection, dev: &Device, insert: bool) -> Result<i64, InventoryError> {
    let binding = dev.binding.as_ref().map(json).transpose()?;
    let (uid, name) = match &dev.binding {
        Some(b) => (Some(b.uid.clone()), Some(b.volume_name.clone())),
        None => (None, None),
    };
    let args = params![
        dev.wwid.as_str(),
        dev.target,
        dev.lun,
        dev.size_bytes as i64,
        dev.vendor,
        dev.model,
        dev.serial,
        json(&dev.labels)?,
        dev.phase.as_str(),
        uid,
        name,
        binding,
        json(&dev.nodes)?,
        json(&dev.published)?,
        dev.last_seen,
        dev.reason,
        dev.generation,
        dev.wipe_failures,
        json(&dev.conflicts)?,
        dev.retired,
        dev.retry_wipe,
    ];
    let changed = if insert {
        conn.execute(
            "INSERT INTO devices (wwid, target, lun, size_bytes, vendor, model, serial, labels, phase,
                binding_uid, volume_name, binding, nodes, published, last_seen, reason, generation,
                wipe_failures, conflicts, retired, retry_wipe)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17 + 1, ?18, ?19,
                ?20, ?21)",
            args,
        )
    } else {
        conn.execute(
            "UPDATE devices SET target = ?2, lun = ?3, size_bytes = ?4, vendor = ?5, model = ?6,
                serial = ?7, labels = ?8, phase = ?9, binding_uid = ?10, volume_name = ?11,
                binding = ?12, nodes = ?13, published = ?14, last_seen = ?15, reason = ?16,
                wipe_failures = ?18, conflicts = ?19, retired = ?20, retry_wipe = ?21,
                generation = generation + 1
             WHERE wwid = ?1 AND generation = ?17",
            args,
        )
    }
    .map_err(|e| match e {
        rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::ConstraintViolation => {
            InventoryError::Conflict(dev.wwid.clone())
        }
        other => sql(other),
    })?;
    if changed == 0 {
        return Err(InventoryError::Conflict(dev.wwid.clone()));
    }
    conn.execute(
        "DELETE FROM device_nodes WHERE wwid = ?1",
        [dev.wwid.as_str()],
    )
    .map_err(sql)?;
    let mut stmt = conn
        .prepare_cached(
            "INSERT OR IGNORE INTO device_nodes (node, wwid, target, phase, size_bytes, wipe_failures)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )
        .map_err(sql)?;
    for v in &dev.nodes {
        stmt.execute(params![
            v.node.as_str(),
            dev.wwid.as_str(),
            v.target,
            dev.phase.as_str(),
            dev.size_bytes as i64,
            dev.wipe_failures
        ])
        .map_err(sql)?;
    }
    Ok(dev.generation + 1)
}

/// Available devices of `min..=max` bytes in preference order (size, wipe
/// failures, WWID: `policy::preference_key`) after `after`: through the
/// node index when `node` is given.
fn available(
    conn: &Connection,
    node: Option<&str>,
    min: u64,
    max: u64,
    after: &(i64, u32, String),
    limit: i64,
) -> Result<Vec<Device>, InventoryError> {
    let cols = DEVICE_COLUMNS
        .split(", ")
        .map(|c| format!("d.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    let sql_text = match node {
        Some(_) => format!(
            "SELECT {cols} FROM device_nodes n INDEXED BY device_nodes_free
               JOIN devices d ON d.wwid = n.wwid
             WHERE n.node = ?7 AND n.phase = 'Available' AND n.size_bytes >= ?1 AND n.size_bytes <= ?2
               AND (n.size_bytes, n.wipe_failures, n.wwid) > (?3, ?4, ?5)
             ORDER BY n.size_bytes, n.wipe_failures, n.wwid LIMIT ?6"
        ),
        None => format!(
            "SELECT {cols} FROM devices d INDEXED BY devices_free
             WHERE d.phase = 'Available' AND d.size_bytes >= ?1 AND d.size_bytes <= ?2
               AND (d.size_bytes, d.wipe_failures, d.wwid) > (?3, ?4, ?5)
             ORDER BY d.size_bytes, d.wipe_failures, d.wwid LIMIT ?6"
        ),
    };
    let mut stmt = conn.prepare_cached(&sql_text).map_err(sql)?;
    let max = i64::try_from(max).unwrap_or(i64::MAX);
    let min = i64::try_from(min).unwrap_or(i64::MAX);
    let (size, failures, wwid) = after;
    let found = match node {
        Some(node) => stmt
            .query_map(
                params![min, max, size, failures, wwid, limit, node],
                device_from_row,
            )
            .map_err(sql)?
            .collect::<Result<Vec<_>, _>>(),
        None => stmt
            .query_map(
                params![min, max, size, failures, wwid, limit],
                device_from_row,
            )
            .map_err(sql)?
            .collect::<Result<Vec<_>, _>>(),
    };
    found.map_err(sql)
}

#[async_trait]
impl Store for EmbeddedInventory {
    async fn device(&self, wwid: &Wwid) -> Result<Option<Device>, InventoryError> {
        if let Some(known) = self.cache().devices.get(wwid) {
            return Ok(Some(known.clone()));
        }
        let cache = self.cache.clone();
        let wwid = wwid.clone();
        // Read and remembered under the connection's lock, so no write
        // commits between the read and the entry.
        self.with(move |c| {
            let found = load(c, &wwid)?;
            // Only devices that exist: an unknown WWID asked for is not kept.
            if let Some(dev) = &found {
                locked(&cache).devices.insert(wwid, dev.clone());
            }
            Ok(found)
        })
        .await
    }

    async fn bound_to_name(&self, name: &str) -> Result<Option<Device>, InventoryError> {
        let name = name.to_owned();
        self.with(move |c| {
            c.query_row(
                &format!("SELECT {DEVICE_COLUMNS} FROM devices WHERE volume_name = ?1"),
                [name],
                device_from_row,
            )
            .optional()
            .map_err(sql)
        })
        .await
    }

    async fn devices(
        &self,
        after: Option<&Wwid>,
        limit: usize,
    ) -> Result<Vec<Device>, InventoryError> {
        let after = after.map_or("", Wwid::as_str).to_owned();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with(move |c| {
            devices_where(c, "wwid > ?1 ORDER BY wwid LIMIT ?2", params![after, limit])
        })
        .await
    }

    async fn available(&self, query: AvailableQuery<'_>) -> Result<Vec<Device>, InventoryError> {
        let node = query.node.map(NodeName::to_string);
        let (min, max) = (query.min, query.max);
        let after = query.after.map_or((-1, 0, String::new()), |k| {
            (
                i64::try_from(k.size_bytes).unwrap_or(i64::MAX),
                k.wipe_failures,
                k.wwid.to_string(),
            )
        });
        let limit = i64::try_from(query.limit).unwrap_or(i64::MAX);
        self.with(move |c| available(c, node.as_deref(), min, max, &after, limit))
            .await
    }

    async fn of_target(&self, target: &str) -> Result<Vec<Device>, InventoryError> {
        let target = target.to_owned();
        self.with(move |c| {
            devices_where(
                c,
                "wwid IN
                   (SELECT wwid FROM device_nodes WHERE target = ?1
                    UNION SELECT wwid FROM devices WHERE target = ?1
                    UNION SELECT wwid FROM devices
                      WHERE conflicts <> '[]' AND EXISTS
                        (SELECT 1 FROM json_each(conflicts) WHERE value ->> 'target' = ?1))",
                [target],
            )
        })
        .await
    }

    async fn put(
        &self,
        writes: Vec<Write>,
    ) -> Result<Vec<Result<Device, InventoryError>>, InventoryError> {
        let cache = self.cache.clone();
        self.with(move |c| {
            // One transaction (one sync) for a discovery round's writes; a
            // lost compare-and-swap changes nothing and the others commit.
            let tx = c
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(sql)?;
            let mut results = Vec::with_capacity(writes.len());
            for w in writes {
                let (mut dev, insert) = match w {
                    Write::Create(d) => (d, true),
                    Write::Replace(d) => (d, false),
                };
                results.push(match write(&tx, &dev, insert) {
                    Ok(generation) => {
                        dev.generation = generation;
                        Ok(dev)
                    }
                    Err(InventoryError::Conflict(w)) => Err(InventoryError::Conflict(w)),
                    Err(e) => return Err(e),
                });
            }
            tx.commit().map_err(sql)?;
            // Still under the connection's lock: no read of the file can
            // come between the commit and the cache taking it in.
            locked(&cache).committed(&results);
            Ok(results)
        })
        .await
    }

    async fn delete(&self, dev: &Device) -> Result<(), InventoryError> {
        let (wwid, generation) = (dev.wwid.clone(), dev.generation);
        let cache = self.cache.clone();
        self.with(move |c| {
            // The node index goes with the row (ON DELETE CASCADE).
            let deleted = c
                .execute(
                    "DELETE FROM devices WHERE wwid = ?1 AND generation = ?2",
                    params![wwid.as_str(), generation],
                )
                .map_err(sql)?;
            locked(&cache).devices.remove(&wwid);
            if deleted == 0 {
                return Err(InventoryError::Conflict(wwid));
            }
            Ok(())
        })
        .await
    }

    async fn summary(&self) -> Result<Summary, InventoryError> {
        self.with(|c| {
            let mut stmt = c
                .prepare("SELECT phase, count(*) FROM devices GROUP BY phase")
                .map_err(sql)?;
            let phases = stmt
                .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
                .map_err(sql)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(sql)?
                .into_iter()
                .map(|(p, n)| {
                    Phase::parse(&p)
                        .map(|p| (p, n as u64))
                        .ok_or_else(|| store(format!("unknown phase {p:?} in the store")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let largest = c
                .query_row(
                    "SELECT coalesce(max(size_bytes), 0) FROM devices",
                    [],
                    |r| r.get::<_, i64>(0),
                )
                .map_err(sql)? as u64;
            Ok(Summary { phases, largest })
        })
        .await
    }

    async fn targets(&self) -> Result<Vec<Target>, InventoryError> {
        if let Some(known) = &self.cache().targets {
            return Ok(known.clone());
        }
        let cache = self.cache.clone();
        self.with(move |c| {
            let mut stmt = c
                .prepare("SELECT spec FROM targets ORDER BY name")
                .map_err(sql)?;
            let specs = stmt
                .query_map([], |r| from_json::<Target>(&r.get::<_, String>(0)?))
                .map_err(sql)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(sql)?;
            locked(&cache).targets = Some(specs.clone());
            Ok(specs)
        })
        .await
    }

    async fn put_target(&self, target: Target) -> Result<(), InventoryError> {
        let spec = json(&target)?;
        let cache = self.cache.clone();
        self.with(move |c| {
            // Dropped before the write: a failed write may have committed.
            locked(&cache).targets = None;
            c.execute(
                "INSERT INTO targets (name, spec) VALUES (?1, ?2)
                 ON CONFLICT (name) DO UPDATE SET spec = excluded.spec",
                params![target.name, spec],
            )
            .map_err(sql)?;
            Ok(())
        })
        .await
    }

    async fn remove_target(&self, name: &str) -> Result<(), InventoryError> {
        let name = name.to_owned();
        let cache = self.cache.clone();
        self.with(move |c| {
            locked(&cache).targets = None;
            c.execute("DELETE FROM targets WHERE name = ?1", [name])
                .map_err(sql)?;
            Ok(())
        })
        .await
    }

    async fn resizes(&self) -> Result<Vec<ResizeRequest>, InventoryError> {
        self.with(|c| {
            let mut stmt = c
                .prepare("SELECT name, volume_id, wwid, requested_bytes, current_bytes, created, done FROM resize_requests ORDER BY name")
                .map_err(sql)?;
            let rows = stmt
                .query_map([], |r| {
                    Ok(ResizeRequest {
                        name: r.get(0)?,
                        volume_id: r.get(1)?,
                        wwid: r.get(2)?,
                        requested_bytes: r.get::<_, i64>(3)? as u64,
                        current_bytes: r.get::<_, i64>(4)? as u64,
                        created: r.get(5)?,
                        done: r.get(6)?,
                    })
                })
                .map_err(sql)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(sql)?;
            Ok(rows)
        })
        .await
    }
    async fn put_resize(&self, r: ResizeRequest) -> Result<(), InventoryError> {
        self.with(move |c| {
            c.execute(
                "INSERT INTO resize_requests (name, volume_id, wwid, requested_bytes, current_bytes, created, done)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT (name) DO UPDATE SET volume_id = excluded.volume_id, wwid = excluded.wwid,
                    requested_bytes = excluded.requested_bytes, current_bytes = excluded.current_bytes,
                    done = excluded.done",
                params![r.name, r.volume_id, r.wwid, r.requested_bytes as i64, r.current_bytes as i64, r.created, r.done],
            )
            .map_err(sql)?;
            Ok(())
        })
        .await
    }

    async fn discovery_done(&self, round: &DiscoveryRound, label_conflicts: Vec<String>) {
        // No object to hold them: the log is where an operator finds them.
        for c in label_conflicts {
            tracing::info!(target = %round.target, conflict = %c, "device label conflict");
        }
    }

    async fn target_refused(&self, _: &TargetRefused) {
        // No object to hold it: discovery has logged it.
    }
}
