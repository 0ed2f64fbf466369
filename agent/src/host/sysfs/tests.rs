use std::collections::BTreeMap;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;
use crate::host::command::CommandRunner;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

fn host_at(sysfs: &Path, dev: &Path) -> Host {
    Host {
        sysfs: sysfs.to_owned(),
        dev: dev.to_owned(),
        mountinfo: PathBuf::from("/nonexistent/mountinfo"),
        kubelet_dir: PathBuf::from("/nonexistent/kubelet"),
        iscsi_nodes: std::path::PathBuf::from("/nonexistent/iscsi/nodes"),
        tools: BTreeMap::new(),
        runner: CommandRunner::new(Duration::from_secs(5)),
    }
}

fn wwid(s: &str) -> Wwid {
    Wwid::parse(s).expect("test WWID")
}

/// Copies a fixture tree, keeping its relative symlinks, so tests can write
/// triggers without touching the checked-in files.
fn copy_tree(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).expect("mkdir");
    for entry in std::fs::read_dir(src).expect("read fixture dir").flatten() {
        let to = dst.join(entry.file_name());
        let ty = entry.file_type().expect("file type");
        if ty.is_symlink() {
            symlink(std::fs::read_link(entry.path()).expect("readlink"), &to).expect("symlink");
        } else if ty.is_dir() {
            copy_tree(&entry.path(), &to);
        } else {
            std::fs::copy(entry.path(), &to).expect("copy");
        }
    }
}

/// How a disk reached the node, as the harness's `PathTransport`.
enum Via<'a> {
    Iscsi {
        host: u32,
        session: u32,
        portal: &'a str,
        iqn: &'a str,
    },
    Fc {
        host: u32,
        wwpn: &'a str,
    },
}

/// A node tree laid out exactly as `tests/src/node_tree.rs` writes it (the
/// harness crate cannot be used from here), with a regular file standing
/// in for each block device node.
struct NodeTree {
    _root: tempfile::TempDir,
    sys: PathBuf,
    dev: PathBuf,
}

impl NodeTree {
    fn new() -> Self {
        let root = tempfile::tempdir().expect("tempdir");
        let t = Self {
            sys: root.path().join("sys"),
            dev: root.path().join("dev"),
            _root: root,
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
            std::fs::create_dir_all(t.sys.parent().expect("root").join(d)).expect("mkdir");
        }
        t
    }

    fn host(&self) -> Host {
        host_at(&self.sys, &self.dev)
    }

    fn add_scsi_host(&self, host: u32) {
        let dir = self
            .sys
            .join(format!("devices/platform/host{host}/scsi_host/host{host}"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("scan"), "").expect("scan");
        relink(
            &format!("../../devices/platform/host{host}/scsi_host/host{host}"),
            &self.sys.join(format!("class/scsi_host/host{host}")),
        );
    }

    fn add_iscsi_session(&self, host: u32, session: u32, iqn: &str, portal: &str) {
        self.add_scsi_host(host);
        let base = self
            .sys
            .join(format!("devices/platform/host{host}/session{session}"));
        let sdir = base.join(format!("iscsi_session/session{session}"));
        std::fs::create_dir_all(&sdir).expect("mkdir");
        for (f, v) in [
            ("targetname", iqn),
            ("state", "LOGGED_IN"),
            ("initiatorname", "iqn.2024-01.io.csi-scsi:node-a"),
            ("ifacename", "default"),
            ("tpgt", "1"),
            ("recovery_tmo", "120"),
        ] {
            std::fs::write(sdir.join(f), format!("{v}\n")).expect("attr");
        }
        let (addr, port) = portal.rsplit_once(':').expect("portal");
        let cdir = base.join(format!(
            "connection{session}:0/iscsi_connection/connection{session}:0"
        ));
        std::fs::create_dir_all(&cdir).expect("mkdir");
        for (f, v) in [
            ("persistent_address", addr),
            ("address", addr),
            ("persistent_port", port),
            ("port", port),
        ] {
            std::fs::write(cdir.join(f), format!("{v}\n")).expect("attr");
        }
        relink(
            &format!(
                "../../devices/platform/host{host}/session{session}/iscsi_session/session{session}"
            ),
            &self
                .sys
                .join(format!("class/iscsi_session/session{session}")),
        );
    }

    /// `add_disk` of the harness, with the kernel name chosen by the test.
    #[allow(clippy::too_many_arguments)]
    fn add_disk(
        &self,
        name: &str,
        via: &Via<'_>,
        target: u32,
        lun: u32,
        wwid: &str,
        serial: &str,
        sectors: u64,
    ) -> PathBuf {
        let (host, parent, by_path) = match via {
            Via::Iscsi {
                host,
                session,
                portal,
                iqn,
            } => (
                *host,
                format!("host{host}/session{session}"),
                format!("ip-{portal}-iscsi-{iqn}-lun-{lun}"),
            ),
            Via::Fc { host, wwpn } => (
                *host,
                format!("host{host}/rport-{host}:0-0"),
                format!("pci-0000:00:1f.0-fc-0x{wwpn}-lun-{lun}"),
            ),
        };
        let hctl = format!("{host}:0:{target}:{lun}");
        let rel_dev = format!("devices/platform/{parent}/target{host}:0:{target}/{hctl}");
        let dev_dir = self.sys.join(&rel_dev);
        std::fs::create_dir_all(&dev_dir).expect("mkdir");
        for (f, v) in [
            ("vendor", format!("{:<8}", "LIO-ORG")),
            ("model", format!("{:<16}", "lab-lun")),
            ("rev", "0001".to_owned()),
            ("wwid", wwid.to_owned()),
            ("state", "running".to_owned()),
            ("type", "0".to_owned()),
        ] {
            std::fs::write(dev_dir.join(f), format!("{v}\n")).expect("attr");
        }
        let mut pg80 = vec![
            0u8,
            0x80,
            0,
            u8::try_from(serial.len()).expect("short serial"),
        ];
        pg80.extend_from_slice(serial.as_bytes());
        std::fs::write(dev_dir.join("vpd_pg80"), pg80).expect("pg80");
        std::fs::write(dev_dir.join("delete"), "").expect("delete");
        std::fs::write(dev_dir.join("rescan"), "").expect("rescan");
        let blk = dev_dir.join("block").join(name);
        std::fs::create_dir_all(&blk).expect("mkdir");
        std::fs::write(blk.join("dev"), "7:0\n").expect("dev");
        std::fs::write(blk.join("size"), format!("{sectors}\n")).expect("size");
        std::fs::write(blk.join("ro"), "0\n").expect("ro");
        std::fs::write(blk.join("removable"), "0\n").expect("removable");
        relink(&format!("../../../{hctl}"), &blk.join("device"));
        relink(
            &format!("../{rel_dev}/block/{name}"),
            &self.sys.join(format!("block/{name}")),
        );
        relink(
            &format!("../../{rel_dev}/block/{name}"),
            &self.sys.join(format!("class/block/{name}")),
        );
        relink(
            &format!("../../{rel_dev}"),
            &self.sys.join(format!("class/scsi_device/{hctl}")),
        );
        std::fs::write(self.dev.join(name), "").expect("device node");
        if let Some(id) = wwid.strip_prefix("naa.") {
            relink(
                &format!("../../{name}"),
                &self.dev.join(format!("disk/by-id/wwn-0x{id}")),
            );
            relink(
                &format!("../../{name}"),
                &self.dev.join(format!("disk/by-id/scsi-3{id}")),
            );
        }
        relink(
            &format!("../../{name}"),
            &self.dev.join(format!("disk/by-path/{by_path}")),
        );
        dev_dir
    }
}

fn relink(target: &str, link: &Path) {
    let _ = std::fs::remove_file(link);
    symlink(target, link).expect("symlink");
}

const LAB_WWID: &str = "naa.6001405aaaaaaaaaaaaaaaaaaaaaaaa1";

/// Two iSCSI targets exposing one LUN (two paths), plus an FC LUN.
fn lab_tree() -> NodeTree {
    let t = NodeTree::new();
    t.add_iscsi_session(3, 1, "iqn.2024-01.io.lab:target-a", "10.0.0.1:3260");
    t.add_iscsi_session(4, 2, "iqn.2024-01.io.lab:target-b", "10.0.0.2:3260");
    let a = Via::Iscsi {
        host: 3,
        session: 1,
        portal: "10.0.0.1:3260",
        iqn: "iqn.2024-01.io.lab:target-a",
    };
    let b = Via::Iscsi {
        host: 4,
        session: 2,
        portal: "10.0.0.2:3260",
        iqn: "iqn.2024-01.io.lab:target-b",
    };
    t.add_disk("sda", &a, 0, 1, LAB_WWID, "serial-1", 2048);
    t.add_disk("sdb", &b, 0, 1, LAB_WWID, "serial-1", 2048);
    t.add_scsi_host(5);
    t.add_disk(
        "sdc",
        &Via::Fc {
            host: 5,
            wwpn: "500a0981891b8dc5",
        },
        2,
        7,
        "naa.600a0980383030523824476f6b5a4e57",
        "fc-serial",
        4096,
    );
    t
}

#[test]
fn harness_layout_is_read_with_transport_links_and_serial() {
    let t = lab_tree();
    let disks = scsi_disks(&t.host()).expect("scan");
    let names: Vec<&str> = disks.iter().map(|d| d.kernel_name.as_str()).collect();
    assert_eq!(names, ["sda", "sdb", "sdc"]);
    let sda = &disks[0];
    assert_eq!(sda.hctl, Hctl::parse("3:0:0:1").expect("hctl"));
    assert_eq!(
        (sda.vendor.as_str(), sda.model.as_str(), sda.rev.as_str()),
        ("LIO-ORG", "lab-lun", "0001")
    );
    assert_eq!(sda.serial.as_deref(), Some("serial-1"));
    assert_eq!(sda.wwid, wwid(LAB_WWID));
    assert_eq!(sda.size_bytes, 2048 * 512);
    assert!(!sda.read_only);
    assert_eq!(sda.state, DeviceState::Running);
    assert_eq!(
        sda.transport,
        Transport::Iscsi {
            session: Some(1),
            target: Some("iqn.2024-01.io.lab:target-a".to_owned()),
            portal: Some(Portal::parse("10.0.0.1:3260").expect("portal")),
        }
    );
    assert_eq!(
        sda.by_path,
        ["ip-10.0.0.1:3260-iscsi-iqn.2024-01.io.lab:target-a-lun-1"]
    );
    assert!(sda.holders.is_empty());
    let sdc = &disks[2];
    assert_eq!(
        sdc.transport,
        Transport::Fc {
            target_wwpn: Some(Wwpn::parse("0x500a0981891b8dc5").expect("wwpn")),
        }
    );
    assert_eq!(sdc.hctl.to_string(), "5:0:2:7");
    assert_eq!(
        sdc.by_id,
        [
            "scsi-3600a0980383030523824476f6b5a4e57",
            "wwn-0x600a0980383030523824476f6b5a4e57"
        ]
    );
}

#[test]
fn two_targets_with_one_wwid_group_into_one_lun() {
    let t = lab_tree();
    let host = t.host();
    let luns = group_luns(
        scsi_disks(&host).expect("scan"),
        multipath_maps(&host).expect("maps"),
    );
    assert_eq!(luns.len(), 2);
    let lab = luns
        .iter()
        .find(|l| l.wwid == wwid(LAB_WWID))
        .expect("lab LUN");
    let paths: Vec<&str> = lab.paths.iter().map(|p| p.kernel_name.as_str()).collect();
    assert_eq!(paths, ["sda", "sdb"]);
    assert_eq!(lab.map, None);
    assert_eq!(lab.size_bytes(), 2048 * 512);
    assert_eq!(lab.device_kernel_name(), Some("sda"));
    assert_eq!(
        disks_with_wwid(&host, &wwid(LAB_WWID))
            .expect("by wwid")
            .len(),
        2
    );
}

#[test]
fn harness_sessions_are_listed_with_portal_and_host() {
    let t = lab_tree();
    let sessions = iscsi_sessions(&t.host()).expect("sessions");
    assert_eq!(sessions.len(), 2);
    assert_eq!(
        sessions[1],
        IscsiSession {
            sid: 2,
            target: "iqn.2024-01.io.lab:target-b".to_owned(),
            state: "LOGGED_IN".to_owned(),
            portal: Some(Portal::parse("10.0.0.2:3260").expect("portal")),
            tpgt: Some(1),
            scsi_host: Some(4),
            initiator: Some("iqn.2024-01.io.csi-scsi:node-a".to_owned()),
        }
    );
    assert_eq!(scsi_hosts(&t.host()).expect("hosts"), [3, 4, 5]);
}

#[test]
fn lio_fixture_single_iscsi_path() {
    let sys = fixture("sysfs/iscsi-lio-single-path/sys");
    let dev = tempfile::tempdir().expect("tempdir");
    // The udev links of the same disk (dev-disk/*/iscsi-lio-rook.txt).
    for (dir, list) in [
        ("by-id", "dev-disk/by-id/iscsi-lio-rook.txt"),
        ("by-path", "dev-disk/by-path/iscsi-lio-rook.txt"),
    ] {
        std::fs::create_dir_all(dev.path().join("disk").join(dir)).expect("mkdir");
        for name in std::fs::read_to_string(fixture(list))
            .expect("list")
            .lines()
        {
            symlink("../../sdk", dev.path().join("disk").join(dir).join(name)).expect("link");
        }
    }
    std::fs::write(dev.path().join("sdk"), "").expect("node");
    let host = host_at(&sys, dev.path());
    let disks = scsi_disks(&host).expect("scan");
    assert_eq!(disks.len(), 1);
    let d = &disks[0];
    assert_eq!(d.kernel_name, "sdk");
    assert_eq!(d.hctl.to_string(), "6:0:0:0");
    assert_eq!(
        (d.vendor.as_str(), d.model.as_str(), d.rev.as_str()),
        ("LIO-ORG", "disk01", "4.0")
    );
    assert_eq!(d.wwid.as_str(), "naa.6001405d27e5d898829468b90ce4ef8c");
    assert_eq!(d.size_bytes, 1 << 30);
    assert_eq!(d.serial, None);
    assert_eq!(d.state, DeviceState::Running);
    assert_eq!(
        d.transport,
        Transport::Iscsi {
            session: Some(2),
            target: Some("iqn.2016-06.world.srv:storage.target01".to_owned()),
            portal: Some(Portal::parse("127.0.0.1:3260").expect("portal")),
        }
    );
    assert_eq!(
        d.by_id,
        [
            "scsi-36001405d27e5d898829468b90ce4ef8c",
            "wwn-0x6001405d27e5d898829468b90ce4ef8c"
        ]
    );
    assert_eq!(
        d.by_path,
        ["ip-127.0.0.1:3260-iscsi-iqn.2016-06.world.srv:storage.target01-lun-0"]
    );
    let sessions = iscsi_sessions(&host).expect("sessions");
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0].sid, 2);
    assert_eq!(sessions[0].state, "LOGGED_IN");
    assert_eq!(sessions[0].scsi_host, Some(6));
    assert_eq!(
        sessions[0]
            .portal
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("127.0.0.1:3260")
    );
    assert_eq!(
        block_wwid(&host, "sdk").expect("wwid"),
        Some(d.wwid.clone())
    );
}

#[test]
fn huawei_fixture_two_paths_under_one_map() {
    let host = host_at(
        &fixture("sysfs/iscsi-multipath-huawei/sys"),
        Path::new("/nonexistent/dev"),
    );
    let disks = scsi_disks(&host).expect("scan");
    let summary: Vec<(String, String, Vec<String>)> = disks
        .iter()
        .map(|d| (d.kernel_name.clone(), d.hctl.to_string(), d.holders.clone()))
        .collect();
    assert_eq!(
        summary,
        [
            (
                "sdd".to_owned(),
                "39:0:0:1".to_owned(),
                vec!["dm-3".to_owned()]
            ),
            (
                "sde".to_owned(),
                "38:0:0:1".to_owned(),
                vec!["dm-3".to_owned()]
            ),
        ]
    );
    // The sessions' own attributes are not in the capture: the number comes
    // from the path, the rest is unknown.
    assert_eq!(
        disks[0].transport,
        Transport::Iscsi {
            session: Some(6),
            target: None,
            portal: None
        }
    );
    assert_eq!(
        (disks[0].vendor.as_str(), disks[0].model.as_str()),
        ("HUAWEI", "XSG1")
    );
    let maps = multipath_maps(&host).expect("maps");
    assert_eq!(
        maps,
        [MultipathMap {
            kernel_name: "dm-3".to_owned(),
            wwid: wwid("naa.618cf24100f8f457014a764c000001f6"),
            name: "mpathb".to_owned(),
            slaves: vec!["sdd".to_owned(), "sde".to_owned()],
            size_bytes: 100 << 30,
            suspended: false,
        }]
    );
    // An array that reused a LUN number: one path under the map now
    // reports another LUN. The map's LUN records it, so it is refused.
    let mut reused = disks.clone();
    reused[0].wwid = wwid("naa.618cf24100f8f457014a764c000009f9");
    let mixed = group_luns(reused, maps.clone());
    let mapped = mixed
        .iter()
        .find(|l| l.map.is_some())
        .expect("the map's LUN");
    assert_eq!(mapped.foreign_paths, [disks[0].kernel_name.clone()]);
    assert!(matches!(
        crate::device::consistent(&host, mapped.clone()),
        Err(crate::error::AgentError::WwidMismatch { .. })
    ));
    let luns = group_luns(disks, maps);
    assert_eq!(luns.len(), 1);
    assert!(luns[0].foreign_paths.is_empty());
    assert!(crate::device::consistent(&host, luns[0].clone()).is_ok());
    assert_eq!(luns[0].paths.len(), 2);
    // Sorted by HCTL: host 38 first.
    assert_eq!(luns[0].paths[0].kernel_name, "sde");
    assert_eq!(luns[0].device_kernel_name(), Some("dm-3"));
    assert_eq!(luns[0].size_bytes(), 100 << 30);
    assert_eq!(
        block_wwid(&host, "dm-3").expect("dm wwid"),
        Some(luns[0].wwid.clone())
    );
    assert_eq!(holders(&host, "sdd").expect("holders"), ["dm-3"]);
}

#[test]
fn procfs_dm_fixture_with_made_up_uuids_is_skipped_not_fatal() {
    let host = host_at(
        &fixture("sysfs/dm-multipath/procfs-fixture/sys"),
        Path::new("/nonexistent/dev"),
    );
    // "mpath-360000000000001" is too short to be a WWID: both maps skipped.
    assert_eq!(multipath_maps(&host).expect("maps"), []);
    // Its sdX entries are plain directories without a device link.
    assert_eq!(scsi_disks(&host).expect("scan"), []);
}

#[test]
fn sas_fixture_device_attributes() {
    let dir = fixture(
        "sysfs/sas-disk-hgst-procfs/sys/devices/pci0000:00/0000:00:03.0/0000:03:00.0/host11/port-11:0/expander-11:0/port-11:0:1/end_device-11:0:1/target11:0:8/11:0:8:0",
    );
    assert_eq!(
        device_wwid(&dir).expect("wwid"),
        Some(wwid("naa.5000cca26128b1f4"))
    );
    assert_eq!(read_attr(&dir.join("vendor")).as_deref(), Some("HITACHI"));
    assert_eq!(
        read_attr(&dir.join("state")).map(|s| DeviceState::parse(&s)),
        Some(DeviceState::Running)
    );
    assert_eq!(
        Hctl::parse("11:0:8:0").map(|h| h.to_string()).as_deref(),
        Some("11:0:8:0")
    );
}

#[test]
fn fc_disk_below_an_rport_takes_the_wwpn_from_sysfs() {
    let root = tempfile::tempdir().expect("tempdir");
    copy_tree(
        &fixture("sysfs/fc/rport-assembled-os-brick/sys"),
        root.path(),
    );
    let target = root
        .path()
        .join("devices/pci0000:00/0000:00:02.0/0000:04:00.0/host6/rport-6:0-1/target6:0:1");
    let lun = target.join("6:0:1:3");
    std::fs::create_dir_all(lun.join("block/sdf")).expect("mkdir");
    for (f, v) in [
        ("vendor", "XtremIO "),
        ("model", "XtremApp        "),
        ("wwid", "naa.514f0c5a51600001"),
        ("state", "running"),
        ("type", "0"),
    ] {
        std::fs::write(lun.join(f), v).expect("attr");
    }
    std::fs::write(lun.join("block/sdf/size"), "8\n").expect("size");
    std::fs::write(lun.join("block/sdf/ro"), "1\n").expect("ro");
    symlink("../../../6:0:1:3", lun.join("block/sdf/device")).expect("device link");
    std::fs::create_dir_all(root.path().join("block")).expect("mkdir");
    symlink(
        "../devices/pci0000:00/0000:00:02.0/0000:04:00.0/host6/rport-6:0-1/target6:0:1/6:0:1:3/block/sdf",
        root.path().join("block/sdf"),
    )
    .expect("block link");
    let disks = scsi_disks(&host_at(root.path(), Path::new("/nonexistent/dev"))).expect("scan");
    assert_eq!(disks.len(), 1);
    assert!(disks[0].read_only);
    assert_eq!(
        disks[0].transport,
        Transport::Fc {
            target_wwpn: Some(Wwpn::parse("514f0c50023f6c00").expect("wwpn"))
        }
    );
}

#[test]
fn malformed_entries_are_skipped_and_the_rest_is_read() {
    let t = lab_tree();
    let via = Via::Iscsi {
        host: 3,
        session: 1,
        portal: "10.0.0.1:3260",
        iqn: "iqn.2024-01.io.lab:target-a",
    };
    // No valid kernel WWID and no VPD page: skipped.
    t.add_disk("sdd", &via, 0, 2, "garbage\u{7}", "s", 8);
    // No valid kernel WWID, but a VPD page: identified from the page.
    let dir = t.add_disk("sde", &via, 0, 3, "host=labels-are-not-ids", "s", 8);
    let mut pg83 = vec![0, 0x83, 0, 12, 0x01, 0x03, 0, 8];
    pg83.extend_from_slice(&[0x50, 0x01, 0x40, 0x5a, 0xbc, 0xde, 0xf0, 0x12]);
    std::fs::write(dir.join("vpd_pg83"), pg83).expect("pg83");
    // An unparsable size: skipped.
    t.add_disk("sdf", &via, 0, 4, "naa.5001405abcdef013", "s", 8);
    std::fs::write(t.sys.join("block/sdf/size"), "lots\n").expect("size");
    // A CD-ROM (type 5): not a disk.
    let dir = t.add_disk("sr0", &via, 0, 5, "naa.5001405abcdef014", "s", 8);
    std::fs::write(dir.join("type"), "5\n").expect("type");
    // A dangling block link, a virtio disk and a loop device.
    relink(
        "../devices/platform/gone/block/sdz",
        &t.sys.join("block/sdz"),
    );
    std::fs::create_dir_all(t.sys.join("devices/pci0000:00/virtio2/block/vda")).expect("mkdir");
    relink(
        "../../../virtio2",
        &t.sys.join("devices/pci0000:00/virtio2/block/vda/device"),
    );
    relink(
        "../devices/pci0000:00/virtio2/block/vda",
        &t.sys.join("block/vda"),
    );
    std::fs::create_dir_all(t.sys.join("block/loop0")).expect("mkdir");
    // A bad serial page: the disk stays, without a serial.
    let dir = t.add_disk("sdg", &via, 0, 6, "naa.5001405abcdef015", "s", 8);
    std::fs::write(dir.join("vpd_pg80"), b"\x00\x80\x00\x03a\x01b").expect("pg80");

    let disks = scsi_disks(&t.host()).expect("scan");
    let names: Vec<&str> = disks.iter().map(|d| d.kernel_name.as_str()).collect();
    assert_eq!(names, ["sda", "sdb", "sdc", "sde", "sdg"]);
    assert_eq!(disks[3].wwid.as_str(), "naa.5001405abcdef012");
    assert_eq!(disks[4].serial, None);
    assert_eq!(scsi_disk(&t.host(), "../block").expect("odd name"), None);
}

#[test]
fn triggers_write_what_the_kernel_expects() {
    let t = lab_tree();
    let host = t.host();
    let dev_dir = t
        .sys
        .join("devices/platform/host3/session1/target3:0:0/3:0:0:1");
    assert!(delete_path(&host, "sda").expect("delete"));
    assert_eq!(
        std::fs::read_to_string(dev_dir.join("delete")).expect("read"),
        "1"
    );
    assert!(!delete_path(&host, "sdq").expect("already gone"));
    assert!(delete_path(&host, "../sda").is_err());
    rescan_device(&host, "sdb").expect("rescan");
    let sdb_dir = t
        .sys
        .join("devices/platform/host4/session2/target4:0:0/4:0:0:1");
    assert_eq!(
        std::fs::read_to_string(sdb_dir.join("rescan")).expect("read"),
        "1"
    );
    let scan = t.sys.join("devices/platform/host3/scsi_host/host3/scan");
    scan_host(&host, 3, ScanAddress::exact(0, 12, 10)).expect("scan");
    assert_eq!(std::fs::read_to_string(&scan).expect("read"), "0 12 10");
    scan_host(&host, 3, ScanAddress::ALL).expect("scan");
    assert_eq!(std::fs::read_to_string(&scan).expect("read"), "- - -");
    // A trigger that does not exist is an error, not a new file.
    let err = scan_host(&host, 9, ScanAddress::ALL).expect_err("no host9");
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(!t.sys.join("class/scsi_host/host9").exists());
}

#[test]
fn stale_path_at_an_address_is_removed_unless_current_or_held() {
    let t = lab_tree();
    let host = t.host();
    let hctl = Hctl::parse("3:0:0:1").expect("hctl");
    let dev_dir = t
        .sys
        .join("devices/platform/host3/session1/target3:0:0/3:0:0:1");
    assert_eq!(
        remove_stale_path_at(&host, hctl, &wwid(LAB_WWID), |_| None).expect("check"),
        PathAtAddress::Current {
            kernel_name: Some("sda".to_owned())
        }
    );
    assert_eq!(
        std::fs::read_to_string(dev_dir.join("delete")).expect("read"),
        ""
    );
    let other = wwid("naa.6001405bbbbbbbbbbbbbbbbbbbbbbbb2");
    assert_eq!(
        remove_stale_path_at(&host, Hctl::parse("3:0:9:9").expect("hctl"), &other, |_| {
            None
        })
        .expect("vacant"),
        PathAtAddress::Vacant
    );
    // Held by a map: reported, not deleted.
    std::fs::create_dir_all(t.sys.join("block/sda/holders")).expect("mkdir");
    std::fs::write(t.sys.join("block/sda/holders/dm-0"), "").expect("holder");
    assert_eq!(
        remove_stale_path_at(&host, hctl, &other, |_| None).expect("held"),
        PathAtAddress::Held {
            kernel_name: "sda".to_owned(),
            found: Some(wwid(LAB_WWID)),
            holders: vec!["dm-0".to_owned()],
        }
    );
    std::fs::remove_file(t.sys.join("block/sda/holders/dm-0")).expect("rm");
    // In use by other means (mounted, published, open): not deleted either.
    assert_eq!(
        remove_stale_path_at(&host, hctl, &other, |name| Some(format!(
            "{name} is mounted at /x"
        )))
        .expect("in use"),
        PathAtAddress::Held {
            kernel_name: "sda".to_owned(),
            found: Some(wwid(LAB_WWID)),
            holders: vec!["sda is mounted at /x".to_owned()],
        }
    );
    assert_eq!(
        std::fs::read_to_string(dev_dir.join("delete")).expect("read"),
        "",
        "an in-use path is never deleted"
    );
    assert_eq!(
        remove_stale_path_at(&host, hctl, &other, |_| None).expect("stale"),
        PathAtAddress::Removed {
            kernel_name: Some("sda".to_owned()),
            found: Some(wwid(LAB_WWID)),
        }
    );
    assert_eq!(
        std::fs::read_to_string(dev_dir.join("delete")).expect("read"),
        "1"
    );
}

#[test]
fn stale_path_lookup_follows_a_real_sysfs_class_link() {
    // class/scsi_device/H:C:T:L -> .../H:C:T:L/scsi_device/H:C:T:L, whose
    // `device` link leads back to the SCSI device (real layout).
    let root = tempfile::tempdir().expect("tempdir");
    copy_tree(&fixture("sysfs/iscsi-lio-single-path/sys"), root.path());
    let host = host_at(root.path(), Path::new("/nonexistent/dev"));
    let other = wwid("naa.6001405bbbbbbbbbbbbbbbbbbbbbbbb2");
    assert_eq!(
        remove_stale_path_at(&host, Hctl::parse("6:0:0:0").expect("hctl"), &other, |_| {
            None
        })
        .expect("stale"),
        PathAtAddress::Removed {
            kernel_name: Some("sdk".to_owned()),
            found: Some(wwid("naa.6001405d27e5d898829468b90ce4ef8c")),
        }
    );
    let delete = root
        .path()
        .join("devices/platform/host6/session2/target6:0:0/6:0:0:0/delete");
    assert_eq!(std::fs::read_to_string(delete).expect("read"), "1");
}

#[test]
fn by_path_names_from_the_fixtures_decode() {
    let mut decoded = Vec::new();
    for file in std::fs::read_dir(fixture("dev-disk/by-path"))
        .expect("dir")
        .flatten()
    {
        for name in std::fs::read_to_string(file.path()).expect("read").lines() {
            decoded.push((name.to_owned(), ByPath::parse(name)));
        }
    }
    decoded.sort_by(|a, b| a.0.cmp(&b.0));
    let get = |n: &str| {
        decoded
            .iter()
            .find(|(name, _)| name == n)
            .map(|(_, d)| d.clone())
            .expect(n)
    };
    assert_eq!(
        get("abc-0000:41:00.0-fc-0x5005076810213404-lun-0"),
        None,
        "the negative case stays invalid"
    );
    assert_eq!(
        get("pci-0000:41:00.0-fc-0x500a0981891b8dc5-lun-0"),
        Some(ByPath::Fc {
            wwpn: Wwpn::parse("500a0981891b8dc5").expect("wwpn"),
            lun: 0
        })
    );
    assert_eq!(
        get("fc-0x5005076802332ade-lun-2"),
        Some(ByPath::Fc {
            wwpn: Wwpn::parse("5005076802332ade").expect("wwpn"),
            lun: 2
        })
    );
    assert!(matches!(
        get("platform-80040000000.peu0-c0-pci-0000:05:00.2-fc-0x1234567890123456-lun-1"),
        Some(ByPath::Fc { lun: 1, .. })
    ));
    assert_eq!(
        get("ip-10.10.220.253:3260-iscsi-iqn.2000-05.com.3pardata:21810002ac00383d-lun-0"),
        Some(ByPath::Iscsi {
            portal: Portal::parse("10.10.220.253:3260").expect("portal"),
            target: "iqn.2000-05.com.3pardata:21810002ac00383d".to_owned(),
            lun: 0,
        })
    );
    assert!(matches!(
        get(
            "pci-0000:00:00.0-ip-10.9.8.7:3260-iscsi-iqn.2000-05.com.openstack:2180002ac00383d-lun-0"
        ),
        Some(ByPath::Iscsi { lun: 0, .. })
    ));
    // Every other fixture name decodes.
    let failed: Vec<&str> = decoded
        .iter()
        .filter(|(n, d)| d.is_none() && !n.starts_with("abc-"))
        .map(|(n, _)| n.as_str())
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(
        ByPath::parse("ip-127.0.0.1:3260-iscsi-iqn.2016-06.world.srv:storage.target01-lun-0-part1"),
        None
    );
    assert_eq!(
        ByPath::parse("pci-0000:41:00.0-fc-0x500a0981891b8dc5-lun-0x0001000000000000"),
        Some(ByPath::Fc {
            wwpn: Wwpn::parse("500a0981891b8dc5").expect("wwpn"),
            lun: 0x0001_0000_0000_0000
        })
    );
    for bad in [
        "",
        "-lun-0",
        "ip--iscsi--lun-0",
        "fc-0x12-lun-0",
        "ip-1.2.3.4:3260-iscsi-iqn.x-lun-x",
    ] {
        assert_eq!(ByPath::parse(bad), None, "{bad:?}");
    }
}

#[test]
fn hctl_and_scan_address_spellings() {
    assert_eq!(
        Hctl::parse("33:0:10:83").map(|h| (h.host, h.channel, h.target, h.lun)),
        Some((33, 0, 10, 83))
    );
    for bad in ["", "1:2:3", "1:2:3:4:5", "a:0:0:0", "-1:0:0:0"] {
        assert_eq!(Hctl::parse(bad), None, "{bad:?}");
    }
    assert_eq!(ScanAddress::default().to_string(), "- - -");
    assert_eq!(
        ScanAddress {
            channel: Some(0),
            target: None,
            lun: Some(3)
        }
        .to_string(),
        "0 - 3"
    );
}

#[test]
fn a_path_whose_wwid_cannot_be_read_is_not_stale() {
    let t = lab_tree();
    let host = t.host();
    let hctl = Hctl::parse("3:0:0:1").expect("hctl");
    let dev_dir = t
        .sys
        .join("devices/platform/host3/session1/target3:0:0/3:0:0:1");
    // The attribute gone (a path in transition): no proof it is stale.
    std::fs::remove_file(dev_dir.join("wwid")).expect("rm wwid");
    let other = wwid("naa.6001405bbbbbbbbbbbbbbbbbbbbbbbb2");
    assert!(matches!(
        remove_stale_path_at(&host, hctl, &other, |_| None).expect("check"),
        PathAtAddress::Unreadable { .. }
    ));
    assert_eq!(
        std::fs::read_to_string(dev_dir.join("delete")).expect("read"),
        "",
        "not deleted"
    );
}
