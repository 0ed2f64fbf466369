//! SCSI devices under the sysfs root: the disks (one per path) with their
//! identity, size, state and the transport they came through; the
//! dm-multipath maps over them; LUNs grouped by WWID; iSCSI sessions; and the
//! kernel's triggers (`delete`, `rescan`, a SCSI host's `scan`).
//!
//! Readers work on the kernel's layout (`block/sdX -> ../devices/.../H:C:T:L/
//! block/sdX`, iSCSI disks below `hostH/sessionS/`, FC disks below
//! `hostH/rport-H:C-N/`) as captured in `agent/tests/fixtures/sysfs` and as
//! the test harness's kernel stand-in writes it. Everything read is
//! untrusted: a malformed entry is skipped with a warning, never a panic.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::OpenOptions;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use super::block::DeviceNumber;
use super::excerpt;
use super::fc::{self, Wwpn};
use super::iscsiadm::Portal;
use super::{Host, dev_links};
use crate::vpd;
use csi_scsi_contract::Wwid;

/// A SCSI address: host (adapter or iSCSI session host), channel, target, LUN.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hctl {
    /// SCSI host number.
    pub host: u32,
    /// Channel (bus).
    pub channel: u32,
    /// Target id.
    pub target: u32,
    /// LUN (64-bit in the kernel).
    pub lun: u64,
}

/// A SCSI device's `state` attribute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceState {
    /// `running`: usable.
    Running,
    /// `offline`: the error handler gave up on it.
    Offline,
    /// `transport-offline`: the transport (session, rport) is gone.
    TransportOffline,
    /// `blocked`: I/O held while the transport recovers.
    Blocked,
    /// `created`, `created-block`: being set up.
    Created,
    /// `quiesce`: I/O held for a power or config change.
    Quiesce,
    /// `cancel`, `deleted`: being removed.
    Deleted,
    /// Anything else the kernel may add, as written.
    Unknown(String),
}

/// The transport a disk path came through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transport {
    /// An iSCSI session.
    Iscsi {
        /// Session id (`N` of `sessionN`), when the disk sits below one.
        session: Option<u32>,
        /// The target name (`targetname`, else from the by-path link).
        target: Option<String>,
        /// The connection's `persistent_address:persistent_port` (else from by-path).
        portal: Option<Portal>,
    },
    /// Fibre Channel.
    Fc {
        /// The target port's WWPN (from the rport, `fc_transport`, or the by-path link).
        target_wwpn: Option<Wwpn>,
    },
    /// Neither (SAS, SATA, a virtual HBA).
    Other,
}

/// One SCSI disk path (`sdX`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScsiDisk {
    /// Kernel name (`sdb`): informational only, names move.
    pub kernel_name: String,
    /// Its SCSI address.
    pub hctl: Hctl,
    /// INQUIRY vendor, blanks trimmed.
    pub vendor: String,
    /// INQUIRY product, blanks trimmed.
    pub model: String,
    /// INQUIRY revision, blanks trimmed.
    pub rev: String,
    /// Unit serial number (VPD 0x80), when the device has one.
    pub serial: Option<String>,
    /// The LUN's identity.
    pub wwid: Wwid,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Whether the block device is read-only.
    pub read_only: bool,
    /// The SCSI device state.
    pub state: DeviceState,
    /// How the path reached the node.
    pub transport: Transport,
    /// Names under `/dev/disk/by-id` pointing at this path, sorted.
    pub by_id: Vec<String>,
    /// Names under `/dev/disk/by-path` pointing at this path, sorted.
    pub by_path: Vec<String>,
    /// Kernel names holding this path open (`holders/`: a dm map, md, ...).
    pub holders: Vec<String>,
}

/// A dm-multipath map (`block/dm-N` whose `dm/uuid` is `mpath-<udev serial>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MultipathMap {
    /// Kernel name (`dm-3`).
    pub kernel_name: String,
    /// The LUN's identity, from the uuid.
    pub wwid: Wwid,
    /// `dm/name`: the alias (`mpathb`) or the udev serial itself.
    pub name: String,
    /// The paths below it (`slaves/`), sorted.
    pub slaves: Vec<String>,
    /// Size in bytes.
    pub size_bytes: u64,
    /// `dm/suspended`.
    pub suspended: bool,
}

/// A LUN as this node sees it: every path with its WWID, and the multipath
/// map over them if there is one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lun {
    /// The identity shared by all paths.
    pub wwid: Wwid,
    /// The paths, sorted by HCTL. Empty for a map whose paths are all gone.
    pub paths: Vec<ScsiDisk>,
    /// The multipath map whose uuid names this WWID.
    pub map: Option<MultipathMap>,
    /// Paths under that map that do not report this WWID (another, or
    /// none): an array that reused a LUN number. Such a LUN is not provably
    /// the one asked for: nothing is staged, wiped or detached on it.
    pub foreign_paths: Vec<String>,
}

/// An iSCSI session (`class/iscsi_session/sessionN`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IscsiSession {
    /// Session id.
    pub sid: u32,
    /// The target name.
    pub target: String,
    /// `state` (`LOGGED_IN`, `FAILED`, `FREE`).
    pub state: String,
    /// The portal of its first connection (`persistent_address:persistent_port`).
    pub portal: Option<Portal>,
    /// Target portal group tag.
    pub tpgt: Option<u32>,
    /// The SCSI host the session's disks appear on (`hostH`).
    pub scsi_host: Option<u32>,
    /// The initiator name used.
    pub initiator: Option<String>,
}

/// Which `channel target lun` a SCSI host scan covers; `None` is the
/// kernel's wildcard `-`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanAddress {
    /// Channel, or every channel.
    pub channel: Option<u32>,
    /// Target id, or every target.
    pub target: Option<u32>,
    /// LUN, or every LUN.
    pub lun: Option<u64>,
}

/// What [`remove_stale_path_at`] found at an address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathAtAddress {
    /// No SCSI device there.
    Vacant,
    /// A path with the expected WWID: not stale, left alone.
    Current {
        /// Its kernel name, if it has a block device.
        kernel_name: Option<String>,
    },
    /// A path whose WWID cannot be read: it may be the LUN's own path in
    /// transition, so it is not stale and is left alone.
    Unreadable {
        /// Its kernel name, if it has a block device.
        kernel_name: Option<String>,
        /// Why the WWID could not be read.
        reason: String,
    },
    /// A path with another WWID: deleted.
    Removed {
        /// Its kernel name, if it had a block device.
        kernel_name: Option<String>,
        /// The identity it reported, if any.
        found: Option<Wwid>,
    },
    /// A path with another WWID that is in use (a multipath map holds it,
    /// it is mounted, published or open): not deleted; free it first.
    Held {
        /// Its kernel name.
        kernel_name: String,
        /// The identity it reported, if any.
        found: Option<Wwid>,
        /// Who holds it.
        holders: Vec<String>,
    },
}

/// A by-path link name, decoded (`ip-<portal>-iscsi-<iqn>-lun-<n>` or
/// `[pci-<bdf>-]fc-0x<wwpn>-lun-<n>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ByPath {
    /// An iSCSI path.
    Iscsi {
        /// The portal.
        portal: Portal,
        /// The target name.
        target: String,
        /// LUN number.
        lun: u64,
    },
    /// An FC path.
    Fc {
        /// The target port.
        wwpn: Wwpn,
        /// LUN number.
        lun: u64,
    },
}

/// What the device `kernel_name` (`sdb`, `dm-3`) says its WWID is:
/// `block/<name>/dm/uuid` (`mpath-<serial>`) for a device-mapper device,
/// else `block/<name>/device/wwid`, else the LUN designator of
/// `device/vpd_pg83`. `Ok(None)` when the device has no readable identity
/// (not a SCSI disk, a non-multipath dm device, or gone). A name that is
/// not one path component is `InvalidInput`, as for every function here
/// that takes a kernel name.
pub fn block_wwid(host: &Host, kernel_name: &str) -> std::io::Result<Option<Wwid>> {
    check_plain_name(kernel_name)?;
    let block = host.sys("block").join(kernel_name);
    match read_small(&block.join("dm/uuid")) {
        Ok(bytes) => return Ok(Wwid::parse(String::from_utf8_lossy(&bytes).trim()).ok()),
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    device_wwid(&block.join("device"))
}

/// Size of `kernel_name` in bytes from `block/<name>/size` (512-byte
/// sectors, whatever the logical block size).
pub fn block_size(host: &Host, kernel_name: &str) -> std::io::Result<u64> {
    check_plain_name(kernel_name)?;
    let bytes = read_small(&host.sys("block").join(kernel_name).join("size"))?;
    let text = String::from_utf8_lossy(&bytes);
    text.trim()
        .parse::<u64>()
        .map(|sectors| sectors.saturating_mul(512))
        .map_err(|_| {
            std::io::Error::new(
                ErrorKind::InvalidData,
                format!(
                    "block/{kernel_name}/size: {:?} is not a number of sectors",
                    excerpt(text.trim())
                ),
            )
        })
}

/// Whether `block/<name>/ro` says the device is read-only.
pub fn block_read_only(host: &Host, kernel_name: &str) -> std::io::Result<bool> {
    check_plain_name(kernel_name)?;
    let bytes = read_small(&host.sys("block").join(kernel_name).join("ro"))?;
    Ok(String::from_utf8_lossy(&bytes).trim() == "1")
}

/// Every SCSI disk path on the node (`block/*` whose `device` is a SCSI
/// device of type disk), sorted by kernel name. A disk without a valid WWID,
/// or whose attributes cannot be read, is skipped with a warning. Errors
/// only when `block/` itself cannot be listed.
pub fn scsi_disks(host: &Host) -> std::io::Result<Vec<ScsiDisk>> {
    let links = DiskLinks::read(host);
    let mut out = each_block(host, |host, name| scsi_disk_linked(host, name, &links))?;
    out.sort_by(|a, b| a.kernel_name.cmp(&b.kernel_name));
    Ok(out)
}

/// `read` of every entry of `block/`; an entry it cannot read is skipped
/// with a warning. Errors only when `block/` itself cannot be listed.
fn each_block<T>(
    host: &Host,
    read: impl Fn(&Host, &str) -> std::io::Result<Option<T>>,
) -> std::io::Result<Vec<T>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(host.sys("block"))?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        match read(host, &name) {
            Ok(Some(d)) => out.push(d),
            Ok(None) => {}
            Err(e) => tracing::warn!(disk = %name, error = %e, "skipping unreadable block device"),
        }
    }
    Ok(out)
}

/// Every SCSI disk path on the node with the WWID it reports, and nothing
/// else read: the cheap walk for finding a LUN's other paths (one device
/// lookup on a node of hundreds of disks reads three attributes of each,
/// not a dozen). Skips what [`scsi_disks`] skips.
pub fn disk_wwids(host: &Host) -> std::io::Result<Vec<(String, Wwid)>> {
    let mut out = each_block(host, |host, name| {
        Ok(disk_identity(host, name)?.map(|id| (name.to_owned(), id.wwid)))
    })?;
    out.sort();
    Ok(out)
}

/// Where a SCSI disk path lives in sysfs and who it says it is.
struct DiskIdentity {
    /// `block/<name>/device`: the SCSI device's directory through its link.
    device: PathBuf,
    hctl: Hctl,
    wwid: Wwid,
}

/// A SCSI disk path's identity by kernel name. `Ok(None)` when it is gone,
/// not a SCSI disk, or has no valid WWID (warned).
fn disk_identity(host: &Host, kernel_name: &str) -> std::io::Result<Option<DiskIdentity>> {
    if !is_plain_name(kernel_name) {
        return Ok(None);
    }
    let device = host.sys("block").join(kernel_name).join("device");
    // The link's last step names the SCSI device (`../../../1:0:0:2`): one
    // readlink, where resolving the whole path takes one per component.
    let target = match std::fs::read_link(&device) {
        Ok(t) => t,
        // No `device`: loop, dm, md, ram, or the disk just went away.
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let dev_dir = device.clone();
    let Some(hctl) = target
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(Hctl::parse)
    else {
        // virtio-blk, nvme, mmc: not SCSI.
        return Ok(None);
    };
    // SCSI peripheral type 0 (disk) or 0xe (RBC); `sr`, tapes, enclosures are not ours.
    if let Some(t) = read_attr(&dev_dir.join("type"))
        && !matches!(t.as_str(), "0" | "14")
    {
        return Ok(None);
    }
    let wwid = match device_wwid(&dev_dir) {
        Ok(Some(w)) => w,
        Ok(None) => {
            tracing::warn!(disk = %kernel_name, %hctl, "skipping SCSI disk without a valid WWID (device/wwid, vpd_pg83)");
            return Ok(None);
        }
        Err(e) => {
            tracing::warn!(disk = %kernel_name, %hctl, error = %e, "skipping SCSI disk whose WWID cannot be read");
            return Ok(None);
        }
    };
    Ok(Some(DiskIdentity {
        device: dev_dir,
        hctl,
        wwid,
    }))
}

/// One SCSI disk path by kernel name. `Ok(None)` when it is gone, not a
/// SCSI disk, or has no valid WWID (warned).
pub fn scsi_disk(host: &Host, kernel_name: &str) -> std::io::Result<Option<ScsiDisk>> {
    scsi_disk_linked(host, kernel_name, &DiskLinks::read(host))
}

/// The `/dev/disk/by-id` and `by-path` links of every device, read once.
struct DiskLinks {
    by_id: HashMap<String, Vec<String>>,
    by_path: HashMap<String, Vec<String>>,
}

// === impl DiskLinks ===

impl DiskLinks {
    fn read(host: &Host) -> Self {
        let read = |dir: &str| {
            dev_links::links_by_device(host, dir).unwrap_or_else(|e| {
                tracing::warn!(dir, error = %e, "cannot list /dev/disk links");
                HashMap::new()
            })
        };
        Self {
            by_id: read("by-id"),
            by_path: read("by-path"),
        }
    }
}

/// [`scsi_disk`] with the links already read.
fn scsi_disk_linked(
    host: &Host,
    kernel_name: &str,
    links: &DiskLinks,
) -> std::io::Result<Option<ScsiDisk>> {
    let Some(DiskIdentity { device, hctl, wwid }) = disk_identity(host, kernel_name)? else {
        return Ok(None);
    };
    // Canonical: the transport is found among its ancestors.
    let dev_dir = match std::fs::canonicalize(&device) {
        Ok(d) => d,
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let size_bytes = match block_size(host, kernel_name) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(disk = %kernel_name, error = %e, "skipping SCSI disk without a readable size");
            return Ok(None);
        }
    };
    let read_only = block_read_only(host, kernel_name).unwrap_or_else(|e| {
        tracing::warn!(disk = %kernel_name, error = %e, "unreadable ro attribute; assuming writable");
        false
    });
    let serial = match std::fs::read(dev_dir.join("vpd_pg80")) {
        Ok(page) => vpd::parse_unit_serial(&page).unwrap_or_else(|e| {
            tracing::warn!(disk = %kernel_name, error = %e, "ignoring malformed vpd_pg80");
            None
        }),
        Err(_) => None,
    };
    let by_id = links.by_id.get(kernel_name).cloned().unwrap_or_default();
    let by_path = links.by_path.get(kernel_name).cloned().unwrap_or_default();
    let transport = transport_of(host, &dev_dir, &by_path);
    Ok(Some(ScsiDisk {
        kernel_name: kernel_name.to_owned(),
        hctl,
        vendor: read_attr(&dev_dir.join("vendor")).unwrap_or_default(),
        model: read_attr(&dev_dir.join("model")).unwrap_or_default(),
        rev: read_attr(&dev_dir.join("rev")).unwrap_or_default(),
        serial,
        wwid,
        size_bytes,
        read_only,
        state: read_attr(&dev_dir.join("state")).map_or(DeviceState::Unknown(String::new()), |s| {
            DeviceState::parse(&s)
        }),
        transport,
        by_id,
        by_path,
        holders: holders(host, kernel_name).unwrap_or_default(),
    }))
}

/// The disk paths that report `wwid`, sorted by kernel name.
pub fn disks_with_wwid(host: &Host, wwid: &Wwid) -> std::io::Result<Vec<ScsiDisk>> {
    // The lean walk finds them; only they are described in full.
    let names: Vec<String> = disk_wwids(host)?
        .into_iter()
        .filter(|(_, w)| w == wwid)
        .map(|(name, _)| name)
        .collect();
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let links = DiskLinks::read(host);
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        match scsi_disk_linked(host, &name, &links) {
            // Read again: it may have changed between the two looks.
            Ok(Some(d)) if &d.wwid == wwid => out.push(d),
            Ok(_) => {}
            Err(e) => tracing::warn!(disk = %name, error = %e, "skipping unreadable block device"),
        }
    }
    Ok(out)
}

/// Every dm-multipath map (`block/dm-*` with a `dm/uuid` of `mpath-<serial>`),
/// sorted by kernel name. Other dm devices (LVM, crypt, partitions of maps)
/// are ignored; a map whose uuid is not a valid WWID is skipped with a
/// warning.
pub fn multipath_maps(host: &Host) -> std::io::Result<Vec<MultipathMap>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(host.sys("block"))?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("dm-") {
            continue;
        }
        let dir = host.sys("block").join(&name);
        let Some(uuid) = read_attr(&dir.join("dm/uuid")) else {
            continue;
        };
        if !uuid.starts_with("mpath-") {
            tracing::debug!(dm = %name, %uuid, "not a multipath map");
            continue;
        }
        let wwid = match Wwid::parse(&uuid) {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(dm = %name, error = %e, "skipping multipath map whose uuid is not a valid WWID");
                continue;
            }
        };
        let size_bytes = block_size(host, &name).unwrap_or_else(|e| {
            tracing::warn!(dm = %name, error = %e, "unreadable size of multipath map");
            0
        });
        out.push(MultipathMap {
            name: read_attr(&dir.join("dm/name")).unwrap_or_default(),
            wwid,
            slaves: dir_names(&dir.join("slaves"))?,
            size_bytes,
            suspended: read_attr(&dir.join("dm/suspended")).as_deref() == Some("1"),
            kernel_name: name,
        });
    }
    out.sort_by(|a, b| a.kernel_name.cmp(&b.kernel_name));
    Ok(out)
}

/// Groups disk paths into LUNs by WWID (several paths, from one target or
/// several, with one WWID are one multipathed LUN) and attaches the map of
/// that WWID. A map whose paths are all gone is a LUN with no paths (a ghost
/// map for Detach to remove). Sorted by WWID.
pub fn group_luns(disks: Vec<ScsiDisk>, maps: Vec<MultipathMap>) -> Vec<Lun> {
    let mut luns: BTreeMap<Wwid, Lun> = BTreeMap::new();
    for d in disks {
        luns.entry(d.wwid.clone())
            .or_insert_with(|| Lun {
                wwid: d.wwid.clone(),
                paths: Vec::new(),
                map: None,
                foreign_paths: Vec::new(),
            })
            .paths
            .push(d);
    }
    for m in maps {
        let lun = luns.entry(m.wwid.clone()).or_insert_with(|| Lun {
            wwid: m.wwid.clone(),
            paths: Vec::new(),
            map: None,
            foreign_paths: Vec::new(),
        });
        let paths = &lun.paths;
        lun.foreign_paths.extend(foreign_slaves(&m, |s| {
            paths.iter().any(|p| p.kernel_name == s)
        }));
        if let Some(first) = &lun.map {
            tracing::warn!(wwid = %m.wwid, kept = %first.kernel_name, ignored = %m.kernel_name, "two multipath maps for one WWID");
        } else {
            lun.map = Some(m);
        }
    }
    luns.into_values()
        .map(|mut l| {
            l.paths.sort_by_key(|p| p.hctl);
            l
        })
        .collect()
}

/// The paths `map` holds that do not report its WWID (`reports` says which
/// do): a map holding another LUN's path is not that LUN's device.
pub fn foreign_slaves(map: &MultipathMap, reports: impl Fn(&str) -> bool) -> Vec<String> {
    map.slaves
        .iter()
        .filter(|slave| !reports(slave))
        .inspect(|slave| tracing::warn!(map = %map.kernel_name, %slave, wwid = %map.wwid, "multipath map holds a path that does not report its WWID; the LUN is refused"))
        .cloned()
        .collect()
}

/// Every iSCSI session (`class/iscsi_session/session*`), sorted by id. No
/// class directory (iscsi_tcp not loaded) is an empty list; an entry without
/// a target name is skipped with a warning.
pub fn iscsi_sessions(host: &Host) -> std::io::Result<Vec<IscsiSession>> {
    let class = host.sys("class/iscsi_session");
    let entries = match std::fs::read_dir(&class) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(sid) = name
            .strip_prefix("session")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            tracing::warn!(entry = %name, "skipping iscsi_session entry that is not session<N>");
            continue;
        };
        let attrs = entry.path();
        let Some(target) = read_attr(&attrs.join("targetname")) else {
            tracing::warn!(session = sid, "skipping iSCSI session without a targetname");
            continue;
        };
        // class/iscsi_session/sessionN -> .../hostH/sessionN/iscsi_session/sessionN
        let session_dir = std::fs::canonicalize(&attrs)
            .ok()
            .and_then(|p| p.parent().and_then(Path::parent).map(Path::to_path_buf));
        out.push(IscsiSession {
            sid,
            target,
            state: read_attr(&attrs.join("state")).unwrap_or_default(),
            portal: session_dir.as_deref().and_then(|d| session_portal(d, sid)),
            tpgt: read_attr(&attrs.join("tpgt")).and_then(|t| t.parse().ok()),
            scsi_host: session_dir.as_deref().and_then(scsi_host_of_session),
            initiator: read_attr(&attrs.join("initiatorname")),
        });
    }
    out.sort_by_key(|s| s.sid);
    Ok(out)
}

/// The SCSI hosts on the node (`class/scsi_host/host*`), sorted.
pub fn scsi_hosts(host: &Host) -> std::io::Result<Vec<u32>> {
    let mut out: Vec<u32> = dir_names(&host.sys("class/scsi_host"))?
        .iter()
        .filter_map(|n| n.strip_prefix("host").and_then(|h| h.parse().ok()))
        .collect();
    out.sort_unstable();
    Ok(out)
}

/// Removes the path `kernel_name` from the kernel (`echo 1 >
/// block/<name>/device/delete`). `Ok(false)` when it was already gone.
/// Flush it and remove any map over it first.
pub fn delete_path(host: &Host, kernel_name: &str) -> std::io::Result<bool> {
    check_plain_name(kernel_name)?;
    match write_trigger(
        &host.sys("block").join(kernel_name).join("device/delete"),
        "1",
    ) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Asks the kernel to re-read `kernel_name`'s capacity and INQUIRY data
/// (`echo 1 > block/<name>/device/rescan`).
pub fn rescan_device(host: &Host, kernel_name: &str) -> std::io::Result<()> {
    check_plain_name(kernel_name)?;
    write_trigger(
        &host.sys("block").join(kernel_name).join("device/rescan"),
        "1",
    )
}

/// The SCSI disk names (`sd*`) sysfs lists under `block/`, readable or
/// not: [`scsi_disks`] leaves out the ones whose attributes cannot be read.
pub fn sd_names(host: &Host) -> std::io::Result<Vec<String>> {
    Ok(dir_names(&host.sys("block"))?
        .into_iter()
        .filter(|n| n.starts_with("sd"))
        .collect())
}

/// Whether a rescan written to `kernel_name` is still pending: `None` when
/// the trigger cannot be read back (a kernel's is write-only, and acts
/// within the write), `Some(true)` while a stand-in has not consumed it.
pub fn rescan_pending(host: &Host, kernel_name: &str) -> Option<bool> {
    check_plain_name(kernel_name).ok()?;
    std::fs::read_to_string(host.sys("block").join(kernel_name).join("device/rescan"))
        .ok()
        .map(|t| !t.trim().is_empty())
}

/// Scans SCSI host `host_no` for devices at `address` (`echo "C T L" >
/// class/scsi_host/host<N>/scan`, `-` for a wildcard).
pub fn scan_host(host: &Host, host_no: u32, address: ScanAddress) -> std::io::Result<()> {
    write_trigger(
        &host.sys(format!("class/scsi_host/host{host_no}/scan")),
        &address.to_string(),
    )
}

/// Before a targeted rescan of `hctl` for the LUN `expected`: if a SCSI
/// device already sits at that address with another identity (a stale path
/// left behind when the array reused the LUN number), delete it, so the scan
/// creates a fresh path instead of the kernel keeping the old one. A path
/// that reports `expected` is left alone; a stale one that is held (by a
/// multipath map) is reported, not deleted. Check mounts before calling.
pub fn remove_stale_path_at(
    host: &Host,
    hctl: Hctl,
    expected: &Wwid,
    in_use: impl Fn(&str) -> Option<String>,
) -> std::io::Result<PathAtAddress> {
    let Some(dev_dir) = scsi_device_dir(host, hctl)? else {
        return Ok(PathAtAddress::Vacant);
    };
    let kernel_name = dir_names(&dev_dir.join("block"))?.into_iter().next();
    let found = match device_wwid(&dev_dir) {
        Ok(Some(w)) => w,
        Ok(None) => {
            return Ok(PathAtAddress::Unreadable {
                kernel_name,
                reason: "it reports no WWID".to_owned(),
            });
        }
        Err(e) => {
            return Ok(PathAtAddress::Unreadable {
                kernel_name,
                reason: e.to_string(),
            });
        }
    };
    if &found == expected {
        return Ok(PathAtAddress::Current { kernel_name });
    }
    if let Some(name) = &kernel_name {
        let mut holders = holders(host, name)?;
        holders.extend(in_use(name));
        if !holders.is_empty() {
            return Ok(PathAtAddress::Held {
                kernel_name: name.clone(),
                found: Some(found),
                holders,
            });
        }
    }
    tracing::info!(%hctl, disk = ?kernel_name, found = %found, %expected, "deleting stale SCSI path before rescan");
    match write_trigger(&dev_dir.join("delete"), "1") {
        Ok(()) => Ok(PathAtAddress::Removed {
            kernel_name,
            found: Some(found),
        }),
        // Removed under us: the address is vacant, which is what we wanted.
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(PathAtAddress::Vacant),
        Err(e) => Err(e),
    }
}

/// The device number of disk `kernel_name` as sysfs reports it
/// (`block/<name>/dev`), `None` when sysfs has no such disk.
pub fn block_device_number(
    host: &Host,
    kernel_name: &str,
) -> std::io::Result<Option<DeviceNumber>> {
    check_plain_name(kernel_name)?;
    let text = match std::fs::read_to_string(host.sys("block").join(kernel_name).join("dev")) {
        Ok(t) => t,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let bad = || {
        std::io::Error::new(
            ErrorKind::InvalidData,
            format!("dev is {:?}, not MAJOR:MINOR", text.trim()),
        )
    };
    let (major, minor) = text.trim().split_once(':').ok_or_else(bad)?;
    Ok(Some(DeviceNumber {
        major: major.parse().map_err(|_| bad())?,
        minor: minor.parse().map_err(|_| bad())?,
    }))
}

/// The kernel names holding `kernel_name` open (`block/<name>/holders/*`),
/// sorted; empty when none or when the device is gone.
pub fn holders(host: &Host, kernel_name: &str) -> std::io::Result<Vec<String>> {
    check_plain_name(kernel_name)?;
    dir_names(&host.sys("block").join(kernel_name).join("holders"))
}

// === impl Hctl ===

impl Hctl {
    /// Parses `H:C:T:L` (decimal).
    pub fn parse(s: &str) -> Option<Self> {
        let mut it = s.trim().split(':');
        let host = it.next()?.parse().ok()?;
        let channel = it.next()?.parse().ok()?;
        let target = it.next()?.parse().ok()?;
        let lun = it.next()?.parse().ok()?;
        if it.next().is_some() {
            return None;
        }
        Some(Self {
            host,
            channel,
            target,
            lun,
        })
    }
}

impl fmt::Display for Hctl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}:{}",
            self.host, self.channel, self.target, self.lun
        )
    }
}

// === impl DeviceState ===

impl DeviceState {
    /// Parses the kernel's spelling.
    pub fn parse(s: &str) -> Self {
        match s.trim() {
            "running" => Self::Running,
            "offline" => Self::Offline,
            "transport-offline" => Self::TransportOffline,
            "blocked" => Self::Blocked,
            "created" | "created-block" => Self::Created,
            "quiesce" => Self::Quiesce,
            "cancel" | "deleted" | "cancel-offline" => Self::Deleted,
            other => Self::Unknown(other.to_owned()),
        }
    }

    /// Whether I/O can flow.
    pub fn is_running(&self) -> bool {
        *self == Self::Running
    }
}

impl fmt::Display for DeviceState {
    /// The kernel's spelling.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Running => "running",
            Self::Offline => "offline",
            Self::TransportOffline => "transport-offline",
            Self::Blocked => "blocked",
            Self::Created => "created",
            Self::Quiesce => "quiesce",
            Self::Deleted => "deleted",
            Self::Unknown(s) => s,
        })
    }
}

// === impl Lun ===

impl Lun {
    /// The LUN's size: the map's when there is one, else the largest path's
    /// (paths disagree briefly while a resize propagates).
    pub fn size_bytes(&self) -> u64 {
        self.map
            .as_ref()
            .map(|m| m.size_bytes)
            .filter(|&s| s > 0)
            .unwrap_or_else(|| self.paths.iter().map(|p| p.size_bytes).max().unwrap_or(0))
    }

    /// The kernel name to use for I/O: the map when there is one, else the
    /// first running path.
    pub fn device_kernel_name(&self) -> Option<&str> {
        if let Some(m) = &self.map {
            return Some(&m.kernel_name);
        }
        self.paths
            .iter()
            .find(|p| p.state.is_running())
            .or(self.paths.first())
            .map(|p| p.kernel_name.as_str())
    }
}

// === impl ScanAddress ===

impl ScanAddress {
    /// Every channel, target and LUN (`- - -`).
    pub const ALL: Self = Self {
        channel: None,
        target: None,
        lun: None,
    };

    /// Exactly one `channel target lun`.
    pub fn exact(channel: u32, target: u32, lun: u64) -> Self {
        Self {
            channel: Some(channel),
            target: Some(target),
            lun: Some(lun),
        }
    }
}

impl fmt::Display for ScanAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn part<T: fmt::Display>(v: Option<T>) -> String {
            v.map_or_else(|| "-".to_owned(), |v| v.to_string())
        }
        write!(
            f,
            "{} {} {}",
            part(self.channel),
            part(self.target),
            part(self.lun)
        )
    }
}

// === impl ByPath ===

impl ByPath {
    /// Decodes a `/dev/disk/by-path` name; `None` for partitions (`-partN`),
    /// other transports and malformed names.
    pub fn parse(name: &str) -> Option<Self> {
        if let Some((_, n)) = name.rsplit_once("-part")
            && !n.is_empty()
            && n.bytes().all(|b| b.is_ascii_digit())
        {
            return None;
        }
        let (head, lun) = name.rsplit_once("-lun-")?;
        let lun = parse_lun(lun)?;
        if let Some(i) = head.find("fc-0x")
            && fc_prefix_ok(&head[..i])
        {
            let wwpn = Wwpn::parse(&head[i + "fc-".len()..]).ok()?;
            return Some(Self::Fc { wwpn, lun });
        }
        let rest = if let Some(r) = head.strip_prefix("ip-") {
            r
        } else {
            // Offload / HBA-bound sessions: `pci-<bdf>-ip-...`.
            let i = head.find("-ip-")?;
            if !head.starts_with("pci-") {
                return None;
            }
            &head[i + "-ip-".len()..]
        };
        let (portal, target) = rest.split_once("-iscsi-")?;
        if target.is_empty() || !target.chars().all(|c| c.is_ascii_graphic()) {
            return None;
        }
        Some(Self::Iscsi {
            portal: Portal::parse(portal).ok()?,
            target: target.to_owned(),
            lun,
        })
    }
}

/// Reads a text attribute: trimmed of blanks and NULs, lossily decoded;
/// `None` when missing or empty (other read errors are warned about).
pub(crate) fn read_attr(path: &Path) -> Option<String> {
    match read_small(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let t = text.trim_matches(|c: char| c == '\0' || c.is_whitespace());
            (!t.is_empty()).then(|| t.to_owned())
        }
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => None,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "unreadable sysfs attribute");
            None
        }
    }
}

/// Reads a text attribute (at most a page, as sysfs serves them) with one
/// read into a page-sized buffer: open, read, close, where a general file
/// read also asks for the size and reads again to see the end.
fn read_small(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    loop {
        let n = file.read(&mut buf[len..])?;
        len += n;
        // A short read of a sysfs attribute (or a small file) is all of it;
        // a full buffer is read on until the end.
        if n == 0 || len < buf.len() {
            break;
        }
        buf.resize(buf.len() * 2, 0);
    }
    buf.truncate(len);
    Ok(buf)
}

/// Writes `value` to a kernel trigger file, as `echo value > path` does but
/// without creating it: a missing trigger is `NotFound`, not a new file.
pub(crate) fn write_trigger(path: &Path, value: &str) -> std::io::Result<()> {
    tracing::debug!(path = %path.display(), value, "writing sysfs trigger");
    off_the_runtime(|| {
        let mut f = OpenOptions::new().write(true).truncate(true).open(path)?;
        f.write_all(value.as_bytes())
    })
}

/// Runs `work`, which may block in the kernel for long, so that the async
/// runtime's worker hands its other tasks on first. A kernel acts within
/// a trigger's write: a rescan re-reads the capacity from the target, a
/// delete flushes the device, a scan probes every LUN, each for as long
/// as the SCSI command timeout and its retries when a target does not
/// answer. On a worker that stalls every other call and `/healthz` (a
/// one-CPU node has one worker: the VM lab's agent was killed by its
/// liveness probe during a rescan).
fn off_the_runtime<T>(work: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        // A current-thread runtime (unit tests) or none: nothing to hand on.
        _ => work(),
    }
}

/// The WWID of the SCSI device directory `dev_dir`: its `wwid` attribute if
/// that is a valid WWID, else the LUN designator of `vpd_pg83`. The kernel's
/// text is not always usable: it prints a SCSI name string designator
/// without a prefix (`iqn...`, InfiniBox's `host=...`), which is refused.
fn device_wwid(dev_dir: &Path) -> std::io::Result<Option<Wwid>> {
    // Read as bytes: the kernel prints a designator's bytes as they came, and
    // text that is not UTF-8 is an unusable attribute, not an unreadable disk.
    match read_small(&dev_dir.join("wwid")) {
        Ok(bytes) => match Wwid::parse(String::from_utf8_lossy(&bytes).trim()) {
            Ok(w) => return Ok(Some(w)),
            Err(e) => {
                tracing::debug!(dir = %dev_dir.display(), error = %e, "kernel wwid not usable; trying vpd_pg83")
            }
        },
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {}
        Err(e) => return Err(e),
    }
    match std::fs::read(dev_dir.join("vpd_pg83")) {
        Ok(page) => Ok(vpd::lun_wwid(&page).unwrap_or_else(|e| {
            tracing::warn!(dir = %dev_dir.display(), error = %e, "malformed vpd_pg83");
            None
        })),
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => Ok(None),
        Err(e) => Err(e),
    }
}

/// How the SCSI device at `dev_dir` (canonical) reached the node: an
/// iSCSI session or FC rport among its ancestors, else its by-path names.
fn transport_of(host: &Host, dev_dir: &Path, by_path: &[String]) -> Transport {
    let from_link = by_path.iter().find_map(|n| ByPath::parse(n));
    for dir in dev_dir.ancestors().skip(1) {
        let Some(name) = dir.file_name().and_then(|n| n.to_str()) else {
            break;
        };
        if let Some(sid) = name
            .strip_prefix("session")
            .and_then(|n| n.parse::<u32>().ok())
        {
            let attrs = dir.join("iscsi_session").join(name);
            let (link_target, link_portal) = match &from_link {
                Some(ByPath::Iscsi { portal, target, .. }) => {
                    (Some(target.clone()), Some(portal.clone()))
                }
                _ => (None, None),
            };
            return Transport::Iscsi {
                session: Some(sid),
                target: read_attr(&attrs.join("targetname")).or(link_target),
                portal: session_portal(dir, sid).or(link_portal),
            };
        }
        if name.starts_with("rport-") {
            let from_sysfs = rport_wwpn(host, dir, name).or_else(|| {
                // `target H:C:T` directory of this device, below the rport.
                let target_dir = dev_dir.parent()?;
                let t = target_dir.file_name()?.to_str()?;
                read_wwpn_attr(&target_dir.join("fc_transport").join(t).join("port_name"))
            });
            let link_wwpn = match &from_link {
                Some(ByPath::Fc { wwpn, .. }) => Some(*wwpn),
                _ => None,
            };
            return Transport::Fc {
                target_wwpn: from_sysfs.or(link_wwpn),
            };
        }
        if name == "devices" {
            break;
        }
    }
    match from_link {
        Some(ByPath::Iscsi { portal, target, .. }) => Transport::Iscsi {
            session: None,
            target: Some(target),
            portal: Some(portal),
        },
        Some(ByPath::Fc { wwpn, .. }) => Transport::Fc {
            target_wwpn: Some(wwpn),
        },
        None => Transport::Other,
    }
}

/// The remote port WWPN of rport directory `dir` (named `name`): its own
/// `fc_remote_ports/<name>/port_name`, else the class entry.
fn rport_wwpn(host: &Host, dir: &Path, name: &str) -> Option<Wwpn> {
    if fc::parse_rport_name(name).is_none() {
        tracing::warn!(rport = %name, "malformed rport directory name");
    }
    read_wwpn_attr(&dir.join("fc_remote_ports").join(name).join("port_name")).or_else(|| {
        read_wwpn_attr(
            &host
                .sys("class/fc_remote_ports")
                .join(name)
                .join("port_name"),
        )
    })
}

fn read_wwpn_attr(path: &Path) -> Option<Wwpn> {
    let text = read_attr(path)?;
    Wwpn::parse(&text)
        .inspect_err(
            |e| tracing::warn!(path = %path.display(), error = %e, "malformed FC port name"),
        )
        .ok()
}

/// The portal of session `sid`'s first connection
/// (`<session dir>/connection<sid>:<cid>/iscsi_connection/...`).
fn session_portal(session_dir: &Path, sid: u32) -> Option<Portal> {
    let prefix = format!("connection{sid}:");
    let mut conns: Vec<String> = dir_names(session_dir)
        .ok()?
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .collect();
    conns.sort();
    for conn in conns {
        let attrs = session_dir.join(&conn).join("iscsi_connection").join(&conn);
        let address = read_attr(&attrs.join("persistent_address"))
            .or_else(|| read_attr(&attrs.join("address")));
        let port = read_attr(&attrs.join("persistent_port"))
            .or_else(|| read_attr(&attrs.join("port")))
            .and_then(|p| p.parse::<u16>().ok());
        if let (Some(address), Some(port)) = (address, port) {
            match Portal::new(&address, port) {
                Ok(p) => return Some(p),
                Err(e) => {
                    tracing::warn!(connection = %conn, error = %e, "malformed iSCSI connection address")
                }
            }
        }
    }
    None
}

/// `H` of the `hostH` directory above an iSCSI session directory.
fn scsi_host_of_session(session_dir: &Path) -> Option<u32> {
    session_dir
        .parent()?
        .file_name()?
        .to_str()?
        .strip_prefix("host")?
        .parse()
        .ok()
}

/// The SCSI device directory at `hctl`: through `class/scsi_device/<hctl>`
/// (whose `device` link points at it in a real sysfs), else by looking for a
/// block device at that address.
fn scsi_device_dir(host: &Host, hctl: Hctl) -> std::io::Result<Option<PathBuf>> {
    let class = host.sys("class/scsi_device").join(hctl.to_string());
    for candidate in [class.join("device"), class] {
        if candidate.join("delete").exists() {
            return std::fs::canonicalize(candidate).map(Some);
        }
    }
    let entries = match std::fs::read_dir(host.sys("block")) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    for entry in entries.flatten() {
        if let Ok(dir) = std::fs::canonicalize(entry.path().join("device"))
            && dir
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(Hctl::parse)
                == Some(hctl)
        {
            return Ok(Some(dir));
        }
    }
    Ok(None)
}

/// Entry names of `dir`, sorted; a missing directory is empty.
fn dir_names(dir: &Path) -> std::io::Result<Vec<String>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
            return Ok(Vec::new());
        }
        Err(e) => return Err(e),
    };
    let mut names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    Ok(names)
}

/// A kernel name is one path component: no separators, no `..`.
fn is_plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

fn check_plain_name(name: &str) -> std::io::Result<()> {
    if is_plain_name(name) {
        Ok(())
    } else {
        Err(std::io::Error::new(
            ErrorKind::InvalidInput,
            format!("not a kernel device name: {name:?}"),
        ))
    }
}

/// A by-path LUN: decimal, or udev's `0x` + 16 hex digits for large LUNs.
fn parse_lun(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// What may precede `fc-0x` in a by-path name: nothing, or a bus path
/// (`pci-<bdf>-`, `platform-...-pci-<bdf>-`).
fn fc_prefix_ok(prefix: &str) -> bool {
    prefix.is_empty()
        || (prefix.ends_with('-')
            && (prefix.starts_with("pci-") || prefix.starts_with("platform-")))
}

#[cfg(test)]
mod tests;
