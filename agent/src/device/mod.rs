//! Device-side domain logic behind the agent API: sessions, discover,
//! attach, detach, wipe, rescan. Reaches the host only through `host::`.

mod attach;
mod attachments;
mod detach;
mod discover;
mod rescan;
mod sessions;
mod wipe;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

pub use attachments::Attachments;
pub use sessions::{PortalReport, TargetSpec, Transport};
pub use wipe::{WipeMode, WipeStep};

use csi_scsi_daemon::{OpGuard, OpGuards};

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
    /// One lock per target: a discover's scan-and-list, an attach's
    /// login-and-wait and a detach's delete-and-logout each see the
    /// target's sessions and paths hold still (a logout mid-discover made
    /// every LUN of the target vanish from the node's report).
    target_locks: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// One Attach, Detach, Wipe or Rescan per WWID at a time. A proxy
    /// killed mid-call leaves its call running here; its successor's call
    /// for the same LUN is answered ABORTED (and retried) instead of
    /// running alongside it (a detach deleting the device under a wipe).
    in_flight: OpGuards<String>,
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
        luns: OpGuards<String>,
    ) -> Self {
        Self {
            host,
            attachments,
            login_timeout,
            target_locks: std::sync::Mutex::new(HashMap::new()),
            in_flight: luns,
            logins: tokio::sync::Semaphore::new(sessions::MAX_CONCURRENT_LOGINS),
        }
    }

    /// Marks an operation on `wwid` in flight, or Busy when one already is.
    pub(crate) fn begin(&self, wwid: &Wwid) -> Result<OpGuard<String>, AgentError> {
        self.in_flight
            .try_begin(wwid.as_str().to_owned())
            .ok_or_else(|| AgentError::Busy(wwid.to_string()))
    }

    /// Holds every target of `targets` (in name order, so two callers
    /// never wait on each other crosswise) until the guards drop.
    pub(crate) async fn lock_targets(
        &self,
        targets: &[TargetSpec],
    ) -> Vec<tokio::sync::OwnedMutexGuard<()>> {
        self.lock_keys(targets.iter().map(TargetSpec::lock_key).collect())
            .await
    }

    /// Holds the targets `lun`'s paths came through (a wipe must not see
    /// its device vanish under an idle-target logout).
    pub(crate) async fn lock_paths_of(&self, lun: &Lun) -> Vec<tokio::sync::OwnedMutexGuard<()>> {
        let keys = lun
            .paths
            .iter()
            .filter_map(|p| match &p.transport {
                sysfs::Transport::Iscsi {
                    target: Some(iqn), ..
                } => Some(format!("iscsi:{iqn}")),
                _ => None,
            })
            .collect();
        self.lock_keys(keys).await
    }

    async fn lock_keys(&self, mut names: Vec<String>) -> Vec<tokio::sync::OwnedMutexGuard<()>> {
        names.sort_unstable();
        names.dedup();
        let locks: Vec<Arc<tokio::sync::Mutex<()>>> = {
            let mut map = self.target_locks.lock().unwrap_or_else(|p| p.into_inner());
            names
                .iter()
                .map(|n| map.entry(n.clone()).or_default().clone())
                .collect()
        };
        let mut guards = Vec::with_capacity(locks.len());
        for l in locks {
            guards.push(l.lock_owned().await);
        }
        guards
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

    /// The LUN with `wwid`, if present; refused (WWID mismatch) when its
    /// multipath map holds a path that reports another WWID, so no attach,
    /// detach, wipe or rescan acts on a LUN that is not provably `wwid`.
    pub fn lun(&self, wwid: &Wwid) -> Result<Option<Lun>, AgentError> {
        let Some(lun) = self.luns()?.into_iter().find(|l| &l.wwid == wwid) else {
            return Ok(None);
        };
        consistent(&self.host, lun).map(Some)
    }
}

/// `lun`, unless a path under its map reports another WWID (or none).
pub(crate) fn consistent(host: &Host, lun: Lun) -> Result<Lun, AgentError> {
    match (&lun.map, lun.foreign_paths.first()) {
        (Some(map), Some(_)) => Err(AgentError::WwidMismatch {
            device: host.dev(&map.kernel_name),
            expected: lun.wwid.clone(),
            found: format!(
                "a multipath map holding {} that report(s) another WWID or none",
                lun.foreign_paths.join(", ")
            ),
        }),
        _ => Ok(lun),
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
