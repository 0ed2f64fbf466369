//! Fibre Channel under the sysfs root: the HBA ports (`class/fc_host`), the
//! remote (target) ports they are logged in to (`class/fc_remote_ports`),
//! and the LIP trigger that makes an HBA rediscover the fabric. Port names
//! are `csi_scsi_contract::Wwpn`.
//!
//! FC has no login of ours: a target's LUNs appear after a LIP and a SCSI
//! host scan (`sysfs::scan_host`), and are matched to the target through its
//! port WWPN (here, or in `/dev/disk/by-path/*-fc-0x<wwpn>-lun-<n>`).

use std::io::ErrorKind;
use std::path::Path;

pub use csi_scsi_contract::{InvalidWwpn, Wwpn};

use super::Host;
use super::sysfs::{read_attr, write_trigger};

/// An FC HBA port (`class/fc_host/host<N>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FcHost {
    /// SCSI host number (the `N` of `host<N>`).
    pub host_no: u32,
    /// The HBA port's WWPN, when readable.
    pub port_name: Option<Wwpn>,
    /// The HBA's node name, when readable.
    pub node_name: Option<Wwpn>,
    /// `port_state` as the kernel spells it (`Online`, `Linkdown`, `Offline`, ...).
    pub port_state: Option<String>,
    /// `port_type` (`NPort (fabric via point-to-point)`, `Unknown`, ...).
    pub port_type: Option<String>,
    /// `speed` (`16 Gbit`, `unknown`).
    pub speed: Option<String>,
}

/// A remote port an HBA is logged in to (`class/fc_remote_ports/rport-H:C-N`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemotePort {
    /// The kernel name, `rport-H:C-N`.
    pub name: String,
    /// SCSI host (HBA) number.
    pub host_no: u32,
    /// SCSI channel.
    pub channel: u32,
    /// The remote port's WWPN.
    pub port_name: Wwpn,
    /// Its node name, when readable.
    pub node_name: Option<Wwpn>,
    /// `port_state` (`Online`, `Blocked`, `Not Present`, ...).
    pub port_state: Option<String>,
    /// `roles` (`FCP Target`, `FCP Initiator`, ...).
    pub roles: Option<String>,
    /// The SCSI target id the port is bound to; `None` when it is not a SCSI
    /// target (the kernel writes -1).
    pub scsi_target_id: Option<u32>,
}

/// Where a target port's LUNs appear: `H:C:T` of their HCTLs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FcTargetAddress {
    /// SCSI host (HBA) number.
    pub host_no: u32,
    /// SCSI channel.
    pub channel: u32,
    /// SCSI target id.
    pub target: u32,
}

/// Every FC HBA port, sorted by host number. No `class/fc_host` (no FC HBA,
/// or its driver is not loaded) is an empty list; an unreadable entry is
/// skipped with a warning.
pub fn fc_hosts(host: &Host) -> std::io::Result<Vec<FcHost>> {
    let mut out = Vec::new();
    for (name, dir) in class_entries(host, "fc_host")? {
        let Some(host_no) = name
            .strip_prefix("host")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            tracing::warn!(entry = %name, "skipping fc_host entry that is not host<N>");
            continue;
        };
        out.push(FcHost {
            host_no,
            port_name: read_wwpn(&dir, "port_name"),
            node_name: read_wwpn(&dir, "node_name"),
            port_state: read_attr(&dir.join("port_state")),
            port_type: read_attr(&dir.join("port_type")),
            speed: read_attr(&dir.join("speed")),
        });
    }
    out.sort_by_key(|h| h.host_no);
    Ok(out)
}

/// Asks HBA `host_no` to issue a loop initialization (`echo 1 > issue_lip`),
/// so it logs in again to the fabric and sees newly zoned target ports. The
/// LUNs themselves appear after a SCSI host scan.
pub fn issue_lip(host: &Host, host_no: u32) -> std::io::Result<()> {
    write_trigger(
        &host.sys(format!("class/fc_host/host{host_no}/issue_lip")),
        "1",
    )
}

/// Every remote port, sorted by name. No `class/fc_remote_ports` is an empty
/// list; an entry without a valid `port_name` is skipped with a warning.
pub fn remote_ports(host: &Host) -> std::io::Result<Vec<RemotePort>> {
    let mut out = Vec::new();
    for (name, dir) in class_entries(host, "fc_remote_ports")? {
        let Some((host_no, channel)) = parse_rport_name(&name) else {
            tracing::warn!(entry = %name, "skipping fc_remote_ports entry that is not rport-H:C-N");
            continue;
        };
        let Some(port_name) = read_wwpn(&dir, "port_name") else {
            tracing::warn!(entry = %name, "skipping remote port without a valid port_name");
            continue;
        };
        let scsi_target_id =
            read_attr(&dir.join("scsi_target_id")).and_then(|t| t.parse::<u32>().ok());
        out.push(RemotePort {
            name,
            host_no,
            channel,
            port_name,
            node_name: read_wwpn(&dir, "node_name"),
            port_state: read_attr(&dir.join("port_state")),
            roles: read_attr(&dir.join("roles")),
            scsi_target_id,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The SCSI addresses (`H:C:T`) behind target port `wwpn`: one per HBA that
/// is logged in to it and has bound it to a SCSI target. Empty when no HBA
/// sees the port (not zoned, link down, or no LIP yet).
pub fn target_addresses(host: &Host, wwpn: Wwpn) -> std::io::Result<Vec<FcTargetAddress>> {
    let mut out: Vec<FcTargetAddress> = remote_ports(host)?
        .into_iter()
        .filter(|p| p.port_name == wwpn)
        .filter_map(|p| {
            p.scsi_target_id.map(|target| FcTargetAddress {
                host_no: p.host_no,
                channel: p.channel,
                target,
            })
        })
        .collect();
    // Older kernels without scsi_target_id: the fc_transport class names the
    // SCSI target directly (`targetH:C:T/port_name`).
    if out.is_empty() {
        for (name, dir) in class_entries(host, "fc_transport")? {
            if read_wwpn(&dir, "port_name") != Some(wwpn) {
                continue;
            }
            let Some(address) = name
                .strip_prefix("target")
                .and_then(parse_host_channel_target)
            else {
                tracing::warn!(entry = %name, "skipping fc_transport entry that is not targetH:C:T");
                continue;
            };
            out.push(address);
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// `(name, dir)` of every entry of `class/<class>`, sorted by name; a
/// missing class directory is an empty list.
fn class_entries(host: &Host, class: &str) -> std::io::Result<Vec<(String, std::path::PathBuf)>> {
    let dir = host.sys("class").join(class);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out: Vec<_> = entries
        .flatten()
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
        .collect();
    out.sort();
    Ok(out)
}

/// A WWPN attribute, `None` (with a warning when present but malformed).
fn read_wwpn(dir: &Path, attr: &str) -> Option<Wwpn> {
    let text = read_attr(&dir.join(attr))?;
    match Wwpn::parse(&text) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(path = %dir.join(attr).display(), error = %e, "unreadable FC port name");
            None
        }
    }
}

/// `(host, channel)` of `rport-H:C-N`.
pub(crate) fn parse_rport_name(name: &str) -> Option<(u32, u32)> {
    let (hc, number) = name.strip_prefix("rport-")?.rsplit_once('-')?;
    let (h, c) = hc.split_once(':')?;
    number.parse::<u32>().ok()?;
    Some((h.parse().ok()?, c.parse().ok()?))
}

/// `H:C:T`.
fn parse_host_channel_target(s: &str) -> Option<FcTargetAddress> {
    let mut it = s.split(':').map(|p| p.parse::<u32>().ok());
    let (Some(Some(host_no)), Some(Some(channel)), Some(Some(target)), None) =
        (it.next(), it.next(), it.next(), it.next())
    else {
        return None;
    };
    Some(FcTargetAddress {
        host_no,
        channel,
        target,
    })
}

#[cfg(test)]
mod tests;
