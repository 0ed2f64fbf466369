//! What the proxy's embedded store says, read with the `sqlite3` CLI (a
//! second, independent reader), and what the LUN files behind it hold.

use std::path::Path;

use anyhow::{Context, bail};

use crate::lab::Lab;
use crate::lab::net::sh;
use crate::lab::scenario::lun_file;

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
    /// The size the store records: what a wipe must cover.
    pub size_bytes: u64,
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
                 replace(reason, char(10), ' '), size_bytes FROM devices WHERE target = '{target}' ORDER BY wwid"
            ),
        ],
    )
    .context("reading the store with sqlite3")?;
    out.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\u{1f}').collect();
            if f.len() != 6 {
                bail!("unexpected sqlite3 row {l:?}");
            }
            Ok(DeviceRow {
                wwid: f[0].into(),
                phase: f[1].into(),
                volume_name: f[2].into(),
                binding_uid: f[3].into(),
                reason: f[4].into(),
                size_bytes: f[5]
                    .parse()
                    .with_context(|| format!("size_bytes in sqlite3 row {l:?}"))?,
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

/// What reading a wiped LUN's backing file back found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readback {
    /// The file covers the recorded size and every byte of it is zero.
    Zeroes,
    /// The file is shorter than the store records: the recorded size
    /// cannot have been wiped (nor be offered).
    Short {
        /// The file's length.
        file: u64,
        /// The size the store records.
        recorded: u64,
    },
    /// A byte that is not zero, at this offset.
    DataAt(u64),
}

/// Reads `file` (a LUN's backing file) back whole: every byte must be
/// zero, and it must cover `recorded`, the size the store records for
/// the LUN (a file that is longer, an array that grew the LUN, is read to
/// its end too: the grown tail is the LUN's as well).
pub fn read_back(file: &Path, recorded: u64) -> anyhow::Result<Readback> {
    use std::io::Read;
    let mut f = std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let len = f.metadata()?.len();
    if len < recorded {
        return Ok(Readback::Short {
            file: len,
            recorded,
        });
    }
    let mut buf = vec![0u8; 4 << 20];
    let mut at = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(Readback::Zeroes);
        }
        if let Some(i) = buf[..n].iter().position(|&b| b != 0) {
            return Ok(Readback::DataAt(at + i as u64));
        }
        at += n as u64;
    }
}

/// Reads the LUN behind `wwid` back over its recorded size
/// ([`read_back`]; `None`: the lab does not know that WWID).
pub fn lun_read_back(lab: &Lab, wwid: &str, recorded: u64) -> anyhow::Result<Option<Readback>> {
    match lun_file(lab, wwid) {
        Some((_, file)) => read_back(&file, recorded).map(Some),
        None => Ok(None),
    }
}

/// The size the store records for `wwid` (`None`: no such device).
pub fn recorded_size(db: &Path, wwid: &str) -> anyhow::Result<Option<u64>> {
    if wwid.contains('\'') {
        bail!("WWID {wwid:?} cannot be quoted");
    }
    let out = sh(
        "sqlite3",
        &[
            "-readonly",
            &db.display().to_string(),
            &format!("SELECT size_bytes FROM devices WHERE wwid = '{wwid}'"),
        ],
    )
    .context("reading the store with sqlite3")?;
    let out = out.trim();
    if out.is_empty() {
        return Ok(None);
    }
    Ok(Some(out.parse().with_context(|| {
        format!("size_bytes of {wwid}: {out:?}")
    })?))
}
