//! NodeStageVolume's and NodeUnstageVolume's rules.

use std::path::{Path, PathBuf};

use csi_scsi_contract::VolumeId;

use super::{Found, Step};
use crate::error::AgentError;
use crate::host::block::Holder;
use crate::host::filesystem::{FsType, Signature};
use crate::host::mount::BlockRecord;

impl Found<'_> {
    fn incompatible(&self, reason: String) -> AgentError {
        AgentError::Incompatible {
            volume: self.volume.to_string(),
            path: self.path.to_owned(),
            reason,
        }
    }

    fn taken(&self, holder: String) -> AgentError {
        AgentError::PathTaken {
            path: self.path.to_owned(),
            holder,
        }
    }
}

/// Staging a filesystem of type `fs`: done already when the volume's
/// device is mounted there as `fs`; refused when anything else is there.
pub(crate) fn filesystem_path(at: Found<'_>, fs: FsType) -> Result<Step, AgentError> {
    if let Some(m) = at.mount {
        if !m.ours {
            return Err(at.taken(m.described.clone()));
        }
        if m.fs_type != fs.name() {
            return Err(at.incompatible(format!(
                "it is staged as {} and the request asks for {fs}",
                m.fs_type
            )));
        }
        // Spec: "If the volume corresponding to the volume_id is already
        // staged to the staging_target_path, and is identical to the
        // specified volume_capability the Plugin MUST reply 0 OK."
        return Ok(Step::AlreadyDone);
    }
    if at.record.is_some() {
        return Err(at.incompatible(format!(
            "it is staged as a raw block device and the request asks for {fs}"
        )));
    }
    Ok(Step::Proceed)
}

/// Staging raw block: done already when this volume's record is there;
/// refused when a mount or another volume's record is.
pub(crate) fn block_path(at: Found<'_>) -> Result<Step, AgentError> {
    if let Some(m) = at.mount {
        if m.ours {
            return Err(at.incompatible(
                "it is staged as a filesystem and the request asks for raw block".to_owned(),
            ));
        }
        return Err(at.taken(m.described.clone()));
    }
    match at.record {
        Some(r) if is_this_volume(r, at.volume) => Ok(Step::AlreadyDone),
        Some(r) => Err(at.taken(format!("raw block volume {}", r.volume_id))),
        None => Ok(Step::Proceed),
    }
}

/// Whether a raw block record is this volume's (its ID and its WWID).
pub(crate) fn is_this_volume(record: &BlockRecord, volume: &VolumeId) -> bool {
    record.volume_id == volume.to_string() && record.wwid == volume.wwid().as_str()
}

/// A device about to be staged must be unused: not mounted anywhere the
/// mount table shows (`mounted_at`) and not held exclusively (`holder`).
pub(crate) fn unused(
    volume: &VolumeId,
    node: &Path,
    mounted_at: Option<&Path>,
    holder: Holder,
) -> Result<(), AgentError> {
    if let Some(at) = mounted_at {
        return Err(AgentError::DeviceInUse {
            wwid: volume.wwid().clone(),
            holder: format!("mounted at {}", at.display()),
        });
    }
    match holder {
        Holder::Free => Ok(()),
        Holder::Busy => Err(AgentError::DeviceInUse {
            wwid: volume.wwid().clone(),
            holder: format!(
                "{} is held exclusively (mounted in another mount namespace, or open by another program)",
                node.display()
            ),
        }),
    }
}

/// Whether to stage read-only: when published read-only, or when the
/// kernel marks the device read-only, which only a reader-only capability
/// or a read-only publication accepts.
pub(crate) fn read_only(
    node: &Path,
    device_read_only: bool,
    mode_read_only: bool,
    published_read_only: bool,
) -> Result<bool, AgentError> {
    if device_read_only && !mode_read_only && !published_read_only {
        return Err(AgentError::DeviceReadOnly {
            device: node.to_owned(),
        });
    }
    Ok(device_read_only || published_read_only)
}

/// Below this, a device larger than its filesystem is not worth a grow
/// (resize2fs rounds down to whole blocks; a few KiB never fill).
pub(crate) const GROW_SLACK: u64 = 1 << 20;

/// Whether NodeStage may grow the filesystem before it mounts it: an ext4
/// staged read-write. ext4 grows unmounted; xfs only mounted, which
/// NodeExpandVolume does.
pub(crate) fn grows_unmounted(fs: FsType, read_only: bool) -> bool {
    fs == FsType::Ext4 && !read_only
}

/// Whether the device outgrew its filesystem by [`GROW_SLACK`] or more
/// (the LUN grew while the volume was not staged: an offline expansion).
pub(crate) fn outgrown(fs_bytes: u64, device_bytes: u64) -> bool {
    fs_bytes
        .checked_add(GROW_SLACK)
        .is_some_and(|enough| device_bytes >= enough)
}

/// What the full probe's answer leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnProbe {
    /// It carries the asked filesystem: mount it as it is.
    Mount,
    /// It is blank and writable: format it (after the last re-verify).
    Format,
}

/// The only path to a format: a blank device, neither published read-only
/// nor read-only. Anything but blank or the asked filesystem is refused.
pub(crate) fn on_probe(
    volume: &VolumeId,
    node: &Path,
    fs: FsType,
    found: &Signature,
    published_read_only: bool,
    read_only: bool,
) -> Result<OnProbe, AgentError> {
    match found {
        Signature::Filesystem(f) if f == fs.name() => Ok(OnProbe::Mount),
        Signature::Blank if published_read_only => Err(AgentError::PublishedReadOnlyBlank {
            volume: volume.to_string(),
        }),
        Signature::Blank if read_only => Err(AgentError::DeviceReadOnly {
            device: node.to_owned(),
        }),
        Signature::Blank => Ok(OnProbe::Format),
        other => Err(foreign(node, fs, other)),
    }
}

/// After a format, only the asked filesystem is mounted.
pub(crate) fn after_format(node: &Path, fs: FsType, made: &Signature) -> Result<(), AgentError> {
    match made {
        Signature::Filesystem(f) if f == fs.name() => Ok(()),
        other => Err(foreign(node, fs, other)),
    }
}

fn foreign(node: &Path, fs: FsType, found: &Signature) -> AgentError {
    AgentError::ForeignFilesystem {
        device: node.to_owned(),
        found: found.describe(),
        wanted: format!("a filesystem of type {fs}"),
    }
}

/// Unstaging raw block: only this volume's record is removed.
pub(crate) fn unstage_record(
    volume: &VolumeId,
    path: &Path,
    record: &BlockRecord,
) -> Result<(), AgentError> {
    if record.volume_id == volume.to_string() {
        return Ok(());
    }
    Err(AgentError::ForeignMount {
        volume: volume.to_string(),
        path: path.to_owned(),
        holder: format!(
            "the raw block staging record of volume {}",
            record.volume_id
        ),
    })
}

/// Spec: "All NodeUnpublishVolume MUST be called and return success for a
/// volume before NodeUnstageVolume MAY be called for the volume."
pub(crate) fn unpublished_first(
    volume: &VolumeId,
    targets: Vec<PathBuf>,
) -> Result<(), AgentError> {
    if targets.is_empty() {
        Ok(())
    } else {
        Err(AgentError::StillPublished {
            volume: volume.to_string(),
            targets,
        })
    }
}

#[cfg(test)]
mod tests;
