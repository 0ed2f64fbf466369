//! Detach: refuse while the device or any path is in use; otherwise flush,
//! remove the multipath map and every SCSI path, and log out of targets
//! that no attached LUN uses any more.

use std::time::{Duration, Instant};

use super::attachments::Logout;
use super::{Devices, TargetSpec, came_through};
use crate::error::AgentError;
use crate::host::block;
use crate::host::mountinfo::MountTable;
use crate::host::{blocking, multipath, sysfs};
use crate::volume::device::publications;
use crate::volume::mount_table;
use csi_scsi_contract::Wwid;

impl Devices {
    /// Removes `wwid` from this node. `Ok(false)` when it was already gone.
    pub async fn detach(&self, wwid: &Wwid, targets: &[TargetSpec]) -> Result<bool, AgentError> {
        let _op = self.begin(wwid)?;
        let _held = self.lock_targets(targets).await;
        let removed = match self.lun(wwid)? {
            None => false,
            Some(lun) => {
                self.remove(wwid, &lun).await?;
                true
            }
        };
        let names: Vec<String> = targets.iter().map(|t| t.name.clone()).collect();
        let unused = self.attachments.remove(wwid.as_str(), &names)?;
        for t in targets.iter().filter(|t| unused.contains(&t.name)) {
            self.logout_if_idle(t).await;
        }
        tracing::info!(%wwid, removed, "detached");
        Ok(removed)
    }

    /// Flushes, removes the map and deletes every path of `lun`. The
    /// in-use check claims what it found unused (O_EXCL) and holds the
    /// claims until the paths are deleted: nothing can mount or claim the
    /// device between the check and the deletion.
    async fn remove(&self, wwid: &Wwid, lun: &sysfs::Lun) -> Result<(), AgentError> {
        let paths: Vec<String> = lun.paths.iter().map(|p| p.kernel_name.clone()).collect();
        let table = mount_table(&self.host)?;
        let claims = self.lun_claims(wwid, &table, lun)?;
        // With no path left a flush would queue forever (and there is
        // nowhere to write to): skip it. Buffers live on the device that
        // was used: the map when there is one (its paths hold none).
        if !paths.is_empty() {
            for (name, claim) in &claims {
                flush(&self.host.dev(name), claim).await?;
            }
        }
        let claims = match &lun.map {
            Some(m) => {
                // The map cannot be removed while open, even by us; a map
                // opened meanwhile makes the removal fail, so nothing is
                // lost. Then its paths are free to claim.
                drop(claims);
                flush_map(&self.host, &m.name)
                    .await
                    .map_err(|e| AgentError::DeviceInUse {
                        wwid: wwid.clone(),
                        holder: format!("multipath map {}: {e}", m.name),
                    })?;
                self.claim_unused(wwid, &mount_table(&self.host)?, &paths)?
            }
            None => claims,
        };
        for p in &lun.paths {
            sysfs::delete_path(&self.host, &p.kernel_name)
                .map_err(|e| AgentError::io(self.host.sys("block").join(&p.kernel_name), e))?;
        }
        self.wait_gone(wwid, Duration::from_secs(10)).await?;
        drop(claims);
        Ok(())
    }

    /// Refuses when `lun` is in use, checking each device as
    /// [`Self::lun_claims`] does, and lets the claims go at once.
    pub(crate) fn check_unused(&self, wwid: &Wwid, lun: &sysfs::Lun) -> Result<(), AgentError> {
        let table = mount_table(&self.host)?;
        self.lun_claims(wwid, &table, lun).map(drop)
    }

    /// Refuses when `lun` is in use; otherwise claims it exclusively. The
    /// paths under its multipath map are held by the map, not by a user:
    /// their mounts and publications are checked, the map is claimed.
    /// Without a map, every path is claimed.
    fn lun_claims(
        &self,
        wwid: &Wwid,
        table: &MountTable,
        lun: &sysfs::Lun,
    ) -> Result<Vec<(String, Option<block::Claim>)>, AgentError> {
        let paths: Vec<String> = lun.paths.iter().map(|p| p.kernel_name.clone()).collect();
        match &lun.map {
            Some(m) => {
                for name in &paths {
                    self.refuse_if_used(wwid, table, name, Exclusive::No)?;
                }
                self.claim_unused(wwid, table, std::slice::from_ref(&m.kernel_name))
            }
            None => self.claim_unused(wwid, table, &paths),
        }
    }

    /// Refuses when any of `nodes` is in use; otherwise claims each one
    /// exclusively (`None` for a disk already gone), in the order given.
    fn claim_unused(
        &self,
        wwid: &Wwid,
        table: &MountTable,
        nodes: &[String],
    ) -> Result<Vec<(String, Option<block::Claim>)>, AgentError> {
        nodes
            .iter()
            .map(|name| {
                let claim = self.refuse_if_used(wwid, table, name, Exclusive::Claim)?;
                Ok((name.clone(), claim))
            })
            .collect()
    }

    fn refuse_if_used(
        &self,
        wwid: &Wwid,
        table: &MountTable,
        name: &str,
        exclusive: Exclusive,
    ) -> Result<Option<block::Claim>, AgentError> {
        match self.examine(table, name, exclusive)? {
            Use::Busy(holder) => Err(AgentError::DeviceInUse {
                wwid: wwid.clone(),
                holder,
            }),
            Use::Free(claim) => Ok(claim),
        }
    }

    /// How the disk `name` is in use, if it is: mounted (in our mount
    /// table), published under the kubelet directory, or held open
    /// exclusively (by anyone, in any namespace).
    pub(super) fn use_of(
        &self,
        table: &MountTable,
        name: &str,
    ) -> Result<Option<String>, AgentError> {
        Ok(match self.examine(table, name, Exclusive::Claim)? {
            Use::Busy(holder) => Some(holder),
            Use::Free(_) => None,
        })
    }

    /// [`Self::use_of`], keeping the exclusive claim that proved the disk
    /// unused when `exclusive` asks for one.
    fn examine(
        &self,
        table: &MountTable,
        name: &str,
        exclusive: Exclusive,
    ) -> Result<Use, AgentError> {
        let node = self.host.dev(name);
        let number = match block::device_number(&node) {
            Ok(n) => n,
            // No node to look at is no proof of "unused": ask sysfs. A disk
            // sysfs does not know is gone; one it knows but whose node is
            // missing cannot be checked for exclusive holders: in use.
            Err(stat) => {
                return Ok(match sysfs::block_device_number(&self.host, name) {
                    Ok(None) => Use::Free(None),
                    Ok(Some(number)) => Use::Busy(match table.mounts_of(number).next() {
                        Some(m) => format!("{name} is mounted at {}", m.mount_point.display()),
                        None => format!(
                            "{name} has no usable device node ({stat}), so whether it is open cannot be checked"
                        ),
                    }),
                    Err(e) => Use::Busy(format!(
                        "whether {name} is in use cannot be told: its device node: {stat}; sysfs: {e}"
                    )),
                });
            }
        };
        if let Some(m) = table.mounts_of(number).next() {
            return Ok(Use::Busy(format!(
                "{name} is mounted at {}",
                m.mount_point.display()
            )));
        }
        // A raw block publication is a bind of the device node, which
        // neither the device's mounts nor an exclusive open show, yet a
        // pod is using it.
        if let Some(at) = publications(&self.host, table, number, &[]).first() {
            return Ok(Use::Busy(format!(
                "{name} is published at {}",
                at.display()
            )));
        }
        if exclusive == Exclusive::No {
            return Ok(Use::Free(None));
        }
        match block::claim(&node).map_err(|e| AgentError::io(&node, e))? {
            Some(claim) => Ok(Use::Free(Some(claim))),
            None => Ok(Use::Busy(format!(
                "{name} is held open (mounted in another namespace, or claimed)"
            ))),
        }
    }

    async fn wait_gone(&self, wwid: &Wwid, within: Duration) -> Result<(), AgentError> {
        let start = Instant::now();
        while self.lun(wwid)?.is_some() {
            if start.elapsed() > within {
                return Err(AgentError::DeviceInUse {
                    wwid: wwid.clone(),
                    holder: "its paths did not go away after delete".into(),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Logs out of `target` unless a disk seen through it is in use.
    async fn logout_if_idle(&self, target: &TargetSpec) {
        // Whatever cannot be read keeps the session: a logout under a disk
        // in use is an I/O error in a pod.
        let (disks, table) = match (sysfs::scsi_disks(&self.host), MountTable::read(&self.host)) {
            (Ok(d), Ok(t)) => (d, t),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(target = %target.name, error = %e, "not logging out: the node's disks or mounts cannot be read");
                return;
            }
        };
        // A disk sysfs lists but whose attributes cannot be read, or whose
        // target cannot be told, may be this target's and in use.
        let listed: Vec<&str> = disks.iter().map(|d| d.kernel_name.as_str()).collect();
        match sysfs::sd_names(&self.host) {
            Ok(names) => {
                if let Some(unread) = names.iter().find(|n| !listed.contains(&n.as_str())) {
                    tracing::warn!(target = %target.name, disk = %unread, "not logging out: a disk's attributes cannot be read");
                    return;
                }
            }
            Err(e) => {
                tracing::warn!(target = %target.name, error = %e, "not logging out: the node's disks cannot be listed");
                return;
            }
        }
        let unattributed = |d: &&crate::host::sysfs::ScsiDisk| {
            matches!(
                &d.transport,
                crate::host::sysfs::Transport::Iscsi { target: None, .. }
            )
        };
        let showing: Vec<_> = disks
            .iter()
            .filter(|d| came_through(d, target) || unattributed(d))
            .collect();
        // A target whose session was live when the record was lost may
        // carry LUNs attached then: held back while any shows through it.
        let mut releasing = None;
        if let super::Transport::Iscsi { iqn, .. } = &target.transport {
            match self.attachments.may_log_out(iqn.as_str(), showing.len()) {
                Logout::Allowed => {}
                Logout::AllowedReleasing => releasing = Some(iqn),
                Logout::HeldBack(why) => {
                    tracing::warn!(target = %target.name, %why, "not logging out: the attachment record was lost");
                    return;
                }
            }
        }
        // multipathd builds a map for every LUN a login brings, attached
        // or not: a path held by its own LUN's map is in use only if the
        // map is. Idle maps go before the logout (they would stay behind
        // with no path, queueing whatever opens them).
        let maps = match sysfs::multipath_maps(&self.host) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(target = %target.name, error = %e, "not logging out: the node's multipath maps cannot be read");
                return;
            }
        };
        let mut idle_maps: Vec<&str> = Vec::new();
        for d in &showing {
            let map = maps
                .iter()
                .find(|m| m.wwid == d.wwid && m.slaves.contains(&d.kernel_name));
            let verdict = match map {
                Some(m) => self
                    .examine(&table, &d.kernel_name, Exclusive::No)
                    .and_then(|path| match path {
                        Use::Busy(why) => Ok(Some(why)),
                        Use::Free(_) => self.use_of(&table, &m.kernel_name),
                    }),
                None => self.use_of(&table, &d.kernel_name),
            };
            match verdict {
                Ok(None) => {}
                Ok(Some(why)) => {
                    tracing::warn!(target = %target.name, %why, "not logging out: a disk of this target is in use");
                    return;
                }
                Err(e) => {
                    tracing::warn!(target = %target.name, disk = %d.kernel_name, error = %e, "not logging out: whether a disk of this target is in use cannot be told");
                    return;
                }
            }
            if let Some(m) = map
                && !idle_maps.contains(&m.name.as_str())
            {
                idle_maps.push(&m.name);
            }
        }
        for map in idle_maps {
            // A map opened since the check refuses the flush: nothing is lost.
            if let Err(e) = flush_map(&self.host, map).await {
                tracing::warn!(target = %target.name, %map, error = %e, "not logging out: an idle multipath map of this target could not be removed");
                return;
            }
        }
        match self.logout(target).await {
            Ok(()) => {
                tracing::info!(target = %target.name, "logged out: no attached LUN uses this target");
                if let Some(iqn) = releasing {
                    self.attachments.release(iqn.as_str());
                }
            }
            Err(e) => tracing::warn!(target = %target.name, error = %e, "logout failed"),
        }
    }
}

/// Removes map `map`, which the detach has just proven unused. udev
/// probes a device when a writer closes it (the `watch` rule), so a map
/// written a moment ago can be open for a few hundred milliseconds more:
/// "in use" is retried for a bounded time; anything else is final.
async fn flush_map(host: &crate::host::Host, map: &str) -> Result<(), multipath::MultipathError> {
    let start = Instant::now();
    loop {
        match multipath::flush(host, map).await {
            Err(multipath::MultipathError::MapInUse { .. }) if start.elapsed() < MAP_BUSY_FOR => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ok(_) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}

/// How long a map proven unused may still be reported open (udev's probe)
/// before the detach gives up.
const MAP_BUSY_FOR: Duration = Duration::from_secs(5);

/// Flushes the device's buffers (fsync through the detach's own claim on
/// it), off the async workers and within [`blocking::FLUSH_TIMEOUT`]. A
/// disk already gone (no claim) has nothing to flush; a flush that fails
/// or hangs refuses the detach (its paths are not deleted under unwritten
/// data).
async fn flush(node: &std::path::Path, claim: &Option<block::Claim>) -> Result<(), AgentError> {
    let Some(claim) = claim else {
        return Ok(());
    };
    let not_flushed = |source: std::io::Error| AgentError::DeviceNotReady {
        device: node.to_owned(),
        reason: format!("its buffers could not be flushed: {source}"),
    };
    let file = claim.descriptor().map_err(not_flushed)?;
    blocking::within("flush", node, blocking::FLUSH_TIMEOUT, move || {
        match file.sync_all() {
            // A path with no device behind it any more (offline): nothing
            // of ours is buffered there.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENXIO | libc::ENODEV)) => Ok(()),
            other => other,
        }
    })
    .await?
    .map_err(not_flushed)
}

/// Whether an in-use check ends with an exclusive claim of the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exclusive {
    /// Claim it (O_EXCL), which is also what proves it is not held open.
    Claim,
    /// Do not: a path held by its multipath map (the map is claimed).
    No,
}

/// What the in-use check found for one disk.
enum Use {
    /// In use: how.
    Busy(String),
    /// Unused; claimed when asked to (`None` also for a disk already gone).
    Free(Option<block::Claim>),
}
