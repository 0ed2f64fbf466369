//! The one seam that stands in for the kernel's SCSI layer, which this
//! machine does not have. A node's tree is `<root>/sys` and `<root>/dev`,
//! laid out as the kernel and udev lay them out (see the sysfs fixtures):
//!
//! - a SCSI disk is `sys/devices/platform/host<H>/session<S>/target<H>:0:<T>/<H:C:T:L>/`
//!   (iSCSI) or `sys/devices/platform/host<H>/rport-<H>:0-0/target<H>:0:<T>/<H:C:T:L>/` (FC)
//!   with `vendor`, `model`, `rev`, `wwid`, `state`, `type`, `delete`, `rescan`,
//!   its `block/sd<x>/{size,ro,dev}` and the `sys/block/sd<x>` and
//!   `sys/class/block/sd<x>` links;
//! - its device node `dev/sd<x>` is a block special file with the major and
//!   minor of a real loop device, so reads, writes, mkfs and mount hit real
//!   storage;
//! - udev's links: `dev/disk/by-id/{wwn-0x…,scsi-3…}` and
//!   `dev/disk/by-path/ip-<portal>-iscsi-<iqn>-lun-<n>` or `…-fc-0x<wwpn>-lun-<n>`;
//! - an iSCSI session is `sys/class/iscsi_session/session<S>` with
//!   `targetname`, `state`, and its connection's `persistent_address`/`port`.
//!
//! Only what the kernel does when a path appears (login, scan) or goes away
//! (`echo 1 > delete`) is done here; everything that reads the tree is the
//! agent's production code.

use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::{Path, PathBuf};

use nix::sys::stat::{Mode, SFlag, makedev, mknod};

/// A node's `sys` and `dev` trees.
#[derive(Debug, Clone)]
pub struct NodeTree {
    root: PathBuf,
}

/// How a disk path reached the node.
#[derive(Debug, Clone)]
pub enum PathTransport {
    /// Through iSCSI session `session` on SCSI host `host`.
    Iscsi {
        /// SCSI host number.
        host: u32,
        /// Session number.
        session: u32,
        /// Portal `ip:port`.
        portal: String,
        /// Target IQN.
        iqn: String,
    },
    /// Through an FC HBA `host` from target port `wwpn` (16 hex digits).
    Fc {
        /// SCSI host number.
        host: u32,
        /// Target port WWPN.
        wwpn: String,
    },
}

/// One SCSI path to a LUN, as the kernel would create it.
#[derive(Debug, Clone)]
pub struct DiskPath {
    /// Transport and host.
    pub transport: PathTransport,
    /// SCSI target id and LUN.
    pub target: u32,
    /// LUN number.
    pub lun: u32,
    /// The kernel `wwid` text (`naa.…`).
    pub wwid: String,
    /// INQUIRY vendor (8 chars) and model (16 chars).
    pub vendor: String,
    /// INQUIRY model.
    pub model: String,
    /// Unit serial number (VPD 0x80).
    pub serial: String,
    /// The real block device holding the data (`/dev/loopN`).
    pub backing: PathBuf,
}

impl NodeTree {
    /// Creates (or reuses) the skeleton under `root`.
    pub fn create(root: &Path) -> io::Result<Self> {
        let t = Self {
            root: root.to_owned(),
        };
        for d in [
            "sys/block",
            "sys/class/block",
            "sys/class/scsi_host",
            "sys/class/scsi_disk",
            "sys/class/scsi_device",
            "sys/class/iscsi_session",
            "sys/class/iscsi_connection",
            "sys/class/fc_host",
            "sys/devices/platform",
            "dev/disk/by-id",
            "dev/disk/by-path",
        ] {
            fs::create_dir_all(t.root.join(d))?;
        }
        Ok(t)
    }

    /// The sysfs root.
    pub fn sys(&self) -> PathBuf {
        self.root.join("sys")
    }

    /// The /dev root.
    pub fn dev(&self) -> PathBuf {
        self.root.join("dev")
    }

    /// Adds SCSI host `host` (`class/scsi_host/host<H>` with its `scan` trigger).
    pub fn add_scsi_host(&self, host: u32) -> io::Result<()> {
        let dir = self
            .sys()
            .join(format!("devices/platform/host{host}/scsi_host/host{host}"));
        fs::create_dir_all(&dir)?;
        write_trigger(&dir.join("scan"))?;
        fs::write(dir.join("proc_name"), "iscsi_tcp\n")?;
        relink(
            &format!("../../devices/platform/host{host}/scsi_host/host{host}"),
            &self.sys().join(format!("class/scsi_host/host{host}")),
        )
    }

    /// Adds an FC HBA: `class/fc_host/host<H>` with `port_name`, `node_name`,
    /// `port_state` and the `issue_lip` trigger.
    pub fn add_fc_host(&self, host: u32, port_name: &str) -> io::Result<()> {
        self.add_scsi_host(host)?;
        fs::write(
            self.sys().join(format!(
                "devices/platform/host{host}/scsi_host/host{host}/proc_name"
            )),
            "qla2xxx\n",
        )?;
        let dir = self
            .sys()
            .join(format!("devices/platform/host{host}/fc_host/host{host}"));
        fs::create_dir_all(&dir)?;
        fs::write(dir.join("port_name"), format!("0x{port_name}\n"))?;
        fs::write(dir.join("node_name"), format!("0x{port_name}\n"))?;
        fs::write(dir.join("port_state"), "Online\n")?;
        write_trigger(&dir.join("issue_lip"))?;
        relink(
            &format!("../../devices/platform/host{host}/fc_host/host{host}"),
            &self.sys().join(format!("class/fc_host/host{host}")),
        )
    }

    /// What the kernel creates at an iSCSI login: the session and its
    /// connection under SCSI host `host`.
    pub fn add_iscsi_session(
        &self,
        host: u32,
        session: u32,
        iqn: &str,
        portal: &str,
        initiator: &str,
    ) -> io::Result<()> {
        self.add_scsi_host(host)?;
        let base = self
            .sys()
            .join(format!("devices/platform/host{host}/session{session}"));
        let sdir = base.join(format!("iscsi_session/session{session}"));
        fs::create_dir_all(&sdir)?;
        for (f, v) in [
            ("targetname", iqn),
            ("state", "LOGGED_IN"),
            ("initiatorname", initiator),
            ("ifacename", "default"),
            ("tpgt", "1"),
            ("recovery_tmo", "120"),
        ] {
            fs::write(sdir.join(f), format!("{v}\n"))?;
        }
        let (addr, port) = portal.rsplit_once(':').unwrap_or((portal, "3260"));
        let cdir = base.join(format!(
            "connection{session}:0/iscsi_connection/connection{session}:0"
        ));
        fs::create_dir_all(&cdir)?;
        for (f, v) in [
            ("persistent_address", addr),
            ("address", addr),
            ("persistent_port", port),
            ("port", port),
        ] {
            fs::write(cdir.join(f), format!("{v}\n"))?;
        }
        relink(
            &format!(
                "../../devices/platform/host{host}/session{session}/iscsi_session/session{session}"
            ),
            &self
                .sys()
                .join(format!("class/iscsi_session/session{session}")),
        )?;
        relink(
            &format!(
                "../../devices/platform/host{host}/session{session}/connection{session}:0/iscsi_connection/connection{session}:0"
            ),
            &self
                .sys()
                .join(format!("class/iscsi_connection/connection{session}:0")),
        )
    }

    /// What the kernel removes at logout (the session's disks must be gone).
    pub fn remove_iscsi_session(&self, host: u32, session: u32) -> io::Result<()> {
        let _ = fs::remove_file(
            self.sys()
                .join(format!("class/iscsi_session/session{session}")),
        );
        let _ = fs::remove_file(
            self.sys()
                .join(format!("class/iscsi_connection/connection{session}:0")),
        );
        remove_if_exists(
            &self
                .sys()
                .join(format!("devices/platform/host{host}/session{session}")),
        )
    }

    /// What the kernel and udev do when a SCSI disk path appears. Returns
    /// its kernel name (`sdX`, the lowest free one, as the kernel picks).
    pub fn add_disk(&self, disk: &DiskPath) -> io::Result<String> {
        let name = self.free_sd_name()?;
        let (host, parent, by_path) = match &disk.transport {
            PathTransport::Iscsi {
                host,
                session,
                portal,
                iqn,
            } => (
                *host,
                format!("host{host}/session{session}"),
                format!("ip-{portal}-iscsi-{iqn}-lun-{}", disk.lun),
            ),
            PathTransport::Fc { host, wwpn } => (
                *host,
                format!("host{host}/rport-{host}:0-0"),
                format!("pci-0000:00:1f.0-fc-0x{wwpn}-lun-{}", disk.lun),
            ),
        };
        let hctl = format!("{host}:0:{}:{}", disk.target, disk.lun);
        let rel_dev = format!(
            "devices/platform/{parent}/target{host}:0:{}/{hctl}",
            disk.target
        );
        let dev_dir = self.sys().join(&rel_dev);
        fs::create_dir_all(&dev_dir)?;
        for (f, v) in [
            ("vendor", format!("{:<8}", disk.vendor)),
            ("model", format!("{:<16}", disk.model)),
            ("rev", "0001".to_owned()),
            ("wwid", disk.wwid.clone()),
            ("state", "running".to_owned()),
            ("type", "0".to_owned()),
        ] {
            fs::write(dev_dir.join(f), format!("{v}\n"))?;
        }
        // The real VPD 0x80 page: header, then the serial.
        let mut pg80 = vec![
            0u8,
            0x80,
            0,
            u8::try_from(disk.serial.len()).unwrap_or(u8::MAX),
        ];
        pg80.extend_from_slice(disk.serial.as_bytes());
        fs::write(dev_dir.join("vpd_pg80"), pg80)?;
        write_trigger(&dev_dir.join("delete"))?;
        write_trigger(&dev_dir.join("rescan"))?;

        let meta = fs::metadata(&disk.backing)?;
        let (major, minor) = (
            nix::sys::stat::major(meta.rdev()),
            nix::sys::stat::minor(meta.rdev()),
        );
        let blk = dev_dir.join("block").join(&name);
        fs::create_dir_all(&blk)?;
        fs::write(blk.join("dev"), format!("{major}:{minor}\n"))?;
        fs::write(
            blk.join("size"),
            format!("{}\n", device_size(&disk.backing)? / 512),
        )?;
        fs::write(blk.join("ro"), "0\n")?;
        fs::write(blk.join("removable"), "0\n")?;
        relink(&format!("../../../{hctl}"), &blk.join("device"))?;
        relink(
            &format!("../{rel_dev}/block/{name}"),
            &self.sys().join(format!("block/{name}")),
        )?;
        relink(
            &format!("../../{rel_dev}/block/{name}"),
            &self.sys().join(format!("class/block/{name}")),
        )?;
        relink(
            &format!("../../{rel_dev}"),
            &self.sys().join(format!("class/scsi_device/{hctl}")),
        )?;

        let node = self.dev().join(&name);
        let _ = fs::remove_file(&node);
        mknod(
            &node,
            SFlag::S_IFBLK,
            Mode::from_bits_truncate(0o660),
            makedev(major, minor),
        )
        .map_err(io::Error::from)?;
        if let Some(id) = disk.wwid.strip_prefix("naa.") {
            relink(
                &format!("../../{name}"),
                &self.dev().join(format!("disk/by-id/wwn-0x{id}")),
            )?;
            relink(
                &format!("../../{name}"),
                &self.dev().join(format!("disk/by-id/scsi-3{id}")),
            )?;
        }
        relink(
            &format!("../../{name}"),
            &self.dev().join(format!("disk/by-path/{by_path}")),
        )?;
        Ok(name)
    }

    /// What the kernel and udev do after `echo 1 > device/delete`: the disk,
    /// its node and every link to it disappear.
    pub fn remove_disk(&self, name: &str) -> io::Result<()> {
        let block_link = self.sys().join(format!("block/{name}"));
        if let Ok(real) = fs::canonicalize(&block_link) {
            // .../<hctl>/block/<name> -> remove the whole <hctl> directory.
            if let Some(hctl_dir) = real.parent().and_then(Path::parent) {
                if let Some(hctl) = hctl_dir.file_name() {
                    let _ = fs::remove_file(self.sys().join("class/scsi_device").join(hctl));
                }
                remove_if_exists(hctl_dir)?;
            }
        }
        let _ = fs::remove_file(&block_link);
        let _ = fs::remove_file(self.sys().join(format!("class/block/{name}")));
        let _ = fs::remove_file(self.dev().join(name));
        for dir in ["disk/by-id", "disk/by-path"] {
            for entry in fs::read_dir(self.dev().join(dir))?.flatten() {
                let points_here = fs::read_link(entry.path())
                    .map(|t| t.file_name().is_some_and(|n| n == name))
                    .unwrap_or(false);
                if points_here {
                    fs::remove_file(entry.path())?;
                }
            }
        }
        Ok(())
    }

    /// Kernel names of the SCSI disks present.
    pub fn disks(&self) -> io::Result<Vec<String>> {
        let mut names: Vec<String> = fs::read_dir(self.sys().join("block"))?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("sd"))
            .collect();
        names.sort();
        Ok(names)
    }

    /// Updates a disk's `size` after its backing device grew (what the
    /// kernel does on `echo 1 > device/rescan`).
    pub fn rescan_size(&self, name: &str, backing: &Path) -> io::Result<()> {
        let size = device_size(backing)? / 512;
        let file = self.sys().join(format!("block/{name}/size"));
        // Replaced whole (the kernel's attribute never reads half-written).
        let tmp = file.with_extension("tmp");
        fs::write(&tmp, format!("{size}\n"))?;
        fs::rename(&tmp, &file)
    }

    fn free_sd_name(&self) -> io::Result<String> {
        let taken = self.disks()?;
        (0..26 * 27)
            .map(sd_name)
            .find(|n| !taken.contains(n))
            .ok_or_else(|| io::Error::other("no free sd name"))
    }
}

/// The kernel's disk naming: sda..sdz, sdaa..
fn sd_name(index: usize) -> String {
    let letters = b"abcdefghijklmnopqrstuvwxyz";
    if index < 26 {
        format!("sd{}", letters[index] as char)
    } else {
        let i = index - 26;
        format!("sd{}{}", letters[i / 26] as char, letters[i % 26] as char)
    }
}

fn device_size(dev: &Path) -> io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    fs::File::open(dev)?.seek(SeekFrom::End(0))
}

/// A write-only trigger file (`delete`, `rescan`, `scan`, `issue_lip`).
fn write_trigger(path: &Path) -> io::Result<()> {
    fs::write(path, "")
}

fn relink(target: &str, link: &Path) -> io::Result<()> {
    let _ = fs::remove_file(link);
    symlink(target, link)
}

fn remove_if_exists(path: &Path) -> io::Result<()> {
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
