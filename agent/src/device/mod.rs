//! Device-side domain logic behind the agent API: sessions, discover,
//! attach, detach, wipe, rescan. Reaches the host only through `host::`.

mod attach;
mod attachments;
mod detach;
mod discover;
mod rescan;
mod sessions;
mod wipe;

use std::sync::Arc;
use std::time::Duration;

pub use attachments::Attachments;
pub use sessions::{PortalReport, TargetSpec, Transport};
pub use wipe::{WipeMode, WipeStep};

use crate::error::AgentError;
use crate::host::Host;
use crate::host::sysfs::{self, Lun, ScsiDisk};
use crate::wwid::Wwid;

/// The node's devices and sessions.
pub struct Devices {
    host: Host,
    attachments: Arc<Attachments>,
    /// Per-portal login timeout.
    login_timeout: Duration,
}

impl Devices {
    /// Devices on `host`, with attachment records in `attachments`.
    pub fn new(host: Host, attachments: Arc<Attachments>, login_timeout: Duration) -> Self {
        Self {
            host,
            attachments,
            login_timeout,
        }
    }

    /// The host layer.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// Every LUN the node sees now, grouped by WWID.
    pub fn luns(&self) -> Result<Vec<Lun>, AgentError> {
        let io = |e| AgentError::io(self.host.sys("block"), e);
        let disks = sysfs::scsi_disks(&self.host).map_err(io)?;
        let maps = sysfs::multipath_maps(&self.host).map_err(io)?;
        Ok(sysfs::group_luns(disks, maps))
    }

    /// The LUN with `wwid`, if present.
    pub fn lun(&self, wwid: &Wwid) -> Result<Option<Lun>, AgentError> {
        Ok(self.luns()?.into_iter().find(|l| &l.wwid == wwid))
    }
}

/// Whether `disk` came through `target`.
pub(crate) fn came_through(disk: &ScsiDisk, target: &TargetSpec) -> bool {
    match (&disk.transport, &target.transport) {
        (
            sysfs::Transport::Iscsi {
                target: Some(iqn), ..
            },
            Transport::Iscsi { iqn: want, .. },
        ) => iqn == want,
        (
            sysfs::Transport::Fc {
                target_wwpn: Some(w),
            },
            Transport::Fc { wwpns },
        ) => wwpns.contains(w),
        _ => false,
    }
}
