//! The lab's stand-in for the kernel's SCSI layer and iSCSI initiator, the
//! one seam the lab replaces. It does, for one node's tree, what the kernel
//! does when the agent's production code asks:
//!
//! - `iscsiadm` (the agent runs it as its `iscsiadm` tool): node records,
//!   and at `--login` a REAL iSCSI login to the target over TCP with the
//!   record's CHAP (so a wrong secret or an ACL refusal fails as in
//!   production), then each disk LUN's identity (VPD 0x83/0x80, INQUIRY)
//!   and size read over the wire, and the path created in the tree with a
//!   loop device over the LUN's backing file; `--logout`, session rescan.
//! - `watch`: acts on the sysfs trigger files the agent writes: `delete`
//!   (remove the path), `rescan` (re-read the size), `scan` and `issue_lip`
//!   (FC: create the zoned LUNs' paths).
//!
//! Everything that reads the tree is the agent's production code.

pub mod iscsiadm;
pub mod iscsid;
pub mod records;
pub mod state;
pub mod watch;

use std::path::{Path, PathBuf};
use std::process::Command;

/// What the stand-in is told about its node.
#[derive(Clone, Debug)]
pub struct NodeContext {
    /// The node's name.
    pub node: String,
    /// Root of the node's tree (`sys/`, `dev/`, `iscsi/`).
    pub root: PathBuf,
    /// The fabric description.
    pub fabric: PathBuf,
    /// The initiator IQN this node logs in with.
    pub initiator: String,
    /// How long an FC scan takes to show a new LUN (a slow fabric).
    pub scan_delay: std::time::Duration,
}

/// Attaches `file` to a free loop device.
pub use crate::loop_luns::attach_file as attach_loop;

/// Detaches a loop device (already gone is fine).
pub fn detach_loop(device: &Path) {
    let _ = Command::new("losetup").arg("-d").arg(device).status();
}

/// Tells the loop driver its file grew (`losetup -c`).
pub fn refresh_loop(device: &Path) {
    let _ = Command::new("losetup").arg("-c").arg(device).status();
}

/// The kernel's `wwid` text from a VPD 0x83 page: the logical-unit
/// designator, NAA before EUI-64 before T10 before SCSI name string (the
/// priority of `scsi_vpd_lun_id`).
pub fn kernel_wwid(page: &[u8]) -> Option<String> {
    let ds = crate::iscsi::parse_designators(page).ok()?;
    let lu: Vec<_> = ds.iter().filter(|d| d.association == 0).collect();
    for ty in [3u8, 2, 1, 8] {
        // Among NAAs the kernel prefers the longest (IEEE Registered
        // Extended, NAA 6) over NAA 5 and locally assigned NAA 3.
        if let Some(d) = lu
            .iter()
            .filter(|d| d.designator_type == ty)
            .max_by_key(|d| d.value.len())
        {
            return Some(match ty {
                3 => format!("naa.{}", crate::iscsi::hex(&d.value)),
                2 => format!("eui.{}", crate::iscsi::hex(&d.value)),
                1 => format!(
                    "t10.{}",
                    String::from_utf8_lossy(&d.value).trim_end_matches('\0')
                ),
                _ => String::from_utf8_lossy(&d.value)
                    .trim_end_matches('\0')
                    .to_owned(),
            });
        }
    }
    None
}
