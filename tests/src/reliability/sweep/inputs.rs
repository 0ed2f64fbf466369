//! The fixed tables of bad inputs several RPCs share: capabilities, agent
//! targets and WWIDs. (Bad paths depend on the lab: see
//! [`super::fixture::Fixture::bad_paths`].)

use csi_scsi_proto::agent as api;
use csi_scsi_proto::csi::VolumeCapability;

use super::fixture::ARRAY_A;
use super::garbage::{garbage, hex};
use super::requests::{cap_mode, fs_cap, iscsi, mount_cap};
use super::{HUGE, clip};
use crate::lab::{CHAP_USER, Lab};

/// Capabilities every service must refuse as invalid: (case, capability).
pub(super) fn bad_capabilities() -> Vec<(String, VolumeCapability)> {
    let mut no_mode = fs_cap();
    no_mode.access_mode = None;
    let mut no_type = fs_cap();
    no_type.access_type = None;
    vec![
        ("a capability without access mode".into(), no_mode),
        ("access mode UNKNOWN".into(), cap_mode(false, 0)),
        (
            "access mode 99 (not in the enum)".into(),
            cap_mode(false, 99),
        ),
        ("access mode -1".into(), cap_mode(true, -1)),
        ("a capability without access type".into(), no_type),
        ("fs_type zfs".into(), mount_cap("zfs", &[], "")),
        (
            "fs_type ../../bin/sh".into(),
            mount_cap("../../bin/sh", &[], ""),
        ),
        (
            "a 1 MiB fs_type".into(),
            mount_cap(&"x".repeat(HUGE), &[], ""),
        ),
    ]
}

/// Targets the agent must refuse before it logs in anywhere: (case, target).
pub(super) fn bad_targets(lab: &Lab, token: &str) -> Vec<(String, api::Target)> {
    let portal = format!("{}:3260", lab.net.host_ip());
    let iqn = ARRAY_A;
    let chap = Some((CHAP_USER, token));
    vec![
        (
            "a target without transport".into(),
            api::Target {
                name: "array-a".into(),
                transport: None,
            },
        ),
        ("no portals".into(), iscsi("array-a", &[], iqn, chap)),
        (
            "a portal that is no address".into(),
            iscsi("array-a", &["not a portal"], iqn, chap),
        ),
        (
            "port 99999".into(),
            iscsi("array-a", &["198.18.0.1:99999"], iqn, chap),
        ),
        (
            "a portal that looks like an option".into(),
            iscsi("array-a", &["--op=delete"], iqn, chap),
        ),
        (
            "an empty IQN".into(),
            iscsi("array-a", &[&portal], "", chap),
        ),
        (
            "an IQN that looks like an option".into(),
            iscsi("array-a", &[&portal], "--op=delete", chap),
        ),
        (
            "an IQN with a blank".into(),
            iscsi("array-a", &[&portal], "iqn.x:a b", chap),
        ),
        (
            "a 1 MiB IQN".into(),
            iscsi("array-a", &[&portal], &"i".repeat(HUGE), chap),
        ),
        (
            "a CHAP user with a newline".into(),
            iscsi(
                "array-a",
                &[&portal],
                iqn,
                Some(("user\nnode.session.auth.authmethod = None", token)),
            ),
        ),
        (
            "a 1 MiB CHAP secret".into(),
            iscsi(
                "array-a",
                &[&portal],
                iqn,
                Some((CHAP_USER, &token.repeat(HUGE / token.len()))),
            ),
        ),
        (
            "an FC WWPN that is no WWPN".into(),
            api::Target {
                name: "fc-1".into(),
                transport: Some(api::target::Transport::FibreChannel(
                    api::FibreChannelTarget {
                        wwpns: vec!["zz:zz".into()],
                    },
                )),
            },
        ),
    ]
}

/// WWIDs the agent must refuse as malformed: (case, wwid).
pub(super) fn bad_wwids(rng: &mut fastrand::Rng) -> Vec<(String, String)> {
    let g = garbage(rng);
    vec![
        ("an empty WWID".into(), String::new()),
        ("the WWID `sda`".into(), "sda".into()),
        ("naa. with non-hex digits".into(), "naa.zz01".into()),
        (
            "a WWID with a NUL".into(),
            format!("naa.6{}\0", hex(rng, 31)),
        ),
        ("a /dev path".into(), "/dev/sda".into()),
        ("a 1 MiB WWID".into(), format!("naa.{}", "6".repeat(HUGE))),
        (format!("garbage {:?}", clip(&g)), g),
    ]
}
