//! The whole driver through the lab harness: real processes in network
//! namespaces, real mTLS, real iSCSI against tgtd, loop-device LUNs.

use std::collections::HashMap;
use std::time::Duration;

use csi_scsi_proto::csi::volume_capability::access_mode::Mode;
use csi_scsi_proto::csi::*;
use csi_scsi_tests::lab::scenario::{
    self, Clients, attach_and_mount, capability, create, unmount_and_detach,
};
use csi_scsi_tests::lab::{Lab, LabConfig, down};
use tempfile::TempDir;
use tonic::Code;

/// A running lab in a temp dir, discovery done.
pub async fn lab() -> (TempDir, Lab, Clients) {
    lab_with(|_| {}).await
}

/// A lab with a tweaked config.
pub async fn lab_with(tweak: impl FnOnce(&mut LabConfig)) -> (TempDir, Lab, Clients) {
    csi_scsi_certs::install_crypto_provider();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = LabConfig::for_test(&dir.path().join("lab"));
    tweak(&mut config);
    let lab = Lab::up(config, &mut |_| {}).await.expect("lab up");
    let mut cl = Clients::connect(&lab).await.expect("clients");
    // Discovery: all five LUNs, 3.5 GiB (the multipath one counted once).
    let mut have = 0;
    for _ in 0..1200 {
        have = scenario::capacity(&mut cl.controller, None, "")
            .await
            .expect("capacity");
        if have == 7 << 29 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(have, 7 << 29, "discovery");
    (dir, lab, cl)
}

fn code<T: std::fmt::Debug>(r: Result<T, tonic::Status>) -> Code {
    match r {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

#[tokio::test]
async fn the_volume_lifecycle_runs_end_to_end() {
    let (_dir, mut lab, _cl) = lab().await;
    let report = scenario::run(&mut lab).await.expect("life cycle");
    assert_eq!(report.steps.len(), 14);
}

#[tokio::test]
async fn two_nodes_racing_to_publish_a_single_writer_volume_one_wins() {
    let (_dir, _lab, mut cl) = lab().await;
    let vol = create(
        &mut cl,
        "race",
        100 << 20,
        false,
        &[("deviceSelector", "array=a")],
        "node-a",
    )
    .await
    .expect("create");
    let publish = |node: &str| {
        let mut c = cl.controller.clone();
        let req = ControllerPublishVolumeRequest {
            volume_id: vol.volume_id.clone(),
            node_id: node.to_owned(),
            volume_capability: Some(capability(false, "xfs", Mode::SingleNodeWriter)),
            readonly: false,
            secrets: HashMap::new(),
            volume_context: HashMap::new(),
        };
        async move { c.controller_publish_volume(req).await }
    };
    let (a, b) = tokio::join!(publish("node-a"), publish("node-b"));
    let mut codes = [code(a), code(b)];
    codes.sort_by_key(|c| *c as i32);
    assert_eq!(codes, [Code::Ok, Code::FailedPrecondition]);
    let v = cl
        .controller
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: vol.volume_id.clone(),
        })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(v.status.expect("status").published_node_ids.len(), 1);
}

#[tokio::test]
async fn an_agent_killed_and_restarted_during_a_publish_ends_published_once() {
    let (_dir, mut lab, mut cl) = lab().await;
    let vol = create(
        &mut cl,
        "restart",
        100 << 20,
        false,
        &[("deviceSelector", "array=a")],
        "node-a",
    )
    .await
    .expect("create");
    lab.kill_agent(0);
    let mut c = cl.controller.clone();
    let req = ControllerPublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        node_id: "node-a".into(),
        volume_capability: Some(capability(false, "xfs", Mode::SingleNodeWriter)),
        readonly: false,
        secrets: HashMap::new(),
        volume_context: HashMap::new(),
    };
    let pending = tokio::spawn(async move { c.controller_publish_volume(req).await });
    // The agent comes back while the proxy retries.
    tokio::time::sleep(Duration::from_millis(300)).await;
    lab.restart_agent(0).await.expect("restart");
    let first = pending.await.expect("task");
    if let Err(s) = &first {
        assert_eq!(s.code(), Code::Unavailable, "{s}");
    }
    // Whatever the first outcome, a retry (as the attacher does) attaches.
    let target = attach_and_mount(&lab, &mut cl, &vol, "node-a", false, "p")
        .await
        .expect("publish after restart");
    std::fs::write(target.join("ok"), "ok").expect("write");
    let v = cl
        .controller
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: vol.volume_id.clone(),
        })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(
        v.status.expect("status").published_node_ids,
        vec!["node-a".to_owned()]
    );
    unmount_and_detach(&lab, &mut cl, &vol, "node-a", "p")
        .await
        .expect("cleanup");
}

#[tokio::test]
async fn delete_with_the_node_of_the_last_publish_down_wipes_through_another_node() {
    let (_dir, mut lab, mut cl) = lab().await;
    let vol = create(
        &mut cl,
        "last-node-down",
        100 << 20,
        false,
        &[("deviceSelector", "array=a"), ("cleanup", "zero")],
        "node-a",
    )
    .await
    .expect("create");
    let target = attach_and_mount(&lab, &mut cl, &vol, "node-a", false, "p")
        .await
        .expect("publish");
    std::fs::write(target.join("secret.txt"), "data that must not survive").expect("write");
    unmount_and_detach(&lab, &mut cl, &vol, "node-a", "p")
        .await
        .expect("unpublish");
    lab.kill_agent(0);
    cl.controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: vol.volume_id.clone(),
            secrets: HashMap::new(),
        })
        .await
        .expect("delete through node-b or node-c");
    let (_, file) = scenario::lun_file(&lab, &vol.volume_context["wwid"]).expect("lun file");
    assert!(scenario::all_zero(&file).expect("read"), "LUN zeroed");
}

#[tokio::test]
async fn delete_fails_cleanly_while_no_agent_that_sees_the_lun_answers_then_succeeds() {
    let (_dir, mut lab, mut cl) = lab().await;
    // The FC LUN is zoned to node-b and node-c only.
    let vol = create(
        &mut cl,
        "agents-down",
        100 << 20,
        true,
        &[("deviceSelector", "array=fc")],
        "node-b",
    )
    .await
    .expect("create");
    lab.kill_agent(1);
    lab.kill_agent(2);
    let err = cl
        .controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: vol.volume_id.clone(),
            secrets: HashMap::new(),
        })
        .await
        .expect_err("no agent can wipe");
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    lab.restart_agent(1).await.expect("restart");
    cl.controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: vol.volume_id.clone(),
            secrets: HashMap::new(),
        })
        .await
        .expect("delete after the agent returns");
    // Available again: the same request binds it anew.
    let db = lab.config.dir.join("proxy/inventory.db");
    let dump = std::process::Command::new("sqlite3")
        .arg(&db)
        .arg("select wwid, phase, reason, nodes from devices where target = 'fc-1'")
        .output()
        .expect("sqlite3");
    let dump = String::from_utf8_lossy(&dump.stdout).into_owned();
    create(
        &mut cl,
        "agents-down-2",
        100 << 20,
        true,
        &[("deviceSelector", "array=fc")],
        "node-b",
    )
    .await
    .unwrap_or_else(|e| {
        panic!(
            "rebind: {e:#}\nstore: {dump}\nproxy log:\n{}",
            std::fs::read_to_string(lab.config.dir.join("proxy.log")).unwrap_or_default()
        )
    });
}

#[tokio::test]
async fn lab_down_leaves_nothing_behind() {
    let (dir, lab, _cl) = lab().await;
    let lab_dir = lab.config.dir.clone();
    let prefix = lab.config.prefix.clone();
    drop(lab);
    down(&lab_dir); // twice is fine
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mounts.contains(&lab_dir.display().to_string()),
        "mounts left"
    );
    let loops = std::process::Command::new("losetup")
        .args(["-l", "-n"])
        .output()
        .expect("losetup");
    assert!(
        !String::from_utf8_lossy(&loops.stdout).contains(&lab_dir.display().to_string()),
        "loop devices left"
    );
    let ns = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip");
    assert!(
        !String::from_utf8_lossy(&ns.stdout).contains(&prefix),
        "namespaces left"
    );
    let ps = std::process::Command::new("pgrep")
        .args(["-f", &lab_dir.display().to_string()])
        .output()
        .expect("pgrep");
    assert!(
        ps.stdout.is_empty(),
        "processes left: {}",
        String::from_utf8_lossy(&ps.stdout)
    );
    assert!(!lab_dir.exists());
    drop(dir);
}

#[tokio::test]
async fn a_lun_that_vanishes_while_bound_goes_lost_and_keeps_its_binding() {
    let (_dir, lab, mut cl) = lab().await;
    let vol = create(
        &mut cl,
        "vanishing",
        100 << 20,
        true,
        &[("deviceSelector", "array=fc")],
        "node-b",
    )
    .await
    .expect("create");
    // The array stops exporting the FC LUN: it leaves the fabric, and the
    // kernel drops its paths.
    let fabric_path = lab.config.dir.join("fabric.json");
    let mut fabric = csi_scsi_tests::fabric::Fabric::load(&fabric_path).expect("fabric");
    fabric.fc[0].luns.clear();
    fabric.save(&fabric_path).expect("save");
    for node in &lab.nodes[1..] {
        let block = node.root.join("sys/block");
        for e in std::fs::read_dir(&block).expect("block").flatten() {
            let wwid = std::fs::read_to_string(e.path().join("device/wwid")).unwrap_or_default();
            if wwid.trim() == vol.volume_context["wwid"] {
                std::fs::write(e.path().join("device/delete"), "1").expect("delete");
            }
        }
    }
    let mut abnormal = None;
    for _ in 0..200 {
        let v = cl
            .controller
            .controller_get_volume(ControllerGetVolumeRequest {
                volume_id: vol.volume_id.clone(),
            })
            .await
            .expect("the volume still exists")
            .into_inner();
        let cond = v
            .status
            .and_then(|s| s.volume_condition)
            .expect("condition");
        if cond.abnormal {
            abnormal = Some(cond.message);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let msg = abnormal.expect("the volume turns abnormal after the next discovery");
    assert!(msg.contains("not visible"), "{msg}");
    // Its binding is kept: deleting it later still finds it (and waits).
    let err = cl
        .controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: vol.volume_id.clone(),
            secrets: HashMap::new(),
        })
        .await
        .expect_err("a Lost LUN cannot be wiped");
    assert_eq!(err.code(), Code::Unavailable, "{err}");
}
