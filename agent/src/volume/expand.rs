//! NodeExpandVolume: after the LUN grew (the array grew it, the node
//! rescanned it), grow the mounted filesystem to fill the device. Raw block
//! volumes have nothing to grow: the new size is just reported. The size
//! reported is the device's, read live from the device node.

use super::device;
use super::mount_table;
use crate::csi::request::{AccessType, ExpandRequest};
use crate::error::AgentError;
use crate::host::Host;
use crate::host::block;
use crate::host::filesystem::{self, FsType};
use crate::host::mount::{self, BlockRecord};

/// Grows the volume at the request's path to fill its device; returns the
/// device's size in bytes.
pub async fn expand(host: &Host, req: &ExpandRequest) -> Result<u64, AgentError> {
    let path = req.path.as_path();
    let not_at_path = |reason: String| AgentError::VolumeNotAtPath {
        volume: req.volume.to_string(),
        path: path.to_owned(),
        reason,
    };
    if !mount::exists(path)? {
        return Err(not_at_path("the path does not exist".to_owned()));
    }
    let wwid = req.volume.wwid();
    let mut device = device::require(host, wwid)?;
    let mut size = block::size(&device.node).map_err(|e| AgentError::io(&device.node, e))?;
    if req.required_bytes.is_some_and(|required| required > size) {
        // The controller's rescan may have missed this node (a path in
        // transition while the array re-presented the LUN), or reached its
        // paths while the map stayed at the old size: this node reads the
        // capacity again itself, then the map follows its paths.
        crate::device::rescan_paths(host, wwid)?;
        crate::device::grow_map(host, wwid).await?;
        device = device::require(host, wwid)?;
        size = block::size(&device.node).map_err(|e| AgentError::io(&device.node, e))?;
    }
    check_range(req, size)?;

    let node = block::node_number(path).map_err(|e| AgentError::io(path, e))?;
    let is_block = match &req.access {
        Some(AccessType::Block) => true,
        Some(AccessType::Mount { .. }) => false,
        None => node.is_some() || BlockRecord::read(path)?.is_some(),
    };
    if is_block {
        if let Some(n) = node
            && !device.is(n)
        {
            return Err(not_at_path(format!(
                "it is device {n}, not {}",
                device.number
            )));
        }
        // A raw block volume is as large as its device: nothing to grow.
        return Ok(size);
    }

    let table = mount_table(host)?;
    let Some(m) = table.mount_at(path) else {
        return Err(not_at_path("nothing is mounted there".to_owned()));
    };
    if !device.is(m.device) {
        return Err(not_at_path(format!("it holds {}", device::describe(m))));
    }
    let fs = FsType::from_name(&m.fs_type).ok_or_else(|| {
        AgentError::UnsupportedCapability(format!(
            "cannot grow a {} filesystem (only ext4 and xfs)",
            m.fs_type
        ))
    })?;
    filesystem::grow(host, fs, &device.node, Some(path)).await?;
    tracing::info!(volume_id = %req.volume, path = %path.display(), %fs, size, "filesystem grown to fill the device");
    Ok(size)
}

/// Spec: OUT_OF_RANGE for a capacity range the volume cannot meet. The
/// device's size is what the volume can have; the node cannot change it.
fn check_range(req: &ExpandRequest, size: u64) -> Result<(), AgentError> {
    if let Some(required) = req.required_bytes
        && required > size
    {
        return Err(AgentError::CapacityOutOfRange {
            size,
            wanted: format!("at least {required} bytes (the LUN has not grown that far yet)"),
        });
    }
    if let Some(limit) = req.limit_bytes
        && limit < size
    {
        return Err(AgentError::CapacityOutOfRange {
            size,
            wanted: format!("at most {limit} bytes"),
        });
    }
    Ok(())
}
