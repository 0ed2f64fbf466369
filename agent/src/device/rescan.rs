//! Rescan: ask the SCSI layer to re-read a LUN's capacity.

use std::time::Duration;

use super::Devices;
use crate::error::AgentError;
use crate::host::{block, sysfs};
use csi_scsi_contract::Wwid;

impl Devices {
    /// Rescans every path of `wwid` and returns its size in bytes.
    pub async fn rescan(&self, wwid: &Wwid) -> Result<u64, AgentError> {
        let _op = self.begin(wwid)?;
        let before = self.size_of(wwid)?;
        let lun = self
            .lun(wwid)?
            .ok_or_else(|| AgentError::DeviceNotFound(wwid.clone()))?;
        for p in &lun.paths {
            sysfs::rescan_device(&self.host, &p.kernel_name)
                .map_err(|e| AgentError::io(self.host.sys("block").join(&p.kernel_name), e))?;
        }
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
        Ok(size)
    }

    /// The larger of the live size of the device node and what sysfs says.
    fn size_of(&self, wwid: &Wwid) -> Result<u64, AgentError> {
        let lun = self
            .lun(wwid)?
            .ok_or_else(|| AgentError::DeviceNotFound(wwid.clone()))?;
        let name = lun
            .device_kernel_name()
            .ok_or_else(|| AgentError::DeviceNotFound(wwid.clone()))?;
        let node = self.host.dev(name);
        let live = block::size(&node).map_err(|e| AgentError::io(&node, e))?;
        let reported = lun.paths.iter().map(|p| p.size_bytes).max().unwrap_or(0);
        Ok(live.max(reported))
    }
}
