//! NodeGetVolumeStats: usage of a staged or published volume, and its
//! condition as this node sees it (abnormal when the device is gone, the
//! filesystem went read-only, or the path is no longer mounted).

use std::path::Path;

use super::device::{self, Device};
use super::mount_table;
use crate::csi::request::StatsRequest;
use crate::error::AgentError;
use crate::host::Host;
use crate::host::block::{self, DeviceNumber};
use crate::host::filesystem;
use crate::host::mount::{self, BlockRecord};
use crate::host::sysfs;

/// What a volume uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Usage {
    /// A mounted filesystem: bytes and inodes.
    Filesystem(filesystem::Usage),
    /// A raw block device: its size.
    Block {
        /// The device's size in bytes.
        total_bytes: u64,
    },
}

/// The volume's condition (CSI `VolumeCondition`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Condition {
    /// Whether something is wrong.
    pub abnormal: bool,
    /// What, for people.
    pub message: String,
}

/// Usage (when it can be measured) and condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VolumeStats {
    /// Usage; `None` when the path no longer shows the volume.
    pub usage: Option<Usage>,
    /// The condition.
    pub condition: Condition,
}

/// Measures the volume at the request's path.
pub(crate) fn stats(host: &Host, req: &StatsRequest) -> Result<VolumeStats, AgentError> {
    let path = req.path.as_path();
    // Spec: NOT_FOUND when the volume "does not exist on specified volume_path".
    if !mount::exists(path)? {
        return Err(not_at_path(req, "the path does not exist"));
    }
    // The volume is there and failing (its LUN's paths lost, the
    // filesystem shut down): a condition, not an error.
    if let Err(e) = std::fs::metadata(path)
        && e.raw_os_error() == Some(libc::EIO)
    {
        let paths = paths_condition(host, req)?;
        return Ok(VolumeStats {
            usage: None,
            condition: abnormal(format!(
                "{} cannot be read (I/O error); {}",
                path.display(),
                paths.message
            )),
        });
    }
    let device = device::find(host, req.volume.wwid())?;
    if let Some(number) = block::node_number(path).map_err(|e| AgentError::io(path, e))? {
        return block_stats(host, req, path, number, device.as_ref());
    }
    let table = mount_table(host)?;
    let Some(m) = table.mount_at(path) else {
        if let Some(record) = BlockRecord::read(path)?
            && record.wwid == req.volume.wwid().as_str()
        {
            // A raw block staging path: measure the device it records.
            return match &device {
                Some(d) => block_stats(host, req, &d.node, record.device(), device.as_ref()),
                None => Ok(gone(req)),
            };
        }
        return Ok(VolumeStats {
            usage: None,
            condition: abnormal(format!("{} is not mounted", path.display())),
        });
    };
    if let Some(d) = &device
        && !d.is(m.device)
    {
        return Err(not_at_path(
            req,
            &format!("it holds {}", device::describe(m)),
        ));
    }
    let usage = filesystem::usage(path)?;
    let condition = if device.is_none() {
        gone(req).condition
    } else if m.filesystem_read_only() {
        abnormal(format!(
            "the {} filesystem went read-only (I/O errors or a read-only device); writes fail",
            m.fs_type
        ))
    } else {
        paths_condition(host, req)?
    };
    Ok(VolumeStats {
        usage: Some(Usage::Filesystem(usage)),
        condition,
    })
}

fn block_stats(
    host: &Host,
    req: &StatsRequest,
    node: &Path,
    number: DeviceNumber,
    device: Option<&Device>,
) -> Result<VolumeStats, AgentError> {
    match device {
        Some(d) if !d.is(number) => Err(not_at_path(
            req,
            &format!("it is device {number}, not {}", d.number),
        )),
        Some(_) => Ok(VolumeStats {
            usage: Some(Usage::Block {
                total_bytes: block::size(node).map_err(|e| AgentError::io(node, e))?,
            }),
            condition: paths_condition(host, req)?,
        }),
        None => Ok(gone(req)),
    }
}

/// The condition the LUN's paths give: abnormal when none is running (every
/// path lost: I/O queues or fails, as the multipath settings say); a
/// degraded LUN (some paths down) is still normal, and says so.
fn paths_condition(host: &Host, req: &StatsRequest) -> Result<Condition, AgentError> {
    let paths = sysfs::disks_with_wwid(host, req.volume.wwid())
        .map_err(|e| AgentError::io(host.sys("block"), e))?;
    let running = paths.iter().filter(|p| p.state.is_running()).count();
    let states = || {
        paths
            .iter()
            .map(|p| format!("{} {}", p.kernel_name, p.state))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Ok(match running {
        _ if paths.is_empty() => normal(),
        0 => abnormal(format!(
            "no path to the LUN is running ({}): I/O to it queues or fails",
            states()
        )),
        n if n < paths.len() => Condition {
            abnormal: false,
            message: format!(
                "degraded: {n} of {} paths running ({})",
                paths.len(),
                states()
            ),
        },
        _ => normal(),
    })
}

fn gone(req: &StatsRequest) -> VolumeStats {
    VolumeStats {
        usage: None,
        condition: abnormal(format!(
            "the device with WWID {} is gone from this node",
            req.volume.wwid()
        )),
    }
}

fn normal() -> Condition {
    Condition {
        abnormal: false,
        message: "volume is healthy".to_owned(),
    }
}

fn abnormal(message: String) -> Condition {
    Condition {
        abnormal: true,
        message,
    }
}

fn not_at_path(req: &StatsRequest, reason: &str) -> AgentError {
    AgentError::VolumeNotAtPath {
        volume: req.volume.to_string(),
        path: req.path.as_path().to_owned(),
        reason: reason.to_owned(),
    }
}
