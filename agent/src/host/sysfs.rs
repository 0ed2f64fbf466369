//! SCSI devices under the sysfs root: a block device's WWID, size and
//! read-only state.

use std::io::ErrorKind;

use super::Host;
use crate::wwid::Wwid;

/// What the device `kernel_name` (`sdb`, `dm-3`) says its WWID is:
/// `block/<name>/dm/uuid` (`mpath-<serial>`) for a multipath map, else
/// `block/<name>/device/wwid`. `Ok(None)` when the device has no readable
/// identity (not a SCSI disk, or gone).
pub fn block_wwid(host: &Host, kernel_name: &str) -> std::io::Result<Option<Wwid>> {
    let block = host.sys("block").join(kernel_name);
    let candidates = [block.join("dm/uuid"), block.join("device/wwid")];
    for file in candidates {
        match std::fs::read_to_string(&file) {
            Ok(text) => return Ok(Wwid::parse(text.trim()).ok()),
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// Size of `kernel_name` in bytes from `block/<name>/size` (512-byte
/// sectors, whatever the logical block size).
pub fn block_size(host: &Host, kernel_name: &str) -> std::io::Result<u64> {
    let text = std::fs::read_to_string(host.sys("block").join(kernel_name).join("size"))?;
    text.trim()
        .parse::<u64>()
        .map(|sectors| sectors.saturating_mul(512))
        .map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e))
}

/// Whether `block/<name>/ro` says the device is read-only.
pub fn block_read_only(host: &Host, kernel_name: &str) -> std::io::Result<bool> {
    let text = std::fs::read_to_string(host.sys("block").join(kernel_name).join("ro"))?;
    Ok(text.trim() == "1")
}
