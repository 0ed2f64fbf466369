//! Device-side domain logic behind the agent API: sessions, discover,
//! attach, detach, wipe, rescan. Reaches the host only through `host::`.

mod attach;
mod attachments;
mod detach;
mod discover;
mod rescan;
mod sessions;
mod targets;
mod verify;
mod wipe;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use attachments::Attachments;
pub use sessions::PortalReport;
pub use targets::{TargetSpec, Transport};
pub use verify::{MAX_RANGE, MAX_RANGES, Verified};
pub use wipe::{WipeMode, WipeStep};

use csi_scsi_daemon::{KeyGuard, KeyedLocks};
pub(crate) use rescan::{grow_map, rescan_paths};
pub(crate) use targets::TargetKey;

use crate::error::AgentError;
use crate::host::Host;
use crate::host::sysfs::{self, IscsiSession, Lun, MultipathMap, ScsiDisk};
use csi_scsi_contract::Wwid;

/// The node's devices and sessions.
pub struct Devices {
    host: Host,
    attachments: Arc<Attachments>,
    /// Per-portal login timeout.
    login_timeout: Duration,
    /// One lock per target: a discover's scan-and-list, an attach's
    /// login-and-wait and a detach's delete-and-logout each see the
    /// target's sessions and paths hold still (a logout mid-discover made
    /// every LUN of the target vanish from the node's report).
    target_locks: KeyedLocks<TargetKey>,
    /// One Attach, Detach, Wipe or Rescan per WWID at a time. A proxy
    /// killed mid-call leaves its call running here; its successor's call
    /// for the same LUN is answered ABORTED (and retried) instead of
    /// running alongside it (a detach deleting the device under a wipe).
    in_flight: KeyedLocks<String>,
    /// Login slots ([`sessions::MAX_CONCURRENT_LOGINS`]).
    logins: tokio::sync::Semaphore,
}

impl Devices {
    /// Devices on `host`, with attachment records in `attachments`, taking
    /// LUNs in `luns` (shared with the Node service).
    pub fn new(
        host: Host,
        attachments: Arc<Attachments>,
        login_timeout: Duration,
        luns: KeyedLocks<String>,
    ) -> Self {
        Self {
            host,
            attachments,
            login_timeout,
            target_locks: KeyedLocks::new(),
            in_flight: luns,
            logins: tokio::sync::Semaphore::new(sessions::MAX_CONCURRENT_LOGINS),
        }
    }

    /// Marks an operation on `wwid` in flight, or Busy when one already is.
    pub(crate) fn begin(&self, wwid: &Wwid) -> Result<KeyGuard<String>, AgentError> {
        self.in_flight
            .try_lock(wwid.as_str().to_owned())
            .ok_or_else(|| AgentError::Busy(wwid.to_string()))
    }

    /// Holds every target of `targets` until the guards drop.
    pub(crate) async fn lock_targets(&self, targets: &[TargetSpec]) -> Vec<KeyGuard<TargetKey>> {
        self.target_locks
            .lock_many(targets.iter().flat_map(TargetSpec::lock_keys))
            .await
    }

    /// Holds the targets `lun`'s paths came through (a wipe must not see
    /// its device vanish under an idle-target logout).
    pub(crate) async fn lock_paths_of(&self, lun: &Lun) -> Vec<KeyGuard<TargetKey>> {
        self.target_locks
            .lock_many(
                lun.paths
                    .iter()
                    .filter_map(|p| TargetKey::of_path(&p.transport)),
            )
            .await
    }

    /// The host layer.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The iSCSI sessions the node has now; none when sysfs cannot be read.
    pub fn iscsi_sessions(&self) -> Vec<IscsiSession> {
        sysfs::iscsi_sessions(&self.host).unwrap_or_default()
    }

    /// Every LUN the node sees now, grouped by WWID.
    pub fn luns(&self) -> Result<Vec<Lun>, AgentError> {
        let io = |e| AgentError::io(self.host.sys("block"), e);
        let disks = sysfs::scsi_disks(&self.host).map_err(io)?;
        let maps = sysfs::multipath_maps(&self.host).map_err(io)?;
        Ok(sysfs::group_luns(disks, maps))
    }

    /// The LUN with `wwid`, if present; refused (WWID mismatch) when its
    /// multipath map holds a path that reports another WWID, so no attach,
    /// detach, wipe or rescan acts on a LUN that is not provably `wwid`.
    pub fn lun(&self, wwid: &Wwid) -> Result<Option<Lun>, AgentError> {
        // Only this LUN's paths and maps are described: on a node of
        // hundreds of disks, an attach looks at its own.
        let io = |e| AgentError::io(self.host.sys("block"), e);
        let disks = sysfs::disks_with_wwid(&self.host, wwid).map_err(io)?;
        let maps: Vec<_> = sysfs::multipath_maps(&self.host)
            .map_err(io)?
            .into_iter()
            .filter(|m| &m.wwid == wwid)
            .collect();
        let Some(lun) = sysfs::group_luns(disks, maps)
            .into_iter()
            .find(|l| &l.wwid == wwid)
        else {
            return Ok(None);
        };
        consistent(&self.host, lun).map(Some)
    }

    /// The LUN `wwid` as this node has it now, with the kernel name and
    /// node of the device to use (its multipath map, else its disk);
    /// `DeviceNotFound` when it is not here.
    pub(crate) fn device_of(&self, wwid: &Wwid) -> Result<(Lun, String, PathBuf), AgentError> {
        let lun = self
            .lun(wwid)?
            .ok_or_else(|| AgentError::DeviceNotFound(wwid.clone()))?;
        let name = lun
            .device_kernel_name()
            .ok_or_else(|| AgentError::DeviceNotFound(wwid.clone()))?
            .to_owned();
        let node = self.host.dev(&name);
        Ok((lun, name, node))
    }
}

/// `lun`, unless a path under its map reports another WWID (or none).
pub(crate) fn consistent(host: &Host, lun: Lun) -> Result<Lun, AgentError> {
    if let Some(map) = &lun.map {
        refuse_foreign(host, map, &lun.foreign_paths)?;
    }
    Ok(lun)
}

/// Refuses `map` when it holds `foreign` paths (ones that report another
/// WWID or none).
pub(crate) fn refuse_foreign(
    host: &Host,
    map: &MultipathMap,
    foreign: &[String],
) -> Result<(), AgentError> {
    if foreign.is_empty() {
        return Ok(());
    }
    Err(AgentError::WwidMismatch {
        device: host.dev(&map.kernel_name),
        expected: map.wwid.clone(),
        found: format!(
            "a multipath map holding {} that report(s) another WWID or none",
            foreign.join(", ")
        ),
    })
}

/// Whether `disk` came through `target`.
pub(crate) fn came_through(disk: &ScsiDisk, target: &TargetSpec) -> bool {
    TargetKey::of_path(&disk.transport).is_some_and(|k| target.lock_keys().contains(&k))
}
