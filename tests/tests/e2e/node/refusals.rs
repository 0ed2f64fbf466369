//! What the Node service refuses, with the spec's codes, and what it leaves
//! untouched when it does.

use std::collections::HashMap;

use csi_scsi_proto::csi::volume_capability::access_mode::Mode;
use tonic::Code;

use super::lab::{Lab, SMALL, XFS_SIZE, assert_code, blkid, block_cap, is_mounted, mount_cap, run};

#[tokio::test]
async fn a_device_with_a_foreign_filesystem_is_refused_and_left_untouched() {
    let Some(lab) = Lab::start(&[SMALL, XFS_SIZE]).await else {
        return;
    };
    let ext2 = lab.lun(0);
    let xfs = lab.lun(1);
    run(
        "mkfs.ext2",
        &["-q", &ext2.backing.device.display().to_string()],
    );
    run(
        "mkfs.xfs",
        &["-q", &xfs.backing.device.display().to_string()],
    );
    let before = [blkid(&ext2.backing.device), blkid(&xfs.backing.device)];

    let staging = lab.staging("pv-a");
    let msg = assert_code(
        lab.stage(
            &ext2.volume_id,
            &staging,
            mount_cap("ext4", Mode::SingleNodeWriter),
        )
        .await,
        Code::FailedPrecondition,
    );
    assert!(
        msg.contains("ext2") && msg.contains("never reformatted"),
        "{msg}"
    );
    let msg = assert_code(
        lab.stage(
            &xfs.volume_id,
            &staging,
            mount_cap("", Mode::SingleNodeWriter),
        )
        .await,
        Code::FailedPrecondition,
    );
    assert!(msg.contains("xfs"), "{msg}");

    assert_eq!(
        [blkid(&ext2.backing.device), blkid(&xfs.backing.device)],
        before,
        "signatures untouched"
    );
    assert!(!is_mounted(&staging));
    assert_eq!(lab.mkfs_count(), 0);
}

#[tokio::test]
async fn staging_another_volume_on_a_staged_path_already_exists() {
    let Some(lab) = Lab::start(&[SMALL, SMALL]).await else {
        return;
    };
    let staging = lab.staging("pv-a");
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    lab.stage(&lab.lun(0).volume_id, &staging, cap.clone())
        .await
        .expect("stage");
    assert_code(
        lab.stage(&lab.lun(1).volume_id, &staging, cap.clone())
            .await,
        Code::AlreadyExists,
    );
    // The same volume with another filesystem type is incompatible too.
    assert_code(
        lab.stage(
            &lab.lun(0).volume_id,
            &staging,
            mount_cap("xfs", Mode::SingleNodeWriter),
        )
        .await,
        Code::AlreadyExists,
    );
    assert_code(
        lab.stage(
            &lab.lun(0).volume_id,
            &staging,
            block_cap(Mode::SingleNodeWriter),
        )
        .await,
        Code::AlreadyExists,
    );
    assert!(
        blkid(&lab.lun(1).backing.device).is_empty(),
        "the other LUN is not formatted"
    );
}

#[tokio::test]
async fn unstaging_a_volume_that_is_still_published_fails_with_failed_precondition() {
    let Some(lab) = Lab::start(&[SMALL]).await else {
        return;
    };
    let vol = lab.lun(0).volume_id.as_str();
    let staging = lab.staging("pv-a");
    let target = lab.target("pod-1", "pv-a");
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    lab.stage(vol, &staging, cap.clone()).await.expect("stage");
    lab.publish(vol, &staging, &target, cap.clone(), false)
        .await
        .expect("publish");
    let msg = assert_code(lab.unstage(vol, &staging).await, Code::FailedPrecondition);
    assert!(msg.contains(&target.display().to_string()), "{msg}");
    assert!(
        is_mounted(&staging) && is_mounted(&target),
        "nothing unmounted"
    );
    lab.unpublish(vol, &target).await.expect("unpublish");
    lab.unstage(vol, &staging).await.expect("unstage");
}

#[tokio::test]
async fn unstaging_a_raw_block_volume_that_is_still_published_fails_with_failed_precondition() {
    let Some(lab) = Lab::start(&[SMALL]).await else {
        return;
    };
    let vol = lab.lun(0).volume_id.as_str();
    let staging = lab.block_staging("pv-b");
    let target = lab.block_target("pod-1", "pv-b");
    let cap = block_cap(Mode::SingleNodeWriter);
    lab.stage(vol, &staging, cap.clone()).await.expect("stage");
    lab.publish(vol, &staging, &target, cap.clone(), false)
        .await
        .expect("publish");
    assert_code(lab.unstage(vol, &staging).await, Code::FailedPrecondition);
    assert!(is_mounted(&target));
    lab.unpublish(vol, &target).await.expect("unpublish");
    lab.unstage(vol, &staging).await.expect("unstage");
}

#[tokio::test]
async fn publishing_a_volume_that_is_not_staged_fails_with_failed_precondition() {
    let Some(lab) = Lab::start(&[SMALL]).await else {
        return;
    };
    let vol = lab.lun(0).volume_id.as_str();
    let staging = lab.staging("pv-a");
    let target = lab.target("pod-1", "pv-a");
    assert_code(
        lab.publish(
            vol,
            &staging,
            &target,
            mount_cap("ext4", Mode::SingleNodeWriter),
            false,
        )
        .await,
        Code::FailedPrecondition,
    );
    let no_staging = lab
        .client
        .clone()
        .node_publish_volume(csi_scsi_proto::csi::NodePublishVolumeRequest {
            volume_id: vol.to_owned(),
            target_path: target.display().to_string(),
            volume_capability: Some(mount_cap("ext4", Mode::SingleNodeWriter)),
            ..Default::default()
        })
        .await;
    assert_code(no_staging, Code::FailedPrecondition);
    assert!(!target.exists() && blkid(&lab.lun(0).backing.device).is_empty());
}

#[tokio::test]
async fn republishing_at_the_same_target_with_another_readonly_flag_already_exists() {
    let Some(lab) = Lab::start(&[SMALL]).await else {
        return;
    };
    let vol = lab.lun(0).volume_id.as_str();
    let staging = lab.staging("pv-a");
    let target = lab.target("pod-1", "pv-a");
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    lab.stage(vol, &staging, cap.clone()).await.expect("stage");
    lab.publish(vol, &staging, &target, cap.clone(), false)
        .await
        .expect("publish");
    assert_code(
        lab.publish(vol, &staging, &target, cap.clone(), true).await,
        Code::AlreadyExists,
    );
    lab.unpublish(vol, &target).await.expect("unpublish");
    lab.unstage(vol, &staging).await.expect("unstage");
}

#[tokio::test]
async fn a_second_target_for_a_single_writer_volume_fails_with_failed_precondition() {
    let Some(lab) = Lab::start(&[SMALL]).await else {
        return;
    };
    let vol = lab.lun(0).volume_id.as_str();
    let staging = lab.staging("pv-a");
    let first = lab.target("pod-1", "pv-a");
    let second = lab.target("pod-2", "pv-a");
    for mode in [Mode::SingleNodeSingleWriter, Mode::SingleNodeWriter] {
        let cap = mount_cap("ext4", mode);
        lab.stage(vol, &staging, cap.clone()).await.expect("stage");
        lab.publish(vol, &staging, &first, cap.clone(), false)
            .await
            .expect("publish");
        assert_code(
            lab.publish(vol, &staging, &second, cap.clone(), false)
                .await,
            Code::FailedPrecondition,
        );
        assert!(!is_mounted(&second));
        lab.unpublish(vol, &first).await.expect("unpublish");
    }
    lab.unstage(vol, &staging).await.expect("unstage");
}

#[tokio::test]
async fn publishing_a_filesystem_volume_as_raw_block_is_an_invalid_argument() {
    let Some(lab) = Lab::start(&[SMALL]).await else {
        return;
    };
    let vol = lab.lun(0).volume_id.as_str();
    let staging = lab.staging("pv-a");
    lab.stage(vol, &staging, mount_cap("ext4", Mode::SingleNodeWriter))
        .await
        .expect("stage");
    let msg = assert_code(
        lab.publish(
            vol,
            &staging,
            &lab.block_target("pod-1", "pv-a"),
            block_cap(Mode::SingleNodeWriter),
            false,
        )
        .await,
        Code::InvalidArgument,
    );
    assert!(msg.contains("volume_capability"), "{msg}");
    lab.unstage(vol, &staging).await.expect("unstage");
}

#[tokio::test]
async fn a_multi_node_mode_for_a_filesystem_exceeds_capabilities() {
    let Some(lab) = Lab::start(&[SMALL]).await else {
        return;
    };
    let staging = lab.staging("pv-a");
    assert_code(
        lab.stage(
            &lab.lun(0).volume_id,
            &staging,
            mount_cap("ext4", Mode::MultiNodeMultiWriter),
        )
        .await,
        Code::FailedPrecondition,
    );
    assert!(blkid(&lab.lun(0).backing.device).is_empty());
    // Raw block may be shared by several nodes.
    lab.stage(
        &lab.lun(0).volume_id,
        &lab.block_staging("pv-a"),
        block_cap(Mode::MultiNodeMultiWriter),
    )
    .await
    .expect("multi-node block");
}

#[tokio::test]
async fn mkfs_options_come_only_from_the_allow_list() {
    let Some(lab) = Lab::start(&[SMALL]).await else {
        return;
    };
    let lun = lab.lun(0);
    let staging = lab.staging("pv-a");
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let forced = HashMap::from([("mkfsOptions".to_owned(), "-F -O ^has_journal".to_owned())]);
    let msg = assert_code(
        lab.stage_with(&lun.volume_id, &staging, cap.clone(), forced)
            .await,
        Code::InvalidArgument,
    );
    assert!(msg.contains("\"-F\""), "{msg}");
    assert!(blkid(&lun.backing.device).is_empty(), "nothing formatted");

    let labelled = HashMap::from([("mkfsOptions".to_owned(), "-L lab-data -m 0".to_owned())]);
    lab.stage_with(&lun.volume_id, &staging, cap, labelled)
        .await
        .expect("stage");
    assert_eq!(
        blkid(&lun.backing.device).get("LABEL").map(String::as_str),
        Some("lab-data")
    );
    lab.unstage(&lun.volume_id, &staging)
        .await
        .expect("unstage");
}

/// Injects EIO into every read the agent (and what it spawns) makes of
/// `paths`, with strace, until dropped.
struct ReadErrors(std::process::Child);

impl ReadErrors {
    fn inject(pid: u32, paths: &[&std::path::Path]) -> Self {
        let mut args: Vec<String> = vec![
            "-f".into(),
            "-p".into(),
            pid.to_string(),
            "-o".into(),
            "/dev/null".into(),
        ];
        for p in paths {
            args.push("-P".into());
            args.push(p.display().to_string());
        }
        args.push("-e".into());
        args.push("inject=read,pread64,readv,preadv,preadv2:error=EIO".into());
        let mut child = std::process::Command::new("strace")
            .args(&args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("strace (install it: .ci/packages)");
        // Wait until it is attached.
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stderr));
        assert!(
            lines.any(|l| l.is_ok_and(|l| l.contains("attached"))),
            "strace did not attach to the agent"
        );
        std::thread::spawn(move || for _ in lines {});
        Self(child)
    }
}

impl Drop for ReadErrors {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn a_read_error_during_stage_is_unavailable_and_formats_nothing() {
    let Some(lab) = Lab::start(&[SMALL]).await else {
        return;
    };
    let lun = lab.lun(0);
    // A volume that holds data: an ext4 made and filled outside the agent.
    let dev = lun.backing.device.display().to_string();
    run("mkfs.ext4", &["-q", &dev]);
    let before = blkid(&lun.backing.device);
    let node = std::fs::canonicalize(lab.tree.dev().join(&lun.name)).expect("node");
    let staging = lab.staging("pv-eio");
    {
        let _eio = ReadErrors::inject(lab.agent.daemon.pid(), &[&node, &lun.backing.device]);
        let msg = assert_code(
            lab.stage(
                &lun.volume_id,
                &staging,
                mount_cap("ext4", Mode::SingleNodeWriter),
            )
            .await,
            Code::Unavailable,
        );
        assert!(
            msg.contains("not ready") && msg.contains("nothing was written"),
            "{msg}"
        );
    }
    assert_eq!(
        blkid(&lun.backing.device),
        before,
        "the filesystem is untouched"
    );
    assert_eq!(lab.mkfs_count(), 0, "nothing was formatted");
    assert!(!is_mounted(&staging));
    // Healed: the same call stages the volume that was there all along.
    lab.stage(
        &lun.volume_id,
        &staging,
        mount_cap("ext4", Mode::SingleNodeWriter),
    )
    .await
    .expect("stage once the reads work");
    assert_eq!(lab.mkfs_count(), 0);
    lab.unstage(&lun.volume_id, &staging)
        .await
        .expect("unstage");
}

#[tokio::test]
async fn a_blank_lun_that_reports_another_wwid_when_rescanned_is_never_formatted() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let Some(mut lab) = Lab::start(&[SMALL]).await else {
        return;
    };
    lab.stop_kernel();
    let lun = lab.lun(0);
    let device = lab.tree.sys().join("block").join(&lun.name).join("device");
    // The kernel's part, played here: a rescan re-reads INQUIRY, and the
    // array now has another LUN at this number.
    let stop = Arc::new(AtomicBool::new(false));
    let kernel = {
        let (device, stop) = (device.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let rescan = std::fs::read_to_string(device.join("rescan")).unwrap_or_default();
                if !rescan.trim().is_empty() {
                    std::fs::write(
                        device.join("wwid"),
                        "naa.6001405ffffffffffffffffffffffff1\n",
                    )
                    .expect("new identity");
                    std::fs::write(device.join("rescan"), "").expect("consumed");
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        })
    };
    let staging = lab.staging("pv-reused");
    let msg = assert_code(
        lab.stage(
            &lun.volume_id,
            &staging,
            mount_cap("ext4", Mode::SingleNodeWriter),
        )
        .await,
        Code::FailedPrecondition,
    );
    stop.store(true, Ordering::Relaxed);
    kernel.join().expect("kernel thread");
    assert!(
        msg.contains("naa.6001405ffffffffffffffffffffffff1"),
        "{msg}"
    );
    assert_eq!(lab.mkfs_count(), 0, "never formatted");
    assert!(blkid(&lun.backing.device).is_empty(), "still blank");
    assert!(!is_mounted(&staging));
}
