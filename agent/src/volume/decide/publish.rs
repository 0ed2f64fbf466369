//! NodePublishVolume's rules.

use std::path::{Path, PathBuf};

use csi_scsi_contract::VolumeId;

use super::stage::is_this_volume;
use super::{Found, SeenMount, Step, how};
use crate::csi::request::AccessMode;
use crate::error::AgentError;
use crate::host::filesystem::FsType;

impl Found<'_> {
    fn not_staged(&self, reason: String) -> AgentError {
        AgentError::NotStaged {
            volume: self.volume.to_string(),
            path: self.path.to_owned(),
            reason,
        }
    }
}

/// A reader-only mode is published read-only whatever the flag says.
pub(crate) fn read_only(flag: bool, mode: AccessMode) -> bool {
    flag || mode.read_only()
}

/// Publishing a filesystem: the staging path must hold this volume's
/// filesystem, of the type asked.
pub(crate) fn staged_filesystem(at: Found<'_>, fs: FsType) -> Result<(), AgentError> {
    match at.mount {
        Some(m) if m.ours && m.fs_type == fs.name() => Ok(()),
        Some(m) if m.ours => Err(AgentError::InvalidArgument {
            field: "volume_capability.mount.fs_type",
            reason: format!("asks for {fs}, but the volume is staged as {}", m.fs_type),
        }),
        Some(m) => Err(at.not_staged(format!("it holds {}", m.described))),
        None => match at.record {
            Some(r) if r.wwid == at.volume.wwid().as_str() => Err(AgentError::InvalidArgument {
                field: "volume_capability",
                reason: format!(
                    "asks for a filesystem, but the volume is staged as a raw block device at {}",
                    at.path.display()
                ),
            }),
            _ => Err(at.not_staged("nothing is mounted there".to_owned())),
        },
    }
}

/// Publishing raw block: the staging path must hold this volume's record.
pub(crate) fn staged_block(at: Found<'_>) -> Result<(), AgentError> {
    match at.record {
        Some(r) if is_this_volume(r, at.volume) => Ok(()),
        Some(r) => Err(at.not_staged(format!("it is the staging path of volume {}", r.volume_id))),
        None => match at.mount {
            Some(m) if m.ours => Err(AgentError::InvalidArgument {
                field: "volume_capability",
                reason: format!(
                    "asks for raw block, but the volume is staged as a filesystem at {}",
                    at.path.display()
                ),
            }),
            _ => Err(at.not_staged("it has no raw block staging record".to_owned())),
        },
    }
}

/// Spec: "If the volume corresponding to the volume_id has already been
/// published at the specified target_path, and is compatible with the
/// specified volume_capability and readonly flag, the Plugin MUST reply 0
/// OK." Published there differently is ALREADY_EXISTS; something else too.
pub(crate) fn target(
    volume: &VolumeId,
    path: &Path,
    mount: Option<&SeenMount>,
    read_only: bool,
) -> Result<Step, AgentError> {
    let Some(m) = mount else {
        return Ok(Step::Proceed);
    };
    if !m.ours {
        return Err(AgentError::PathTaken {
            path: path.to_owned(),
            holder: m.described.clone(),
        });
    }
    if m.read_only != read_only {
        return Err(AgentError::Incompatible {
            volume: volume.to_string(),
            path: path.to_owned(),
            reason: format!(
                "it is published {} and the request asks for {}",
                how(m.read_only),
                how(read_only)
            ),
        });
    }
    Ok(Step::AlreadyDone)
}

/// Whether the shell must look for other publications on this node: only
/// modes that allow one per node care.
pub(crate) fn needs_sole_publication(mode: AccessMode) -> bool {
    mode.one_publication_per_node()
}

/// The spec's second-publish table: another target on this node is
/// FAILED_PRECONDITION unless the mode allows several
/// (SINGLE_NODE_MULTI_WRITER, MULTI_NODE_*). `others` are the volume's
/// publications other than this staging path and target.
pub(crate) fn sole_publication(
    volume: &VolumeId,
    mode: AccessMode,
    others: Vec<PathBuf>,
) -> Result<(), AgentError> {
    if !needs_sole_publication(mode) {
        return Ok(());
    }
    match others.into_iter().next() {
        None => Ok(()),
        Some(target) => Err(AgentError::PublishedElsewhere {
            volume: volume.to_string(),
            target,
            mode: mode.name(),
        }),
    }
}

#[cfg(test)]
mod tests;
