//! `/dev/disk/by-id` and `/dev/disk/by-path` under the /dev root: find a
//! LUN's device node by WWID, list the links that point at a device.

use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};

use super::Host;
use csi_scsi_contract::Wwid;

/// A device node found through a `/dev/disk` link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LinkedDevice {
    /// The link used (`<dev>/disk/by-id/...`).
    pub link: PathBuf,
    /// The device node it points at, inside the /dev root (`<dev>/sdb`).
    pub node: PathBuf,
    /// The kernel name (`sdb`, `dm-3`).
    pub kernel_name: String,
}

/// Finds the device of `wwid` through `/dev/disk/by-id`, preferring the
/// multipath map over a single path. `Ok(None)` when no link exists.
pub(crate) fn find_by_wwid(host: &Host, wwid: &Wwid) -> std::io::Result<Option<LinkedDevice>> {
    for name in wwid.by_id_names() {
        let link = host.dev("disk/by-id").join(&name);
        match resolve(host, &link) {
            Ok(Some(found)) => return Ok(Some(found)),
            Ok(None) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// Every link of `/dev/disk/<dir>` by the kernel name it resolves to, each
/// list sorted: one listing for a walk over all disks, where asking per
/// disk lists the directory once per disk.
pub(crate) fn links_by_device(
    host: &Host,
    dir: &str,
) -> std::io::Result<std::collections::HashMap<String, Vec<String>>> {
    let base = host.dev("disk").join(dir);
    let entries = match std::fs::read_dir(&base) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Default::default()),
        Err(e) => return Err(e),
    };
    let mut by_device: std::collections::HashMap<String, Vec<String>> = Default::default();
    for entry in entries.flatten() {
        if let Ok(Some(found)) = resolve(host, &entry.path()) {
            by_device
                .entry(found.kernel_name)
                .or_default()
                .push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    for names in by_device.values_mut() {
        names.sort();
    }
    Ok(by_device)
}

/// Follows one link lexically inside the /dev root (links are relative,
/// `../../sdb`, as udev writes them; an absolute `/dev/sdb` target is taken
/// relative to the /dev root). `Ok(None)` when the link or its target is
/// missing.
fn resolve(host: &Host, link: &Path) -> std::io::Result<Option<LinkedDevice>> {
    let target = match std::fs::read_link(link) {
        Ok(t) => t,
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::InvalidInput) => {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let node = if let Ok(rest) = target.strip_prefix("/dev") {
        host.dev.join(rest)
    } else if target.is_absolute() {
        target.clone()
    } else {
        normalize(&link.parent().unwrap_or(Path::new("/")).join(&target))
    };
    if !node.exists() {
        return Ok(None);
    }
    let Some(kernel_name) = node.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return Ok(None);
    };
    Ok(Some(LinkedDevice {
        link: link.to_owned(),
        node,
        kernel_name,
    }))
}

/// Removes `.` and `..` components without touching the filesystem.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}
