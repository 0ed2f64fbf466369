//! NodeExpandVolume: after the LUN grew (the array grew it, the node
//! rescanned it), grow the mounted filesystem to fill the device. Raw block
//! volumes have nothing to grow: the new size is just reported. The size
//! reported is the device's, read live from the device node.

use super::decide::SeenMount;
use super::decide::expand::{self as decide, AtPath, Grow};
use super::device;
use super::mount_table;
use crate::csi::request::ExpandRequest;
use crate::error::AgentError;
use crate::host::Host;
use crate::host::block;
use crate::host::filesystem;
use crate::host::mount::{self, BlockRecord};

/// Grows the volume at the request's path to fill its device; returns the
/// device's size in bytes.
pub(crate) async fn expand(host: &Host, req: &ExpandRequest) -> Result<u64, AgentError> {
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
    if decide::needs_rescan(req.required_bytes, size) {
        // The controller's rescan may have missed this node (a path in
        // transition while the array re-presented the LUN), or reached its
        // paths while the map stayed at the old size: this node reads the
        // capacity again itself, then the map follows its paths.
        crate::device::rescan_paths(host, wwid)?;
        crate::device::grow_map(host, wwid).await?;
        device = device::require(host, wwid)?;
        size = block::size(&device.node).map_err(|e| AgentError::io(&device.node, e))?;
    }
    decide::in_range(req.required_bytes, req.limit_bytes, size)?;

    let at = AtPath {
        volume: &req.volume,
        path,
    };
    let node = block::node_number(path).map_err(|e| AgentError::io(path, e))?;
    // The record is looked for only when neither the capability nor a
    // device node at the path says.
    let record = req.access.is_none() && node.is_none() && BlockRecord::read(path)?.is_some();
    let grow = if decide::is_block(req.access.as_ref(), node.is_some(), record) {
        decide::block(at, node.map(|n| (n, device.is(n))), device.number)?
    } else {
        let table = mount_table(host)?;
        let mount = table
            .mount_at(path)
            .map(|m| SeenMount::of(m, device.is(m.device)));
        decide::filesystem(at, mount.as_ref())?
    };
    match grow {
        Grow::Nothing => Ok(size),
        Grow::Filesystem(fs) => {
            filesystem::grow(host, fs, &device.node, Some(path)).await?;
            tracing::info!(volume_id = %req.volume, path = %path.display(), %fs, size, "filesystem grown to fill the device");
            Ok(size)
        }
    }
}
