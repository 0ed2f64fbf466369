//! NodeGetVolumeStats: numbers that match `df`, and a condition that turns
//! abnormal when the filesystem goes read-only, the device disappears or
//! the path is no longer mounted.

use std::path::Path;

use csi_scsi_proto::csi::volume_capability::access_mode::Mode;
use csi_scsi_proto::csi::volume_usage::Unit;
use csi_scsi_proto::csi::{NodeGetVolumeStatsResponse, VolumeUsage};
use tonic::Code;

use super::lab::{Lab, SMALL, assert_code, block_cap, mount_cap, run};

fn usage(r: &NodeGetVolumeStatsResponse, unit: Unit) -> VolumeUsage {
    *r.usage
        .iter()
        .find(|u| u.unit == unit as i32)
        .unwrap_or_else(|| panic!("{unit:?} usage in {r:?}"))
}

/// `df --output=<fields> <path>` as numbers.
fn df(path: &Path, fields: &str, block_size: bool) -> Vec<i64> {
    let mut args = vec![format!("--output={fields}")];
    if block_size {
        args.push("-B1".into());
    }
    args.push(path.display().to_string());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run("df", &args);
    out.lines()
        .nth(1)
        .expect("df data line")
        .split_whitespace()
        .map(|n| n.parse().expect("number"))
        .collect()
}

fn condition(r: &NodeGetVolumeStatsResponse) -> (bool, String) {
    let c = r
        .volume_condition
        .as_ref()
        .expect("VOLUME_CONDITION capability: condition always set");
    (c.abnormal, c.message.clone())
}

#[tokio::test]
async fn filesystem_stats_match_df_and_the_condition_is_normal() {
    let Some(lab) = Lab::start(&[SMALL]).await else {
        return;
    };
    let vol = lab.lun(0).volume_id.as_str();
    let staging = lab.staging("pv-a");
    let target = lab.target("pod-1", "pv-a");
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    lab.stage(vol, &staging, cap.clone()).await.expect("stage");
    lab.publish(vol, &staging, &target, cap, false)
        .await
        .expect("publish");
    std::fs::write(target.join("data"), vec![7u8; 3 << 20]).expect("write 3 MiB");
    for i in 0..50 {
        std::fs::write(target.join(format!("f{i}")), b"x").expect("small file");
    }
    run("sync", &[]);

    let r = lab.stats(vol, &target).await.expect("stats");
    let bytes = usage(&r, Unit::Bytes);
    let want = df(&target, "size,used,avail", true);
    let slack = 4 * 4096;
    for (got, want, what) in [
        (bytes.total, want[0], "size"),
        (bytes.used, want[1], "used"),
        (bytes.available, want[2], "avail"),
    ] {
        assert!(
            (got - want).abs() <= slack,
            "{what}: stats {got}, df {want}"
        );
    }
    assert!(
        bytes.used >= 3 << 20,
        "the 3 MiB written are counted: {bytes:?}"
    );
    let inodes = usage(&r, Unit::Inodes);
    let want = df(&target, "itotal,iused,iavail", false);
    assert_eq!(inodes.total, want[0]);
    assert!(
        (inodes.used - want[1]).abs() <= 2,
        "iused: {} vs {}",
        inodes.used,
        want[1]
    );
    assert!(inodes.used >= 50);
    assert_eq!(condition(&r), (false, "volume is healthy".to_owned()));
    // The staging path reports the same filesystem.
    assert_eq!(
        usage(&lab.stats(vol, &staging).await.expect("stats"), Unit::Bytes).total,
        bytes.total
    );
}

#[tokio::test]
async fn raw_block_stats_report_the_device_size() {
    let Some(lab) = Lab::start(&[SMALL]).await else {
        return;
    };
    let vol = lab.lun(0).volume_id.as_str();
    let staging = lab.block_staging("pv-b");
    let target = lab.block_target("pod-1", "pv-b");
    let cap = block_cap(Mode::SingleNodeWriter);
    lab.stage(vol, &staging, cap.clone()).await.expect("stage");
    lab.publish(vol, &staging, &target, cap, false)
        .await
        .expect("publish");
    let r = lab.stats(vol, &target).await.expect("stats");
    assert_eq!(usage(&r, Unit::Bytes).total, SMALL as i64);
    assert!(!condition(&r).0);
}

#[tokio::test]
async fn the_condition_turns_abnormal_when_the_filesystem_goes_read_only_or_the_device_goes() {
    let Some(lab) = Lab::start(&[SMALL]).await else {
        return;
    };
    let lun = lab.lun(0);
    let vol = lun.volume_id.as_str();
    let staging = lab.staging("pv-a");
    let target = lab.target("pod-1", "pv-a");
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    lab.stage(vol, &staging, cap.clone()).await.expect("stage");
    lab.publish(vol, &staging, &target, cap, false)
        .await
        .expect("publish");

    // What errors=remount-ro does to a failing filesystem.
    run(
        "mount",
        &["-o", "remount,ro", &staging.display().to_string()],
    );
    let (abnormal, message) = condition(&lab.stats(vol, &target).await.expect("stats"));
    assert!(abnormal && message.contains("read-only"), "{message}");
    run(
        "mount",
        &["-o", "remount,rw", &staging.display().to_string()],
    );
    assert!(!condition(&lab.stats(vol, &target).await.expect("stats")).0);

    // The LUN disappears from the node (its path was deleted).
    lab.tree.remove_disk(&lun.name).expect("remove disk");
    let (abnormal, message) = condition(&lab.stats(vol, &target).await.expect("stats"));
    assert!(abnormal && message.contains("gone"), "{message}");
    // kubelet can still clean up after a LUN that is gone.
    lab.unpublish(vol, &target).await.expect("unpublish");
    lab.unstage(vol, &staging).await.expect("unstage");
    assert_eq!(lab.mounts_left(), Vec::<std::path::PathBuf>::new());
}

#[tokio::test]
async fn stats_of_a_path_that_is_not_mounted_are_abnormal_and_of_a_missing_path_not_found() {
    let Some(lab) = Lab::start(&[SMALL]).await else {
        return;
    };
    let vol = lab.lun(0).volume_id.as_str();
    let staging = lab.staging("pv-a");
    let (abnormal, message) = condition(&lab.stats(vol, &staging).await.expect("stats"));
    assert!(abnormal && message.contains("not mounted"), "{message}");
    assert_code(
        lab.stats(vol, &staging.join("missing")).await,
        Code::NotFound,
    );
}
