//! Mounting through the mount(2) family (nix's safe wrappers): mount a
//! device's filesystem, bind mount a directory or a device node, make a
//! bind read-only, unmount. Mount flags come only from an allow-list. Also
//! the mount points themselves (the target directory or file the plugin
//! creates and removes) and the record that stands in for a staging mount
//! of a raw block volume, which has nothing to mount.
//!
//! The syscalls can block (journal replay, a busy device), so each runs on
//! the blocking pool.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use csi_scsi_textfs::text;
use nix::mount::{MntFlags, MsFlags};
use serde::{Deserialize, Serialize};

use super::Host;
use super::block::DeviceNumber;
use super::filesystem::FsType;
use crate::error::AgentError;

/// The name of the raw block staging record inside a staging directory.
pub(crate) const BLOCK_RECORD: &str = "csi-scsi-block.json";

/// Checked mount flags: per-mount flags for mount(2) plus filesystem data
/// options, both from an allow-list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOptions {
    flags: MsFlags,
    data: Vec<String>,
}

/// What a raw block staging path records: which volume and device it
/// stands for. Written atomically, read back on every later call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BlockRecord {
    /// The volume ID that staged it.
    pub volume_id: String,
    /// The LUN's WWID (canonical).
    pub wwid: String,
    /// The device's major number when staged.
    pub major: u32,
    /// The device's minor number when staged.
    pub minor: u32,
}

/// Flags that map to mount(2) flags; `rw` and `defaults` are no-ops.
const FLAG_OPTIONS: &[(&str, MsFlags)] = &[
    ("ro", MsFlags::MS_RDONLY),
    ("rw", MsFlags::empty()),
    ("defaults", MsFlags::empty()),
    ("nosuid", MsFlags::MS_NOSUID),
    ("nodev", MsFlags::MS_NODEV),
    ("noexec", MsFlags::MS_NOEXEC),
    ("noatime", MsFlags::MS_NOATIME),
    ("nodiratime", MsFlags::MS_NODIRATIME),
    ("relatime", MsFlags::MS_RELATIME),
    ("strictatime", MsFlags::MS_STRICTATIME),
    ("lazytime", MsFlags::MS_LAZYTIME),
    ("sync", MsFlags::MS_SYNCHRONOUS),
    ("dirsync", MsFlags::MS_DIRSYNC),
];

/// The per-mount subset of [`FLAG_OPTIONS`] that a bind mount can carry.
const BIND_FLAGS: MsFlags = MsFlags::MS_RDONLY
    .union(MsFlags::MS_NOSUID)
    .union(MsFlags::MS_NODEV)
    .union(MsFlags::MS_NOEXEC)
    .union(MsFlags::MS_NOATIME)
    .union(MsFlags::MS_NODIRATIME)
    .union(MsFlags::MS_RELATIME)
    .union(MsFlags::MS_STRICTATIME);

/// Filesystem data options allowed for both types.
const COMMON_DATA: &[&str] = &["discard", "nodiscard", "usrquota", "grpquota", "prjquota"];
/// ext4 data options allowed (no `errors=panic`: a volume must not crash the node).
const EXT4_DATA: &[&str] = &[
    "data=ordered",
    "data=writeback",
    "data=journal",
    "errors=remount-ro",
    "errors=continue",
    "barrier",
    "nobarrier",
    "noauto_da_alloc",
    "user_xattr",
    "acl",
    "noacl",
];
/// XFS data options allowed (no `norecovery`: it would hide a dirty log).
const XFS_DATA: &[&str] = &[
    "inode64",
    "inode32",
    "largeio",
    "nolargeio",
    "noquota",
    "uquota",
    "gquota",
    "pquota",
    "nouuid",
    "wsync",
];
/// Data options with a numeric value: `name=<n>` within a range.
const NUMERIC_DATA: &[(&str, FsType, u64, u64)] = &[
    ("commit", FsType::Ext4, 1, 300),
    ("logbufs", FsType::Xfs, 2, 8),
];

// === impl MountOptions ===

impl Default for MountOptions {
    fn default() -> Self {
        Self {
            flags: MsFlags::empty(),
            data: Vec::new(),
        }
    }
}

impl MountOptions {
    /// Parses CSI `mount_flags` for a filesystem of type `fs`; the error
    /// names the first flag that is not allowed (an excerpt of it, escaped,
    /// so a hostile flag is never echoed whole or across lines).
    pub fn parse(fs: FsType, mount_flags: &[String]) -> Result<Self, String> {
        let mut options = Self::default();
        for raw in mount_flags {
            // kubelet passes PV mountOptions one per entry, but a
            // comma-separated entry is the same thing spelled differently.
            for flag in raw.split(',').map(str::trim).filter(|f| !f.is_empty()) {
                if let Some((_, bits)) = FLAG_OPTIONS.iter().find(|(name, _)| *name == flag) {
                    options.flags |= *bits;
                } else if data_allowed(fs, flag) {
                    if !options.data.iter().any(|d| d == flag) {
                        options.data.push(flag.to_owned());
                    }
                } else {
                    return Err(format!(
                        "mount flag {} is not allowed for {fs}",
                        text::quote(flag, text::INPUT_MAX)
                    ));
                }
            }
        }
        Ok(options)
    }

    /// Options that make a mount read-only.
    pub fn read_only() -> Self {
        Self {
            flags: MsFlags::MS_RDONLY,
            data: Vec::new(),
        }
    }

    /// Whether these options ask for a read-only mount.
    pub fn is_read_only(&self) -> bool {
        self.flags.contains(MsFlags::MS_RDONLY)
    }

    /// These options, plus read-only when `read_only` is set.
    pub fn with_read_only(mut self, read_only: bool) -> Self {
        if read_only {
            self.flags |= MsFlags::MS_RDONLY;
        }
        self
    }

    /// The per-mount flags a bind mount can apply (data options belong to
    /// the filesystem and were applied when it was mounted).
    fn bind_flags(&self) -> MsFlags {
        self.flags & BIND_FLAGS
    }

    fn data_string(&self) -> Option<String> {
        (!self.data.is_empty()).then(|| self.data.join(","))
    }
}

fn data_allowed(fs: FsType, flag: &str) -> bool {
    let listed = match fs {
        FsType::Ext4 => EXT4_DATA,
        FsType::Xfs => XFS_DATA,
    };
    if COMMON_DATA.contains(&flag) || listed.contains(&flag) {
        return true;
    }
    let Some((name, value)) = flag.split_once('=') else {
        return false;
    };
    NUMERIC_DATA.iter().any(|(n, t, lo, hi)| {
        *n == name && *t == fs && value.parse::<u64>().is_ok_and(|v| (*lo..=*hi).contains(&v))
    })
}

/// Mounts the `fs` filesystem on `device` at `target` (a directory).
pub(crate) async fn mount_filesystem(
    device: &Path,
    target: &Path,
    fs: FsType,
    options: &MountOptions,
) -> Result<(), AgentError> {
    let (device, target, options) = (device.to_owned(), target.to_owned(), options.clone());
    blocking("mount", target.clone(), move || {
        tracing::debug!(device = %device.display(), target = %target.display(), %fs, flags = ?options.flags, "mount");
        let data = options.data_string();
        nix::mount::mount(
            Some(device.as_path()),
            target.as_path(),
            Some(fs.name()),
            options.flags,
            data.as_deref(),
        )
    })
    .await
}

/// Bind mounts `source` (a directory or a device node) onto `target` with
/// the per-mount flags of `options` (read-only, nosuid, ...). A plain bind
/// ignores them and a bind remount sets them on this mount only: the
/// copies propagated to the peers of a shared `target` (kubelet's
/// directory is Bidirectional, so the host and the Pod's container see
/// those copies) would stay read-write. So the flags are set on a private
/// scratch bind first, and `target` is a bind of that one, which carries
/// them into every copy. If a step fails, what was made is undone.
pub(crate) async fn bind(
    source: &Path,
    target: &Path,
    options: &MountOptions,
) -> Result<(), AgentError> {
    let flags = options.bind_flags();
    if flags.is_empty() {
        return bind_plain(source, target).await;
    }
    let scratch = scratch_point(source, target)?;
    let made = async {
        bind_plain(source, &scratch).await?;
        let flagged = async {
            make_private(&scratch).await?;
            remount_bind(&scratch, flags).await?;
            bind_plain(&scratch, target).await
        }
        .await;
        let _ = unmount(&scratch).await;
        flagged
    }
    .await;
    let _ = std::fs::remove_file(&scratch).or_else(|_| std::fs::remove_dir(&scratch));
    made
}

/// A fresh mount point beside nothing shared (the temporary directory), of
/// the same kind as `source` (a directory, or a file for a device node).
fn scratch_point(source: &Path, target: &Path) -> Result<PathBuf, AgentError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let scratch = std::env::temp_dir().join(format!(
        "csi-scsi-bind-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let made = if source.is_dir() {
        std::fs::create_dir(&scratch)
    } else {
        std::fs::File::create(&scratch).map(drop)
    };
    made.map_err(|e| AgentError::io(target, e))?;
    Ok(scratch)
}

/// A bind mount of `source` onto `target`, no flags.
async fn bind_plain(source: &Path, target: &Path) -> Result<(), AgentError> {
    let (source, target) = (source.to_owned(), target.to_owned());
    blocking("bind mount", target.clone(), move || {
        tracing::debug!(source = %source.display(), target = %target.display(), "bind mount");
        nix::mount::mount(
            Some(source.as_path()),
            target.as_path(),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
    })
    .await
}

/// Makes the mount at `target` private: nothing done to it propagates.
async fn make_private(target: &Path) -> Result<(), AgentError> {
    let target = target.to_owned();
    blocking("make private", target.clone(), move || {
        nix::mount::mount(
            None::<&str>,
            target.as_path(),
            None::<&str>,
            MsFlags::MS_PRIVATE,
            None::<&str>,
        )
    })
    .await
}

/// Re-applies per-mount `flags` to the bind mount at `target`.
async fn remount_bind(target: &Path, flags: MsFlags) -> Result<(), AgentError> {
    let target = target.to_owned();
    blocking("remount", target.clone(), move || {
        tracing::debug!(target = %target.display(), ?flags, "bind remount");
        nix::mount::mount(
            None::<&str>,
            target.as_path(),
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | flags,
            None::<&str>,
        )
    })
    .await
}

/// Unmounts the mount on top of `target` (never following a symlink at
/// `target`, and never lazily: a busy mount stays and the error says so).
pub(crate) async fn unmount(target: &Path) -> Result<(), AgentError> {
    let target = target.to_owned();
    blocking("unmount", target.clone(), move || {
        tracing::debug!(target = %target.display(), "unmount");
        nix::mount::umount2(target.as_path(), MntFlags::UMOUNT_NOFOLLOW)
    })
    .await
}

/// Runs a mount syscall off the async workers, within
/// [`blocking::MOUNT_TIMEOUT`], naming `op` and `path` in its error.
async fn blocking<F>(op: &'static str, path: PathBuf, call: F) -> Result<(), AgentError>
where
    F: FnOnce() -> nix::Result<()> + Send + 'static,
{
    match super::blocking::within(op, &path, super::blocking::MOUNT_TIMEOUT, call).await? {
        Ok(()) => Ok(()),
        Err(errno) => Err(AgentError::Mount {
            op,
            path,
            source: errno.into(),
        }),
    }
}

/// Creates the directory `path` (and missing parents) as a mount point.
pub(crate) fn create_dir(path: &Path) -> Result<(), AgentError> {
    std::fs::create_dir_all(path).map_err(|e| AgentError::io(path, e))
}

/// Creates `path` as an empty regular file (a raw block mount point) unless
/// a file is there already.
pub(crate) fn create_file(path: &Path) -> Result<(), AgentError> {
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.is_file() => Ok(()),
            Ok(_) => Err(AgentError::InvalidArgument {
                field: "target_path",
                reason: format!("{} exists and is not a file", path.display()),
            }),
            Err(e) => Err(AgentError::io(path, e)),
        },
        Err(e) => Err(AgentError::io(path, e)),
    }
}

/// Removes the mount point `path` the plugin created: an empty directory or
/// a regular file. Never recursive: a directory with content is refused,
/// whatever it holds stays. Already gone is success.
pub(crate) fn remove_mount_point(path: &Path) -> Result<(), AgentError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(AgentError::io(path, e)),
    };
    let removed = if meta.is_dir() {
        std::fs::remove_dir(path)
    } else {
        std::fs::remove_file(path)
    };
    match removed {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(AgentError::io(path, e)),
        _ => Ok(()),
    }
}

/// The kubelet directory as the kernel resolves it: mountinfo shows
/// resolved paths, so every comparison with it uses this form.
pub(crate) fn kubelet_root(host: &Host) -> PathBuf {
    std::fs::canonicalize(&host.kubelet_dir).unwrap_or_else(|_| host.kubelet_dir.clone())
}

/// A hint, not a check: whether `path` may be a mount point (it is on
/// another device than its parent, or cannot be looked at). A bind mount
/// from the same filesystem reads as no mount point here; the mount table
/// is what decides.
pub(crate) fn may_be_mount_point(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(parent) = path.parent() else {
        return true;
    };
    match (
        std::fs::symlink_metadata(path),
        std::fs::symlink_metadata(parent),
    ) {
        (Ok(at), Ok(above)) => at.dev() != above.dev(),
        (Err(e), _) if e.kind() == ErrorKind::NotFound => false,
        _ => true,
    }
}

/// Whether `path` exists (without following a final symlink).
pub(crate) fn exists(path: &Path) -> Result<bool, AgentError> {
    match std::fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        // The mount point of a filesystem whose device fails (its LUN lost
        // every path, the filesystem shut down): it is there, and kubelet
        // must still be able to unmount it.
        Err(e) if e.raw_os_error() == Some(libc::EIO) => Ok(true),
        Err(e) => Err(AgentError::io(path, e)),
    }
}

// === impl BlockRecord ===

impl BlockRecord {
    /// The device number recorded at staging.
    pub(crate) fn device(&self) -> DeviceNumber {
        DeviceNumber {
            major: self.major,
            minor: self.minor,
        }
    }

    /// Reads the record in staging directory `staging`; `None` when there is none.
    pub(crate) fn read(staging: &Path) -> Result<Option<Self>, AgentError> {
        let path = staging.join(BLOCK_RECORD);
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(AgentError::io(path, e)),
        };
        serde_json::from_slice(&text)
            .map(Some)
            .map_err(|e| AgentError::io(path, std::io::Error::new(ErrorKind::InvalidData, e)))
    }

    /// Writes the record into staging directory `staging`, atomically
    /// (a temporary file renamed over it), creating the directory if needed.
    pub(crate) fn write(&self, staging: &Path) -> Result<(), AgentError> {
        create_dir(staging)?;
        let path = staging.join(BLOCK_RECORD);
        let text = serde_json::to_vec_pretty(self)
            .map_err(|_| AgentError::Unreachable("a block record always serialises"))?;
        // Durably: a record lost to a power cut would make a staged raw
        // block volume look unstaged.
        csi_scsi_textfs::write_durably(&path, &text, 0o644).map_err(|source| {
            AgentError::RecordNotSaved {
                path: path.clone(),
                source,
            }
        })
    }

    /// Removes the record from `staging`; already gone is success.
    pub(crate) fn remove(staging: &Path) -> Result<(), AgentError> {
        let path = staging.join(BLOCK_RECORD);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(AgentError::io(path, e)),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_path_on_another_device_than_its_parent_may_be_a_mount_point() {
        let dir = tempfile::tempdir().expect("tempdir");
        let plain = dir.path().join("staging");
        assert!(
            !may_be_mount_point(&plain),
            "a missing path is no mount point"
        );
        std::fs::create_dir(&plain).expect("mkdir");
        assert!(!may_be_mount_point(&plain), "a plain directory");
        // /proc is its own filesystem wherever the tests run.
        assert!(may_be_mount_point(Path::new("/proc")));
    }

    fn flags(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn allowed_mount_flags_become_flags_and_data() {
        let o = MountOptions::parse(
            FsType::Ext4,
            &flags(&["noatime", "discard,nosuid", "commit=30", "rw"]),
        )
        .expect("allowed");
        assert_eq!(o.flags, MsFlags::MS_NOATIME | MsFlags::MS_NOSUID);
        assert_eq!(o.data_string().as_deref(), Some("discard,commit=30"));
        assert!(!o.is_read_only());
        assert!(
            MountOptions::parse(FsType::Xfs, &flags(&["ro", "nouuid"]))
                .expect("xfs")
                .is_read_only()
        );
    }

    #[test]
    fn mount_flags_outside_the_allow_list_are_refused_by_name() {
        for (fs, flag) in [
            (FsType::Ext4, "errors=panic"),
            (FsType::Ext4, "nouuid"),
            (FsType::Xfs, "norecovery"),
            (FsType::Ext4, "commit=0"),
            (FsType::Ext4, "bind"),
            (FsType::Xfs, "context=system_u:object_r:foo"),
        ] {
            let err = MountOptions::parse(fs, &flags(&["noatime", flag])).expect_err(flag);
            assert!(err.contains(&format!("{flag:?}")), "{flag}: {err}");
        }
    }

    #[test]
    fn a_refused_flag_is_quoted_as_a_bounded_excerpt_on_one_line() {
        let long = format!("x-{}", "o".repeat(3000));
        for flag in [long.as_str(), "bad\nflag", "é\u{202e}\0"] {
            let err = MountOptions::parse(FsType::Ext4, &flags(&[flag])).expect_err(flag);
            assert!(err.len() < 256, "{} bytes: {err}", err.len());
            assert!(!err.chars().any(char::is_control), "{err:?}");
            assert!(err.starts_with("mount flag \""), "{err}");
        }
        let err = MountOptions::parse(FsType::Ext4, &flags(&[&long])).expect_err("long");
        assert!(err.contains(&format!("({} bytes)", long.len())), "{err}");
    }

    #[test]
    fn only_per_mount_flags_reach_a_bind_mount() {
        let o = MountOptions::parse(FsType::Ext4, &flags(&["sync", "noexec", "discard"]))
            .expect("allowed")
            .with_read_only(true);
        assert_eq!(o.bind_flags(), MsFlags::MS_NOEXEC | MsFlags::MS_RDONLY);
    }

    #[test]
    fn block_records_round_trip_and_vanish() {
        let dir = tempfile::tempdir().expect("tempdir");
        let staging = dir.path().join("staging");
        assert_eq!(BlockRecord::read(&staging).expect("read"), None);
        let record = BlockRecord {
            volume_id: "naa.6001405d27e5d898829468b90ce4ef8c:1".into(),
            wwid: "naa.6001405d27e5d898829468b90ce4ef8c".into(),
            major: 7,
            minor: 2,
        };
        record.write(&staging).expect("write");
        assert_eq!(
            BlockRecord::read(&staging).expect("read"),
            Some(record.clone())
        );
        assert_eq!(record.device(), DeviceNumber { major: 7, minor: 2 });
        BlockRecord::remove(&staging).expect("remove");
        BlockRecord::remove(&staging).expect("remove again");
        assert_eq!(BlockRecord::read(&staging).expect("read"), None);
    }

    #[test]
    fn removing_a_mount_point_never_removes_content() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("target");
        create_dir(&target).expect("mkdir");
        std::fs::write(target.join("data"), b"keep").expect("write");
        assert!(remove_mount_point(&target).is_err());
        assert!(target.join("data").exists());
        std::fs::remove_file(target.join("data")).expect("rm");
        remove_mount_point(&target).expect("empty dir removed");
        remove_mount_point(&target).expect("already gone");
        let file = dir.path().join("block");
        create_file(&file).expect("create");
        create_file(&file).expect("again");
        remove_mount_point(&file).expect("file removed");
    }
}
