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
