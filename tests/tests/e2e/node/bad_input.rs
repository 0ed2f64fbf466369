//! Bad input: each gets the spec's code, and nothing is formatted, mounted
//! or unmounted because of it.

use std::path::{Path, PathBuf};

use csi_scsi_proto::csi::volume_capability::access_mode::Mode;
use tonic::Code;

use super::lab::{Lab, SMALL, assert_code, blkid, is_mounted, mount_cap};

#[tokio::test]
async fn paths_outside_the_kubelet_dir_are_invalid_arguments_and_hold_no_volume_for_lookups() {
    let Some(lab) = Lab::start(&[SMALL]).await else {
        return;
    };
    let vol = lab.lun(0).volume_id.as_str();
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let outside = lab.env.path("outside");
    std::fs::create_dir_all(&outside).expect("outside dir");
    // A symlink planted inside the kubelet dir that leads out of it.
    let escape = lab.kubelet.join("plugins/escape");
    std::fs::create_dir_all(escape.parent().expect("parent")).expect("mkdir");
    std::os::unix::fs::symlink(&outside, &escape).expect("symlink");

    let k = lab.kubelet.display().to_string();
    let bad: Vec<PathBuf> = vec![
        PathBuf::from(format!("{k}/../etc")),
        PathBuf::from(format!("{k}/plugins/../../outside")),
        PathBuf::from(format!("{k}/missing/../../outside/globalmount")),
        outside.join("globalmount"),
        PathBuf::from("/etc"),
        escape.join("globalmount"),
        escape.clone(),
        lab.kubelet.clone(),
        PathBuf::from("relative/globalmount"),
    ];
    for path in &bad {
        let msg = assert_code(
            lab.stage(vol, path, cap.clone()).await,
            Code::InvalidArgument,
        );
        assert!(
            msg.contains("staging_target_path"),
            "{}: {msg}",
            path.display()
        );
        let good_staging = lab.staging("pv-a");
        let msg = assert_code(
            lab.publish(vol, &good_staging, path, cap.clone(), false)
                .await,
            Code::InvalidArgument,
        );
        assert!(msg.contains("target_path"), "{}: {msg}", path.display());
        assert_code(lab.unstage(vol, path).await, Code::InvalidArgument);
        assert_code(lab.unpublish(vol, path).await, Code::InvalidArgument);
        // The lookups answer "no such volume there": no volume can be at
        // a path kubelet never uses (the spec's NOT_FOUND row).
        assert_code(lab.stats(vol, path).await, Code::NotFound);
        assert_code(
            lab.expand(vol, path, Path::new(""), 0).await,
            Code::NotFound,
        );
    }
    assert!(
        blkid(&lab.lun(0).backing.device).is_empty(),
        "nothing formatted"
    );
    assert_eq!(
        std::fs::read_dir(&outside).expect("outside").count(),
        0,
        "nothing created outside"
    );
    assert_eq!(lab.mounts_left(), Vec::<PathBuf>::new());
}

#[tokio::test]
async fn malformed_volume_ids_and_capabilities_are_invalid_arguments() {
    let Some(lab) = Lab::start(&[SMALL]).await else {
        return;
    };
    let staging = lab.staging("pv-a");
    for bad in [
        "",
        "sdb",
        "naa.6001405d27e5d898829468b90ce4ef8c",
        "../../etc:1",
        "/dev/sdb:1",
    ] {
        let msg = assert_code(
            lab.stage(bad, &staging, mount_cap("ext4", Mode::SingleNodeWriter))
                .await,
            Code::InvalidArgument,
        );
        assert!(msg.contains("volume"), "{bad}: {msg}");
    }
    let vol = lab.lun(0).volume_id.as_str();
    for (cap, field) in [
        (
            mount_cap("ext4", Mode::Unknown),
            "volume_capability.access_mode",
        ),
        (
            mount_cap("btrfs", Mode::SingleNodeWriter),
            "volume_capability.mount.fs_type",
        ),
        (
            super::lab::mount_cap_with("ext4", Mode::SingleNodeWriter, &["errors=panic"]),
            "volume_capability.mount.mount_flags",
        ),
    ] {
        let msg = assert_code(lab.stage(vol, &staging, cap).await, Code::InvalidArgument);
        assert!(msg.contains(field), "{field}: {msg}");
    }
    assert!(
        blkid(&lab.lun(0).backing.device).is_empty(),
        "nothing formatted"
    );
}

#[tokio::test]
async fn an_unknown_volume_is_not_found() {
    let Some(lab) = Lab::start(&[SMALL]).await else {
        return;
    };
    let unknown = "naa.6001405ffffffffffffffffffffffff0:binding-x";
    let staging = lab.staging("pv-x");
    let target = lab.target("pod-1", "pv-x");
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    assert_code(
        lab.stage(unknown, &staging, cap.clone()).await,
        Code::NotFound,
    );
    assert_code(
        lab.publish(unknown, &staging, &target, cap.clone(), false)
            .await,
        Code::NotFound,
    );
    assert_code(lab.stats(unknown, &target).await, Code::NotFound);
    assert_code(
        lab.expand(unknown, &staging, &staging, 0).await,
        Code::NotFound,
    );
    // Spec: unstage and unpublish of a volume that is not there reply OK.
    lab.unstage(unknown, &staging)
        .await
        .expect("unstage is idempotent");
    lab.unpublish(unknown, &target)
        .await
        .expect("unpublish is idempotent");
}

#[tokio::test]
async fn a_by_id_link_that_names_another_disk_is_refused_and_nothing_is_formatted() {
    let Some(lab) = Lab::start(&[SMALL, SMALL]).await else {
        return;
    };
    let (a, b) = (lab.lun(0), lab.lun(1));
    // The links of A now lead to B's node: a stale udev link after a LUN
    // was remapped. The agent must notice B reports another WWID.
    let id = a.wwid.strip_prefix("naa.").expect("naa");
    let by_id = lab.tree.dev().join("disk/by-id");
    for name in [format!("wwn-0x{id}"), format!("scsi-3{id}")] {
        let link = by_id.join(name);
        std::fs::remove_file(&link).expect("remove link");
        std::os::unix::fs::symlink(format!("../../{}", b.name), &link).expect("relink");
    }
    let staging = lab.staging("pv-a");
    let msg = assert_code(
        lab.stage(
            &a.volume_id,
            &staging,
            mount_cap("ext4", Mode::SingleNodeWriter),
        )
        .await,
        Code::FailedPrecondition,
    );
    assert!(
        msg.contains(&a.wwid) && msg.contains(&b.wwid),
        "names both WWIDs: {msg}"
    );
    assert!(
        blkid(&a.backing.device).is_empty() && blkid(&b.backing.device).is_empty(),
        "nothing formatted"
    );
    assert!(!is_mounted(&staging));
    assert_eq!(lab.mkfs_count(), 0);
}

#[tokio::test]
async fn a_foreign_mount_at_a_target_is_never_unmounted() {
    let Some(lab) = Lab::start(&[SMALL, SMALL]).await else {
        return;
    };
    let (a, b) = (lab.lun(0), lab.lun(1));
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let staging_b = lab.staging("pv-b");
    let target_b = lab.target("pod-1", "pv-b");
    lab.stage(&b.volume_id, &staging_b, cap.clone())
        .await
        .expect("stage b");
    lab.publish(&b.volume_id, &staging_b, &target_b, cap.clone(), false)
        .await
        .expect("publish b");
    // Calls about volume A that name B's paths.
    assert_code(
        lab.unpublish(&a.volume_id, &target_b).await,
        Code::FailedPrecondition,
    );
    assert_code(
        lab.unstage(&a.volume_id, &staging_b).await,
        Code::FailedPrecondition,
    );
    assert!(
        is_mounted(&target_b) && is_mounted(&staging_b),
        "B untouched"
    );
    lab.unpublish(&b.volume_id, &target_b)
        .await
        .expect("unpublish b");
    lab.unstage(&b.volume_id, &staging_b)
        .await
        .expect("unstage b");
}
