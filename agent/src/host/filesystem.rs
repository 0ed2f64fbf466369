//! Filesystems on block devices: probe for signatures (libblkid's safe
//! probe in process, then the probe areas read ourselves), create
//! (`mkfs.ext4`, `mkfs.xfs`, with options only from an allow-list), grow
//! (`resize2fs`, `xfs_growfs`) and measure (`statvfs`). Formatting is only
//! ever done by the caller after [`probe`] proved the device blank. The
//! tools' own checks are no defence: mke2fs asks before overwriting a
//! filesystem only on a terminal, and the `blkid` tool answers "nothing
//! found" with the same exit code when it cannot read.
//!
//! The probe runs in process (libblkid through `libblkid-rs`, on the
//! blocking pool, bounded by [`PROBE_TIMEOUT`]) rather than as a `blkid`
//! child process: it saves a fork and exec on every stage of an already
//! formatted volume (the common case), and it tells a read error from
//! "nothing found", which the tool's exit codes do not. The price is crash
//! isolation: a defect in libblkid that crashes on a hostile superblock
//! takes the agent down with it (kubelet restarts it; nothing was written),
//! and a probe stuck in the kernel holds a blocking thread past its timeout
//! (the call answers UNAVAILABLE at the timeout; the thread is lost until
//! the read returns).

use std::path::{Path, PathBuf};

pub(crate) use csi_scsi_contract::FsType;

use super::Host;
use super::command::{Arg, CommandError};
use crate::error::AgentError;

/// What [`probe`] found on a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Signature {
    /// No signature at all: the device may be formatted.
    Blank,
    /// A filesystem of this type (`TYPE` with `USAGE=filesystem`).
    Filesystem(String),
    /// Anything else: a partition table, RAID or LVM member, swap, or
    /// several conflicting signatures. Described for people.
    Other(String),
}

/// Extra `mkfs` arguments, each checked against the allow-list of its
/// filesystem (no forcing, no features that change what the device is).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MkfsOptions {
    args: Vec<String>,
}

/// Space usage of a mounted filesystem, as `df -B1` and `df -i` show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Usage {
    /// Size in bytes (`f_blocks * f_frsize`).
    pub total_bytes: u64,
    /// Bytes available to unprivileged users (`f_bavail * f_frsize`).
    pub available_bytes: u64,
    /// Bytes in use (`(f_blocks - f_bfree) * f_frsize`).
    pub used_bytes: u64,
    /// Inodes in total.
    pub total_inodes: u64,
    /// Inodes free.
    pub free_inodes: u64,
    /// Inodes in use.
    pub used_inodes: u64,
}

/// How an allowed `mkfs` flag takes its value.
enum Value {
    /// The flag stands alone.
    Flag,
    /// One of these exact values.
    OneOf(&'static [&'static str]),
    /// An integer in this inclusive range.
    Range(u64, u64),
    /// A label of at most this many `[A-Za-z0-9._-]` characters.
    Label(usize),
}

const EXT4_OPTIONS: &[(&str, Value)] = &[
    ("-b", Value::OneOf(&["1024", "2048", "4096"])),
    ("-i", Value::Range(1024, 67_108_864)),
    ("-I", Value::OneOf(&["128", "256", "512", "1024"])),
    ("-m", Value::Range(0, 50)),
    ("-N", Value::Range(1, 4_294_967_295)),
    ("-L", Value::Label(16)),
    (
        "-E",
        Value::OneOf(&[
            "lazy_itable_init=0",
            "lazy_itable_init=1",
            "lazy_journal_init=0",
            "lazy_journal_init=1",
            "discard",
            "nodiscard",
        ]),
    ),
];

const XFS_OPTIONS: &[(&str, Value)] = &[
    ("-b", Value::OneOf(&["size=1024", "size=2048", "size=4096"])),
    (
        "-i",
        Value::OneOf(&["size=256", "size=512", "size=1024", "size=2048"]),
    ),
    ("-L", Value::Label(12)),
    (
        "-m",
        Value::OneOf(&[
            "crc=0",
            "crc=1",
            "reflink=0",
            "reflink=1",
            "bigtime=0",
            "bigtime=1",
        ]),
    ),
    ("-K", Value::Flag),
];

// === impl Signature ===

impl Signature {
    /// A description for error messages ("an xfs filesystem").
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::Blank => "no signature".to_owned(),
            Self::Filesystem(t) => format!("a filesystem of type {t}"),
            Self::Other(what) => what.clone(),
        }
    }
}

// === impl MkfsOptions ===

impl MkfsOptions {
    /// Parses whitespace-separated `mkfs` arguments for `fs`; the error
    /// names the first argument that is not allowed.
    pub fn parse(fs: FsType, text: &str) -> Result<Self, String> {
        let allowed = match fs {
            FsType::Ext4 => EXT4_OPTIONS,
            FsType::Xfs => XFS_OPTIONS,
        };
        let mut args = Vec::new();
        let mut tokens = text.split_whitespace();
        while let Some(flag) = tokens.next() {
            let Some((_, value)) = allowed.iter().find(|(name, _)| *name == flag) else {
                let names: Vec<&str> = allowed.iter().map(|(n, _)| *n).collect();
                return Err(format!(
                    "mkfs.{fs} option {flag:?} is not allowed (allowed: {})",
                    names.join(" ")
                ));
            };
            args.push(flag.to_owned());
            if matches!(value, Value::Flag) {
                continue;
            }
            let Some(v) = tokens.next() else {
                return Err(format!("mkfs.{fs} option {flag} needs a value"));
            };
            if !value.accepts(v) {
                return Err(format!(
                    "mkfs.{fs} option {flag} does not allow the value {v:?}"
                ));
            }
            args.push(v.to_owned());
        }
        Ok(Self { args })
    }

    /// The checked arguments.
    pub fn args(&self) -> &[String] {
        &self.args
    }
}

// === impl Value ===

impl Value {
    fn accepts(&self, v: &str) -> bool {
        match self {
            Self::Flag => false,
            Self::OneOf(values) => values.contains(&v),
            Self::Range(lo, hi) => v.parse::<u64>().is_ok_and(|n| (*lo..=*hi).contains(&n)),
            Self::Label(max) => {
                !v.is_empty()
                    && v.len() <= *max
                    && v.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
            }
        }
    }
}

/// How long one mkfs may run: longer than other tools (a large LUN on a
/// slow array), but bounded.
pub(crate) const MKFS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// How long reading the probe areas may take.
pub(crate) const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// How much of each end of a device is read before calling it blank:
/// every signature blkid knows of the kinds that matter here (filesystems,
/// partition tables, RAID, LVM, LUKS) lies within the first or last MiB.
pub(crate) const PROBE_AREA: u64 = 1 << 20;

/// Probes `device` for any signature, in process with libblkid's safe
/// probe (superblocks and partition tables: filesystems, RAID, LVM, LUKS,
/// swap), as udev does, off the async workers and within
/// [`PROBE_TIMEOUT`]. A device is [`Signature::Blank`] only when the probe
/// found nothing AND both ends were then read back whole (the first and
/// last [`PROBE_AREA`]) and are all zeroes. A probe that fails (a read
/// error), a device that cannot be read, reads short, reports no size or
/// does not answer in time is not ready (UNAVAILABLE, retried), never
/// blank; data the probe does not explain is a signature of its own.
pub(crate) async fn probe(device: &Path) -> Result<Signature, AgentError> {
    let owned = device.to_owned();
    super::blocking::within("probe", device, PROBE_TIMEOUT, move || probe_now(&owned))
        .await?
        .map_err(|reason| AgentError::DeviceNotReady {
            device: device.to_owned(),
            reason,
        })
}

/// Whether `device` carries a filesystem of type `fs`, by libblkid's probe
/// of that one type (one superblock read instead of the whole safe probe's
/// dozens): the fast path of staging a volume that is already formatted.
/// The read starts at once on the blocking pool, so the caller can go on
/// with its own checks meanwhile; [`TypedProbe::answer`] waits for it.
pub(crate) fn carries(device: &Path, fs: FsType) -> TypedProbe {
    let owned = device.to_owned();
    TypedProbe {
        device: device.to_owned(),
        fs,
        started: super::blocking::start("probe", device, PROBE_TIMEOUT, move || {
            safe_probe(&owned, Some(fs))
        }),
    }
}

/// A typed probe under way (see [`carries`]).
#[derive(Debug)]
pub(crate) struct TypedProbe {
    device: PathBuf,
    fs: FsType,
    started: super::blocking::Started<Result<Probed, String>>,
}

impl TypedProbe {
    /// Whether the device carries the asked type. `false` says nothing
    /// more; only [`probe`] may call a device blank. A read error or a
    /// device that does not answer within [`PROBE_TIMEOUT`] of the start
    /// is not ready.
    pub(crate) async fn answer(self) -> Result<bool, AgentError> {
        let probed = self
            .started
            .finish()
            .await?
            .map_err(|reason| AgentError::DeviceNotReady {
                device: self.device,
                reason,
            })?;
        Ok(matches!(probed, Probed::Found(Signature::Filesystem(t)) if t == self.fs.name()))
    }
}

/// [`probe`]'s work, on a blocking thread: the signature, or why the
/// device cannot be judged.
fn probe_now(device: &Path) -> Result<Signature, String> {
    match safe_probe(device, None)? {
        Probed::Found(signature) => Ok(signature),
        // Ambivalent low-level probing (several signatures): never blank.
        Probed::Ambivalent => Ok(Signature::Other(
            "several conflicting signatures".to_owned(),
        )),
        Probed::Nothing => match read_probe_areas(device)? {
            true => Ok(Signature::Blank),
            false => Ok(Signature::Other(format!(
                "data in its first or last {} KiB that no known signature explains",
                PROBE_AREA >> 10
            ))),
        },
    }
}

/// What libblkid's safe probe answered.
#[derive(Debug)]
enum Probed {
    /// One signature.
    Found(Signature),
    /// Nothing at all.
    Nothing,
    /// Several signatures that contradict each other.
    Ambivalent,
}

/// `blkid_do_safeprobe` over superblocks and partition tables, or over the
/// superblock of type `only` alone. Its error (-1, an I/O error among
/// others) is kept apart from "nothing found", which the `blkid` tool
/// reports with the same exit code.
fn safe_probe(device: &Path, only: Option<FsType>) -> Result<Probed, String> {
    use libblkid_rs::{BlkidFltr, BlkidProbe, BlkidSafeprobeRet, BlkidSublks, BlkidSublksFlags};
    let mut probe = BlkidProbe::new_from_filename(device)
        .map_err(|e| format!("it cannot be opened for probing: {e}"))?;
    let setup = |p: &mut BlkidProbe| -> libblkid_rs::Result<()> {
        p.enable_superblocks(true)?;
        p.set_superblock_flags(BlkidSublksFlags::new(vec![
            BlkidSublks::Type,
            BlkidSublks::Usage,
        ]))?;
        match only {
            Some(fs) => p.filter_superblock_type(BlkidFltr::Onlyin, &[fs.name()]),
            None => p.enable_partitions(true),
        }
    };
    setup(&mut probe).map_err(|e| format!("the probe could not be set up: {e}"))?;
    match probe.do_safeprobe() {
        Ok(BlkidSafeprobeRet::Success) => {
            let value = |name: &str| probe.lookup_value(name).ok().filter(|v| !v.is_empty());
            Ok(Probed::Found(signature_of(
                value("TYPE").as_deref(),
                value("USAGE").as_deref(),
                value("PTTYPE").as_deref(),
            )))
        }
        Ok(BlkidSafeprobeRet::None) => Ok(Probed::Nothing),
        Ok(BlkidSafeprobeRet::Ambiguous) => Ok(Probed::Ambivalent),
        Err(e) => Err(format!(
            "probing it failed (a read error, or a device in transition): {e}"
        )),
    }
}

/// Reads the first and last [`PROBE_AREA`] of `device`; whether both are
/// all zeroes, or why the device is not ready to be judged.
fn read_probe_areas(device: &Path) -> Result<bool, String> {
    use std::io::{Seek, SeekFrom};
    use std::os::unix::fs::FileExt;
    let mut file = std::fs::File::open(device).map_err(|e| format!("it cannot be opened: {e}"))?;
    let size = file
        .seek(SeekFrom::End(0))
        .map_err(|e| format!("its size cannot be read: {e}"))?;
    if size == 0 {
        return Err("it reports a size of zero (a path in transition, or a LUN gone)".to_owned());
    }
    let area = PROBE_AREA.min(size);
    let mut buf = vec![0u8; usize::try_from(area).unwrap_or(1 << 20)];
    let mut zero = true;
    for offset in [0, size - area] {
        file.read_exact_at(&mut buf, offset)
            .map_err(|e| format!("reading {area} bytes at offset {offset} failed: {e}"))?;
        zero &= buf.iter().all(|&b| b == 0);
    }
    Ok(zero)
}

/// The signature the probe's values describe.
fn signature_of(kind: Option<&str>, usage: Option<&str>, table: Option<&str>) -> Signature {
    match (kind, usage, table) {
        (Some(t), Some("filesystem"), _) => Signature::Filesystem(t.to_owned()),
        (Some(t), _, _) => Signature::Other(format!("a {t} signature")),
        (None, _, Some(pt)) => Signature::Other(format!("a {pt} partition table")),
        (None, _, None) => Signature::Other("an unrecognised signature".to_owned()),
    }
}

/// Creates a filesystem of type `fs` on `device`. The caller must have
/// seen [`Signature::Blank`]; mkfs is never forced.
pub(crate) async fn format(
    host: &Host,
    device: &Path,
    fs: FsType,
    options: &MkfsOptions,
) -> Result<(), AgentError> {
    let tool = host.tool(match fs {
        FsType::Ext4 => "mkfs.ext4",
        FsType::Xfs => "mkfs.xfs",
    });
    let mut args: Vec<Arg> = vec!["-q".into()];
    // Never discard the LUN while formatting: a discard of a whole LUN can
    // take minutes on some arrays, and the wipe on delete already did it.
    args.extend(match fs {
        FsType::Ext4 => ["-E".into(), "nodiscard".into()].to_vec(),
        FsType::Xfs => ["-K".into()].to_vec(),
    });
    args.extend(options.args().iter().map(Arg::from));
    args.push(device.into());
    tracing::info!(device = %device.display(), %fs, "creating filesystem");
    host.runner.run_within(&tool, &args, MKFS_TIMEOUT).await?;
    Ok(())
}

/// Grows the filesystem on `device` to fill it. `mounted_at` is a mount
/// point of that filesystem when it is mounted (online grow), `None` when
/// it is not (ext4 only: XFS grows only while mounted).
pub(crate) async fn grow(
    host: &Host,
    fs: FsType,
    device: &Path,
    mounted_at: Option<&Path>,
) -> Result<(), AgentError> {
    match (fs, mounted_at) {
        (FsType::Ext4, Some(_)) => {
            // resize2fs finds the mount itself (it compares st_rdev, so any
            // node of the device works) and resizes online through an ioctl
            // that needs CAP_SYS_RESOURCE.
            let tool = host.tool("resize2fs");
            let out = host.runner.output(&tool, &[device.into()]).await?;
            check_grow(&tool, fs, device, &out.stdout, &out.stderr, out.code)
        }
        (FsType::Ext4, None) => {
            // resize2fs refuses an unmounted filesystem that was not checked
            // since it was last mounted; a preen-mode check satisfies it.
            let fsck = host.tool("e2fsck");
            let out = host
                .runner
                .output(&fsck, &["-f".into(), "-p".into(), device.into()])
                .await?;
            // e2fsck(8): 0 clean, 1 errors corrected; anything else is trouble.
            if out.code > 1 {
                return Err(failed(&fsck, out.code, &out.stderr, &out.stdout));
            }
            let tool = host.tool("resize2fs");
            let out = host.runner.output(&tool, &[device.into()]).await?;
            check_grow(&tool, fs, device, &out.stdout, &out.stderr, out.code)
        }
        (FsType::Xfs, Some(mount_point)) => {
            let tool = host.tool("xfs_growfs");
            let out = host.runner.output(&tool, &[mount_point.into()]).await?;
            check_grow(&tool, fs, device, &out.stdout, &out.stderr, out.code)
        }
        (FsType::Xfs, None) => Err(AgentError::InvalidArgument {
            field: "volume_path",
            reason: format!("xfs on {} can only grow while mounted", device.display()),
        }),
    }
}

/// The size the ext4 filesystem on `device` claims, read off the async
/// workers within [`PROBE_TIMEOUT`]; a read error or a superblock that does
/// not parse is not ready (UNAVAILABLE), never a size.
pub(crate) async fn ext4_size(device: &Path) -> Result<u64, AgentError> {
    let owned = device.to_owned();
    super::blocking::within("superblock", device, PROBE_TIMEOUT, move || {
        ext4::size(&owned)
    })
    .await?
    .map_err(|reason| AgentError::DeviceNotReady {
        device: device.to_owned(),
        reason,
    })
}

/// Turns a grow tool's exit into a result, recognising the kernel's refusal
/// of an online grow so that it is reported as such and never as success.
fn check_grow(
    tool: &Path,
    fs: FsType,
    device: &Path,
    stdout: &str,
    stderr: &str,
    code: i32,
) -> Result<(), AgentError> {
    if code == 0 {
        return Ok(());
    }
    let text = format!("{stderr}\n{stdout}");
    // resize2fs prints "Permission denied to resize filesystem" when the
    // EXT4_IOC_RESIZE_FS ioctl fails with EPERM (no CAP_SYS_RESOURCE);
    // xfs_growfs reports EPERM as "Operation not permitted".
    if text.contains("Permission denied to resize") || text.contains("Operation not permitted") {
        // EXT4_IOC_RESIZE_FS checks CAP_SYS_RESOURCE; XFS_IOC_FSGROWFSDATA
        // checks CAP_SYS_ADMIN.
        let capability = match fs {
            FsType::Ext4 => "CAP_SYS_RESOURCE",
            FsType::Xfs => "CAP_SYS_ADMIN",
        };
        return Err(AgentError::OnlineGrowRefused {
            device: device.to_owned(),
            fs: fs.name(),
            detail: format!(
                "the kernel refused the online resize (EPERM): growing a mounted {fs} needs {capability}, \
                 which this agent lacks; the filesystem was not grown ({})",
                stderr
                    .lines()
                    .chain(stdout.lines())
                    .map(str::trim)
                    .find(|l| l.contains("Permission denied") || l.contains("not permitted"))
                    .unwrap_or_default()
            ),
        });
    }
    Err(failed(tool, code, stderr, stdout))
}

/// Space and inode usage of the filesystem mounted at `path` (`statvfs`).
pub(crate) fn usage(path: &Path) -> Result<Usage, AgentError> {
    let st = nix::sys::statvfs::statvfs(path).map_err(|e| AgentError::io(path, e.into()))?;
    let frsize = st.fragment_size();
    let blocks = st.blocks();
    let total_inodes = st.files();
    let free_inodes = st.files_free();
    Ok(Usage {
        total_bytes: blocks.saturating_mul(frsize),
        available_bytes: st.blocks_available().saturating_mul(frsize),
        used_bytes: blocks
            .saturating_sub(st.blocks_free())
            .saturating_mul(frsize),
        total_inodes,
        free_inodes,
        used_inodes: total_inodes.saturating_sub(free_inodes),
    })
}

/// A tool's non-zero exit as an error carrying its stderr.
fn failed(tool: &Path, code: i32, stderr: &str, stdout: &str) -> AgentError {
    let text = if stderr.trim().is_empty() {
        stdout
    } else {
        stderr
    };
    let lines: Vec<&str> = text.trim().lines().collect();
    let tail = lines[lines.len().saturating_sub(4)..].join(" | ");
    AgentError::Tool(CommandError::Failed {
        tool: tool.to_owned(),
        code,
        stderr_tail: tail.chars().take(600).collect(),
    })
}

pub(crate) mod ext4;
#[cfg(test)]
mod tests;
