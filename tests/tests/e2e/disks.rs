//! The data-safety rules with disks that fail (`csi_scsi_tests::disks`):
//! a read error or a stall while staging never formats, a wipe that meets
//! write errors fails retryably and completes after the disk heals, and a
//! detach keeps the disk claimed from its in-use check to the deletion.

use std::collections::HashMap;
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

use csi_scsi_proto::csi::*;
use csi_scsi_tests::disks::{Fault, ends_of};
use csi_scsi_tests::lab::scenario::{
    self, Clients, attach_and_mount, create, lun_file, unmount_and_detach,
};
use csi_scsi_tests::lab::{Lab, LabConfig};
use tempfile::TempDir;
use tonic::Code;

use crate::lab::lab_with;

/// The first MiB, where XFS keeps its superblock (what the probe reads).
const HEAD: u64 = 1 << 20;

/// A lab whose LUNs can fail; host tools time out after 5 s (a probe
/// stuck on a stalled disk answers in time).
async fn failing_lab() -> (TempDir, Lab, Clients) {
    lab_with(|c: &mut LabConfig| {
        c.faulty_disks = true;
        c.agent_args = vec!["--command-timeout".into(), "5".into()];
    })
    .await
}

/// The disk behind `vol`, and its backing file.
fn disk_of(lab: &Lab, vol: &Volume) -> (String, std::path::PathBuf) {
    lun_file(lab, &vol.volume_context["wwid"]).expect("a lab LUN")
}

/// A DeleteVolume of `vol`, and the request (a retry sends it again).
async fn delete_volume(cl: &mut Clients, vol: &Volume) -> DeleteVolumeRequest {
    let delete = DeleteVolumeRequest {
        volume_id: vol.volume_id.clone(),
        secrets: HashMap::new(),
    };
    cl.controller
        .delete_volume(delete.clone())
        .await
        .expect("delete");
    delete
}

fn status_code(e: &anyhow::Error) -> Code {
    e.downcast_ref::<tonic::Status>()
        .map(|s| s.code())
        .unwrap_or(Code::Unknown)
}

/// A volume on array-a (XFS needs 300 MB: its LUNs are 512 MiB and up),
/// formatted and holding `marker`, detached again.
async fn volume_with_marker(lab: &Lab, cl: &mut Clients, name: &str) -> Volume {
    let vol = create(
        cl,
        name,
        100 << 20,
        false,
        &[("deviceSelector", "array=a"), ("cleanup", "discard")],
        "node-a",
    )
    .await
    .expect("create");
    let target = attach_and_mount(lab, cl, &vol, "node-a", false, "writer")
        .await
        .expect("first publish");
    std::fs::write(target.join("marker"), name).expect("write the marker");
    unmount_and_detach(lab, cl, &vol, "node-a", "writer")
        .await
        .expect("detach");
    vol
}

#[tokio::test]
async fn the_failing_disks_pass_data_unchanged_until_told_to_fail() {
    let (_dir, lab, mut cl) = failing_lab().await;
    let vol = volume_with_marker(&lab, &mut cl, "plain").await;
    let target = attach_and_mount(&lab, &mut cl, &vol, "node-a", false, "reader")
        .await
        .expect("publish again");
    assert_eq!(
        std::fs::read_to_string(target.join("marker")).expect("read"),
        "plain"
    );
    let (disk, _) = disk_of(&lab, &vol);
    let disks = lab.disks.as_ref().expect("failing disks");
    assert_eq!(disks.state(&disk).expect("state").failed, 0);
    unmount_and_detach(&lab, &mut cl, &vol, "node-a", "reader")
        .await
        .expect("detach");
}

#[tokio::test]
async fn a_read_error_while_staging_a_volume_with_data_formats_nothing() {
    let (_dir, lab, mut cl) = failing_lab().await;
    let vol = volume_with_marker(&lab, &mut cl, "eio").await;
    let (disk, file) = disk_of(&lab, &vol);
    let disks = lab.disks.as_ref().expect("failing disks");
    let before = ends_of(&file).expect("read");

    disks
        .inject(&disk, Fault::ReadError(0..HEAD))
        .expect("inject");
    let err = attach_and_mount(&lab, &mut cl, &vol, "node-a", false, "reader")
        .await
        .expect_err("the probe cannot read the head");
    assert!(
        disks.state(&disk).expect("state").failed > 0,
        "the fault was hit"
    );
    assert_eq!(status_code(&err), Code::Unavailable, "{err:#}");
    assert!(
        ends_of(&file).expect("read") == before,
        "nothing was written to {disk}"
    );

    disks.heal(&disk).expect("heal");
    let target = attach_and_mount(&lab, &mut cl, &vol, "node-a", false, "reader")
        .await
        .expect("staged once the disk reads again");
    assert_eq!(
        std::fs::read_to_string(target.join("marker")).expect("the data survived"),
        "eio"
    );
    unmount_and_detach(&lab, &mut cl, &vol, "node-a", "reader")
        .await
        .expect("detach");
}

#[tokio::test]
async fn a_stalled_disk_makes_stage_fail_in_time_and_the_stage_succeeds_once_it_heals() {
    let (_dir, lab, mut cl) = failing_lab().await;
    let vol = create(
        &mut cl,
        "stall",
        100 << 20,
        false,
        &[("deviceSelector", "array=a")],
        "node-a",
    )
    .await
    .expect("create");
    let (disk, file) = disk_of(&lab, &vol);
    let disks = lab.disks.as_ref().expect("failing disks");
    disks.inject(&disk, Fault::Stall).expect("inject");

    let started = Instant::now();
    let (staged, stalled) = tokio::join!(
        attach_and_mount(&lab, &mut cl, &vol, "node-a", false, "pod"),
        disks.until_stalled(&disk, Duration::from_secs(30)),
    );
    stalled.expect("the stage reached the disk");
    let err = staged.expect_err("nothing can be read");
    assert!(
        matches!(
            status_code(&err),
            Code::Unavailable | Code::DeadlineExceeded
        ),
        "a retryable code: {err:#}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(45),
        "answered in {:?}",
        started.elapsed()
    );
    assert!(
        scenario::all_zero(&file).expect("read"),
        "a blank LUN whose probe stalled is not formatted"
    );

    disks.heal(&disk).expect("heal");
    let target = attach_and_mount(&lab, &mut cl, &vol, "node-a", false, "pod")
        .await
        .expect("staged once the disk answers");
    std::fs::write(target.join("after"), "ok").expect("writable");
    unmount_and_detach(&lab, &mut cl, &vol, "node-a", "pod")
        .await
        .expect("detach");
}

#[tokio::test]
async fn a_wipe_that_meets_write_errors_fails_retryably_and_completes_after_a_heal() {
    let (_dir, lab, mut cl) = failing_lab().await;
    let vol = volume_with_marker(&lab, &mut cl, "wipe").await;
    let (disk, file) = disk_of(&lab, &vol);
    let disks = lab.disks.as_ref().expect("failing disks");
    disks
        .inject(&disk, Fault::WriteError(0..u64::MAX))
        .expect("inject");
    // DeleteVolume answers once the volume can never be used again; the
    // release worker's wipe meets the write errors (the agent answers
    // UNAVAILABLE) and the LUN waits, Releasing, never offered.
    let delete = delete_volume(&mut cl, &vol).await;
    let wwid = vol.volume_context["wwid"].clone();
    let start = Instant::now();
    while disks.state(&disk).expect("state").failed == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the wipe never met the fault"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let phase = lab.device_phase(&wwid).expect("phase");
    assert!(phase == "Releasing" || phase == "Failed", "{phase}");
    assert!(
        !scenario::all_zero(&file).expect("read"),
        "the data is still there"
    );
    // Not available for a new volume while its wipe has not happened.
    let rebind = create(
        &mut cl,
        "wipe-rebind",
        100 << 20,
        false,
        &[("deviceSelector", "array=a")],
        "node-a",
    )
    .await
    .expect("another LUN of array-a");
    assert_ne!(
        rebind.volume_context["wwid"], vol.volume_context["wwid"],
        "a LUN whose wipe failed was bound again"
    );

    disks.heal(&disk).expect("heal");
    // A retried DeleteVolume is still OK; the worker's retry wipes.
    cl.controller
        .delete_volume(delete)
        .await
        .expect("the retried delete");
    lab.wait_device_phase(&wwid, "Available", Duration::from_secs(180))
        .await
        .expect("wiped after the heal");
    assert!(scenario::all_zero(&file).expect("read"), "wiped");
}

#[tokio::test]
async fn a_detach_holds_its_claim_on_the_disk_from_its_check_until_the_paths_are_deleted() {
    let (_dir, lab, mut cl) = failing_lab().await;
    let vol = volume_with_marker(&lab, &mut cl, "claimed").await;
    attach_and_mount(&lab, &mut cl, &vol, "node-a", false, "writer")
        .await
        .expect("publish");
    scenario::unmount(&lab, &mut cl, &vol, "node-a", "writer")
        .await
        .expect("the node's side");
    let wwid = &vol.volume_context["wwid"];
    let link = lab.nodes[0].root.join(format!(
        "dev/disk/by-id/wwn-0x{}",
        wwid.strip_prefix("naa.").expect("an NAA WWID")
    ));
    let node = std::fs::canonicalize(&link).expect("attached");
    let (disk, _) = disk_of(&lab, &vol);
    let disks = lab.disks.as_ref().expect("failing disks");

    // The detach checks the disk is unused, then flushes it: the flush
    // waits on the stalled disk, between the check and the deletion.
    disks.inject(&disk, Fault::Stall).expect("inject");
    let mut controller = cl.controller.clone();
    let mut request = tonic::Request::new(ControllerUnpublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        node_id: "node-a".into(),
        secrets: HashMap::new(),
    });
    request.set_timeout(Duration::from_secs(60));
    let detach = tokio::spawn(async move { controller.controller_unpublish_volume(request).await });
    disks
        .until_stalled(&disk, Duration::from_secs(30))
        .await
        .expect("the detach reached the disk");

    // Meanwhile nothing else can claim the disk: not a mount, not mkfs.
    let claim = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_EXCL)
        .open(&node);
    let held = matches!(&claim, Err(e) if e.raw_os_error() == Some(nix::libc::EBUSY));
    drop(claim);
    disks.heal(&disk).expect("heal");
    let answer = detach.await.expect("joined");
    assert!(
        held,
        "{} could be claimed while the detach that found it unused was still running",
        node.display()
    );
    answer.expect("the detach completes once the disk answers");
    assert!(!link.exists(), "the paths were deleted");
}

#[tokio::test]
async fn a_lun_unmapped_under_a_mounted_volume_is_reported_and_can_still_be_unmounted() {
    let (_dir, lab, mut cl) = failing_lab().await;
    let vol = volume_with_marker(&lab, &mut cl, "unmapped").await;
    let target = attach_and_mount(&lab, &mut cl, &vol, "node-a", false, "reader")
        .await
        .expect("publish");
    let (disk, _) = disk_of(&lab, &vol);
    let disks = lab.disks.as_ref().expect("failing disks");
    disks.inject(&disk, Fault::Unmapped).expect("inject");
    // A write the filesystem must commit meets the unmapped LUN. Here the
    // loop device's page cache may absorb it; on a real kernel XFS shuts
    // down and its root answers EIO (the VM lab's "all paths lost" check
    // asserts that case: docs/lab.md).
    let _ = std::fs::write(target.join("after"), b"lost");
    let _ = std::process::Command::new("sync")
        .arg("-f")
        .arg(&target)
        .status();
    assert!(
        disks.state(&disk).expect("state").failed > 0,
        "the fault was hit"
    );
    let (staging, _) = scenario::kubelet_paths(
        &lab.nodes[0].kubelet,
        &vol.volume_id.replace(':', "-"),
        "reader",
    );
    let stats = cl
        .node("node-a")
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: vol.volume_id.clone(),
            volume_path: target.display().to_string(),
            staging_target_path: staging.display().to_string(),
        })
        .await;
    // Never "no volume there": either a condition that says it fails, or
    // (when the filesystem still answers from memory) a plain answer.
    match stats {
        Ok(s) => {
            let s = s.into_inner();
            if let Some(c) = s.volume_condition.filter(|c| c.abnormal) {
                assert!(c.message.contains("I/O error"), "{}", c.message);
            }
        }
        Err(s) => assert_ne!(s.code(), Code::NotFound, "{s:?}"),
    }
    // kubelet can still take the volume down: unmounting needs no I/O.
    scenario::unmount(&lab, &mut cl, &vol, "node-a", "reader")
        .await
        .expect("unpublish and unstage of a volume whose LUN is unmapped");
    disks.heal(&disk).expect("heal");
    cl.controller
        .controller_unpublish_volume(ControllerUnpublishVolumeRequest {
            volume_id: vol.volume_id.clone(),
            node_id: "node-a".into(),
            secrets: HashMap::new(),
        })
        .await
        .expect("detach once the LUN is back");
}

#[tokio::test]
async fn a_lun_that_reports_no_size_is_neither_wiped_nor_offered_until_it_reports_its_size() {
    let (_dir, lab, mut cl) = failing_lab().await;
    let vol = volume_with_marker(&lab, &mut cl, "no-size").await;
    let (disk, file) = disk_of(&lab, &vol);
    let disks = lab.disks.as_ref().expect("failing disks");
    // A path in transition: the next rescan (the wipe's own, before it
    // erases) reads a capacity of 0. An erase of "all" of 0 bytes writes
    // nothing and reads nothing back.
    disks.inject(&disk, Fault::Size(0)).expect("inject");
    delete_volume(&mut cl, &vol).await;
    let wwid = vol.volume_context["wwid"].clone();
    // The release worker tries at once; for as long as the LUN reports no
    // size it must never be offered again.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(15) {
        let phase = lab.device_phase(&wwid).expect("phase");
        assert!(
            phase == "Releasing" || phase == "Failed",
            "a LUN that reported no size went {phase}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        !scenario::all_zero(&file).expect("read"),
        "the tenant's data is still there, unwiped"
    );
    disks.heal(&disk).expect("heal");
    lab.wait_device_phase(&wwid, "Available", Duration::from_secs(180))
        .await
        .expect("wiped once it reports its size");
    assert!(scenario::all_zero(&file).expect("read"), "wiped whole");
}
