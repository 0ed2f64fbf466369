//! A volume's device on this node: found by WWID through `/dev/disk/by-id`
//! (never by `/dev/sdX` name), then checked to really be that LUN; and
//! what the mount table says about it (where it is mounted or bound).

use std::path::{Path, PathBuf};

use super::{MAX_STACKED, mount_table};
use crate::error::AgentError;
use crate::host::block::{self, DeviceNumber};
use crate::host::mountinfo::{Mount, MountTable};
use crate::host::{Host, dev_links, mount, sysfs};
use csi_scsi_contract::{VolumeId, Wwid};

/// A LUN's device node, verified to report the LUN's WWID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Device {
    /// The device node inside the /dev root.
    pub node: PathBuf,
    /// The kernel name (`sdb`, `dm-3`).
    pub kernel_name: String,
    /// Its device number, which mounts of it show in mountinfo.
    pub number: DeviceNumber,
    /// The numbers of every other path of the LUN and of its map: without
    /// a map, the by-id link may move between paths from stage to unstage.
    pub others: Vec<DeviceNumber>,
}

impl Device {
    /// Whether `n` is this LUN (any of its paths, or its map).
    pub(crate) fn is(&self, n: DeviceNumber) -> bool {
        n == self.number || self.others.contains(&n)
    }

    /// Every number of this LUN, the linked one first.
    pub(crate) fn numbers(&self) -> impl Iterator<Item = DeviceNumber> + '_ {
        std::iter::once(self.number).chain(self.others.iter().copied())
    }
}

/// Filesystem types that are never a bind of a device node and whose mount
/// points may hang a `stat` (network filesystems).
const NETWORK_FS: &[&str] = &[
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "ceph",
    "glusterfs",
    "9p",
    "afs",
];

/// Finds the device of `wwid`: `Ok(None)` when no link names it (the LUN is
/// not on this node), an error when the device behind the link reports
/// another WWID (the link is stale; the device is never touched).
pub(crate) fn find(host: &Host, wwid: &Wwid) -> Result<Option<Device>, AgentError> {
    let Some(linked) = dev_links::find_by_wwid(host, wwid)
        .map_err(|e| AgentError::io(host.dev("disk/by-id"), e))?
    else {
        return Ok(None);
    };
    let reported = sysfs::block_wwid(host, &linked.kernel_name)
        .map_err(|e| AgentError::io(host.sys("block").join(&linked.kernel_name), e))?;
    if reported.as_ref() != Some(wwid) {
        return Err(AgentError::WwidMismatch {
            device: linked.node,
            expected: wwid.clone(),
            found: reported.map_or_else(|| "no WWID".to_owned(), |w| w.to_string()),
        });
    }
    let number = block::device_number(&linked.node).map_err(|e| AgentError::io(&linked.node, e))?;
    let mut others = path_numbers(host, wwid)?;
    others.retain(|n| *n != number);
    Ok(Some(Device {
        node: linked.node,
        kernel_name: linked.kernel_name,
        number,
        others,
    }))
}

/// Proves, just before a write that destroys what is there (mkfs, wipe), that
/// every path of `wwid` still is that LUN: asks the SCSI layer to re-read
/// each path's INQUIRY data (`device/rescan`; synchronous in a kernel),
/// then reads every path's WWID again. A path that now reports another
/// WWID (an array that reused the LUN number) or none refuses the write;
/// one that cannot be rescanned or read is not ready.
pub(crate) async fn reverify(
    host: &Host,
    wwid: &Wwid,
    node: &Path,
    kernel_name: &str,
) -> Result<(), AgentError> {
    let io = |e| AgentError::io(host.sys("block"), e);
    let maps = sysfs::multipath_maps(host).map_err(io)?;
    // Every path of the LUN, and every path under its map, whatever WWID
    // each reports now (a path that stopped reporting this one must fail
    // the check, not drop out of it).
    let mut paths: Vec<String> = sysfs::disks_with_wwid(host, wwid)
        .map_err(io)?
        .into_iter()
        .map(|d| d.kernel_name)
        .collect();
    paths.extend(
        maps.into_iter()
            .filter(|m| &m.wwid == wwid)
            .flat_map(|m| m.slaves),
    );
    if !kernel_name.starts_with("dm-") {
        paths.push(kernel_name.to_owned());
    }
    paths.sort();
    paths.dedup();
    let not_ready = |reason: String| AgentError::DeviceNotReady {
        device: node.to_owned(),
        reason,
    };
    if paths.is_empty() {
        return Err(not_ready(
            "it has no path to re-read its identity from".to_owned(),
        ));
    }
    for name in &paths {
        sysfs::rescan_device(host, name)
            .map_err(|e| not_ready(format!("its path {name} could not be rescanned: {e}")))?;
    }
    // A kernel has re-read by the time the write returns; a stand-in that
    // acts on the trigger takes a moment, and says so by clearing it. One
    // still pending is not taken for done: what it reads would be stale.
    let pending = || {
        paths
            .iter()
            .find(|n| sysfs::rescan_pending(host, n).is_some_and(|p| p))
            .cloned()
    };
    // Bounded: a stand-in under load takes seconds; a kernel never waits here.
    for _ in 0..400 {
        if pending().is_none() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    if let Some(name) = pending() {
        return Err(not_ready(format!(
            "its path {name} has not finished re-reading its identity within 10 s"
        )));
    }
    // Every path re-read the LUN's capacity too: they must agree on one
    // size, and not on none. A path still reporting the old size beside
    // one that reports none (a LUN that stopped reporting its size, whose
    // news reached one path only) leaves the size in doubt.
    let mut sizes = Vec::with_capacity(paths.len());
    for name in &paths {
        let size = sysfs::block_size(host, name).map_err(|e| {
            not_ready(format!(
                "the size of its path {name} could not be read: {e}"
            ))
        })?;
        sizes.push((name.as_str(), size));
    }
    if let Some(why) = super::decide::device::sizes_in_doubt(&sizes) {
        return Err(not_ready(why));
    }
    // The paths, and the device written itself (a map reports its WWID
    // through its uuid).
    let mut checked = paths;
    checked.push(kernel_name.to_owned());
    checked.dedup();
    for name in &checked {
        let now = sysfs::block_wwid(host, name)
            .map_err(|e| not_ready(format!("the WWID of {name} could not be read: {e}")))?;
        if now.as_ref() != Some(wwid) {
            return Err(AgentError::WwidMismatch {
                device: host.dev(name),
                expected: wwid.clone(),
                found: now.map_or_else(|| "no WWID".to_owned(), |w| w.to_string()),
            });
        }
    }
    Ok(())
}

/// The device numbers of every path of `wwid` and of its multipath map.
pub(crate) fn path_numbers(host: &Host, wwid: &Wwid) -> Result<Vec<DeviceNumber>, AgentError> {
    let io = |e| AgentError::io(host.sys("block"), e);
    let paths: Vec<String> = sysfs::disk_wwids(host)
        .map_err(io)?
        .into_iter()
        .filter(|(_, w)| w == wwid)
        .map(|(name, _)| name)
        .collect();
    let maps: Vec<_> = sysfs::multipath_maps(host)
        .map_err(io)?
        .into_iter()
        .filter(|m| &m.wwid == wwid)
        .collect();
    let map = maps.first();
    if let Some(first) = map {
        // A map holding another LUN's path is not this volume's device.
        let foreign: Vec<String> = maps
            .iter()
            .flat_map(|m| sysfs::foreign_slaves(m, |s| paths.iter().any(|p| p == s)))
            .collect();
        crate::device::refuse_foreign(host, first, &foreign)?;
    }
    Ok(paths
        .iter()
        .map(String::as_str)
        .chain(map.map(|m| m.kernel_name.as_str()))
        .filter_map(|name| block::device_number(&host.dev(name)).ok())
        .collect())
}

/// Like [`find`], but a missing device is [`AgentError::DeviceNotFound`].
pub(crate) fn require(host: &Host, wwid: &Wwid) -> Result<Device, AgentError> {
    find(host, wwid)?.ok_or_else(|| AgentError::DeviceNotFound(wwid.clone()))
}

/// What a path holds, for messages ("device 7:1 (ext4 from /dev/sdb)").
pub(crate) fn describe(mount: &Mount) -> String {
    format!(
        "device {} ({} from {})",
        mount.device, mount.fs_type, mount.source
    )
}

/// The device a mount point shows: the node's number when it is a bind of
/// a device node (raw block publication), else the filesystem's device.
pub(crate) fn mounted_device(mount: &Mount) -> Result<DeviceNumber, AgentError> {
    if is_node_bind_candidate(mount)
        && let Some(n) = block::node_number(&mount.mount_point)
            .map_err(|e| AgentError::io(&mount.mount_point, e))?
    {
        return Ok(n);
    }
    Ok(mount.device)
}

/// Mount points under the kubelet directory, other than `except`, where
/// device `number` is mounted (a filesystem bind) or bound (a device node).
pub(crate) fn publications(
    host: &Host,
    table: &MountTable,
    number: DeviceNumber,
    except: &[&Path],
) -> Vec<PathBuf> {
    let kubelet = mount::kubelet_root(host);
    let mut found: Vec<PathBuf> = table
        .mounts_under(&kubelet)
        .filter(|m| !except.contains(&m.mount_point.as_path()))
        .filter(|m| {
            m.device == number
                || (is_node_bind_candidate(m)
                    && block::node_number(&m.mount_point).ok().flatten() == Some(number))
        })
        .map(|m| m.mount_point.clone())
        .collect();
    found.sort();
    found.dedup();
    found
}

/// Whether `mount` could be a bind of a device node: a bind of a single
/// file has a root other than `/`, and network filesystems are skipped so
/// that a hung server cannot hang this scan.
fn is_node_bind_candidate(mount: &Mount) -> bool {
    mount.root != Path::new("/")
        && !NETWORK_FS.contains(&mount.fs_type.as_str())
        && !mount.fs_type.starts_with("fuse")
}

/// Unmounts every mount stacked on `path` that shows device `number`, top
/// first, stopping at anything else. Returns how many were removed.
pub(crate) async fn unmount_ours(
    host: &Host,
    path: &Path,
    number: DeviceNumber,
) -> Result<usize, AgentError> {
    let mut removed = 0;
    for _ in 0..MAX_STACKED {
        let table = mount_table(host)?;
        let Some(top) = table.mount_at(path) else {
            break;
        };
        if mounted_device(top)? != number {
            break;
        }
        mount::unmount(path).await?;
        removed += 1;
    }
    Ok(removed)
}

/// Refuses to touch `path` unless what is mounted there (device `number`,
/// described by `holder`) is `volume`'s device. When the LUN is gone from
/// the node the mount is all that is left of it, and kubelet must still be
/// able to clean up, so any disk is accepted then (major 0 is never a disk:
/// tmpfs, proc, overlay, ...).
pub(crate) fn ensure_ours(
    host: &Host,
    volume: &VolumeId,
    path: &Path,
    number: DeviceNumber,
    holder: &str,
) -> Result<(), AgentError> {
    let ours = match find(host, volume.wwid())? {
        Some(d) => d.is(number),
        None => {
            tracing::warn!(volume_id = %volume, path = %path.display(), "device is gone; unmounting what is left of it unverified");
            number.major != 0
        }
    };
    if ours {
        Ok(())
    } else {
        Err(AgentError::ForeignMount {
            volume: volume.to_string(),
            path: path.to_owned(),
            holder: holder.to_owned(),
        })
    }
}
