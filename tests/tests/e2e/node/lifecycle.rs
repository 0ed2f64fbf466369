//! The whole life of a volume on a node: stage, publish read-write and
//! read-only, write, unpublish, unstage; every call made twice to prove it
//! is idempotent; and restaging keeps what was written.

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use csi_scsi_proto::csi::volume_capability::access_mode::Mode;

use super::lab::{Lab, SMALL, XFS_SIZE, blkid, block_cap, is_mounted, mount_cap};

const HELLO: &[u8] = b"written through the read-write publication";

async fn filesystem_life_cycle(fs: &str, size: u64) {
    let Some(lab) = Lab::start(&[size]).await else {
        return;
    };
    let lun = lab.lun(0);
    let vol = lun.volume_id.as_str();
    let staging = lab.staging("pv-a");
    let cap = mount_cap(fs, Mode::SingleNodeMultiWriter);

    for _ in 0..2 {
        lab.stage(vol, &staging, cap.clone()).await.expect("stage");
    }
    assert!(is_mounted(&staging));
    assert_eq!(
        blkid(&lun.backing.device).get("TYPE").map(String::as_str),
        Some(fs)
    );
    assert_eq!(lab.mkfs_count(), 1, "formatted once");

    let rw = lab.target("pod-1", "pv-a");
    let ro = lab.target("pod-2", "pv-a");
    for _ in 0..2 {
        lab.publish(vol, &staging, &rw, cap.clone(), false)
            .await
            .expect("publish rw");
    }
    std::fs::write(rw.join("hello.txt"), HELLO).expect("write through rw");
    for _ in 0..2 {
        lab.publish(vol, &staging, &ro, cap.clone(), true)
            .await
            .expect("publish ro");
    }
    assert_eq!(
        std::fs::read(ro.join("hello.txt")).expect("read through ro"),
        HELLO
    );
    let refused = std::fs::write(ro.join("nope"), b"x").expect_err("read-only publication");
    assert_eq!(
        refused.raw_os_error(),
        Some(nix::errno::Errno::EROFS as i32)
    );

    for target in [&rw, &ro] {
        for _ in 0..2 {
            lab.unpublish(vol, target).await.expect("unpublish");
        }
        assert!(!target.exists(), "the plugin removes the target it created");
    }
    for _ in 0..2 {
        lab.unstage(vol, &staging).await.expect("unstage");
    }
    assert!(!is_mounted(&staging));
    assert!(
        staging.exists(),
        "the staging directory is kubelet's and stays"
    );
    assert_eq!(lab.mounts_left(), Vec::<std::path::PathBuf>::new());
    assert!(
        !lab.agent.daemon.log().contains("hunter2"),
        "secrets are never logged"
    );
}

#[tokio::test]
async fn ext4_volume_is_staged_published_written_unpublished_and_unstaged_idempotently() {
    filesystem_life_cycle("ext4", SMALL).await;
}

#[tokio::test]
async fn xfs_volume_is_staged_published_written_unpublished_and_unstaged_idempotently() {
    filesystem_life_cycle("xfs", XFS_SIZE).await;
}

#[tokio::test]
async fn raw_block_volume_is_published_as_its_device_node_idempotently() {
    let Some(lab) = Lab::start(&[SMALL]).await else {
        return;
    };
    let lun = lab.lun(0);
    let vol = lun.volume_id.as_str();
    let staging = lab.block_staging("pv-b");
    let cap = block_cap(Mode::SingleNodeMultiWriter);

    for _ in 0..2 {
        lab.stage(vol, &staging, cap.clone()).await.expect("stage");
    }
    assert!(!is_mounted(&staging), "raw block has no staging mount");
    assert!(blkid(&lun.backing.device).is_empty(), "nothing formatted");

    let rw = lab.block_target("pod-1", "pv-b");
    let ro = lab.block_target("pod-2", "pv-b");
    for _ in 0..2 {
        lab.publish(vol, &staging, &rw, cap.clone(), false)
            .await
            .expect("publish rw");
    }
    let meta = std::fs::metadata(&rw).expect("target");
    assert!(meta.file_type().is_block_device());
    assert_eq!(
        meta.rdev(),
        std::fs::metadata(&lun.backing.device).expect("loop").rdev()
    );

    // Write through the publication, read the LUN's backing device.
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    let mut dev = std::fs::OpenOptions::new()
        .write(true)
        .open(&rw)
        .expect("open rw target");
    dev.seek(SeekFrom::Start(8192)).expect("seek");
    dev.write_all(&pattern).expect("write");
    dev.sync_all().expect("sync");
    drop(dev);
    let mut back = vec![0u8; 4096];
    let mut loopdev = std::fs::File::open(&lun.backing.device).expect("open loop");
    loopdev.seek(SeekFrom::Start(8192)).expect("seek");
    loopdev.read_exact(&mut back).expect("read");
    assert_eq!(back, pattern);

    for _ in 0..2 {
        lab.publish(vol, &staging, &ro, cap.clone(), true)
            .await
            .expect("publish ro");
    }
    assert!(is_mounted(&ro));

    for target in [&rw, &ro] {
        for _ in 0..2 {
            lab.unpublish(vol, target).await.expect("unpublish");
        }
        assert!(
            !target.exists(),
            "the plugin removes the target file it created"
        );
    }
    for _ in 0..2 {
        lab.unstage(vol, &staging).await.expect("unstage");
    }
    assert!(staging.exists());
    assert_eq!(
        std::fs::read_dir(&staging).expect("staging").count(),
        0,
        "the staging record is gone"
    );
    assert_eq!(lab.mounts_left(), Vec::<std::path::PathBuf>::new());
}

#[tokio::test]
async fn restaging_an_already_formatted_volume_keeps_its_data() {
    let Some(lab) = Lab::start(&[SMALL]).await else {
        return;
    };
    let lun = lab.lun(0);
    let vol = lun.volume_id.as_str();
    let staging = lab.staging("pv-a");
    let target = lab.target("pod-1", "pv-a");
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);

    lab.stage(vol, &staging, cap.clone()).await.expect("stage");
    lab.publish(vol, &staging, &target, cap.clone(), false)
        .await
        .expect("publish");
    std::fs::write(target.join("keep.txt"), HELLO).expect("write");
    let uuid = blkid(&lun.backing.device).get("UUID").cloned();
    lab.unpublish(vol, &target).await.expect("unpublish");
    lab.unstage(vol, &staging).await.expect("unstage");

    lab.stage(vol, &staging, cap.clone())
        .await
        .expect("restage");
    lab.publish(vol, &staging, &target, cap.clone(), false)
        .await
        .expect("republish");
    assert_eq!(std::fs::read(target.join("keep.txt")).expect("read"), HELLO);
    assert_eq!(
        blkid(&lun.backing.device).get("UUID").cloned(),
        uuid,
        "same filesystem"
    );
    assert_eq!(lab.mkfs_count(), 1, "never reformatted");
}
