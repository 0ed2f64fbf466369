use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;
use crate::host::command::CommandRunner;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tools/multipath")
        .join(rel)
}

fn parse_fixture(rel: &str) -> Vec<TopologyMap> {
    parse_topology(&std::fs::read_to_string(fixture(rel)).unwrap_or_else(|e| panic!("{rel}: {e}")))
}

/// `(wwid, alias, dm, vendor, product, size, [(hctl, dev, dm_state, checker, dev_state, group)])`.
type Summary = (
    String,
    Option<String>,
    String,
    String,
    String,
    Option<String>,
    Vec<(String, String, String, String, String, usize)>,
);

fn summary(m: &TopologyMap) -> Summary {
    (
        m.wwid.to_string(),
        m.alias.clone(),
        m.dm_name.clone(),
        m.vendor.clone(),
        m.product.clone(),
        m.size.clone(),
        m.paths
            .iter()
            .map(|p| {
                (
                    p.hctl.to_string(),
                    p.devnode.clone(),
                    p.dm_state.clone().unwrap_or_default(),
                    p.checker_state.clone().unwrap_or_default(),
                    p.device_state.clone().unwrap_or_default(),
                    p.group,
                )
            })
            .collect(),
    )
}

fn path(
    hctl: &str,
    dev: &str,
    states: [&str; 3],
    group: usize,
) -> (String, String, String, String, String, usize) {
    (
        hctl.to_owned(),
        dev.to_owned(),
        states[0].to_owned(),
        states[1].to_owned(),
        states[2].to_owned(),
        group,
    )
}

#[test]
fn huawei_healthy_two_maps_two_paths_each() {
    let maps = parse_fixture("multipath-ll/huawei-xsg1-iscsi-healthy.txt");
    assert_eq!(maps.len(), 2);
    assert_eq!(
        summary(&maps[0]),
        (
            "naa.618cf24100f8f457014a764c000001f6".to_owned(),
            Some("mpathb".to_owned()),
            "dm-3".to_owned(),
            "HUAWEI".to_owned(),
            "XSG1".to_owned(),
            Some("100G".to_owned()),
            vec![
                path("39:0:0:1", "sdd", ["active", "ready", "running"], 0),
                path("38:0:0:1", "sde", ["active", "ready", "running"], 0),
            ],
        )
    );
    assert_eq!(maps[1].dm_name, "dm-5");
    assert_eq!(maps[1].name(), "mpathn");
    // The same map once its LUN was unmapped.
    let failed = parse_fixture("multipath-ll/huawei-xsg1-iscsi-failed-faulty.txt");
    assert_eq!(failed[0].paths[0].dm_state.as_deref(), Some("failed"));
    assert_eq!(failed[0].paths[0].checker_state.as_deref(), Some("faulty"));
}

#[test]
fn alua_groups_and_four_letter_devnodes() {
    let maps = parse_fixture("multipath-ll/ibm-2145-fc-4-paths-openshift.txt");
    assert_eq!(maps.len(), 1);
    let groups: Vec<(String, String, usize)> = maps[0]
        .paths
        .iter()
        .map(|p| (p.hctl.to_string(), p.devnode.clone(), p.group))
        .collect();
    assert_eq!(
        groups,
        [
            ("33:0:10:83".to_owned(), "sdbu".to_owned(), 0),
            ("33:0:7:83".to_owned(), "sdbs".to_owned(), 0),
            ("33:0:1:83".to_owned(), "sdbr".to_owned(), 1),
            ("33:0:8:83".to_owned(), "sdbt".to_owned(), 1),
        ]
    );
    assert_eq!(maps[0].paths[0].dev_t.as_deref(), Some("68:128"));
    let all = parse_fixture("multipath-ll/ibm-2145-fc-all-paths.txt");
    assert_eq!(
        all.iter()
            .map(|m| (m.name(), m.paths.len()))
            .collect::<Vec<_>>(),
        [("mpathv", 4), ("mpathw", 4), ("mpathx", 4)]
    );
    let half = parse_fixture("multipath-ll/ibm-2145-fc-half-paths.txt");
    assert_eq!(
        half.iter().map(|m| m.paths.len()).collect::<Vec<_>>(),
        [2, 2]
    );
}

#[test]
fn maps_named_by_wwid_and_warning_lines() {
    for file in [
        "multipath-ll/ibm-2107900-ds8000.txt",
        "multipath-ll/ibm-2107900-with-scsi_id-error-line.txt",
    ] {
        let maps = parse_fixture(file);
        assert_eq!(maps.len(), 1, "{file}");
        assert_eq!(
            maps[0].wwid.as_str(),
            "naa.6005076303ffc48e0000000000000101"
        );
        assert_eq!(maps[0].alias, None);
        assert_eq!(maps[0].name(), "dm-2");
        assert_eq!(
            (maps[0].vendor.as_str(), maps[0].product.as_str()),
            ("IBM", "2107900")
        );
        assert_eq!(maps[0].paths.len(), 2);
        assert_eq!(maps[0].paths[1].hctl.to_string(), "6:1:0:3");
    }
    let pure = parse_fixture("multipath-ll/pure-flasharray-with-warning-lines.txt");
    assert_eq!(pure.len(), 1);
    assert_eq!(pure[0].dm_name, "dm-84");
    assert_eq!(
        (pure[0].vendor.as_str(), pure[0].product.as_str()),
        ("PURE", "FlashArray")
    );
    assert_eq!(
        pure[0]
            .paths
            .iter()
            .map(|p| p.devnode.as_str())
            .collect::<Vec<_>>(),
        ["sdaa", "sdac"]
    );
    let svc = parse_fixture("multipath-ll/ibm-2145-svc.txt");
    assert_eq!(svc[0].wwid.as_str(), "naa.6005076da00638089c000000000004d5");
    assert_eq!(svc[0].paths.len(), 4);
    let threepar = parse_fixture("multipath-ll/hpe-3par-vv.txt");
    assert_eq!(threepar[0].wwid.as_str(), "naa.50002ac20398383d");
    assert_eq!(threepar[0].size.as_deref(), Some("2.0G"));
}

#[test]
fn multipath_l_without_checker() {
    let maps = parse_fixture("multipath-l/azure-storsimple-4-paths.txt");
    assert_eq!(maps.len(), 1);
    assert_eq!(
        (maps[0].vendor.as_str(), maps[0].product.as_str()),
        ("MSFT", "STORSIMPLE 8100")
    );
    assert_eq!(maps[0].paths.len(), 4);
    assert!(
        maps[0]
            .paths
            .iter()
            .all(|p| p.checker_state.as_deref() == Some("undef"))
    );
    assert_eq!(
        parse_fixture("multipath-l/azure-storsimple-2-paths.txt")[0]
            .paths
            .len(),
        2
    );
}

#[test]
fn doc_example_with_an_untyped_wwid_is_skipped() {
    // "828ce9096eb211eaabc8005056a49b44" has no type digit (edited for a doc).
    assert_eq!(
        parse_fixture("multipath-ll/ibm-2810xiv-iscsi-usage-doc.txt"),
        []
    );
}

#[test]
fn v4_output_with_t10_wwids_and_chatter() {
    let maps =
        parse_fixture("multipath-v4-ll/insights-mixed-rhel6-dell-md36xxi-lio-iet-compellent.txt");
    let names: Vec<(&str, &str, usize)> = maps
        .iter()
        .map(|m| (m.wwid.as_str(), m.dm_name.as_str(), m.paths.len()))
        .collect();
    assert_eq!(
        names,
        [
            ("naa.6f01faf000da360b0000033c528fea6d", "dm-2", 8),
            ("naa.6f01faf000da3761000004323aa6fbce", "dm-4", 8),
            ("naa.6001405b1629f80d52a4c898f8856e43", "dm-5", 2),
            ("t10.IET_00080001", "dm-0", 2),
            ("t10.IET_00080001", "dm-0", 2),
            ("t10.IET_00080002", "dm-8", 2),
            ("t10.IET_00080007", "dm-19", 2),
        ],
        "the made-up 'mpathc (test_with_no_devs)' map is skipped"
    );
    assert_eq!(maps[3].alias.as_deref(), Some("mpatha"));
    assert_eq!(maps[4].alias, None);
    assert_eq!(
        (maps[5].vendor.as_str(), maps[5].product.as_str()),
        ("COMPELNT", "Compellent Vol")
    );
    assert_eq!(
        (maps[2].vendor.as_str(), maps[2].product.as_str()),
        ("LIO-ORG", "block0_sdb")
    );
    // The path table before the first map is not taken for paths.
    assert!(
        maps.iter()
            .all(|m| m.paths.iter().all(|p| p.devnode != "sda"))
    );
    let rhel5 = parse_fixture("multipath-v4-ll/insights-rhel5-v4-verbose-dgc-clariion.txt");
    assert_eq!(rhel5.len(), 1);
    assert_eq!(
        summary(&rhel5[0]),
        (
            "naa.60060160ade32800f2e3baf47665e211".to_owned(),
            Some("L004".to_owned()),
            "dm-9".to_owned(),
            "DGC".to_owned(),
            "RAID 5".to_owned(),
            Some("100G".to_owned()),
            vec![
                path("3:0:1:4", "sdk", ["active", "ready", ""], 0),
                path("5:0:0:4", "sdp", ["active", "ready", ""], 0),
                path("3:0:0:4", "sdf", ["active", "ready", ""], 1),
                path("5:0:1:4", "sdu", ["active", "ready", ""], 1),
            ],
        )
    );
}

#[test]
fn multipathd_sessions_old_format_without_space_before_dm() {
    let maps = parse_fixture("multipathd-show/infinidat-multipathd-sessions-nexsan.txt");
    let got: Vec<(&str, &str, &str, usize)> = maps
        .iter()
        .map(|m| {
            (
                m.wwid.as_str(),
                m.dm_name.as_str(),
                m.vendor.as_str(),
                m.paths.len(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("naa.6000402001f45eb566e79f6d00000000", "dm-0", "NEXSAN", 1),
            ("naa.6000402001f45eb56424ca6800000000", "dm-1", "NEXSAN", 1),
            ("naa.6000402001f45eb566e79fb700000000", "dm-2", "NEXSAN", 1),
            ("naa.6000402001f45eb56424ca6800000000", "dm-0", "NEXSAN", 1),
            ("naa.6000402001f45eb566e79f6d00000000", "dm-1", "NEXSAN", 1),
            ("naa.6000402001f45eb566e79fb700000000", "dm-2", "NEXSAN", 1),
            ("naa.6000402001f45eb56424ca6800000000", "dm-0", "NEXSAN", 1),
            ("naa.6000402001f45eb566e79f6d00000000", "dm-1", "NEXSAN", 1),
            ("naa.6000402001f45eb566e79fb700000000", "dm-2", "NEXSAN", 1),
            // Later sessions: `show maps topology` / `show topology` of one map,
            // new and old formats. (`show maps` table rows have no vendor,product
            // and are not maps.)
            ("naa.6000402001f45eb56424ca6800000000", "dm-0", "NEXSAN", 1),
            ("naa.6000402001f45eb56424ca6800000000", "dm-0", "NEXSAN", 1),
            ("naa.6000402001f45eb56424ca6800000000", "dm-0", "NEXSAN", 1),
            ("naa.6000402001f45eb56424ca6800000000", "dm-0", "NEXSAN", 1),
        ]
    );
    // The source's typo survives as text; nothing panics on it.
    assert_eq!(maps[1].paths[0].checker_state.as_deref(), Some("f\"aulty"));
    assert_eq!(maps[3].size.as_deref(), Some("466G"));
    assert_eq!(maps[3].paths[0].dm_state.as_deref(), Some("active"));
}

#[test]
fn garbage_never_panics() {
    for text in [
        "",
        "dm-0",
        " dm-1 x,y",
        "(a) dm-3 b,c",
        "mpatha () dm-2 ,",
        "3600a0980383030523824476f6b5a4e57 dm-",
        "3600a0980383030523824476f6b5a4e57 dm-x",
        "|- 1:0:0:0",
        "`- 1:0:0:0 sdb",
        "size=",
        "3600a0980383030523824476f6b5a4e57 dm-1 A,B\n|- 1:2:3 sdb 8:16 active\n`- 4294967296:0:0:0 sdc\n| `- 1:0:0:1 sd/x 8:1\n",
        "\u{0}\u{1}dm-9\u{7f}",
    ] {
        let maps = parse_topology(text);
        assert!(
            maps.iter().all(|m| m.paths.is_empty()),
            "{text:?}: {maps:?}"
        );
    }
}

/// A stand-in `multipath` printing `stderr` and exiting with `code`.
fn fake_multipath(code: i32, stderr: &str) -> (tempfile::TempDir, Host) {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("multipath");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"$*\" > '{}/argv'\necho '{stderr}' >&2\nexit {code}\n",
            dir.path().display()
        ),
    )
    .expect("script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let host = Host {
        sysfs: dir.path().join("sys"),
        dev: PathBuf::from("/nonexistent/dev"),
        mountinfo: PathBuf::from("/nonexistent/mountinfo"),
        kubelet_dir: PathBuf::from("/nonexistent/kubelet"),
        iscsi_nodes: std::path::PathBuf::from("/nonexistent/iscsi/nodes"),
        tools: BTreeMap::from([("multipath".to_owned(), script)]),
        runner: CommandRunner::new(Duration::from_secs(5)),
    };
    (dir, host)
}

#[tokio::test]
async fn flush_outcomes() {
    let (dir, host) = fake_multipath(0, "");
    assert_eq!(
        flush(&host, "mpathb").await.expect("flush"),
        FlushOutcome::Flushed
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("argv")).expect("argv"),
        "-f mpathb\n"
    );
    let (_d, host) = fake_multipath(1, "Jun 21 04:39:26 | mpathb: map in use");
    assert!(matches!(
        flush(&host, "mpathb").await,
        Err(MultipathError::MapInUse { .. })
    ));
    let (_d, host) = fake_multipath(1, "Jun 21 04:39:26 | mpathq: not a multipath device");
    assert_eq!(
        flush(&host, "mpathq").await.expect("gone"),
        FlushOutcome::NotPresent
    );
    let (_d, host) = fake_multipath(1, "something else");
    let err = flush(&host, "mpathb").await.expect_err("failed");
    assert_eq!(err.metric_label(), "failed");
    for bad in ["", "-F", "a b"] {
        assert!(
            matches!(
                flush(&host, bad).await,
                Err(MultipathError::InvalidMapName(_))
            ),
            "{bad:?}"
        );
    }
}

#[tokio::test]
async fn topology_runs_multipath_ll() {
    let (dir, host) = fake_multipath(0, "");
    assert_eq!(topology(&host).await.expect("topology"), []);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("argv")).expect("argv"),
        "-ll\n"
    );
    let (_d, host) = fake_multipath(1, "DM multipath kernel driver not loaded");
    assert!(matches!(
        topology(&host).await,
        Err(MultipathError::Failed { code: 1, .. })
    ));
}

#[test]
fn configured_when_the_tool_is_named_or_the_kernel_module_is_loaded() {
    let (dir, mut host) = fake_multipath(0, "");
    assert!(is_configured(&host));
    host.tools.clear();
    assert!(!is_configured(&host));
    std::fs::create_dir_all(dir.path().join("sys/module/dm_multipath")).expect("mkdir");
    assert!(is_configured(&host));
}

#[test]
fn two_word_checker_states_keep_the_device_state() {
    let maps = parse_topology(
        "mpatha (3600140551ec5e8c7a4b4b1e9d6a0b2c1) dm-0 LIO-ORG,disk\n\
         `-+- policy='service-time 0' prio=50 status=active\n\
         \x20 |- 3:0:0:1 sdb 8:16 active i/o pending running\n\
         \x20 `- 4:0:0:1 sdc 8:32 [failed][i/o timeout]\n",
    );
    let states: Vec<_> = maps[0]
        .paths
        .iter()
        .map(|p| (p.checker_state.as_deref(), p.device_state.as_deref()))
        .collect();
    assert_eq!(
        states,
        [
            (Some("i/o pending"), Some("running")),
            (Some("i/o timeout"), None)
        ]
    );
}
