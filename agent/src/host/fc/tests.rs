use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;
use crate::host::command::CommandRunner;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

fn host_at(sysfs: &Path) -> Host {
    Host {
        sysfs: sysfs.to_owned(),
        dev: PathBuf::from("/nonexistent/dev"),
        mountinfo: PathBuf::from("/nonexistent/mountinfo"),
        kubelet_dir: PathBuf::from("/nonexistent/kubelet"),
        iscsi_nodes: std::path::PathBuf::from("/nonexistent/iscsi/nodes"),
        tools: BTreeMap::new(),
        runner: CommandRunner::new(Duration::from_secs(5)),
    }
}

fn wwpn(s: &str) -> Wwpn {
    Wwpn::parse(s).expect("test WWPN")
}

#[test]
fn qla2xxx_fixture_lists_two_ports() {
    let hosts = fc_hosts(&host_at(&fixture(
        "sysfs/fc/qla2xxx-qle2562-rhel-infinidat/sys",
    )))
    .expect("fc hosts");
    assert_eq!(hosts.len(), 2);
    assert_eq!(
        hosts[0],
        FcHost {
            host_no: 3,
            port_name: Some(wwpn("0x21000024ff2c4e52")),
            node_name: Some(wwpn("0x20000024ff2c4e52")),
            port_state: Some("Online".to_owned()),
            port_type: Some("Unknown".to_owned()),
            speed: Some("unknown".to_owned()),
        }
    );
    assert_eq!(hosts[1].host_no, 4);
    assert!(hosts.iter().all(|h| h.port_name.is_some()));
    // No remote ports were logged in on that host.
    assert_eq!(
        remote_ports(&host_at(&fixture(
            "sysfs/fc/qla2xxx-qle2562-rhel-infinidat/sys"
        )))
        .expect("rports"),
        []
    );
}

#[test]
fn lpfc_fixture_reads_port_and_speed() {
    let hosts = fc_hosts(&host_at(&fixture("sysfs/fc/lpfc-emulex-procfs/sys"))).expect("fc hosts");
    assert_eq!(hosts.len(), 1);
    assert_eq!(hosts[0].host_no, 0);
    assert_eq!(hosts[0].port_name, Some(wwpn("1000e0071bce95f2")));
    assert_eq!(hosts[0].node_name, Some(wwpn("2000e0071bce95f2")));
    assert_eq!(hosts[0].speed.as_deref(), Some("16 Gbit"));
    assert_eq!(
        hosts[0].port_type.as_deref(),
        Some("Point-To-Point (direct nport connection)")
    );
}

#[test]
fn rport_fixture_maps_the_target_wwpn_to_its_scsi_target() {
    let host = host_at(&fixture("sysfs/fc/rport-assembled-os-brick/sys"));
    let hba = fc_hosts(&host).expect("fc hosts");
    assert_eq!(hba.len(), 1);
    assert_eq!(hba[0].port_name, Some(wwpn("50014380186af83c")));
    let ports = remote_ports(&host).expect("rports");
    assert_eq!(
        ports,
        [RemotePort {
            name: "rport-6:0-1".to_owned(),
            host_no: 6,
            channel: 0,
            port_name: wwpn("0x514f0c50023f6c00"),
            node_name: None,
            port_state: Some("Online".to_owned()),
            roles: Some("FCP Target".to_owned()),
            scsi_target_id: Some(1),
        }]
    );
    // Any spelling of the array's port finds host 6, channel 0, target 1.
    let want = [FcTargetAddress {
        host_no: 6,
        channel: 0,
        target: 1,
    }];
    assert_eq!(
        target_addresses(&host, wwpn("51:4F:0C:50:02:3F:6C:00")).expect("lookup"),
        want
    );
    assert_eq!(
        target_addresses(&host, wwpn("1111111111111111")).expect("lookup"),
        []
    );
}

#[test]
fn fc_transport_class_is_the_fallback_without_scsi_target_id() {
    let root = tempfile::tempdir().expect("tempdir");
    let t = root.path().join("class/fc_transport/target7:0:4");
    std::fs::create_dir_all(&t).expect("mkdir");
    std::fs::write(t.join("port_name"), "0x5005076802332ade\n").expect("write");
    let bad = root.path().join("class/fc_transport/targetX");
    std::fs::create_dir_all(&bad).expect("mkdir");
    std::fs::write(bad.join("port_name"), "0x5005076802332ade\n").expect("write");
    let got = target_addresses(&host_at(root.path()), wwpn("5005076802332ade")).expect("lookup");
    assert_eq!(
        got,
        [FcTargetAddress {
            host_no: 7,
            channel: 0,
            target: 4
        }]
    );
}

#[test]
fn malformed_fc_entries_are_skipped() {
    let root = tempfile::tempdir().expect("tempdir");
    let class = root.path().join("class");
    for (dir, port_name) in [
        ("fc_host/host1", "0x21000024ff2c4e52"),
        ("fc_host/host2", "garbage"),
        ("fc_host/not-a-host", "0x21000024ff2c4e53"),
        ("fc_remote_ports/rport-1:0-0", "0x500a0981891b8dc5"),
        ("fc_remote_ports/rport-1:0-1", "0xffffffff"),
        ("fc_remote_ports/rport-bogus", "0x500a0981891b8dc6"),
    ] {
        std::fs::create_dir_all(class.join(dir)).expect("mkdir");
        std::fs::write(class.join(dir).join("port_name"), port_name).expect("write");
    }
    std::fs::write(
        class.join("fc_remote_ports/rport-1:0-0/scsi_target_id"),
        "-1\n",
    )
    .expect("write");
    let host = host_at(root.path());
    let hosts = fc_hosts(&host).expect("hosts");
    assert_eq!(
        hosts
            .iter()
            .map(|h| (h.host_no, h.port_name.is_some()))
            .collect::<Vec<_>>(),
        [(1, true), (2, false)]
    );
    let ports = remote_ports(&host).expect("rports");
    assert_eq!(ports.len(), 1);
    // -1: logged in but not a SCSI target.
    assert_eq!(ports[0].scsi_target_id, None);
    assert_eq!(
        target_addresses(&host, wwpn("500a0981891b8dc5")).expect("lookup"),
        []
    );
    // No FC at all is not an error.
    assert_eq!(
        fc_hosts(&host_at(Path::new("/nonexistent/sys"))).expect("none"),
        []
    );
}

#[test]
fn issue_lip_writes_the_trigger_and_never_creates_it() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("class/fc_host/host3");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("issue_lip"), "").expect("trigger");
    let host = host_at(root.path());
    issue_lip(&host, 3).expect("lip");
    assert_eq!(
        std::fs::read_to_string(dir.join("issue_lip")).expect("read"),
        "1"
    );
    assert!(issue_lip(&host, 4).is_err());
    assert!(!root.path().join("class/fc_host/host4").exists());
}

#[test]
fn fixture_transcript_port_names_parse() {
    // `cat /sys/class/fc_host/host*/port_name` on an IBM node.
    let text =
        std::fs::read_to_string(fixture("sysfs/fc/cat-fc_host-port_state-port_name-ibm.txt"))
            .expect("read");
    let names: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with("0x"))
        .map(|l| wwpn(l).to_string())
        .collect();
    assert_eq!(names, ["2100f4e9d456d700", "2100f4e9d456d701"]);
    assert_eq!(parse_rport_name("rport-1:0-1"), Some((1, 0)));
    assert_eq!(parse_rport_name("rport-1:0"), None);
}
