//! The embedded inventory: one SQLite database (bundled build) in WAL mode
//! with full sync, so a committed bind survives a crash or `kill -9`.
//! One connection behind a mutex: every write is a short transaction, and
//! every bind selects and claims its device inside one `IMMEDIATE`
//! transaction. Lookups are indexed; CreateVolume never scans every device.
//! Inspect it with `sqlite3 <file> 'select wwid, phase, volume_name from devices'`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, params};

use super::model::*;
use super::{Inventory, InventoryError};
use crate::selector::Selector;

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
];

/// How many candidates one selection query reads before labels are checked.
const PAGE: i64 = 64;

/// The SQLite-backed inventory.
#[derive(Clone)]
pub struct EmbeddedInventory {
    conn: Arc<Mutex<Connection>>,
    path: PathBuf,
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

    /// The deliberate defect `Fault::SkipCas`: pick, let other binds run,
    /// then overwrite whatever the device holds by then.
    async fn bind_without_cas(
        &self,
        request: BindRequest,
        min_bytes: u64,
        max_bytes: u64,
    ) -> Result<Device, InventoryError> {
        let selector = request.selector.clone();
        let node = request.topology.iter().flatten().next().cloned();
        let picked = self
            .with(move |c| pick(c, node.as_deref(), &selector, min_bytes, max_bytes))
            .await?
            .ok_or_else(|| InventoryError::NoFit(format!("{min_bytes} bytes or more")))?;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        self.with(move |c| {
            let mut dev = load(c, &picked.wwid)?.ok_or(InventoryError::NotFound(picked.wwid))?;
            dev.phase = Phase::Bound;
            dev.binding = Some(request.binding);
            dev.generation = write(c, &dev, false)?;
            Ok(dev)
        })
        .await
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
        _ => InventoryError::Store(e.to_string()),
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

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

const DEVICE_COLUMNS: &str = "wwid, target, lun, size_bytes, vendor, model, serial, labels, phase, binding, nodes, published, last_seen, reason, generation";

fn device_from_row(r: &Row<'_>) -> rusqlite::Result<Device> {
    let phase: String = r.get(8)?;
    let binding: Option<String> = r.get(9)?;
    Ok(Device {
        wwid: r.get(0)?,
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
    })
}

fn load(conn: &Connection, wwid: &str) -> Result<Option<Device>, InventoryError> {
    conn.query_row(
        &format!("SELECT {DEVICE_COLUMNS} FROM devices WHERE wwid = ?1"),
        [wwid],
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
        dev.wwid,
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
    ];
    let changed = if insert {
        conn.execute(
            "INSERT INTO devices (wwid, target, lun, size_bytes, vendor, model, serial, labels, phase,
                binding_uid, volume_name, binding, nodes, published, last_seen, reason, generation)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17 + 1)",
            args,
        )
    } else {
        conn.execute(
            "UPDATE devices SET target = ?2, lun = ?3, size_bytes = ?4, vendor = ?5, model = ?6,
                serial = ?7, labels = ?8, phase = ?9, binding_uid = ?10, volume_name = ?11,
                binding = ?12, nodes = ?13, published = ?14, last_seen = ?15, reason = ?16,
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
    conn.execute("DELETE FROM device_nodes WHERE wwid = ?1", [&dev.wwid])
        .map_err(sql)?;
    let mut stmt = conn
        .prepare_cached(
            "INSERT OR IGNORE INTO device_nodes (node, wwid, target, phase, size_bytes)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .map_err(sql)?;
    for v in &dev.nodes {
        stmt.execute(params![
            v.node,
            dev.wwid,
            v.target,
            dev.phase.as_str(),
            dev.size_bytes as i64
        ])
        .map_err(sql)?;
    }
    Ok(dev.generation + 1)
}

/// Candidate devices for a bind, smallest first, in pages: visible from
/// `node` (through the node index) or from anywhere.
fn candidates(
    conn: &Connection,
    node: Option<&str>,
    min: u64,
    max: u64,
    after: &(i64, String),
) -> Result<Vec<Device>, InventoryError> {
    let cols = DEVICE_COLUMNS
        .split(", ")
        .map(|c| format!("d.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    let (sql_text, rows) = match node {
        Some(node) => (
            format!(
                "SELECT {cols} FROM device_nodes n INDEXED BY device_nodes_free
                   JOIN devices d ON d.wwid = n.wwid
                 WHERE n.node = ?5 AND n.phase = 'Available' AND n.size_bytes >= ?1 AND n.size_bytes <= ?2
                   AND (n.size_bytes, n.wwid) > (?3, ?4)
                 ORDER BY n.size_bytes, n.wwid LIMIT {PAGE}"
            ),
            Some(node.to_owned()),
        ),
        None => (
            format!(
                "SELECT {cols} FROM devices d INDEXED BY devices_free
                 WHERE d.phase = 'Available' AND d.size_bytes >= ?1 AND d.size_bytes <= ?2
                   AND (d.size_bytes, d.wwid) > (?3, ?4)
                 ORDER BY d.size_bytes, d.wwid LIMIT {PAGE}"
            ),
            None,
        ),
    };
    let mut stmt = conn.prepare_cached(&sql_text).map_err(sql)?;
    let max = i64::try_from(max).unwrap_or(i64::MAX);
    let min = i64::try_from(min).unwrap_or(i64::MAX);
    let found = match rows {
        Some(node) => stmt
            .query_map(params![min, max, after.0, after.1, node], device_from_row)
            .map_err(sql)?
            .collect::<Result<Vec<_>, _>>(),
        None => stmt
            .query_map(params![min, max, after.0, after.1], device_from_row)
            .map_err(sql)?
            .collect::<Result<Vec<_>, _>>(),
    };
    found.map_err(sql)
}

fn pick(
    conn: &Connection,
    node: Option<&str>,
    selector: &Selector,
    min: u64,
    max: u64,
) -> Result<Option<Device>, InventoryError> {
    let mut after = (-1i64, String::new());
    loop {
        let page = candidates(conn, node, min, max, &after)?;
        if let Some(hit) = page.iter().find(|d| selector.matches(&d.labels)) {
            return Ok(Some(hit.clone()));
        }
        match page.last() {
            Some(last) if page.len() as i64 == PAGE => {
                after = (last.size_bytes as i64, last.wwid.clone())
            }
            _ => return Ok(None),
        }
    }
}

#[async_trait]
impl Inventory for EmbeddedInventory {
    async fn put_target(&self, target: Target) -> Result<(), InventoryError> {
        let spec = json(&target)?;
        self.with(move |c| {
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
        self.with(move |c| {
            c.execute("DELETE FROM targets WHERE name = ?1", [name])
                .map_err(sql)?;
            Ok(())
        })
        .await
    }

    async fn targets(&self) -> Result<Vec<Target>, InventoryError> {
        self.with(|c| {
            let mut stmt = c
                .prepare("SELECT spec FROM targets ORDER BY name")
                .map_err(sql)?;
            let specs = stmt
                .query_map([], |r| from_json::<Target>(&r.get::<_, String>(0)?))
                .map_err(sql)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(sql)?;
            Ok(specs)
        })
        .await
    }

    async fn apply_discovery(
        &self,
        round: DiscoveryRound,
    ) -> Result<DiscoveryOutcome, InventoryError> {
        self.with(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate).map_err(sql)?;
            let t = &round.target;
            let mut reported: BTreeMap<String, Vec<(&String, &LunReport)>> = BTreeMap::new();
            for (node, luns) in &round.answered {
                for lun in luns {
                    reported.entry(lun.wwid.clone()).or_default().push((node, lun));
                }
            }
            let mut wwids: BTreeSet<String> = reported.keys().cloned().collect();
            {
                let mut stmt = tx
                    .prepare("SELECT wwid FROM device_nodes WHERE target = ?1 UNION SELECT wwid FROM devices WHERE target = ?1")
                    .map_err(sql)?;
                for w in stmt.query_map([t], |r| r.get::<_, String>(0)).map_err(sql)? {
                    wwids.insert(w.map_err(sql)?);
                }
            }
            let now = now();
            let mut out = DiscoveryOutcome::default();
            for wwid in wwids {
                let reports = reported.get(&wwid).cloned().unwrap_or_default();
                let existing = load(&tx, &wwid)?;
                let fresh = reports.iter().map(|(node, lun)| NodeView {
                    node: (*node).clone(),
                    target: t.clone(),
                    paths: lun.paths.clone(),
                });
                match existing {
                    None => {
                        let Some((_, first)) = reports.first() else { continue };
                        let dev = Device {
                            wwid: wwid.clone(),
                            target: t.clone(),
                            lun: first.lun,
                            size_bytes: first.size_bytes,
                            vendor: first.vendor.clone(),
                            model: first.model.clone(),
                            serial: first.serial.clone(),
                            labels: round.device_labels.clone(),
                            phase: Phase::Available,
                            binding: None,
                            nodes: fresh.collect(),
                            published: Vec::new(),
                            last_seen: now,
                            reason: String::new(),
                            generation: 0,
                        };
                        write(&tx, &dev, true)?;
                        out.added.push(wwid);
                    }
                    Some(mut dev) => {
                        let before = dev.clone();
                        // Keep what other targets and silent nodes said.
                        dev.nodes.retain(|v| !(v.target == *t && round.answered.contains_key(&v.node)));
                        dev.nodes.extend(fresh);
                        dev.nodes.sort_by(|a, b| (&a.node, &a.target).cmp(&(&b.node, &b.target)));
                        if let Some((_, lun)) = reports.iter().max_by_key(|(_, l)| l.size_bytes) {
                            dev.size_bytes = lun.size_bytes;
                            dev.last_seen = now;
                        }
                        for (k, v) in &round.device_labels {
                            dev.labels.entry(k.clone()).or_insert_with(|| v.clone());
                        }
                        if dev.nodes.is_empty() && matches!(dev.phase, Phase::Available | Phase::Bound) {
                            dev.phase = Phase::Lost;
                            dev.reason = format!("no node reports it (target {t})");
                            out.lost.push(wwid.clone());
                        } else if !dev.nodes.is_empty() && dev.phase == Phase::Lost {
                            dev.phase = if dev.binding.is_some() { Phase::Bound } else { Phase::Available };
                            dev.reason.clear();
                            out.found.push(wwid.clone());
                        }
                        let seen = dev.last_seen;
                        dev.last_seen = before.last_seen;
                        if dev != before {
                            dev.last_seen = seen;
                            write(&tx, &dev, false)?;
                        } else if seen != before.last_seen {
                            // Only seen again: no new generation, so a
                            // lifecycle call that read the device before
                            // this pass still wins its compare-and-swap.
                            tx.execute(
                                "UPDATE devices SET last_seen = ?1 WHERE wwid = ?2",
                                params![seen, wwid],
                            )
                            .map_err(sql)?;
                        }
                    }
                }
            }
            tx.commit().map_err(sql)?;
            Ok(out)
        })
        .await
    }

    async fn device(&self, wwid: &str) -> Result<Option<Device>, InventoryError> {
        let wwid = wwid.to_owned();
        self.with(move |c| load(c, &wwid)).await
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
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Device>, InventoryError> {
        let after = after.unwrap_or("").to_owned();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with(move |c| {
            let mut stmt = c
                .prepare_cached(&format!(
                    "SELECT {DEVICE_COLUMNS} FROM devices WHERE wwid > ?1 ORDER BY wwid LIMIT ?2"
                ))
                .map_err(sql)?;
            let rows = stmt
                .query_map(params![after, limit], device_from_row)
                .map_err(sql)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(sql)?;
            Ok(rows)
        })
        .await
    }

    async fn phase_counts(&self) -> Result<Vec<(Phase, u64)>, InventoryError> {
        self.with(|c| {
            let mut stmt = c
                .prepare("SELECT phase, count(*) FROM devices GROUP BY phase")
                .map_err(sql)?;
            let rows = stmt
                .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
                .map_err(sql)?
                .filter_map(|r| r.ok())
                .filter_map(|(p, n)| Phase::parse(&p).map(|p| (p, n as u64)))
                .collect();
            Ok(rows)
        })
        .await
    }

    async fn largest_size(&self) -> Result<u64, InventoryError> {
        self.with(|c| {
            c.query_row(
                "SELECT coalesce(max(size_bytes), 0) FROM devices",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n as u64)
            .map_err(sql)
        })
        .await
    }

    async fn capacity(
        &self,
        nodes: &[String],
        selector: &Selector,
    ) -> Result<(u64, u64), InventoryError> {
        let nodes = nodes.to_vec();
        let selector = selector.clone();
        self.with(move |c| {
            let mut seen = BTreeSet::new();
            let (mut total, mut largest) = (0u64, 0u64);
            let scopes: Vec<Option<&str>> = if nodes.is_empty() {
                vec![None]
            } else {
                nodes.iter().map(|n| Some(n.as_str())).collect()
            };
            for scope in scopes {
                let mut after = (-1i64, String::new());
                loop {
                    let page = candidates(c, scope, 0, u64::MAX, &after)?;
                    for d in &page {
                        if selector.matches(&d.labels) && seen.insert(d.wwid.clone()) {
                            total = total.saturating_add(d.size_bytes);
                            largest = largest.max(d.size_bytes);
                        }
                    }
                    match page.last() {
                        Some(last) if page.len() as i64 == PAGE => {
                            after = (last.size_bytes as i64, last.wwid.clone())
                        }
                        _ => break,
                    }
                }
            }
            Ok((total, largest))
        })
        .await
    }

    async fn bind(
        &self,
        request: BindRequest,
        min_bytes: u64,
        max_bytes: u64,
    ) -> Result<Device, InventoryError> {
        if crate::fault::injected(crate::fault::Fault::SkipCas) {
            return self.bind_without_cas(request, min_bytes, max_bytes).await;
        }
        self.with(move |c| {
            let tx = c
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(sql)?;
            if let Some(existing) = tx
                .query_row(
                    &format!("SELECT {DEVICE_COLUMNS} FROM devices WHERE volume_name = ?1"),
                    [&request.binding.volume_name],
                    device_from_row,
                )
                .optional()
                .map_err(sql)?
            {
                // Raced with ourselves: the caller re-checks the parameters.
                return Ok(existing);
            }
            let scopes: Vec<Option<&str>> = if request.topology.is_empty() {
                vec![None]
            } else {
                request
                    .topology
                    .iter()
                    .flatten()
                    .map(|n| Some(n.as_str()))
                    .collect()
            };
            let mut chosen = None;
            for scope in scopes {
                if let Some(dev) = pick(&tx, scope, &request.selector, min_bytes, max_bytes)? {
                    chosen = Some(dev);
                    break;
                }
            }
            let Some(mut dev) = chosen else {
                return Err(InventoryError::NoFit(format!(
                    "{} bytes or more{}",
                    min_bytes,
                    if request.topology.is_empty() {
                        String::new()
                    } else {
                        " on the requested nodes".into()
                    }
                )));
            };
            dev.phase = Phase::Bound;
            dev.binding = Some(request.binding.clone());
            dev.reason.clear();
            dev.generation = write(&tx, &dev, false)?;
            tx.commit().map_err(sql)?;
            Ok(dev)
        })
        .await
    }

    async fn update(&self, device: Device) -> Result<Device, InventoryError> {
        self.with(move |c| {
            let tx = c
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(sql)?;
            let mut dev = device;
            dev.generation = write(&tx, &dev, false)?;
            tx.commit().map_err(sql)?;
            Ok(dev)
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
}
