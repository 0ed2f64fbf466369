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

/// How much each checked range of a node read-back covers.
const CHECKED_LEN: u64 = 1 << 20;
/// Ranges a node read-back checks besides the two ends.
const CHECKED_RANGES: usize = 8;

/// The offsets a node read-back checks over `recorded` bytes: both ends
/// and [`CHECKED_RANGES`] ranges at random, 4 KiB aligned, each
/// [`CHECKED_LEN`] long (less for a LUN smaller than that).
pub fn checked_offsets(recorded: u64, rng: &mut fastrand::Rng) -> (Vec<u64>, u64) {
    let len = CHECKED_LEN.min(recorded) / 4096 * 4096;
    let last = (recorded - len) / 4096 * 4096;
    let mut offsets = vec![0, last];
    offsets.extend((0..CHECKED_RANGES).map(|_| rng.u64(..=last / 4096) * 4096));
    (offsets, len)
}

/// One node's read-back of a LUN through its own block device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeReadback {
    /// The node.
    pub node: String,
    /// Its path of the LUN (`sdX`).
    pub disk: String,
    /// What the read found: [`Readback::Short`] when the node's device is
    /// smaller than the recorded size, [`Readback::DataAt`] a nonzero
    /// byte at one of the checked offsets.
    pub found: Readback,
}

/// Reads the LUN `wwid` back through the block device of every node that
/// has a path of it, except `wiper` (the node that wiped it, when known):
/// the device must cover `recorded` bytes and read as zeroes at `offsets`
/// (each `len` bytes), with direct I/O, past the node's page cache. A node
/// whose path is smaller is asked to rescan it first (a map left at an
/// old size is not a wipe's fault), and is `Short` only if it stays so. A
/// path that cannot be opened or read now (it is being removed) is left
/// out and named in the second list.
pub fn node_read_back(
    lab: &Lab,
    wwid: &str,
    recorded: u64,
    wiper: Option<&str>,
    (offsets, len): (&[u64], u64),
) -> (Vec<NodeReadback>, Vec<String>) {
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    for n in lab.nodes.iter().filter(|n| Some(n.name.as_str()) != wiper) {
        let Some(disk) = node_path(&n.root, wwid) else {
            continue;
        };
        let mut size = path_size(&n.root, &disk);
        if size.is_some_and(|s| s < recorded) {
            let _ = std::fs::write(
                n.root.join("sys/block").join(&disk).join("device/rescan"),
                "1",
            );
            let until = std::time::Instant::now() + std::time::Duration::from_secs(3);
            while size.is_some_and(|s| s < recorded) && std::time::Instant::now() < until {
                std::thread::sleep(std::time::Duration::from_millis(100));
                size = path_size(&n.root, &disk);
            }
        }
        let Some(size) = size else {
            skipped.push(format!("{}/{disk}: no size", n.name));
            continue;
        };
        let found = if size < recorded {
            Readback::Short {
                file: size,
                recorded,
            }
        } else {
            match read_zeroes(&n.root.join("dev").join(&disk), offsets, len) {
                Ok(found) => found,
                Err(e) => {
                    skipped.push(format!("{}/{disk}: {e}", n.name));
                    continue;
                }
            }
        };
        out.push(NodeReadback {
            node: n.name.clone(),
            disk,
            found,
        });
    }
    (out, skipped)
}

/// Reads `dev` with direct I/O at `offsets`, `len` bytes each:
/// [`Readback::Zeroes`], or the first nonzero byte.
fn read_zeroes(dev: &Path, offsets: &[u64], len: u64) -> std::io::Result<Readback> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_DIRECT.bits())
        .open(dev)?;
    // Direct I/O wants an aligned buffer: the aligned part of a larger one.
    let mut raw = vec![0u8; len as usize + 4096];
    let at = raw.as_ptr().align_offset(4096);
    let buf = &mut raw[at..at + len as usize];
    for &off in offsets {
        file.read_exact_at(buf, off)?;
        if let Some(i) = buf.iter().position(|&b| b != 0) {
            return Ok(Readback::DataAt(off + i as u64));
        }
    }
    Ok(Readback::Zeroes)
}

/// Node root `root`'s first path (`sdX`) whose WWID is `wwid`.
fn node_path(root: &Path, wwid: &str) -> Option<String> {
    let mut names: Vec<String> = std::fs::read_dir(root.join("sys/block"))
        .ok()?
        .flatten()
        .filter(|e| {
            std::fs::read_to_string(e.path().join("device/wwid")).is_ok_and(|id| id.trim() == wwid)
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names.into_iter().next()
}

/// The size node root `root`'s path `disk` reports, in bytes.
fn path_size(root: &Path, disk: &str) -> Option<u64> {
    std::fs::read_to_string(root.join("sys/block").join(disk).join("size"))
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(|s| s.saturating_mul(512))
}

/// What a suite's read-backs through other nodes did, for its report.
#[derive(Clone, Debug, Default)]
pub struct OtherNodeReads {
    /// LUNs read back.
    pub luns: usize,
    /// Of those, how many the proxy's log named the wiping node of (the
    /// others were read through every node that has a path).
    pub wiper_named: usize,
    /// Reads through a node, in all.
    pub reads: usize,
    /// Paths that could not be read.
    pub skipped: Vec<String>,
}

impl OtherNodeReads {
    /// Counts one LUN's read-back.
    pub fn add(&mut self, wiper: Option<&str>, reads: usize, skipped: Vec<String>) {
        self.luns += 1;
        self.wiper_named += usize::from(wiper.is_some());
        self.reads += reads;
        self.skipped.extend(skipped);
    }

    /// The report's line about them.
    pub fn summary(&self, what: &str) -> String {
        format!(
            "{what} read back through a node that did not wipe them (direct I/O, both ends and {CHECKED_RANGES} random 1 MiB ranges of the recorded size): {} LUN(s), the wiping node named by the proxy's log for {}, {} read(s); paths not read: {}",
            self.luns,
            self.wiper_named,
            self.reads,
            if self.skipped.is_empty() {
                "none".to_owned()
            } else {
                self.skipped.join("; ")
            }
        )
    }
}

/// Who wiped a LUN, for a violation's message.
pub fn wiped_by(wiper: Option<&str>) -> String {
    match wiper {
        Some(w) => format!("node {w} wiped it"),
        None => "no verified wipe in the proxy's log names the wiping node".into(),
    }
}

/// The node that last wiped `wwid`, as the proxy's log `log` names it
/// (its "wipe verified from another node" line); `None` when the log does
/// not say (no other node could verify).
pub fn wiper(log: &str, wwid: &str) -> Option<String> {
    log.lines()
        .rev()
        .filter(|l| l.contains("wipe verified") && l.contains(wwid))
        .find_map(|l| {
            let v = l.split("wiped_on=").nth(1)?;
            let v = v.split_whitespace().next()?;
            Some(v.trim_matches('"').to_owned())
        })
}
