//! NodeExpandVolume's rules.

use std::path::Path;

use csi_scsi_contract::VolumeId;

use super::SeenMount;
use crate::csi::request::AccessType;
use crate::error::AgentError;
use crate::host::block::DeviceNumber;
use crate::host::filesystem::FsType;

/// What to grow at the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Grow {
    /// A raw block volume is as large as its device: nothing to grow.
    Nothing,
    /// A filesystem of this type is mounted there: grow it.
    Filesystem(FsType),
}

/// Whether the node must rescan before answering: the device is smaller
/// than required (the controller's rescan may have missed this node).
pub(crate) fn needs_rescan(required: Option<u64>, size: u64) -> bool {
    required.is_some_and(|required| required > size)
}

/// Spec: OUT_OF_RANGE for a capacity range the volume cannot meet. The
/// device's size is what the volume can have; the node cannot change it.
pub(crate) fn in_range(
    required: Option<u64>,
    limit: Option<u64>,
    size: u64,
) -> Result<(), AgentError> {
    if let Some(required) = required
        && required > size
    {
        return Err(AgentError::CapacityOutOfRange {
            size,
            wanted: format!("at least {required} bytes (the LUN has not grown that far yet)"),
        });
    }
    if let Some(limit) = limit
        && limit < size
    {
        return Err(AgentError::CapacityOutOfRange {
            size,
            wanted: format!("at most {limit} bytes"),
        });
    }
    Ok(())
}

/// Whether the path holds raw block: as the capability says, or, when the
/// request carries none, a device node or a block record there.
pub(crate) fn is_block(
    access: Option<&AccessType>,
    node_at_path: bool,
    record_at_path: bool,
) -> bool {
    match access {
        Some(AccessType::Block) => true,
        Some(AccessType::Mount { .. }) => false,
        None => node_at_path || record_at_path,
    }
}

/// The path as the shell found it for an expansion.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AtPath<'a> {
    /// The volume to grow.
    pub volume: &'a VolumeId,
    /// The volume path of the request.
    pub path: &'a Path,
}

impl AtPath<'_> {
    fn not_at_path(&self, reason: String) -> AgentError {
        AgentError::VolumeNotAtPath {
            volume: self.volume.to_string(),
            path: self.path.to_owned(),
            reason,
        }
    }
}

/// Raw block: the device node at the path (its number, and whether it is
/// the volume's device), when one is there, must be the volume's device,
/// numbered `wanted`.
pub(crate) fn block(
    at: AtPath<'_>,
    node: Option<(DeviceNumber, bool)>,
    wanted: DeviceNumber,
) -> Result<Grow, AgentError> {
    match node {
        Some((n, false)) => Err(at.not_at_path(format!("it is device {n}, not {wanted}"))),
        _ => Ok(Grow::Nothing),
    }
}

/// A filesystem: the volume's device must be mounted at the path, with a
/// filesystem this driver can grow.
pub(crate) fn filesystem(at: AtPath<'_>, mount: Option<&SeenMount>) -> Result<Grow, AgentError> {
    let Some(m) = mount else {
        return Err(at.not_at_path("nothing is mounted there".to_owned()));
    };
    if !m.ours {
        return Err(at.not_at_path(format!("it holds {}", m.described)));
    }
    FsType::parse(&m.fs_type)
        .map(Grow::Filesystem)
        .map_err(|_| {
            AgentError::UnsupportedCapability(format!(
                "cannot grow a {} filesystem (only ext4 and xfs)",
                m.fs_type
            ))
        })
}

#[cfg(test)]
mod tests;
