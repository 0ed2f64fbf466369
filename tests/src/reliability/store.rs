//! What the proxy's embedded store says, read with the `sqlite3` CLI (a
//! second, independent reader), and what the LUN files behind it hold.

use std::path::Path;

use anyhow::{Context, bail};

use crate::lab::Lab;
use crate::lab::net::sh;
use crate::lab::scenario::{all_zero, lun_file};

/// One device row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceRow {
    /// Its WWID.
    pub wwid: String,
    /// Its phase (`Available`, `Bound`, `Releasing`, `Failed`, `Lost`).
    pub phase: String,
    /// The CreateVolume name it is bound to, or empty.
    pub volume_name: String,
    /// The binding's UID (the second half of the volume ID), or empty.
    pub binding_uid: String,
    /// Why it is in its phase, when it says.
    pub reason: String,
}

/// The devices of target `target`, read-only.
pub fn devices(db: &Path, target: &str) -> anyhow::Result<Vec<DeviceRow>> {
    if target.contains('\'') {
        bail!("target name {target:?} cannot be quoted");
    }
    let out = sh(
        "sqlite3",
        &[
            "-readonly",
            "-separator",
            "\u{1f}",
            &db.display().to_string(),
            &format!(
                "SELECT wwid, phase, coalesce(volume_name, ''), coalesce(binding_uid, ''), \
                 replace(reason, char(10), ' ') FROM devices WHERE target = '{target}' ORDER BY wwid"
            ),
        ],
    )
    .context("reading the store with sqlite3")?;
    out.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\u{1f}').collect();
            if f.len() != 5 {
                bail!("unexpected sqlite3 row {l:?}");
            }
            Ok(DeviceRow {
                wwid: f[0].into(),
                phase: f[1].into(),
                volume_name: f[2].into(),
                binding_uid: f[3].into(),
                reason: f[4].into(),
            })
        })
        .collect()
}

/// `PRAGMA integrity_check` of the store: `ok`, or what is wrong.
pub fn integrity(db: &Path) -> anyhow::Result<String> {
    Ok(sh(
        "sqlite3",
        &[
            "-readonly",
            &db.display().to_string(),
            "PRAGMA integrity_check",
        ],
    )?
    .trim()
    .to_owned())
}

/// Runs `sql` against `db` with the `sqlite3` CLI (it may write, e.g. a
/// checkpoint); returns its output.
pub fn run(db: &Path, sql: &str) -> anyhow::Result<String> {
    sh("sqlite3", &[&db.display().to_string(), sql])
}

/// Whether the LUN behind `wwid` reads as zeroes end to end (`None`: the
/// lab does not know that WWID).
pub fn lun_is_zero(lab: &Lab, wwid: &str) -> anyhow::Result<Option<bool>> {
    match lun_file(lab, wwid) {
        Some((_, file)) => all_zero(&file).map(Some),
        None => Ok(None),
    }
}
