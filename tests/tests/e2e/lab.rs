//! The whole driver through the lab harness: real processes in network
//! namespaces, real mTLS, real iSCSI against tgtd, loop-device LUNs.

use std::collections::HashMap;
use std::time::Duration;

use csi_scsi_proto::csi::volume_capability::access_mode::Mode;
use csi_scsi_proto::csi::*;
use csi_scsi_tests::lab::scenario::{
    self, Clients, attach_and_mount, attach_and_mount_as, capability, create, unmount_and_detach,
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

/// The nodes ControllerGetVolume says `volume_id` is published to.
async fn published_nodes(cl: &mut Clients, volume_id: &str) -> Vec<String> {
    cl.controller
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: volume_id.to_owned(),
        })
        .await
        .expect("ControllerGetVolume")
        .into_inner()
        .status
        .expect("status")
        .published_node_ids
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
    assert_eq!(published_nodes(&mut cl, &vol.volume_id).await.len(), 1);
}

/// Whether the first MiB of the lab LUN `name` is all zeroes.
fn lun_head_is_blank(lab: &Lab, name: &str) -> bool {
    use std::io::Read;
    let mut head = vec![0u8; 1 << 20];
    std::fs::File::open(&lab.luns[name])
        .and_then(|mut f| f.read_exact(&mut head))
        .expect("read the LUN file");
    head.iter().all(|&b| b == 0)
}

#[tokio::test]
async fn a_read_only_controller_publish_is_refused_and_a_read_only_node_publish_mounts_read_only() {
    let (_dir, lab, mut cl) = lab().await;
    let vol = create(
        &mut cl,
        "ro",
        100 << 20,
        false,
        &[("deviceSelector", "array=a")],
        "node-a",
    )
    .await
    .expect("create");
    // PUBLISH_READONLY is not advertised (the LUN is always attached
    // read-write): a CO must send readonly=false (spec), and true is
    // refused before anything is attached or written.
    let publish = |readonly| ControllerPublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        node_id: "node-a".into(),
        volume_capability: Some(capability(false, "xfs", Mode::SingleNodeWriter)),
        readonly,
        secrets: HashMap::new(),
        volume_context: vol.volume_context.clone(),
    };
    let refused = cl.controller.controller_publish_volume(publish(true)).await;
    assert_eq!(code(refused), Code::InvalidArgument);
    assert!(
        ["a1", "a2", "mp"]
            .iter()
            .all(|l| lun_head_is_blank(&lab, l)),
        "nothing may be written by a refused publish"
    );
    // Written once read-write, then published with kubelet's readonly flag
    // (a read-only PV or Pod volume): the data is there and the mount
    // refuses writes.
    let target = attach_and_mount(&lab, &mut cl, &vol, "node-a", false, "pod-rw")
        .await
        .expect("read-write publish");
    std::fs::write(target.join("marker"), "written read-write").expect("write");
    unmount_and_detach(&lab, &mut cl, &vol, "node-a", "pod-rw")
        .await
        .expect("detach");
    let target = attach_and_mount_as(&lab, &mut cl, &vol, "node-a", false, "pod-ro2", true)
        .await
        .expect("read-only publish of a formatted volume");
    assert_eq!(
        std::fs::read_to_string(target.join("marker")).expect("read"),
        "written read-write"
    );
    let refused = std::fs::write(target.join("other"), "x").expect_err("read-only");
    assert_eq!(refused.raw_os_error(), Some(libc_erofs()), "{refused}");
    unmount_and_detach(&lab, &mut cl, &vol, "node-a", "pod-ro2")
        .await
        .expect("detach");
}

/// Spec, ControllerPublishVolume: published to this node "but is
/// incompatible with the specified volume_capability" is ALREADY_EXISTS;
/// the same publication again is OK (idempotent). The refusal changes
/// nothing: the first publication stays recorded as it was.
#[tokio::test]
async fn a_second_publish_to_the_same_node_with_another_access_mode_is_already_exists() {
    let (_dir, _lab, mut cl) = lab().await;
    let writer = capability(false, "xfs", Mode::SingleNodeWriter);
    let reader = capability(false, "xfs", Mode::SingleNodeReaderOnly);
    let vol = cl
        .controller
        .create_volume(CreateVolumeRequest {
            name: "two-modes".into(),
            capacity_range: Some(CapacityRange {
                required_bytes: 100 << 20,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![writer.clone(), reader.clone()],
            parameters: HashMap::from([("deviceSelector".into(), "array=a".into())]),
            secrets: HashMap::new(),
            volume_content_source: None,
            accessibility_requirements: Some(scenario::prefer("node-a")),
            mutable_parameters: HashMap::new(),
        })
        .await
        .expect("create")
        .into_inner()
        .volume
        .expect("volume");
    let publish = |cap: &VolumeCapability| ControllerPublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        node_id: "node-a".into(),
        volume_capability: Some(cap.clone()),
        readonly: false,
        secrets: HashMap::new(),
        volume_context: vol.volume_context.clone(),
    };
    let first = cl
        .controller
        .controller_publish_volume(publish(&writer))
        .await
        .expect("first publish")
        .into_inner();
    let again = cl
        .controller
        .controller_publish_volume(publish(&writer))
        .await
        .expect("the same publish again")
        .into_inner();
    assert_eq!(first.publish_context, again.publish_context);
    let other = cl
        .controller
        .controller_publish_volume(publish(&reader))
        .await
        .expect_err("another access mode on the same node");
    assert_eq!(other.code(), Code::AlreadyExists, "{other:?}");
    assert!(
        other.message().contains("unpublish it first"),
        "{}",
        other.message()
    );
    assert_eq!(published_nodes(&mut cl, &vol.volume_id).await, ["node-a"]);
    // The writer publication still stands: asking for it again is OK.
    cl.controller
        .controller_publish_volume(publish(&writer))
        .await
        .expect("the recorded publication is unchanged");
}

#[tokio::test]
async fn a_node_at_its_attach_limit_refuses_another_volume_until_one_detaches() {
    let (_dir, _lab, mut cl) =
        lab_with(|c| c.agent_args = vec!["--max-volumes".into(), "1".into()]).await;
    let info = cl
        .node("node-a")
        .node_get_info(NodeGetInfoRequest {})
        .await
        .expect("info")
        .into_inner();
    assert_eq!(
        info.max_volumes_per_node, 1,
        "the limit is what kubelet hears"
    );
    let mut vols = Vec::new();
    for name in ["limit-1", "limit-2"] {
        vols.push(
            create(
                &mut cl,
                name,
                100 << 20,
                true,
                &[("deviceSelector", "array=a")],
                "node-a",
            )
            .await
            .expect("create"),
        );
    }
    let publish = |id: &str| ControllerPublishVolumeRequest {
        volume_id: id.to_owned(),
        node_id: "node-a".into(),
        volume_capability: Some(capability(true, "", Mode::SingleNodeWriter)),
        readonly: false,
        secrets: HashMap::new(),
        volume_context: HashMap::new(),
    };
    cl.controller
        .controller_publish_volume(publish(&vols[0].volume_id))
        .await
        .expect("the first volume fits");
    let refused = cl
        .controller
        .controller_publish_volume(publish(&vols[1].volume_id))
        .await;
    assert_eq!(code(refused), Code::ResourceExhausted);
    assert!(
        published_nodes(&mut cl, &vols[1].volume_id)
            .await
            .is_empty(),
        "a refused publish leaves no record"
    );
    // The first one again is fine: it is attached already.
    cl.controller
        .controller_publish_volume(publish(&vols[0].volume_id))
        .await
        .expect("idempotent");
    cl.controller
        .controller_unpublish_volume(ControllerUnpublishVolumeRequest {
            volume_id: vols[0].volume_id.clone(),
            node_id: "node-a".into(),
            secrets: HashMap::new(),
        })
        .await
        .expect("unpublish");
    cl.controller
        .controller_publish_volume(publish(&vols[1].volume_id))
        .await
        .expect("room again after a detach");
}

/// EROFS.
fn libc_erofs() -> i32 {
    nix::errno::Errno::EROFS as i32
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
    assert_eq!(published_nodes(&mut cl, &vol.volume_id).await, ["node-a"]);
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
    // The release worker wipes after DeleteVolume answers.
    lab.wait_device_phase(
        &vol.volume_context["wwid"],
        "Available",
        Duration::from_secs(120),
    )
    .await
    .expect("released");
    let (_, file) = scenario::lun_file(&lab, &vol.volume_context["wwid"]).expect("lun file");
    assert!(scenario::all_zero(&file).expect("read"), "LUN zeroed");
}

#[tokio::test]
async fn a_lun_no_agent_can_wipe_stays_releasing_until_one_answers() {
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
    let wwid = vol.volume_context["wwid"].clone();
    // DeleteVolume answers at once (the volume can never be used again);
    // the wipe waits for an agent that sees the LUN.
    cl.controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: vol.volume_id.clone(),
            secrets: HashMap::new(),
        })
        .await
        .expect("delete");
    for _ in 0..30 {
        let phase = lab.device_phase(&wwid).expect("phase");
        assert_eq!(phase, "Releasing", "unwiped, so never offered again");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    lab.restart_agent(1).await.expect("restart");
    lab.wait_device_phase(&wwid, "Available", Duration::from_secs(120))
        .await
        .expect("wiped once an agent answers");
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
    // Its binding is kept: deleting it later still finds it, and the LUN
    // waits, unwiped and never offered, until a node sees it again.
    cl.controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: vol.volume_id.clone(),
            secrets: HashMap::new(),
        })
        .await
        .expect("delete");
    let wwid = &vol.volume_context["wwid"];
    for _ in 0..30 {
        let phase = lab.device_phase(wwid).expect("phase");
        assert!(
            phase == "Releasing" || phase == "Lost",
            "a LUN no node sees is never wiped nor offered: {phase}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A call the proxy gave up on while a node's link was down is never
/// delivered once the link is back. TCP would retransmit it (the timer
/// doubles from 200 ms, so a segment first sent at the start of an 8 s cut
/// goes out again about 13 s later), and the agent would start a Detach
/// behind the publish record's back (or an Attach that makes a
/// single-writer volume visible on a second node). The proxy's connections
/// are closed abortively instead: nothing queued is sent after it gave up.
#[tokio::test]
async fn a_detach_abandoned_while_the_link_was_down_never_reaches_the_agent_later() {
    let (_dir, lab, mut cl) = lab().await;
    let vol = create(
        &mut cl,
        "late",
        100 << 20,
        true,
        &[("deviceSelector", "array=a")],
        "node-a",
    )
    .await
    .expect("create");
    let wwid = vol.volume_context["wwid"].clone();
    cl.controller
        .controller_publish_volume(ControllerPublishVolumeRequest {
            volume_id: vol.volume_id.clone(),
            node_id: "node-a".into(),
            volume_capability: Some(capability(true, "", Mode::SingleNodeWriter)),
            readonly: false,
            secrets: HashMap::new(),
            volume_context: vol.volume_context.clone(),
        })
        .await
        .expect("publish");
    let link = lab.nodes[0].root.join(format!(
        "dev/disk/by-id/wwn-0x{}",
        wwid.strip_prefix("naa.").expect("an NAA WWID")
    ));
    assert!(link.exists(), "attached: {}", link.display());
    let unpublish = ControllerUnpublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        node_id: "node-a".into(),
        secrets: HashMap::new(),
    };

    lab.net.set_node_link(0, false).expect("cut");
    let mut request = tonic::Request::new(unpublish.clone());
    request.set_timeout(Duration::from_secs(8));
    let err = cl
        .controller
        .controller_unpublish_volume(request)
        .await
        .expect_err("node-a cannot answer");
    lab.net.set_node_link(0, true).expect("restore");
    assert_eq!(err.code(), Code::Unavailable, "{err}");

    // Past the first retransmission after the cut, short of the next.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let metrics = crate::observability::get(lab.nodes[0].status, "/metrics").await;
    let detaches: u64 = metrics
        .body
        .lines()
        .filter(|l| l.contains("_count{") && l.contains("method=\"Detach\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(
        detaches, 0,
        "node-a's agent got the Detach the proxy gave up on after its link came back"
    );
    assert!(link.exists(), "still attached");
    assert_eq!(
        published_nodes(&mut cl, &vol.volume_id).await,
        ["node-a"],
        "the record is kept"
    );
    cl.controller
        .controller_unpublish_volume(unpublish)
        .await
        .expect("a fresh unpublish works");
    assert!(!link.exists(), "detached now");
}

/// A LUN the array hands over with somebody's filesystem on it is held,
/// never bound; erased on the array, it is offered. (Before: it was
/// Available at once, and the first volume bound to it mounted that
/// filesystem with its files.)
#[tokio::test]
async fn a_new_lun_holding_a_filesystem_is_held_until_it_is_erased_on_the_array() {
    let (dir, lab, mut cl) = lab().await;
    // The array exports a second FC LUN, 2 GiB (more than any other LUN
    // of the lab), with an ext4 filesystem and a file on it.
    let file = dir.path().join("handed-over.img");
    std::fs::File::create(&file)
        .and_then(|f| f.set_len(2 << 30))
        .expect("LUN file");
    let mkfs = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F", "-L", "tenant-a"])
        .arg(&file)
        .status()
        .expect("mkfs.ext4");
    assert!(mkfs.success());
    let wwid = "naa.600a098038303053453f463045727032";
    let fabric_path = lab.config.dir.join("fabric.json");
    let mut fabric = csi_scsi_tests::fabric::Fabric::load(&fabric_path).expect("fabric");
    let mut def = fabric.fc[0].luns[0].clone();
    def.lun = 1;
    def.file = file.clone();
    def.data = None;
    def.wwid = wwid.into();
    def.serial = "80SE?F0Erp2".into();
    fabric.fc[0].luns.push(def);
    fabric.save(&fabric_path).expect("save");

    lab.wait_device_phase(wwid, "HoldsData", Duration::from_secs(120))
        .await
        .expect("the probe finds the filesystem");
    // Never bound: a volume only it could hold finds nothing.
    let params = [("deviceSelector", "array=fc")];
    let refused = create(&mut cl, "wants-2gib", 2 << 30, false, &params, "node-b")
        .await
        .expect_err("the held LUN is not offered");
    assert_eq!(
        refused
            .downcast_ref::<tonic::Status>()
            .map(tonic::Status::code),
        Some(Code::ResourceExhausted),
        "{refused:?}"
    );
    assert_eq!(lab.device_phase(wwid).expect("phase"), "HoldsData");
    // The probe only read: the filesystem is still there.
    let probe = std::process::Command::new("blkid")
        .args(["-o", "value", "-s", "LABEL"])
        .arg(&file)
        .output()
        .expect("blkid");
    assert_eq!(String::from_utf8_lossy(&probe.stdout).trim(), "tenant-a");

    // The storage admin erases it on the array: offered at the next probe.
    std::fs::File::create(&file)
        .and_then(|f| f.set_len(2 << 30))
        .expect("erase");
    lab.wait_device_phase(wwid, "Available", Duration::from_secs(60))
        .await
        .expect("offered once it reads blank");
    let vol = create(&mut cl, "wants-2gib", 2 << 30, false, &params, "node-b")
        .await
        .expect("bound once blank");
    assert_eq!(vol.volume_context["wwid"], wwid);
}

/// A publish to a node that a LUN's target does not select (the FC
/// target is zoned to node-b and node-c only) is refused before anything
/// is recorded or sent: a target's CHAP credentials and its LUNs go only
/// to the nodes it names. (Before: the Attach went out, with the target's
/// credentials, to any node the CO named.)
#[tokio::test]
async fn a_publish_to_a_node_the_target_does_not_select_is_refused_and_records_nothing() {
    let (_dir, _lab, mut cl) = lab().await;
    let vol = create(
        &mut cl,
        "zoned",
        100 << 20,
        false,
        &[("deviceSelector", "array=fc")],
        "node-b",
    )
    .await
    .expect("create");
    let publish = |node: &str| ControllerPublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        node_id: node.to_owned(),
        volume_capability: Some(capability(false, "", Mode::SingleNodeWriter)),
        readonly: false,
        secrets: HashMap::new(),
        volume_context: HashMap::new(),
    };
    let refused = cl
        .controller
        .controller_publish_volume(publish("node-a"))
        .await
        .expect_err("node-a is not zoned to the FC target");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("node node-a is not selected by target fc-1"),
        "{refused:?}"
    );
    assert!(published_nodes(&mut cl, &vol.volume_id).await.is_empty());
    // A node the target selects is published as before.
    cl.controller
        .controller_publish_volume(publish("node-b"))
        .await
        .expect("node-b is zoned");
    assert_eq!(published_nodes(&mut cl, &vol.volume_id).await, ["node-b"]);
}
