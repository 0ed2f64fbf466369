//! Concurrent calls on one volume are never interleaved: each is answered
//! OK or ABORTED ("Operation pending for volume"), and the device is
//! formatted and mounted exactly once.

use csi_scsi_proto::csi::volume_capability::access_mode::Mode;
use tonic::Code;

use super::lab::{Lab, XFS_SIZE, blkid, mount_cap, mount_points};

#[tokio::test]
async fn concurrent_stage_of_one_volume_formats_and_mounts_it_once() {
    // xfs on 320 MB: mkfs takes long enough for the calls to overlap.
    let Some(lab) = Lab::start(&[XFS_SIZE]).await else {
        return;
    };
    let vol = lab.lun(0).volume_id.clone();
    let staging = lab.staging("pv-a");
    let cap = mount_cap("xfs", Mode::SingleNodeWriter);

    let calls: Vec<_> = (0..12)
        .map(|_| {
            let (lab_client, vol, staging, cap) = (
                lab.client.clone(),
                vol.clone(),
                staging.clone(),
                cap.clone(),
            );
            tokio::spawn(async move {
                let mut client = lab_client;
                client
                    .node_stage_volume(csi_scsi_proto::csi::NodeStageVolumeRequest {
                        volume_id: vol,
                        staging_target_path: staging.display().to_string(),
                        volume_capability: Some(cap),
                        ..Default::default()
                    })
                    .await
                    .map(drop)
            })
        })
        .collect();
    let mut ok = 0;
    let mut aborted = 0;
    for call in calls {
        match call.await.expect("task") {
            Ok(()) => ok += 1,
            Err(s) if s.code() == Code::Aborted => aborted += 1,
            Err(s) => panic!("unexpected {:?}: {}", s.code(), s.message()),
        }
    }
    assert!(ok >= 1, "one call staged it");
    assert_eq!(ok + aborted, 12);
    assert!(
        aborted >= 1,
        "calls overlapped and were refused, not interleaved"
    );

    // Whatever the interleaving, the result is one filesystem, one mount.
    lab.stage(&vol, &staging, cap)
        .await
        .expect("retry after the burst");
    assert_eq!(lab.mkfs_count(), 1, "formatted once");
    assert_eq!(
        blkid(&lab.lun(0).backing.device)
            .get("TYPE")
            .map(String::as_str),
        Some("xfs")
    );
    assert_eq!(
        mount_points().iter().filter(|p| **p == staging).count(),
        1,
        "mounted once"
    );
    lab.unstage(&vol, &staging).await.expect("unstage");
}
