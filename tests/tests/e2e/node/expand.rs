//! NodeExpandVolume after the LUN grew (`losetup -c`, then the tree's
//! rescan): xfs grows online; ext4 grows online only where the kernel lets
//! this agent (CAP_SYS_RESOURCE), and a refusal is reported, never hidden;
//! an ext4 whose LUN grew while it was not staged grows at NodeStage,
//! unmounted.

use std::path::Path;

use csi_scsi_proto::csi::volume_capability::access_mode::Mode;
use tonic::Code;

use super::lab::{Lab, SMALL, XFS_SIZE, assert_code, block_cap, mount_cap};

/// Filesystem size as `statvfs` (df) sees it.
fn fs_size(path: &Path) -> u64 {
    let st = nix::sys::statvfs::statvfs(path).expect("statvfs");
    st.blocks() * st.fragment_size()
}

#[tokio::test]
async fn a_mounted_xfs_grows_online_after_its_lun_grew() {
    let Some(lab) = Lab::start(&[XFS_SIZE]).await else {
        return;
    };
    let lun = lab.lun(0);
    let vol = lun.volume_id.as_str();
    let staging = lab.staging("pv-a");
    let target = lab.target("pod-1", "pv-a");
    let cap = mount_cap("xfs", Mode::SingleNodeWriter);
    lab.stage(vol, &staging, cap.clone()).await.expect("stage");
    lab.publish(vol, &staging, &target, cap, false)
        .await
        .expect("publish");
    std::fs::write(target.join("before.txt"), b"kept across the grow").expect("write");
    let before = fs_size(&target);

    let grown: u64 = 512 << 20;
    lab.grow_lun(0, grown);
    for _ in 0..2 {
        let size = lab
            .expand(vol, &target, &staging, grown as i64)
            .await
            .expect("expand");
        assert_eq!(size, grown as i64);
    }
    let after = fs_size(&target);
    assert!(
        after > before + (150 << 20),
        "xfs grew: {before} -> {after}"
    );
    assert_eq!(
        std::fs::read(target.join("before.txt")).expect("read"),
        b"kept across the grow"
    );
}

#[tokio::test]
async fn growing_a_mounted_ext4_either_really_grows_or_says_why_not() {
    let Some(lab) = Lab::start(&[SMALL]).await else {
        return;
    };
    let lun = lab.lun(0);
    let vol = lun.volume_id.as_str();
    let staging = lab.staging("pv-a");
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    lab.stage(vol, &staging, cap).await.expect("stage");
    // Nothing to grow yet: success, whatever the kernel allows.
    assert_eq!(
        lab.expand(vol, &staging, &staging, 0)
            .await
            .expect("no-op expand"),
        SMALL as i64
    );
    let before = fs_size(&staging);

    let grown: u64 = 128 << 20;
    lab.grow_lun(0, grown);
    match lab.expand(vol, &staging, &staging, grown as i64).await {
        // A machine where the agent has CAP_SYS_RESOURCE: it really grew.
        Ok(size) => {
            assert_eq!(size, grown as i64);
            assert!(fs_size(&staging) > before + (40 << 20), "ext4 grew online");
        }
        // This machine: root lacks CAP_SYS_RESOURCE, the kernel refuses.
        Err(status) => {
            eprintln!(
                "online ext4 grow refused, as expected without CAP_SYS_RESOURCE: {}",
                status.message()
            );
            assert_eq!(
                status.code(),
                Code::FailedPrecondition,
                "{}",
                status.message()
            );
            assert!(
                status.message().contains("CAP_SYS_RESOURCE"),
                "{}",
                status.message()
            );
            assert!(
                status.message().contains("not grown"),
                "{}",
                status.message()
            );
            assert_eq!(fs_size(&staging), before, "nothing pretends it grew");
        }
    }
}

#[tokio::test]
async fn an_ext4_whose_lun_grew_while_unstaged_grows_at_stage_before_it_is_mounted() {
    let Some(lab) = Lab::start(&[SMALL]).await else {
        return;
    };
    let lun = lab.lun(0);
    let vol = lun.volume_id.as_str();
    let staging = lab.staging("pv-a");
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    lab.stage(vol, &staging, cap.clone()).await.expect("stage");
    std::fs::write(staging.join("kept.txt"), b"kept across the offline grow").expect("write");
    let before = fs_size(&staging);
    lab.unstage(vol, &staging).await.expect("unstage");

    // The array grows the LUN while no Pod uses it (an offline expansion).
    let grown: u64 = 128 << 20;
    lab.grow_lun(0, grown);
    lab.stage(vol, &staging, cap)
        .await
        .expect("stage after the grow");
    let after = fs_size(&staging);
    assert!(
        after > before + (40 << 20),
        "the unmounted ext4 grew at stage (no online resize needed): {before} -> {after}"
    );
    assert_eq!(
        std::fs::read(staging.join("kept.txt")).expect("read"),
        b"kept across the offline grow"
    );
    // kubelet's NodeExpandVolume after it: nothing left to grow, success
    // even where the kernel refuses an online grow.
    assert_eq!(
        lab.expand(vol, &staging, &staging, grown as i64)
            .await
            .expect("expand after the offline grow"),
        grown as i64
    );
    assert_eq!(fs_size(&staging), after);
}

#[tokio::test]
async fn expanding_beyond_the_lun_size_is_out_of_range() {
    let Some(lab) = Lab::start(&[SMALL]).await else {
        return;
    };
    let vol = lab.lun(0).volume_id.as_str();
    let staging = lab.staging("pv-a");
    lab.stage(vol, &staging, mount_cap("ext4", Mode::SingleNodeWriter))
        .await
        .expect("stage");
    let msg = assert_code(
        lab.expand(vol, &staging, &staging, 2 * SMALL as i64).await,
        Code::OutOfRange,
    );
    assert!(msg.contains("has not grown"), "{msg}");
}

#[tokio::test]
async fn expanding_a_raw_block_volume_reports_the_new_device_size() {
    let Some(lab) = Lab::start(&[SMALL]).await else {
        return;
    };
    let lun = lab.lun(0);
    let vol = lun.volume_id.as_str();
    let staging = lab.block_staging("pv-b");
    let target = lab.block_target("pod-1", "pv-b");
    let cap = block_cap(Mode::SingleNodeWriter);
    lab.stage(vol, &staging, cap.clone()).await.expect("stage");
    lab.publish(vol, &staging, &target, cap, false)
        .await
        .expect("publish");
    lab.grow_lun(0, 96 << 20);
    assert_eq!(
        lab.expand(vol, &target, &staging, 0).await.expect("expand"),
        96 << 20
    );
}
