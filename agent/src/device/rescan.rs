//! Rescan: ask the SCSI layer to re-read a LUN's capacity.

use std::time::Duration;

use super::Devices;
use crate::error::AgentError;
use crate::host::{Host, block, multipath, sysfs};
use csi_scsi_contract::Wwid;

/// Why a device of no size is neither wiped nor verified.
pub(super) const NO_SIZE: &str = "it reports a size of 0 bytes (a path in transition?)";

impl Devices {
    /// Rescans every path of `wwid` and returns its size in bytes.
    pub async fn rescan(&self, wwid: &Wwid) -> Result<u64, AgentError> {
        let _op = self.begin(wwid)?;
        self.rescan_held(wwid).await
    }

    /// [`Self::rescan`] for a caller that holds the LUN's operation guard
    /// already (a wipe or a verify that found the device smaller than the
    /// inventory records).
    pub(crate) async fn rescan_held(&self, wwid: &Wwid) -> Result<u64, AgentError> {
        let before = self.size_of(wwid)?;
        self.lun(wwid)?
            .ok_or_else(|| AgentError::DeviceNotFound(wwid.clone()))?;
        rescan_paths(&self.host, wwid)?;
        // A kernel re-reads the capacity within the write; a transport that
        // answers late (and the lab's stand-in) needs a moment. Wait a
        // little for a change, then report what is there.
        let mut size = before;
        for _ in 0..20 {
            size = self.size_of(wwid)?;
            if size != before {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        grow_map(&self.host, wwid).await?;
        Ok(size)
    }

    /// The larger of the live size of the device node and what sysfs says.
    fn size_of(&self, wwid: &Wwid) -> Result<u64, AgentError> {
        let (lun, _, node) = self.device_of(wwid)?;
        let live = block::size(&node).map_err(|e| AgentError::io(&node, e))?;
        let reported = lun.paths.iter().map(|p| p.size_bytes).max().unwrap_or(0);
        Ok(live.max(reported))
    }
}

impl Devices {
    /// The live size of `node` (the LUN `wwid`): rescanned once (and its
    /// multipath map grown) when it reports less than `expected` or
    /// nothing. A size of 0, or one that cannot be read, is never an
    /// answer: the device is not ready. The caller holds the LUN's guard.
    pub(crate) async fn size_at_least(
        &self,
        wwid: &Wwid,
        node: &std::path::Path,
        expected: u64,
    ) -> Result<u64, AgentError> {
        let read = || {
            block::size(node).map_err(|e| AgentError::DeviceNotReady {
                device: node.to_owned(),
                reason: format!("its size cannot be read: {e}"),
            })
        };
        let mut size = read()?;
        if size < expected.max(1) {
            self.rescan_held(wwid).await?;
            size = read()?;
        }
        if size == 0 {
            return Err(AgentError::DeviceNotReady {
                device: node.to_owned(),
                reason: NO_SIZE.to_owned(),
            });
        }
        Ok(size)
    }
}

/// Asks the SCSI layer to re-read the capacity of every path of `wwid`
/// (`device/rescan`; synchronous in a kernel).
pub(crate) fn rescan_paths(host: &Host, wwid: &Wwid) -> Result<(), AgentError> {
    let paths =
        sysfs::disks_with_wwid(host, wwid).map_err(|e| AgentError::io(host.sys("block"), e))?;
    for p in &paths {
        sysfs::rescan_device(host, &p.kernel_name)
            .map_err(|e| AgentError::io(host.sys("block").join(&p.kernel_name), e))?;
    }
    Ok(())
}

/// Grows the multipath map of `wwid` when its paths are larger (after a
/// rescan): the map is the device that is mounted, and it keeps the size it
/// was built with until multipathd resizes it. No map, or a map as large
/// as its paths, is left alone.
pub(crate) async fn grow_map(host: &Host, wwid: &Wwid) -> Result<(), AgentError> {
    let io = |e| AgentError::io(host.sys("block"), e);
    let paths = sysfs::disks_with_wwid(host, wwid).map_err(io)?;
    let largest = paths.iter().map(|p| p.size_bytes).max().unwrap_or(0);
    let Some(map) = sysfs::multipath_maps(host)
        .map_err(io)?
        .into_iter()
        .find(|m| &m.wwid == wwid)
    else {
        return Ok(());
    };
    if map.size_bytes >= largest {
        return Ok(());
    }
    // Paths that disagree on the size are mid-rescan: resizing now would
    // fail (or settle on the smaller); the next rescan or expand retries.
    if paths.iter().any(|p| p.size_bytes != largest) {
        return Err(AgentError::DeviceNotReady {
            device: host.dev(&map.kernel_name),
            reason: "its paths report different sizes (a rescan is still under way)".to_owned(),
        });
    }
    multipath::resize(host, &map.name)
        .await
        .map_err(|e| AgentError::DeviceNotReady {
            device: host.dev(&map.kernel_name),
            reason: format!("its paths grew to {largest} bytes but the map could not follow: {e}"),
        })?;
    tracing::info!(%wwid, map = %map.name, from = map.size_bytes, to = largest, "multipath map resized to its paths");
    Ok(())
}
