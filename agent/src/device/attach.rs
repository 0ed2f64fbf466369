//! Attach: ensure the sessions, remove a stale path at the LUN's address,
//! rescan, wait (bounded) for a device with the WWID, verify it, and
//! return the node-local path to use.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::{Devices, TargetSpec, Transport, came_through};
use crate::error::AgentError;
use crate::host::sysfs::{self, Lun, PathAtAddress};
use crate::host::{block, dev_links, multipath};

/// How long an attach on a dm-multipath node waits for multipathd to build
/// a LUN's map before it settles for a single path nothing holds.
pub(super) const MAP_GRACE: Duration = Duration::from_secs(10);
use crate::volume::device::publications;
use crate::volume::mount_table;
use csi_scsi_contract::Wwid;

impl Devices {
    /// Attaches `wwid` through `targets`; `lun` is the inventory's hint of
    /// its LUN number (see [`Self::stale_path_hint`]). Waits until
    /// `deadline` for the device.
    pub async fn attach(
        &self,
        wwid: &Wwid,
        targets: &[TargetSpec],
        lun: u32,
        deadline: Duration,
    ) -> Result<(PathBuf, Lun), AgentError> {
        let start = Instant::now();
        if targets.is_empty() {
            return Err(AgentError::InvalidArgument {
                field: "targets",
                reason: "at least one target is required".into(),
            });
        }
        let _op = self.begin(wwid)?;
        // Attach is asked again and again (every ControllerPublish retry):
        // a device already attached through these targets is answered from
        // what is here, verified, without touching sessions or rescanning.
        let names: Vec<String> = targets.iter().map(|t| t.name.clone()).collect();
        if self.attachments.covers(wwid.as_str(), &names)
            && let Some(found) = self.present(wwid)?
        {
            return Ok(found);
        }
        let lun = self.stale_path_hint(targets, lun)?;
        // The node's attach limit (NodeGetInfo's max_volumes_per_node).
        let mut admission = self.attachments.admit(wwid.as_str())?;
        // Marked before the lock: a detach that follows sees the targets
        // in use and keeps their sessions while this attach waits.
        admission.through(&names);
        let held = self.lock_targets(targets).await;
        let mut reached = 0;
        let mut last_err = None;
        for t in targets {
            match self.connect_target(t).await {
                Ok(_) => reached += 1,
                Err(e) => {
                    tracing::warn!(target = %t.name, error = %e, "target not reachable for attach");
                    last_err = Some(e);
                }
            }
        }
        if reached == 0 {
            return Err(last_err.unwrap_or(AgentError::Unreachable("no target given")));
        }
        if let Some(lun) = lun {
            self.remove_stale_paths(wwid, targets, lun)?;
        }
        // A LUN a login's scan or another attach's already brought up
        // through every session needs no scan of its own: a storm of
        // attaches through one target scans it once, not once per LUN (a
        // session rescan re-reads every LUN of the target).
        if !self.seen_through_every_session(wwid, targets)? {
            for t in targets {
                if let Err(e) = self.rescan_target(t).await {
                    tracing::warn!(target = %t.name, error = %e, "rescan failed");
                }
            }
        }
        // Sessions are up and the scan asked for: the wait needs no lock,
        // so attaches through one target overlap (an attach storm).
        drop(held);
        // Wait for the kernel (and udev) to bring the device up: the link
        // first (two readlinks), the whole LUN only once it is there.
        let multipathed = multipath::is_configured(&self.host);
        let mut pause = Duration::from_millis(5);
        let found = loop {
            if let Some(link) = dev_links::find_by_wwid(&self.host, wwid)
                .map_err(|e| AgentError::io(self.host.dev("disk/by-id"), e))?
                && let Some(l) = self.lun(wwid)?
                && (!multipathed || self.map_settled(&link.kernel_name, &l, start)?)
            {
                break (link, l);
            }
            if start.elapsed() >= deadline {
                return Err(AgentError::AttachTimeout {
                    wwid: wwid.clone(),
                    waited: start.elapsed(),
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        };
        let (link, lun_info) = found;
        // Never hand out a device that is not provably the one asked for.
        let reported = sysfs::block_wwid(&self.host, &link.kernel_name)
            .map_err(|e| AgentError::io(&link.node, e))?;
        if reported.as_ref() != Some(wwid) {
            return Err(AgentError::WwidMismatch {
                device: link.node,
                expected: wwid.clone(),
                found: reported
                    .map(|w| w.to_string())
                    .unwrap_or_else(|| "no WWID".into()),
            });
        }
        if let Some(map) = &lun_info.map {
            // Paths of this LUN left outside its map (open while multipathd
            // built it) and held by nothing: multipathd adds them now.
            for p in lun_info
                .paths
                .iter()
                .filter(|p| !map.slaves.contains(&p.kernel_name) && p.holders.is_empty())
            {
                if let Err(e) = multipath::add_path(&self.host, &p.kernel_name).await {
                    tracing::warn!(%wwid, path = %p.kernel_name, error = %e, "a path of the LUN stays outside its map");
                }
            }
        }
        admission.complete(targets.iter().map(|t| t.name.clone()))?;
        tracing::info!(%wwid, device = %link.link.display(), paths = lun_info.paths.len(), "attached");
        Ok((link.link, lun_info))
    }

    /// On a dm-multipath node, whether the device found for a LUN is the
    /// one to hand out: its map, once multipathd has built it and udev has
    /// pointed the link at it. A path handed out before that is taken by
    /// the map a moment later (mkfs or mount then find it held, or race
    /// it), so a path alone is used only after [`MAP_GRACE`] with nothing
    /// holding it: a LUN multipathd leaves alone (`find_multipaths`
    /// strict, a blacklisted WWID).
    fn map_settled(&self, linked: &str, lun: &Lun, start: Instant) -> Result<bool, AgentError> {
        if let Some(map) = &lun.map {
            return Ok(map.kernel_name == linked);
        }
        if start.elapsed() < MAP_GRACE {
            return Ok(false);
        }
        for path in &lun.paths {
            let held = sysfs::holders(&self.host, &path.kernel_name)
                .map_err(|e| AgentError::io(self.host.sys("block").join(&path.kernel_name), e))?;
            if !held.is_empty() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The LUN-number hint `lun`, unless a disk at that address through
    /// `targets` is in use: the hint lets the attach remove a stale path
    /// there, and a path that is mounted, held or published is never stale.
    fn stale_path_hint(&self, targets: &[TargetSpec], lun: u32) -> Result<Option<u64>, AgentError> {
        let host = &self.host;
        let disks = sysfs::scsi_disks(host).map_err(|e| AgentError::io(host.sys("block"), e))?;
        let table = mount_table(host)?;
        let at_address = disks
            .iter()
            .filter(|d| d.hctl.lun == u64::from(lun) && targets.iter().any(|t| came_through(d, t)));
        for d in at_address {
            let Ok(number) = block::device_number(&host.dev(&d.kernel_name)) else {
                continue;
            };
            if !d.holders.is_empty()
                || table.mounts_of(number).next().is_some()
                || !publications(host, &table, number, &[]).is_empty()
            {
                tracing::warn!(disk = %d.kernel_name, wwid = %d.wwid, lun, "the disk at the hinted address is in use; not treating it as stale");
                return Ok(None);
            }
        }
        Ok(Some(u64::from(lun)))
    }

    /// Whether `wwid` already has a path on the SCSI host of every session
    /// of `targets` (all iSCSI). Anything else, an FC target among
    /// them or a session whose host is unknown, says no: the scan runs.
    fn seen_through_every_session(
        &self,
        wwid: &Wwid,
        targets: &[TargetSpec],
    ) -> Result<bool, AgentError> {
        let mut iqns = Vec::with_capacity(targets.len());
        for t in targets {
            let Transport::Iscsi { iqn, .. } = &t.transport else {
                return Ok(false);
            };
            iqns.push(iqn.as_str());
        }
        let sessions = sysfs::iscsi_sessions(&self.host)
            .map_err(|e| AgentError::io(self.host.sys("class/iscsi_session"), e))?;
        let mut hosts = Vec::new();
        for s in sessions
            .iter()
            .filter(|s| iqns.contains(&s.target.as_str()))
        {
            let Some(host) = s.scsi_host else {
                return Ok(false);
            };
            hosts.push(host);
        }
        if hosts.is_empty() {
            return Ok(false);
        }
        let Some(lun) = self.lun(wwid)? else {
            return Ok(false);
        };
        Ok(hosts
            .iter()
            .all(|h| lun.paths.iter().any(|p| p.hctl.host == *h)))
    }

    /// The device of `wwid` and its path, if present and verified.
    fn present(&self, wwid: &Wwid) -> Result<Option<(PathBuf, Lun)>, AgentError> {
        let Some(l) = self.lun(wwid)? else {
            return Ok(None);
        };
        let Some(link) = dev_links::find_by_wwid(&self.host, wwid)
            .map_err(|e| AgentError::io(self.host.dev("disk/by-id"), e))?
        else {
            return Ok(None);
        };
        let reported = sysfs::block_wwid(&self.host, &link.kernel_name)
            .map_err(|e| AgentError::io(&link.node, e))?;
        Ok((reported.as_ref() == Some(wwid)).then_some((link.link, l)))
    }

    /// Deletes paths at `lun` on these targets' sessions that report another
    /// WWID: a LUN number the array reused after a ghost detach.
    fn remove_stale_paths(
        &self,
        wwid: &Wwid,
        targets: &[TargetSpec],
        lun: u64,
    ) -> Result<(), AgentError> {
        let disks =
            sysfs::scsi_disks(&self.host).map_err(|e| AgentError::io(self.host.sys("block"), e))?;
        let table = mount_table(&self.host)?;
        // The full in-use check, as for a detach: never delete a path that
        // is mounted, published or open, whatever WWID it reports.
        let in_use = |name: &str| {
            self.use_of(&table, name)
                .unwrap_or_else(|e| Some(format!("cannot tell: {e}")))
        };
        for d in disks
            .iter()
            .filter(|d| d.hctl.lun == lun && targets.iter().any(|t| came_through(d, t)))
        {
            match sysfs::remove_stale_path_at(&self.host, d.hctl, wwid, in_use) {
                Ok(PathAtAddress::Removed { kernel_name, found }) => {
                    tracing::warn!(hctl = ?d.hctl, ?kernel_name, ?found, expected = %wwid, "removed a stale path at the LUN's address");
                }
                Ok(PathAtAddress::Held {
                    kernel_name,
                    holders,
                    ..
                }) => {
                    tracing::warn!(%kernel_name, ?holders, "stale path at the LUN's address is held; left alone");
                }
                Ok(PathAtAddress::Unreadable {
                    kernel_name,
                    reason,
                }) => {
                    tracing::warn!(hctl = ?d.hctl, ?kernel_name, %reason, "the path at the LUN's address reports no readable WWID; not stale, left alone");
                }
                Ok(PathAtAddress::Vacant | PathAtAddress::Current { .. }) => {}
                Err(e) => {
                    tracing::warn!(hctl = ?d.hctl, error = %e, "cannot check the path at the LUN's address")
                }
            }
        }
        Ok(())
    }
}
