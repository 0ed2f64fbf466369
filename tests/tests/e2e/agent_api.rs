//! The agent API over real mTLS against a lab node: discover, attach,
//! detach, wipe, and who may call it. The test plays the proxy with the
//! proxy's certificate.

use std::time::Duration;

use csi_scsi_certs::{MaterialPaths, MaterialStore, Role, TrustDomain};
use csi_scsi_daemon::agent_channel;
use csi_scsi_proto::agent::agent_client::AgentClient;
use csi_scsi_proto::agent::*;
use csi_scsi_tests::disks::Fault;
use csi_scsi_tests::lab::Lab;
use csi_scsi_tests::lab::net::sh;
use tonic::Code;
use tonic::transport::Channel;

use crate::lab::{lab, lab_with};

fn client(lab: &Lab, node: usize) -> AgentClient<Channel> {
    let store = MaterialStore::load(
        MaterialPaths::in_dir(&lab.config.dir.join("pki/proxy-tls")),
        Role::Proxy,
        TrustDomain::new("csi-scsi.local").expect("domain"),
    )
    .expect("proxy material");
    let n = &lab.nodes[node];
    AgentClient::new(
        agent_channel(&n.api.to_string(), &n.name, store, Duration::from_secs(5)).expect("channel"),
    )
}

fn iscsi_target(lab: &Lab, name: &str, chap: bool) -> Target {
    Target {
        name: name.into(),
        transport: Some(target::Transport::Iscsi(IscsiTarget {
            portals: vec![format!("{}:3260", lab.net.host_ip())],
            iqn: format!("iqn.2026-11.io.csi-scsi.lab:{name}"),
            chap: chap.then(|| ChapCredentials {
                username: csi_scsi_tests::lab::CHAP_USER.into(),
                password: std::fs::read_to_string(
                    lab.config.dir.join("secrets/chap-array-a/password"),
                )
                .expect("secret"),
                mutual_username: String::new(),
                mutual_password: String::new(),
            }),
        })),
    }
}

fn fc_target() -> Target {
    Target {
        name: "fc-1".into(),
        transport: Some(target::Transport::FibreChannel(FibreChannelTarget {
            wwpns: vec!["0x500A0981891B8DC5".into()],
        })),
    }
}

const MP_WWID: &str = "naa.60014050000900000000000000000001";
const FC_WWID: &str = "naa.600a098038303053453f463045727031";

#[tokio::test]
async fn discovering_two_targets_groups_the_paths_of_one_lun_by_wwid() {
    let (_d, lab, _cl) = lab().await;
    let mut a = client(&lab, 0);
    let ra = a
        .discover(DiscoverRequest {
            target: Some(iscsi_target(&lab, "array-a", true)),
        })
        .await
        .expect("array-a")
        .into_inner();
    let rb = a
        .discover(DiscoverRequest {
            target: Some(iscsi_target(&lab, "array-b", false)),
        })
        .await
        .expect("array-b")
        .into_inner();
    assert!(ra.luns.iter().any(|l| l.wwid == MP_WWID) && rb.luns.iter().any(|l| l.wwid == MP_WWID));
    let status = a
        .status(StatusRequest {})
        .await
        .expect("status")
        .into_inner();
    let mp = status
        .devices
        .iter()
        .find(|d| d.wwid == MP_WWID)
        .expect("multipath LUN");
    assert_eq!(mp.paths.len(), 2, "two paths, one device: {mp:?}");
    let targets: std::collections::BTreeSet<_> =
        mp.paths.iter().map(|p| p.target.clone()).collect();
    assert_eq!(targets.len(), 2);
    assert!(ra.portals.iter().all(|p| p.reachable));
}

#[tokio::test]
async fn a_wrong_chap_secret_or_an_acl_is_refused_as_unauthenticated() {
    let (_d, lab, _cl) = lab().await;
    // node-c: array-b's ACL excludes it (a real refusal from tgtd).
    let mut c = client(&lab, 2);
    let err = c
        .discover(DiscoverRequest {
            target: Some(iscsi_target(&lab, "array-b", false)),
        })
        .await
        .expect_err("ACL");
    assert_eq!(err.code(), Code::Unauthenticated, "{err}");
    let mut t = iscsi_target(&lab, "array-a", true);
    if let Some(target::Transport::Iscsi(i)) = &mut t.transport {
        i.chap.as_mut().expect("chap").password = "not-the-secret".into();
    }
    // node-c's session to array-a (discovery made it) ends: the next login
    // presents the secret (a live session is reused without one).
    lab.logout_iscsi(2, "array-a").expect("logout");
    let err = c
        .discover(DiscoverRequest { target: Some(t) })
        .await
        .expect_err("wrong CHAP");
    assert_eq!(err.code(), Code::Unauthenticated, "{err}");
    assert!(!err.message().contains("not-the-secret"), "{err}");
}

#[tokio::test]
async fn attach_waits_for_a_late_device_and_returns_its_path() {
    let (_d, lab, _cl) = lab_with(|c| c.fc_scan_delay_ms = 1500).await;
    // node-b saw the FC LUN during discovery; remove it as a detach would.
    let mut b = client(&lab, 1);
    b.detach(DetachRequest {
        wwid: FC_WWID.into(),
        targets: vec![fc_target()],
    })
    .await
    .expect("detach");
    let started = std::time::Instant::now();
    let r = b
        .attach(AttachRequest {
            wwid: FC_WWID.into(),
            targets: vec![fc_target()],
            lun: 0,
        })
        .await
        .expect("attach")
        .into_inner();
    assert!(
        started.elapsed() >= Duration::from_millis(1400),
        "waited for the slow fabric"
    );
    assert!(
        r.device_path
            .contains("disk/by-id/wwn-0x600a098038303053453f463045727031"),
        "{}",
        r.device_path
    );
}

#[tokio::test]
async fn detach_refuses_a_mounted_device_and_succeeds_after_unmount() {
    let (_d, lab, _cl) = lab().await;
    let mut b = client(&lab, 1);
    let dev = attach_fc(&mut b).await;
    sh("mkfs.ext4", &["-q", &dev.display().to_string()]).expect("mkfs");
    let mnt = lab.config.dir.join("mnt");
    std::fs::create_dir_all(&mnt).expect("mkdir");
    sh(
        "mount",
        &[&dev.display().to_string(), &mnt.display().to_string()],
    )
    .expect("mount");
    let err = b
        .detach(DetachRequest {
            wwid: FC_WWID.into(),
            targets: vec![fc_target()],
        })
        .await
        .expect_err("in use");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    sh("umount", &[&mnt.display().to_string()]).expect("umount");
    let r = b
        .detach(DetachRequest {
            wwid: FC_WWID.into(),
            targets: vec![fc_target()],
        })
        .await
        .expect("detach")
        .into_inner();
    assert!(r.removed);
    let again = b
        .detach(DetachRequest {
            wwid: FC_WWID.into(),
            targets: vec![fc_target()],
        })
        .await
        .expect("idempotent")
        .into_inner();
    assert!(!again.removed);
}

/// Attaches the FC LUN fc-1 through `c` and returns its device node.
async fn attach_fc(c: &mut AgentClient<Channel>) -> std::path::PathBuf {
    let att = c
        .attach(AttachRequest {
            wwid: FC_WWID.into(),
            targets: vec![fc_target()],
            lun: 0,
        })
        .await
        .expect("attach")
        .into_inner();
    std::fs::canonicalize(&att.device_path).expect("device node")
}

async fn wipe(
    c: &mut AgentClient<Channel>,
    wwid: &str,
    mode: WipeMode,
) -> Result<WipeProgress, tonic::Status> {
    wipe_expecting(c, wwid, mode, 0).await
}

/// A wipe told the size the inventory records.
async fn wipe_expecting(
    c: &mut AgentClient<Channel>,
    wwid: &str,
    mode: WipeMode,
    expected_size_bytes: u64,
) -> Result<WipeProgress, tonic::Status> {
    let mut stream = c
        .wipe(WipeRequest {
            wwid: wwid.into(),
            mode: mode as i32,
            expected_size_bytes,
        })
        .await?
        .into_inner();
    let mut last = None;
    while let Some(p) = stream.message().await? {
        last = Some(p);
    }
    last.ok_or_else(|| tonic::Status::internal("no progress"))
}

#[tokio::test]
async fn a_wipe_of_a_device_smaller_than_recorded_is_refused_and_another_node_reads_the_truth() {
    let (_d, lab, _cl) = lab().await;
    // fc-1 is zoned to node-b and node-c.
    let (mut b, mut c) = (client(&lab, 1), client(&lab, 2));
    for c in [&mut b, &mut c] {
        c.attach(AttachRequest {
            wwid: FC_WWID.into(),
            targets: vec![fc_target()],
            lun: 0,
        })
        .await
        .expect("attach");
    }
    let lun = 512u64 << 20;
    let fc1 = &lab.luns["fc1"];
    let mut data = std::fs::OpenOptions::new()
        .write(true)
        .open(fc1)
        .expect("open");
    std::io::Seek::seek(&mut data, std::io::SeekFrom::Start(300 << 20)).expect("seek");
    std::io::Write::write_all(&mut data, b"tenant data").expect("write");
    drop(data);
    // The inventory records more than this node's device holds (its
    // rescan after an expansion failed, or the LUN shrank): an erase of
    // the device would leave the rest as it was. Nothing is written.
    let err = wipe_expecting(&mut b, FC_WWID, WipeMode::Zero, lun + (256 << 20))
        .await
        .expect_err("a wipe of less than the recorded size");
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(err.message().contains("inventory records"), "{err}");
    assert!(
        !csi_scsi_tests::lab::scenario::all_zero(fc1).expect("read"),
        "nothing was erased"
    );
    // Node c reads the LUN back past its page cache: the data is there.
    let verify = |offsets: Vec<u64>| VerifyRequest {
        wwid: FC_WWID.into(),
        expected_size_bytes: lun,
        offsets,
        length: 64 << 10,
    };
    let v = c
        .verify(verify(vec![0, 300 << 20]))
        .await
        .expect("verify")
        .into_inner();
    assert_eq!(v.size_bytes, lun);
    assert!(!v.zeroes && v.nonzero_offset == 300 << 20, "{v:?}");
    // Node c has the data's page cached; node b zeroes the LUN; node c still
    // reads the array, not its cache.
    let last = wipe_expecting(&mut b, FC_WWID, WipeMode::Zero, lun)
        .await
        .expect("a whole wipe");
    assert!(last.done && last.bytes_total == lun, "{last:?}");
    let v = c
        .verify(verify(vec![0, 300 << 20, lun - (64 << 10)]))
        .await
        .expect("verify")
        .into_inner();
    assert!(v.zeroes, "{v:?}");
    // A verify of a device no node has is NOT_FOUND, never "zeroes".
    let err = c
        .verify(VerifyRequest {
            wwid: "naa.600140500000000000000000000000ff".into(),
            ..verify(vec![0])
        })
        .await
        .expect_err("no such device");
    assert_eq!(err.code(), Code::NotFound, "{err}");
}

#[tokio::test]
async fn wipe_zero_leaves_zeroes_and_discard_leaves_no_signature() {
    let (_d, lab, _cl) = lab().await;
    let mut b = client(&lab, 1);
    let dev = attach_fc(&mut b).await.display().to_string();
    sh("mkfs.xfs", &["-q", "-f", &dev]).expect("mkfs");
    let last = wipe(&mut b, FC_WWID, WipeMode::Zero).await.expect("zero");
    assert!(last.done && last.bytes_done == last.bytes_total && last.bytes_total == 512 << 20);
    assert!(csi_scsi_tests::lab::scenario::all_zero(&lab.luns["fc1"]).expect("read"));
    sh("mkfs.ext4", &["-q", &dev]).expect("mkfs");
    wipe(&mut b, FC_WWID, WipeMode::Discard)
        .await
        .expect("discard");
    let probe = std::process::Command::new("blkid")
        .args(["-p", &dev])
        .output()
        .expect("blkid");
    assert_eq!(
        probe.status.code(),
        Some(2),
        "no signature left: {}",
        String::from_utf8_lossy(&probe.stdout)
    );
}

#[tokio::test]
async fn wipe_refuses_a_mounted_device_a_missing_one_and_a_wrong_wwid_and_the_data_stays() {
    let (_d, lab, _cl) = lab().await;
    let mut b = client(&lab, 1);
    let dev = attach_fc(&mut b).await.display().to_string();
    sh("mkfs.ext4", &["-q", "-L", "precious", &dev]).expect("mkfs");
    let mnt = lab.config.dir.join("mnt");
    std::fs::create_dir_all(&mnt).expect("mkdir");
    sh("mount", &[&dev, &mnt.display().to_string()]).expect("mount");
    std::fs::write(mnt.join("keep.txt"), "keep me").expect("write");
    let err = wipe(&mut b, FC_WWID, WipeMode::Zero)
        .await
        .expect_err("mounted");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert_eq!(
        std::fs::read_to_string(mnt.join("keep.txt")).expect("read"),
        "keep me"
    );
    sh("umount", &[&mnt.display().to_string()]).expect("umount");
    let err = wipe(
        &mut b,
        "naa.6001405fffffffffffffffffffffffff",
        WipeMode::Zero,
    )
    .await
    .expect_err("absent");
    assert_eq!(err.code(), Code::NotFound, "{err}");
    // A by-id name forged to point at this device under a WWID no device
    // reports: the agent goes by the WWID the device itself reports, so
    // the forged name leads nowhere.
    let by_id = lab.nodes[1].root.join("dev/disk/by-id");
    let forged = by_id.join("wwn-0x6001405ffffffffffffffffffffffff1");
    std::os::unix::fs::symlink(&dev, &forged).expect("symlink");
    let err = wipe(
        &mut b,
        "naa.6001405ffffffffffffffffffffffff1",
        WipeMode::Zero,
    )
    .await
    .expect_err("forged name");
    assert_eq!(err.code(), Code::NotFound, "{err}");
    let label = sh("blkid", &["-o", "value", "-s", "LABEL", &dev]).expect("blkid");
    assert_eq!(label.trim(), "precious", "data intact");
}

#[tokio::test]
async fn a_wipe_whose_rescan_the_kernel_has_not_finished_refuses_and_writes_nothing() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let (_d, lab, _cl) = lab().await;
    let mut b = client(&lab, 1);
    let dev = attach_fc(&mut b).await.display().to_string();
    sh("mkfs.ext4", &["-q", "-L", "precious", &dev]).expect("mkfs");
    // Node b's kernel stops acting on sysfs triggers (a hung SCSI scan):
    // the wipe's rescan stays pending, and what the device reports is stale.
    let watcher = lab.nodes[1].watcher.as_ref().expect("kernel stand-in");
    let pid = Pid::from_raw(i32::try_from(watcher.pid()).expect("pid"));
    kill(pid, Signal::SIGSTOP).expect("stop the stand-in");
    let refused = wipe(&mut b, FC_WWID, WipeMode::Zero).await;
    kill(pid, Signal::SIGCONT).expect("continue the stand-in");
    let err = refused.expect_err("a rescan still pending");
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(err.message().contains("re-reading"), "{err}");
    // Probed from the device (-p), not from blkid's cache.
    let label = sh("blkid", &["-p", "-o", "value", "-s", "LABEL", &dev]).expect("blkid");
    assert_eq!(label.trim(), "precious", "nothing written");
    // Once the kernel answers again, the same wipe goes through.
    wipe(&mut b, FC_WWID, WipeMode::Zero)
        .await
        .expect("wipe once the rescan is done");
    assert!(
        csi_scsi_tests::lab::scenario::all_zero(&lab.luns["fc1"]).expect("read"),
        "wiped whole"
    );
}

#[tokio::test]
async fn only_the_proxy_may_call_and_only_the_node_it_dialled_answers() {
    let (_d, lab, _cl) = lab().await;
    // The proxy's certificate dialling node-a's address while expecting node-b.
    let store = MaterialStore::load(
        MaterialPaths::in_dir(&lab.config.dir.join("pki/proxy-tls")),
        Role::Proxy,
        TrustDomain::new("csi-scsi.local").expect("domain"),
    )
    .expect("material");
    let ch = agent_channel(
        &lab.nodes[0].api.to_string(),
        "node-b",
        store,
        Duration::from_secs(5),
    )
    .expect("channel");
    let err = AgentClient::new(ch)
        .status(StatusRequest {})
        .await
        .expect_err("wrong node");
    assert!(err.to_string().contains("node-b"), "{err}");
    // An agent's certificate as a client cannot call any method.
    let (cfg, _) = crate::support::client_config(
        &lab.config.dir.join("pki/ca/ca.crt"),
        Some(&lab.config.dir.join("pki/node-b-tls")),
    );
    let err = crate::support::health_check(lab.nodes[0].api, "node-a", cfg)
        .await
        .expect_err("agent as client");
    assert!(!err.is_empty());
}

#[tokio::test]
async fn a_dead_portal_is_reported_and_the_live_one_is_used() {
    let (_d, lab, _cl) = lab().await;
    let mut a = client(&lab, 0);
    let mut t = iscsi_target(&lab, "array-a", true);
    if let Some(target::Transport::Iscsi(i)) = &mut t.transport {
        // An address on the lab's subnet that nobody answers.
        i.portals
            .push(format!("198.18.{}.250:3260", lab.net.subnet));
    }
    let started = std::time::Instant::now();
    let r = a
        .discover(DiscoverRequest { target: Some(t) })
        .await
        .expect("discover")
        .into_inner();
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "bounded by the per-portal login timeout"
    );
    assert!(!r.luns.is_empty());
    let dead: Vec<_> = r.portals.iter().filter(|p| !p.reachable).collect();
    assert_eq!(dead.len(), 1, "{:?}", r.portals);
    assert!(dead[0].portal.ends_with(".250:3260") && !dead[0].error.is_empty());
}

#[tokio::test]
async fn a_second_call_for_a_lun_being_wiped_is_aborted_and_the_wipe_completes() {
    // The LUN's disk stalls once the wipe is under way, so the wipe is
    // still running while the other calls come, however fast the machine.
    let (_d, lab, cl) = lab_with(|c| c.faulty_disks = true).await;
    let disks = lab.disks.as_ref().expect("failing disks");
    let mut b = client(&lab, 1);
    b.attach(AttachRequest {
        wwid: FC_WWID.into(),
        targets: vec![fc_target()],
        lun: 0,
    })
    .await
    .expect("attach");
    // The first wipe is under way once it reports progress.
    let mut first = b
        .wipe(WipeRequest {
            wwid: FC_WWID.into(),
            mode: WipeMode::Zero as i32,
            expected_size_bytes: 512 << 20,
        })
        .await
        .expect("wipe")
        .into_inner();
    let progress = first.message().await.expect("progress").expect("a step");
    assert!(!progress.done, "the wipe is still running: {progress:?}");
    disks.inject("fc1", Fault::Stall).expect("inject");
    disks
        .until_stalled("fc1", Duration::from_secs(30))
        .await
        .expect("the wipe reached the stalled disk");
    // A successor (a restarted proxy) asks for the same LUN meanwhile.
    let again = wipe(&mut b, FC_WWID, WipeMode::Zero).await;
    assert_eq!(again.map(|_| ()).map_err(|s| s.code()), Err(Code::Aborted));
    let detach = b
        .detach(DetachRequest {
            wwid: FC_WWID.into(),
            targets: vec![fc_target()],
        })
        .await;
    assert_eq!(detach.map(|_| ()).map_err(|s| s.code()), Err(Code::Aborted));
    // kubelet's calls take the same per-LUN guard: no stage beside a wipe.
    let staging = lab.nodes[1]
        .kubelet
        .join("plugins/kubernetes.io/csi/csi-scsi.io/pv-wiped/globalmount");
    std::fs::create_dir_all(&staging).expect("staging dir");
    let stage = cl
        .node("node-b")
        .node_stage_volume(csi_scsi_proto::csi::NodeStageVolumeRequest {
            volume_id: format!("{FC_WWID}:b1"),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(csi_scsi_tests::lab::scenario::capability(
                false,
                "ext4",
                csi_scsi_proto::csi::volume_capability::access_mode::Mode::SingleNodeWriter,
            )),
            ..Default::default()
        })
        .await;
    assert_eq!(stage.map(|_| ()).map_err(|s| s.code()), Err(Code::Aborted));
    disks.heal("fc1").expect("heal");
    let mut last = progress;
    while let Some(p) = first.message().await.expect("the first wipe goes on") {
        last = p;
    }
    assert!(last.done && last.bytes_done == last.bytes_total, "{last:?}");
    assert!(csi_scsi_tests::lab::scenario::all_zero(&lab.luns["fc1"]).expect("read"));
    b.detach(DetachRequest {
        wwid: FC_WWID.into(),
        targets: vec![fc_target()],
    })
    .await
    .expect("detach once the wipe is done");
}

#[tokio::test]
async fn detach_refuses_a_device_whose_node_cannot_be_checked_and_deletes_nothing() {
    let (_d, lab, _cl) = lab().await;
    let mut b = client(&lab, 1);
    let detach = || DetachRequest {
        wwid: FC_WWID.into(),
        targets: vec![fc_target()],
    };
    let dev = attach_fc(&mut b).await;
    let name = dev.file_name().expect("name").to_owned();
    sh("mkfs.ext4", &["-q", &dev.display().to_string()]).expect("mkfs");
    let mnt = lab.config.dir.join("mnt-hidden");
    std::fs::create_dir_all(&mnt).expect("mkdir");
    // Mounted in a private mount namespace the agent's mount table cannot
    // show (not the host's: once `/` is shared, as the Kubernetes lab
    // makes it, a host mount would propagate into the agent's namespace).
    let mut holder = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(format!(
            "mount {} {} && exec sleep 600",
            dev.display(),
            mnt.display()
        ))
        .spawn()
        .expect("a private mount namespace");
    let mountinfo = format!("/proc/{}/mountinfo", holder.id());
    let mnt_text = mnt.display().to_string();
    for _ in 0..100 {
        if std::fs::read_to_string(&mountinfo).is_ok_and(|m| m.contains(&mnt_text)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        std::fs::read_to_string(&mountinfo).is_ok_and(|m| m.contains(&mnt_text)),
        "the private mount"
    );
    // The node goes missing (udev in the middle of a change) while the
    // disk is mounted where the agent cannot see: no node to open is no
    // proof of "unused".
    let hidden = dev.with_extension("hidden");
    std::fs::rename(&dev, &hidden).expect("hide the node");
    let err = b.detach(detach()).await.expect_err("mounted");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.message().contains("cannot be checked"), "{err}");
    // Unmounted, but with no node an exclusive open cannot be tried:
    // still refused, and the path is still there.
    // The namespace goes with its last process, and the mount with it.
    holder.kill().expect("kill the holder");
    holder.wait().expect("reap the holder");
    let err = b.detach(detach()).await.expect_err("cannot be checked");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    let sys_block = lab.nodes[1].root.join("sys/block").join(&name);
    assert!(sys_block.exists(), "the path was not deleted");
    std::fs::rename(&hidden, &dev).expect("the node back");
    assert!(
        b.detach(detach())
            .await
            .expect("detach")
            .into_inner()
            .removed
    );
}

#[tokio::test]
async fn chap_secrets_never_reach_a_command_line_and_a_logout_deletes_the_record() {
    let (_d, lab, _cl) = lab().await;
    let secret = std::fs::read_to_string(lab.config.dir.join("secrets/chap-array-a/password"))
        .expect("secret");
    let node = &lab.nodes[0];
    let argv_log = iscsiadm_argv_log(&lab, 0);
    // Discovery has logged in to array-a (CHAP) already.
    let iqn = "iqn.2026-11.io.csi-scsi.lab:array-a";
    let record = node
        .root
        .join("etc/iscsi/nodes")
        .join(iqn)
        .join(format!("{},3260,1/default", lab.net.host_ip()));
    let text = std::fs::read_to_string(&record).expect("the node record");
    assert!(
        text.lines()
            .any(|l| l == format!("node.session.auth.password = {secret}")),
        "the secret is in the record:\n{text}"
    );
    assert!(text.contains("node.startup = manual"), "{text}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&record)
        .expect("stat")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    // An attach and a detach through array-a (which then has no attached
    // LUN: the agent logs out).
    let mut a = client(&lab, 0);
    let wwid = "naa.60014050000100000000000000000001";
    let target = || vec![iscsi_target(&lab, "array-a", true)];
    a.attach(AttachRequest {
        wwid: wwid.into(),
        targets: target(),
        lun: 1,
    })
    .await
    .expect("attach");
    a.detach(DetachRequest {
        wwid: wwid.into(),
        targets: target(),
    })
    .await
    .expect("detach");
    let argv = std::fs::read_to_string(&argv_log).expect("argv log");
    assert!(argv.contains("--login"), "the log is real:\n{argv}");
    assert!(
        !argv.contains(secret.trim()),
        "a CHAP secret on a command line:\n{argv}"
    );
    let lines: Vec<&str> = argv.lines().collect();
    let logout = lines
        .iter()
        .rposition(|l| l.contains(iqn) && l.contains("--logout"))
        .expect("logged out of array-a");
    assert!(
        lines[logout..]
            .iter()
            .any(|l| l.contains(iqn) && l.contains("-o delete")),
        "the record is deleted with the session:\n{argv}"
    );
}

/// Where the lab's stand-in logs node `node`'s iscsiadm command lines.
fn iscsiadm_argv_log(lab: &Lab, node: usize) -> std::path::PathBuf {
    lab.config
        .dir
        .join("nodes")
        .join(&lab.nodes[node].name)
        .join(csi_scsi_tests::lab::ISCSIADM_ARGV_LOG)
}

/// Session rescans in node `node`'s iscsiadm log so far.
fn session_rescans(lab: &Lab, node: usize) -> usize {
    std::fs::read_to_string(iscsiadm_argv_log(lab, node))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("--rescan"))
        .count()
}

/// The kernel name of the disk under `root` that reports `wwid`.
fn disk_reporting(root: &std::path::Path, wwid: &str) -> Option<String> {
    std::fs::read_dir(root.join("sys/block"))
        .expect("sys/block")
        .flatten()
        .find(|e| {
            std::fs::read_to_string(e.path().join("device/wwid")).is_ok_and(|w| w.trim() == wwid)
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
}

#[tokio::test]
async fn an_attach_scans_the_target_only_for_a_lun_its_sessions_do_not_show() {
    let (_d, mut lab, _cl) = lab().await;
    // No discovery pass may rescan meanwhile: the proxy goes, and whatever
    // it asked for last runs out first.
    lab.kill_proxy();
    let mut settled = session_rescans(&lab, 0);
    loop {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let now = session_rescans(&lab, 0);
        if now == settled {
            break;
        }
        settled = now;
    }
    assert!(settled > 0, "discovery scanned array-a: the log is real");
    let mut a = client(&lab, 0);
    let target = || vec![iscsi_target(&lab, "array-a", true)];

    // Discovery's login and scans showed every LUN of array-a.
    let a1 = "naa.60014050000100000000000000000001";
    a.attach(AttachRequest {
        wwid: a1.into(),
        targets: target(),
        lun: 1,
    })
    .await
    .expect("attach a1");
    assert_eq!(
        session_rescans(&lab, 0),
        settled,
        "a1 showed through the session: nothing to scan for"
    );

    // a2's path is deleted (`echo 1 > device/delete`): only a scan brings
    // it back.
    let a2 = "naa.60014050000100000000000000000002";
    let root = &lab.nodes[0].root;
    let name = disk_reporting(root, a2).expect("a2 is on node-a");
    std::fs::write(
        root.join("sys/block").join(&name).join("device/delete"),
        "1",
    )
    .expect("delete the path");
    for _ in 0..100 {
        if disk_reporting(root, a2).is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(disk_reporting(root, a2), None, "the path is gone");
    let attached = a
        .attach(AttachRequest {
            wwid: a2.into(),
            targets: target(),
            lun: 2,
        })
        .await
        .expect("attach a2")
        .into_inner();
    assert_eq!(
        session_rescans(&lab, 0),
        settled + 1,
        "the session was scanned for a2, once"
    );
    assert!(
        disk_reporting(root, a2).is_some() && !attached.device_path.is_empty(),
        "a2 is back: {attached:?}"
    );
}

/// `message` as a proxy leading in `epoch` sends it.
fn in_epoch<T>(epoch: u64, message: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    r.metadata_mut().insert(
        csi_scsi_contract::LEADER_EPOCH_HEADER,
        epoch.to_string().parse().expect("ascii"),
    );
    r
}

/// A zeroing wipe of `wwid` sent in `epoch`, drained.
async fn wipe_in(
    c: &mut AgentClient<Channel>,
    epoch: u64,
    wwid: &str,
) -> Result<WipeProgress, tonic::Status> {
    let request = WipeRequest {
        wwid: wwid.into(),
        mode: WipeMode::Zero as i32,
        expected_size_bytes: 512 << 20,
    };
    let mut stream = c.wipe(in_epoch(epoch, request)).await?.into_inner();
    let mut last = None;
    while let Some(p) = stream.message().await? {
        last = Some(p);
    }
    last.ok_or_else(|| tonic::Status::internal("no progress"))
}

fn assert_stale(result: Result<impl std::fmt::Debug, tonic::Status>, epoch: u64, since: u64) {
    let err = result.expect_err("a stale leader's call");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(
        err.message().contains(&format!(
            "a call from a proxy that led in epoch {epoch}; epoch {since} has led since"
        )),
        "{err}"
    );
}

#[tokio::test]
async fn a_stale_leaders_attach_detach_and_wipe_are_refused_and_change_nothing_across_a_restart() {
    let (_d, mut lab, _cl) = lab().await;
    let mut b = client(&lab, 1);
    let attach = || AttachRequest {
        wwid: FC_WWID.into(),
        targets: vec![fc_target()],
        lun: 0,
    };
    let detach = || DetachRequest {
        wwid: FC_WWID.into(),
        targets: vec![fc_target()],
    };
    // The leader of epoch 7 attaches; the volume gets data.
    let att = b
        .attach(in_epoch(7, attach()))
        .await
        .expect("attach in epoch 7")
        .into_inner();
    let dev = std::fs::canonicalize(&att.device_path)
        .expect("node")
        .display()
        .to_string();
    sh("mkfs.ext4", &["-q", "-L", "precious", &dev]).expect("mkfs");
    let label = || sh("blkid", &["-o", "value", "-s", "LABEL", &dev]).expect("blkid");

    // The leader of epoch 6, frozen until now, wakes and acts.
    assert_stale(wipe_in(&mut b, 6, FC_WWID).await, 6, 7);
    assert_stale(b.detach(in_epoch(6, detach())).await, 6, 7);
    assert_stale(b.attach(in_epoch(6, attach())).await, 6, 7);
    assert_eq!(label().trim(), "precious", "a stale wipe erased data");
    assert!(
        std::path::Path::new(&att.device_path).exists(),
        "a stale detach removed the device"
    );
    // What changes nothing is answered in any epoch.
    b.status(in_epoch(6, StatusRequest {}))
        .await
        .expect("a stale leader may still look");

    // The node remembers epoch 7 across a restart of its agent.
    lab.restart_agent(1).await.expect("restart");
    let mut b = client(&lab, 1);
    let until = tokio::time::Instant::now() + Duration::from_secs(15);
    while let Err(e) = b.status(StatusRequest {}).await {
        assert!(tokio::time::Instant::now() < until, "agent API: {e}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_stale(wipe_in(&mut b, 6, FC_WWID).await, 6, 7);
    // A call without the header (an older proxy) is epoch 0.
    let unmarked = b
        .wipe(WipeRequest {
            wwid: FC_WWID.into(),
            mode: WipeMode::Zero as i32,
            expected_size_bytes: 512 << 20,
        })
        .await
        .map(drop);
    assert_stale(unmarked, 0, 7);
    assert_eq!(label().trim(), "precious", "a stale wipe erased data");

    // The leader of epoch 8 wipes and detaches: from then on 7 is stale.
    let last = wipe_in(&mut b, 8, FC_WWID).await.expect("wipe in epoch 8");
    assert!(last.done, "{last:?}");
    assert!(csi_scsi_tests::lab::scenario::all_zero(&lab.luns["fc1"]).expect("read"));
    assert_stale(b.detach(in_epoch(7, detach())).await, 7, 8);
    let gone = b
        .detach(in_epoch(8, detach()))
        .await
        .expect("detach in epoch 8")
        .into_inner();
    assert!(gone.removed);
}

/// A peer that opens connections to the agent API and never sends a TLS
/// ClientHello holds at most the handshake slots: the next connection is
/// closed at once and counted, and once the slots are let go the proxy is
/// answered again. (Before: every connection cost a task and waited out the
/// handshake timeout, with no bound on how many.)
#[tokio::test]
async fn connections_that_never_finish_a_handshake_hold_no_more_than_the_handshake_slots() {
    use csi_scsi_daemon::HandshakeLimit;
    let (_d, lab, _cl) = lab().await;
    let node = &lab.nodes[0];
    let refused_so_far = || async {
        crate::observability::scrape(node.status)
            .await
            .value("csi_scsi_agent_api_handshakes_refused_total", &[])
            .unwrap_or(0.0)
    };
    let before = refused_so_far().await;
    let mut silent = Vec::new();
    for _ in 0..HandshakeLimit::DEFAULT {
        silent.push(
            tokio::net::TcpStream::connect(node.api)
                .await
                .expect("connect"),
        );
    }
    // The agent accepts them and waits for their handshakes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = std::time::Instant::now();
    let err = client(&lab, 0)
        .status(StatusRequest {})
        .await
        .expect_err("every handshake slot is taken");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "closed at once, not after the handshake timeout: {:?} {err}",
        started.elapsed()
    );
    assert!(refused_so_far().await > before, "the refusal is counted");
    drop(silent);
    let mut answered = None;
    for _ in 0..50 {
        match client(&lab, 0).status(StatusRequest {}).await {
            Ok(a) => {
                answered = Some(a);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert!(answered.is_some(), "answered once the slots are free");
}

/// A sysfs trigger the kernel holds (a rescan of a path whose target does
/// not answer blocks in the write for the SCSI command timeout) keeps one
/// thread, not the agent: on a one-CPU node (one runtime worker) its
/// `/healthz` and its other calls still answer meanwhile. The trigger here
/// is a FIFO, whose write blocks until something reads it.
#[tokio::test]
async fn a_rescan_held_in_the_kernel_does_not_stall_a_one_cpu_agent() {
    use nix::sched::{CpuSet, sched_setaffinity};
    use nix::unistd::Pid;
    // The lab's processes inherit this thread's CPUs: the agent's runtime
    // sizes itself to one worker, as on a one-CPU node.
    let mut one = CpuSet::new();
    one.set(0).expect("cpu 0");
    sched_setaffinity(Pid::from_raw(0), &one).expect("one CPU");
    let (_d, lab, _cl) = lab().await;
    let mut b = client(&lab, 1);
    let dev = attach_fc(&mut b).await;
    let name = dev
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    let trigger = lab.nodes[1]
        .root
        .join("sys/block")
        .join(&name)
        .join("device/rescan");
    std::fs::remove_file(&trigger).expect("the stand-in's trigger");
    nix::unistd::mkfifo(&trigger, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    let mut held = b.clone();
    let rescan = tokio::spawn(async move {
        held.rescan(RescanRequest {
            wwid: FC_WWID.into(),
        })
        .await
    });
    // The rescan is in the write once the FIFO has a writer waiting; give
    // it time to get there.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !rescan.is_finished(),
        "the rescan did not wait on its trigger"
    );
    let health = tokio::time::timeout(
        Duration::from_secs(5),
        crate::observability::get(lab.nodes[1].status, "/healthz"),
    )
    .await
    .expect("/healthz answered while a rescan was held in the kernel");
    assert_eq!(health.status, 200);
    let status = tokio::time::timeout(Duration::from_secs(5), b.status(StatusRequest {}))
        .await
        .expect("a Status call answered while a rescan was held in the kernel");
    assert!(status.is_ok(), "{status:?}");
    // The kernel answers: the write completes, so does the rescan.
    let mut reader = std::fs::File::open(&trigger).expect("open the FIFO");
    let mut got = String::new();
    std::io::Read::read_to_string(&mut reader, &mut got).expect("read");
    assert_eq!(got, "1");
    let done = tokio::time::timeout(Duration::from_secs(30), rescan)
        .await
        .expect("the rescan ends once the trigger is read")
        .expect("joined");
    assert!(done.is_ok(), "{done:?}");
}
