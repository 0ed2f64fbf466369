//! The steps of `lab up --kubernetes --vm`: the volume life cycle driven
//! only through the Kubernetes API, on nodes whose kubelet, agent Pod and
//! volumes sit on Debian's real kernel (initiator, udev, dm-multipath).
//! Each filesystem volume's staging mount is checked in the guest to be a
//! dm-multipath map over both portals' paths.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use csi_scsi_proxy::resources::{SCSIDevice, SCSITarget};

use super::KubeLab;
use super::api::Typed;
use super::scenario::{
    NS, WAIT, bound_pv, delete_workloads, exec, pod, pv_wwid, pvc, storage_class,
    wait_all_released, wait_running,
};
use crate::lab::node_name;
use crate::lab::scenario::Report;
use crate::vm::checks::wait_map;

/// How long the first discovery may take: under TCG a guest's first
/// Discover (logins to both portals, udev, multipath) outlasts the proxy's
/// 60 s deadline, and a later pass finds the LUNs (139 to 271 s measured;
/// a run with the host's cores busy meanwhile passed 300 s).
const DISCOVERY_WAIT: Duration = Duration::from_secs(480);

/// A developer's shortcut (docs/kubernetes-lab.md): `drain` runs the
/// targets and classes steps, then drain and the steps after it, which
/// need nothing else; `upgrade` and `e2e` the same from the upgrade under
/// load and from the storage e2e suite; a run so cut is not the lab's
/// SUCCESS.
pub const FROM_ENV: &str = "CSI_SCSI_VM_KUBE_FROM";

/// Where a run begins after the targets and classes ([`FROM_ENV`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Start {
    /// Every step: the lab's run.
    Ext4,
    /// Drain, hard reset, upgrade under load, the storage e2e suite.
    Drain,
    /// Upgrade under load, the storage e2e suite.
    Upgrade,
    /// The storage e2e suite.
    E2e,
}

impl Start {
    /// The shortcut named in [`FROM_ENV`], if any.
    fn from_env() -> anyhow::Result<Self> {
        match std::env::var(FROM_ENV) {
            Err(_) => Ok(Self::Ext4),
            Ok(v) if v == "drain" => Ok(Self::Drain),
            Ok(v) if v == "upgrade" => Ok(Self::Upgrade),
            Ok(v) if v == "e2e" => Ok(Self::E2e),
            Ok(v) => {
                bail!("{FROM_ENV}={v:?}: the shortcuts are \"drain\", \"upgrade\" and \"e2e\"")
            }
        }
    }
}

/// Runs the steps; the first failure ends the run.
pub async fn run(lab: &mut KubeLab) -> anyhow::Result<Report> {
    let from = Start::from_env()?;
    if from != Start::Ext4 {
        println!(
            "  ({FROM_ENV}={}: the steps before it are skipped, but targets and classes; not a full run)",
            std::env::var(FROM_ENV).unwrap_or_default()
        );
    }
    let mut r = Report::default();
    let k = lab.kubectl.clone();
    let node_b = node_name(1);
    // Two guests by default (lab.rs, VM_KUBE_NODES): the last one is the
    // node array-b's ACL refuses.
    let last = lab.lab.nodes.len() - 1;

    r.step(
        "targets: array-a's CHAP Secret and the SCSITargets (two portals each), created through the API; every guest's agent discovers through its real initiator",
        async {
            super::targets::create_targets(lab, super::targets::Pool::Later)?;
            let devices = k
                .wait_for("SCSIDevices discovered", DISCOVERY_WAIT, |k| {
                    let n = k.objects::<SCSIDevice>(&[])?.len();
                    Ok((n >= 4).then_some(n))
                })
                .await?;
            let nodes = k
                .wait_for("SCSITarget array-a seen by every guest", DISCOVERY_WAIT, |k| {
                    let status = k.object::<SCSITarget>("array-a", None)?.status.unwrap_or_default();
                    let nodes = status.nodes.len();
                    Ok((nodes == lab.lab.nodes.len()).then_some(nodes))
                })
                .await?;
            Ok(((), format!("{devices} SCSIDevices; array-a seen by {nodes} nodes")))
        },
    )
    .await?;

    r.step(
        "classes: ext4 and xfs on array-a (CHAP), raw block on array-b (its ACL refuses the last node)",
        async {
            k.run(&["create", "namespace", NS])?;
            k.apply_object(&storage_class("vm-ext4", "array=a", "ext4", "zero"))?;
            k.apply_object(&storage_class("vm-xfs", "array=a", "xfs", "zero"))?;
            k.apply_object(&storage_class("vm-block", "array=b", "ext4", "discard"))?;
            Ok(((), String::new()))
        },
    )
    .await?;

    if from <= Start::Ext4 {
        r.step(
        "ext4: a PVC and a Pod on node-a that writes a marker (fsynced); staged on a dm-multipath map over both portals",
        marker_pod(
            lab,
            ("data", "vm-ext4", "400Mi"),
            ("writer", 0),
            "vm-marker-1",
            &cut_load_on_start(),
        ),
    )
    .await?;

        r.step(
            "xfs: a PVC and a Pod on the last node that writes a marker; its own map",
            marker_pod(
                lab,
                ("logs", "vm-xfs", "600Mi"),
                ("logger", last),
                "vm-marker-2",
                "sleep 100000",
            ),
        )
        .await?;

        r.step(
        "raw block: a Block PVC on array-b and a Pod on node-a (array-b admits it) that writes and reads the device",
        async {
            k.apply_object(&pvc("raw", "vm-block", "Block", "600Mi"))?;
            k.apply_object(&pod(
                "raw",
                &node_name(0),
                "raw",
                true,
                "echo vm-block-marker | dd of=/dev/xvda bs=512 conv=fsync 2>/dev/null && sleep 100000",
            ))?;
            wait_running(&k, "raw").await?;
            let got = exec(
                &k,
                "raw",
                &["sh", "-c", "dd if=/dev/xvda bs=512 count=1 2>/dev/null | head -1"],
            )?;
            anyhow::ensure!(got.trim() == "vm-block-marker", "block marker read back as {got:?}");
            Ok(((), String::new()))
        },
    )
    .await?;

        r.step(
        "expand: the ext4 PVC asks for 256 MiB more while its Pod runs; the array grows the LUN; the resizer, the agent (the map resized) and kubelet grow the filesystem online (df in the Pod)",
        async {
            let grown = super::scenario::expand(&mut *lab).await?;
            let wwid = pv_wwid(&lab.kubectl, &bound_pv(&lab.kubectl, "data")?)?;
            let map = staged_map(lab, 0, &wwid).await?;
            Ok(((), format!("{grown}\n      still staged on {map}")))
        },
    )
    .await?;

        r.step(
        "kubelet restart: node-a's kubelet stopped and started under the running ext4 Pod; the volume stays mounted, kubelet reconstructs it, no NodeUnstage",
        kubelet_restart_in_guest(lab, 0, "writer", "vm-marker-1"),
    )
    .await?;

        r.step(
        "path cut: portal 2's link of node-a cut while the ext4 Pod writes 64 KiB blocks, each fsynced; writes go on over one path, the path comes back, every block reads back",
        path_cut(lab),
    )
    .await?;

        r.step(
        "all paths lost: array-a refuses node-a and drops its sessions under the ext4 Pod; the Pod's next fsynced write fails once multipath stops queueing, NodeGetVolumeStats says abnormal, nothing is detached or wiped; the array takes node-a back, both paths return, the Pod is recreated there and every block fsynced before reads back",
        all_paths_lost(lab),
    )
    .await?;

        r.step(
        "move: the ext4 Pod is deleted and recreated on node-b, which reads node-a's marker; node-a's agent detached the LUN and nothing on node-a stands on it",
        async {
            let pv = bound_pv(&k, "data")?;
            let wwid = pv_wwid(&k, &pv)?;
            let detached = format!("detached wwid={wwid}");
            let detaches = agent_log_count(lab, 0, &detached).await?;
            delete_workloads(&k, &["survivor"], &[])?;
            k.apply_object(&pod("reader", &node_b, "data", false, "sleep 100000"))?;
            wait_running(&k, "reader").await?;
            let got = exec(&k, "reader", &["cat", "/data/marker"])?;
            anyhow::ensure!(got.trim() == "vm-marker-1", "marker on {node_b} read as {got:?}");
            let map = staged_map(lab, 1, &wwid).await?;
            // The detach removed node-a's map and logged out of array-a;
            // the proxy's next discovery pass logs in again and the map
            // comes back, by design (docs/lab.md, VM nodes: detach), so
            // what must hold is that it was detached and is not in use.
            anyhow::ensure!(
                agent_log_count(lab, 0, &detached).await? > detaches,
                "node-a's agent logged no detach of {wwid}"
            );
            let used = mounts_on_maps(lab, 0, &wwid).await?;
            anyhow::ensure!(used.is_empty(), "on node-a, mounts still stand on {wwid}'s map: {used:?}");
            Ok(((), format!("on {node_b}: {map}; node-a's agent detached it (its map back since by discovery: {:?}, nothing mounted on it)", maps_of(lab, 0, &wwid).await?)))
        },
    )
    .await?;

        r.step(
            "delete: Pods and PVCs deleted; PVs go, the LUNs are wiped and offered again",
            async {
                delete_workloads(&k, &["reader", "logger", "raw"], &["data", "logs", "raw"])?;
                let available = wait_all_released(&k).await?;
                Ok(((), format!("{available} devices Available")))
            },
        )
        .await?;
    }
    if from <= Start::Drain {
        r.step(
            "drain: kubectl drain the node of a Deployment's Pod with an ext4 volume on array-a; it runs again on the other node with its data; the LUN wiped after",
            async {
                let moved = super::operations::drain(&mut *lab, "vm-ext4").await?;
                let available = wait_all_released(&lab.kubectl).await?;
                Ok(((), format!("{moved}; {available} devices Available")))
            },
        )
        .await?;

        r.step(
            "hard reset: node-a loses its power (qemu system_reset) while a Pod on it writes fsynced blocks; the guest boots blank, the next discovery logs it in again, kubelet stages the volume again and the same Pod runs there; every block fsynced before reads back; the volume attached to node-a alone throughout",
            async { Ok(((), super::vm_reset::hard_reset(&mut *lab, "vm-ext4").await?)) },
        )
        .await?;
    }
    if from <= Start::Upgrade {
        r.step(
            "upgrade under load: a Pod on every guest writes and verifies fsynced blocks while the agents' DaemonSet and the Deployment roll to another tag and back; 0 errors, same Pods and VolumeAttachments, no unmount",
            async {
                Ok((
                    (),
                    super::vm_upgrade::upgrade_under_load(&mut *lab, "vm-ext4").await?,
                ))
            },
        )
        .await?;
    }
    r.step(
        "storage e2e: Kubernetes' own storage tests, a focused subset, on the guests (the suite's Pods that enter the node enter Debian's kernel); a small pool on array-c declared for it alone",
        async {
            Ok((
                (),
                super::vm_storage_e2e::storage_e2e(&mut *lab).await?,
            ))
        },
    )
    .await?;

    Ok(r)
}

/// Writes block `$n` of 64 KiB (its text "block <n>" repeated) and
/// fsyncs it, until `/data/cut/stop` exists; `/data/cut/progress` holds
/// "<blocks> <errors>".
const CUT_LOAD: &str = r#"mkdir -p /data/cut; n=0; e=0; while [ ! -e /data/cut/stop ]; do
  if yes "block $n" | head -c 65536 | dd of=/data/cut/b.$n conv=fsync 2>/dev/null; then n=$((n+1)); else e=$((e+1)); fi
  echo "$n $e" > /data/cut/p.tmp && mv /data/cut/p.tmp /data/cut/progress
done"#;

/// Where the path-cut step asks the `writer` Pod to start [`CUT_LOAD`].
const CUT_START: &str = "/data/cut-start";

/// The `writer` Pod's own command after its marker: it waits for
/// [`CUT_START`], then runs [`CUT_LOAD`]. The Pod's main process runs the
/// load: a process started by `kubectl exec` in the background did not
/// outlive the exec (busybox has no `nohup`, and the exec's session ends).
fn cut_load_on_start() -> String {
    format!("while [ ! -e {CUT_START} ]; do sleep 1; done; {CUT_LOAD}; sleep 100000")
}

/// Counts the blocks of [`CUT_LOAD`] below `/data/cut/progress`'s count
/// whose content differs from what was written.
const CUT_VERIFY: &str = r#"read n e < /data/cut/progress; i=0; bad=0; while [ $i -lt $n ]; do
  yes "block $i" | head -c 65536 | cmp -s - /data/cut/b.$i || bad=$((bad+1)); i=$((i+1)); done; echo "$n $e $bad""#;

/// [`CUT_VERIFY`] in `pod`: (blocks written, write errors, blocks that
/// differ).
fn verify_blocks(k: &crate::kube::Kubectl, pod: &str) -> anyhow::Result<(u64, u64, u64)> {
    let verdict = exec(k, pod, &["sh", "-c", CUT_VERIFY])?;
    let mut it = verdict.split_whitespace().map(str::parse::<u64>);
    match (it.next(), it.next(), it.next()) {
        (Some(Ok(n)), Some(Ok(e)), Some(Ok(bad))) => Ok((n, e, bad)),
        _ => bail!("the verify script in {pod} said {verdict:?}"),
    }
}

/// The path-cut step: [`CUT_LOAD`] started in the `writer` Pod on node-a,
/// portal 2's link of the guest cut until multipath fails that path and
/// the Pod has written on over the other one, then restored; every block
/// reads back and none failed.
async fn path_cut(lab: &KubeLab) -> anyhow::Result<((), String)> {
    let k = &lab.kubectl;
    let vm = lab.lab.nodes[0].vm.as_ref().context("a VM node")?;
    let wwid = pv_wwid(k, &bound_pv(k, "data")?)?;
    exec(k, "writer", &["touch", CUT_START])?;
    let progress = |k: &crate::kube::Kubectl| -> anyhow::Result<(u64, u64)> {
        let text = exec(k, "writer", &["cat", "/data/cut/progress"])?;
        let mut it = text.split_whitespace().map(str::parse::<u64>);
        match (it.next(), it.next()) {
            (Some(Ok(n)), Some(Ok(e))) => Ok((n, e)),
            _ => bail!("progress {text:?}"),
        }
    };
    // Until the load wrote its first progress file, `cat` fails: that is
    // "not yet", any other answer is read as it is.
    k.wait_for("the writer's first blocks", WAIT, |k| {
        let started = exec(k, "writer", &["test", "-e", "/data/cut/progress"]).is_ok();
        if !started {
            return Ok(None);
        }
        Ok((progress(k)?.0 >= 5).then_some(()))
    })
    .await?;
    let cut_at = Instant::now();
    vm.set_link(1, false).await?;
    let failed = wait_map(&vm.guest, &wwid, |m| m.failed == 1, WAIT)
        .await
        .context("multipath never failed the cut path")?;
    let failed_after = cut_at.elapsed();
    let (at_failure, _) = progress(k)?;
    let (during, errors) = k
        .wait_for("20 more blocks over the one path left", WAIT, |k| {
            let (n, e) = progress(k)?;
            if e > 0 {
                bail!("{e} write errors during the cut");
            }
            Ok((n >= at_failure + 20).then_some((n, e)))
        })
        .await?;
    vm.set_link(1, true).await?;
    let back = wait_map(&vm.guest, &wwid, |m| m.active == 2, WAIT)
        .await
        .context("the path was not reinstated")?;
    let reinstated = cut_at.elapsed();
    exec(k, "writer", &["touch", "/data/cut/stop"])?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (n, e, bad) = verify_blocks(k, "writer")?;
    anyhow::ensure!(
        e == 0 && bad == 0,
        "{n} blocks: {e} write errors, {bad} differ"
    );
    Ok((
        (),
        format!(
            "multipath failed the path {:.1}s after the cut ({}); {} blocks written over one path ({during} by then, {errors} errors); reinstated {:.1}s after the cut ({}); {n} blocks of 64 KiB read back intact",
            failed_after.as_secs_f64(),
            failed.summary(),
            during - at_failure,
            reinstated.as_secs_f64(),
            back.summary()
        ),
    ))
}

/// How many times node `i`'s agent (its container log in the guest) shows
/// an agent API call of `method`.
async fn agent_calls_in_guest(lab: &KubeLab, i: usize, method: &str) -> anyhow::Result<usize> {
    agent_log_count(lab, i, &format!("method=\"{method}\"")).await
}

/// How many times node `i`'s agent (its container log in the guest) shows
/// a CSI call of `method` (as kubelet made it).
async fn csi_calls_in_guest(lab: &KubeLab, i: usize, method: &str) -> anyhow::Result<usize> {
    agent_log_count(lab, i, &format!("rpc{{method={method} ")).await
}

/// Lines of node `i`'s agent container logs in the guest holding `needle`.
async fn agent_log_count(lab: &KubeLab, i: usize, needle: &str) -> anyhow::Result<usize> {
    let guest = &lab.lab.nodes[i].vm.as_ref().context("a VM node")?.guest;
    let script = format!(
        "cat /var/log/pods/csi-scsi_csi-scsi-node-*/csi-scsi-agent/*.log | grep -cF '{needle}' || true"
    );
    Ok(guest.run(&["sh", "-c", &script]).await?.trim().parse()?)
}

/// Detach and Wipe calls node-a's agent has served.
async fn detach_or_wipe_calls(lab: &KubeLab) -> anyhow::Result<usize> {
    Ok(
        agent_calls_in_guest(lab, 0, "Detach").await?
            + agent_calls_in_guest(lab, 0, "Wipe").await?,
    )
}

/// The all-paths-lost step: array-a's ACL keeps node-b only and its
/// sessions are dropped, so node-a's map loses both paths under the
/// `writer` Pod (the blocks of [`CUT_LOAD`] on it). While that lasts the
/// Pod's fsynced write must fail (not hang, not succeed), the agent's
/// NodeGetVolumeStats must say abnormal, and the VolumeAttachment, the
/// device's phase and the map must stay, with no Detach or Wipe on
/// node-a. Then the array takes node-a back; once both paths are active
/// the Pod is replaced by `survivor` on node-a, which reads every block.
async fn all_paths_lost(lab: &mut KubeLab) -> anyhow::Result<((), String)> {
    use csi_scsi_proto::csi::NodeGetVolumeStatsRequest;
    use csi_scsi_proto::csi::node_client::NodeClient;
    let k = lab.kubectl.clone();
    let node_a = node_name(0);
    let pv = bound_pv(&k, "data")?;
    let wwid = pv_wwid(&k, &pv)?;
    let handle = super::scenario::volume_handle(&k, &pv)?;
    let pod_uid =
        super::api::uid_of(&k.object::<k8s_openapi::api::core::v1::Pod>("writer", Some(NS))?)
            .to_owned();
    let phase_before = super::scenario::phase(&super::scenario::device_of_volume(&k, &handle)?);
    let guest = lab.lab.nodes[0]
        .vm
        .as_ref()
        .context("a VM node")?
        .guest
        .clone();
    let before = detach_or_wipe_calls(lab).await?;

    let node_b_ip = lab.lab.net.node_ip(1);
    let tgtd = lab.lab.tgtd.as_mut().context("tgtd")?;
    tgtd.unbind_all(1).await?;
    tgtd.bind_initiator_address(1, &node_b_ip).await?;
    let lost_at = Instant::now();
    let dropped = tgtd.drop_connections(1).await?;
    wait_map(&guest, &wwid, |m| m.active == 0, WAIT)
        .await
        .context("node-a's paths did not fail")?;
    let failed_after = lost_at.elapsed();

    // What the Pod sees: a write and fsync that fails once multipath
    // gives up queueing (no_path_retry), never a success.
    let t = Instant::now();
    let seen = exec(
        &k,
        "writer",
        &[
            "sh",
            "-c",
            "dd if=/dev/zero of=/data/lost bs=4096 count=1 conv=fsync 2>&1; echo rc=$?",
        ],
    )?;
    let write_took = t.elapsed();
    anyhow::ensure!(
        !seen.contains("rc=0"),
        "a fsynced write with every path lost succeeded: {seen:?}"
    );

    // What the node plugin reports, through the guest's CSI socket (as
    // kubelet calls it).
    let volume_path =
        format!("/var/lib/kubelet/pods/{pod_uid}/volumes/kubernetes.io~csi/{pv}/mount");
    let mut node = NodeClient::new(crate::csi_client::csi_channel(&lab.lab.nodes[0].csi).await?);
    let stats = node
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: handle.clone(),
            volume_path,
            staging_target_path: String::new(),
        })
        .await
        .context("NodeGetVolumeStats")?
        .into_inner();
    let condition = stats
        .volume_condition
        .filter(|c| c.abnormal)
        .map(|c| c.message)
        .context("NodeGetVolumeStats reports no abnormal condition with every path lost")?;
    anyhow::ensure!(
        condition.contains("no path"),
        "the condition does not say the paths are gone: {condition}"
    );

    // Nothing detached or wiped while it lasts.
    let va =
        super::scenario::attachment(&k, &pv, &node_a)?.context("the VolumeAttachment is gone")?;
    anyhow::ensure!(
        super::scenario::attached(&va),
        "the VolumeAttachment is no longer attached: {}",
        super::scenario::attachment_status(&va)
    );
    let phase_now = super::scenario::phase(&super::scenario::device_of_volume(&k, &handle)?);
    anyhow::ensure!(
        phase_now == phase_before,
        "the device went from {phase_before:?} to {phase_now:?} while its paths were lost"
    );
    anyhow::ensure!(
        crate::vm::checks::map_of(&guest, &wwid).await.is_ok(),
        "node-a's map is gone: something removed it"
    );
    let during = detach_or_wipe_calls(lab).await?;
    anyhow::ensure!(
        during == before,
        "node-a's agent was called {} Detach or Wipe",
        during - before
    );

    // The array takes node-a back.
    lab.lab.tgtd.as_mut().context("tgtd")?.bind_all(1).await?;
    let back = wait_map(&guest, &wwid, |m| m.active == 2, WAIT)
        .await
        .context("node-a's paths did not come back")?;
    let back_after = lost_at.elapsed();
    delete_workloads(&k, &["writer"], &[])?;
    k.apply_object(&pod("survivor", &node_a, "data", false, "sleep 100000"))?;
    wait_running(&k, "survivor").await?;
    let (n, _, bad) = verify_blocks(&k, "survivor")?;
    anyhow::ensure!(
        n > 0 && bad == 0,
        "{bad} of {n} blocks differ after every path was lost"
    );
    let marker = exec(&k, "survivor", &["cat", "/data/marker"])?;
    anyhow::ensure!(marker.trim() == "vm-marker-1", "marker read as {marker:?}");
    Ok((
        (),
        format!(
            "{dropped} connections dropped; both paths failed {:.1}s after; the Pod's fsynced write answered after {:.1}s: {}; NodeGetVolumeStats: {condition}; VolumeAttachment attached, device {phase_now:?}, map kept, no Detach or Wipe; paths back {:.1}s after the loss ({}); a new Pod on {node_a} read {n} blocks and the marker intact",
            failed_after.as_secs_f64(),
            write_took.as_secs_f64(),
            seen.lines()
                .filter(|l| !l.trim().is_empty())
                .collect::<Vec<_>>()
                .join(" | "),
            back_after.as_secs_f64(),
            back.summary()
        ),
    ))
}

/// The kubelet-restart step on guest `i` under Pod `pod`: kubelet is
/// stopped as `systemctl stop` would (the guest's init supervises it and
/// holds it down while `/run/kubelet.stopped` exists), the Pod's volume
/// stays mounted in the guest meanwhile, kubelet starts again and
/// reconstructs the volume: same Pod, `marker` read, no NodeUnstage or
/// NodeUnpublish.
async fn kubelet_restart_in_guest(
    lab: &KubeLab,
    i: usize,
    pod: &str,
    marker: &str,
) -> anyhow::Result<((), String)> {
    use super::scenario::{chrono_now, wait_lease_renewed, wait_node_ready};
    let k = &lab.kubectl;
    let node = node_name(i);
    let guest = &lab.lab.nodes[i].vm.as_ref().context("a VM node")?.guest;
    let (unstage, unpublish) = (
        csi_calls_in_guest(lab, i, "NodeUnstageVolume").await?,
        csi_calls_in_guest(lab, i, "NodeUnpublishVolume").await?,
    );
    let stage = csi_calls_in_guest(lab, i, "NodeStageVolume").await?;
    anyhow::ensure!(
        stage > 0,
        "no NodeStageVolume in {node}'s agent log: wrong log format?"
    );
    let uid =
        super::api::uid_of(&k.object::<k8s_openapi::api::core::v1::Pod>(pod, Some(NS))?).to_owned();
    let before = guest
        .run(&["cat", "/run/kubelet.pid"])
        .await?
        .trim()
        .to_owned();
    guest
        .run(&[
            "sh",
            "-c",
            "touch /run/kubelet.stopped; p=$(cat /run/kubelet.pid); kill $p; while kill -0 $p 2>/dev/null; do sleep 0.2; done",
        ])
        .await?;
    let stopped = chrono_now(k)?;
    let mounts = guest
        .run(&[
            "sh",
            "-c",
            &format!("grep {uid} /proc/mounts | grep -vc volume-subpaths || true"),
        ])
        .await?;
    let mounts: usize = mounts.trim().parse()?;
    anyhow::ensure!(
        mounts > 0,
        "with kubelet stopped, {node} holds no mount of Pod {pod}"
    );
    guest.run(&["rm", "/run/kubelet.stopped"]).await?;
    let t = Instant::now();
    wait_lease_renewed(k, &node, stopped).await?;
    wait_node_ready(k, &node, true).await?;
    let ready = t.elapsed();
    let after = guest
        .run(&["cat", "/run/kubelet.pid"])
        .await?
        .trim()
        .to_owned();
    anyhow::ensure!(after != before, "kubelet's PID is still {before}");
    let got = k
        .wait_for("kubectl exec through the restarted kubelet", WAIT, |k| {
            Ok(exec(k, pod, &["cat", "/data/marker"]).ok())
        })
        .await?;
    anyhow::ensure!(got.trim() == marker, "marker read back as {got:?}");
    let p = k.object::<k8s_openapi::api::core::v1::Pod>(pod, Some(NS))?;
    anyhow::ensure!(super::api::uid_of(&p) == uid, "the Pod was replaced");
    // A few syncs, so a wrong teardown would have happened.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (u2, p2) = (
        csi_calls_in_guest(lab, i, "NodeUnstageVolume").await?,
        csi_calls_in_guest(lab, i, "NodeUnpublishVolume").await?,
    );
    anyhow::ensure!(
        u2 == unstage && p2 == unpublish,
        "kubelet tore the volume down after its restart: NodeUnstageVolume {unstage} -> {u2}, NodeUnpublishVolume {unpublish} -> {p2}"
    );
    let restaged = csi_calls_in_guest(lab, i, "NodeStageVolume")
        .await?
        .saturating_sub(stage);
    Ok((
        (),
        format!(
            "{node}'s kubelet stopped (PID {before}) with the Pod's {mounts} mounts kept in the guest, started again (PID {after}), Lease renewed and Ready {:.1}s after; Pod {pod} the same, marker read; NodeUnstageVolume/NodeUnpublishVolume unchanged ({unstage}/{unpublish}); {restaged} idempotent NodeStageVolume on reconstruction",
            ready.as_secs_f64()
        ),
    ))
}

/// A filesystem PVC `(claim, class, size)` and a Pod `(name, node index)`
/// writing `marker` (fsynced) to it, then running `then` as its command;
/// the marker is read back, and the volume's staging mount in that guest
/// stands on its dm-multipath map.
async fn marker_pod(
    lab: &KubeLab,
    (claim, class, size): (&str, &str, &str),
    (name, node): (&str, usize),
    marker: &str,
    then: &str,
) -> anyhow::Result<((), String)> {
    let k = &lab.kubectl;
    let node_name = node_name(node);
    k.apply_object(&pvc(claim, class, "Filesystem", size))?;
    k.apply_object(&pod(
        name,
        &node_name,
        claim,
        false,
        &format!("echo {marker} > /data/marker && sync && {then}"),
    ))?;
    wait_running(k, name).await?;
    let got = exec(k, name, &["cat", "/data/marker"])?;
    anyhow::ensure!(got.trim() == marker, "marker read back as {got:?}");
    let pv = bound_pv(k, claim).context("bound PV")?;
    let map = staged_map(lab, node, &pv_wwid(k, &pv)?).await?;
    Ok(((), format!("{pv} on {node_name}: {map}")))
}

/// The dm-multipath map of `wwid` on guest `i` that kubelet's staging
/// mount stands on, with its paths; fails unless there is exactly one
/// such map, it has at least two paths (one per portal), and a staging
/// mount's source is it.
pub(super) async fn staged_map(lab: &KubeLab, i: usize, wwid: &str) -> anyhow::Result<String> {
    let maps = maps_of(lab, i, wwid).await?;
    let [(dm, paths)] = maps.as_slice() else {
        bail!(
            "{} holds {} maps for {wwid}: {maps:?}",
            node_name(i),
            maps.len()
        );
    };
    if *paths < 2 {
        bail!("{dm} for {wwid} has {paths} path(s), not one per portal");
    }
    let guest = &lab.lab.nodes[i].vm.as_ref().context("a VM node")?.guest;
    // The devices kubelet's CSI mounts stand on, links resolved (a raw
    // block volume's bind mount of its device file names no path: kept).
    let sources = guest
        .run(&[
            "sh",
            "-c",
            "awk '$2 ~ /kubernetes.io\\/csi\\// {print $1}' /proc/mounts | while read -r s; do readlink -f \"$s\" || echo \"$s\"; done",
        ])
        .await?;
    anyhow::ensure!(
        sources.lines().any(|s| s == format!("/dev/{dm}")),
        "no staging mount of /dev/{dm} on {} (mounted: {sources:?})",
        node_name(i)
    );
    Ok(format!("/dev/{dm} over {paths} paths"))
}

/// The mounts on guest `i` (lines of `/proc/mounts`) whose source is one
/// of `wwid`'s maps, links resolved.
async fn mounts_on_maps(lab: &KubeLab, i: usize, wwid: &str) -> anyhow::Result<Vec<String>> {
    let maps: Vec<String> = maps_of(lab, i, wwid)
        .await?
        .into_iter()
        .map(|(dm, _)| format!("/dev/{dm}"))
        .collect();
    if maps.is_empty() {
        return Ok(Vec::new());
    }
    let guest = &lab.lab.nodes[i].vm.as_ref().context("a VM node")?.guest;
    let out = guest
        .run(&[
            "sh",
            "-c",
            "while read -r s rest; do echo \"$(readlink -f \"$s\" || echo \"$s\") $s $rest\"; done < /proc/mounts",
        ])
        .await?;
    Ok(out
        .lines()
        .filter(|l| {
            maps.iter()
                .any(|m| l.split_whitespace().next() == Some(m.as_str()))
        })
        .map(str::to_owned)
        .collect())
}

/// The dm-multipath maps on guest `i` whose uuid names `wwid`
/// (`mpath-3<naa>`), each with its number of paths, read from sysfs.
async fn maps_of(lab: &KubeLab, i: usize, wwid: &str) -> anyhow::Result<Vec<(String, usize)>> {
    let hex = wwid.trim_start_matches("naa.").to_ascii_lowercase();
    let guest = &lab.lab.nodes[i].vm.as_ref().context("a VM node")?.guest;
    let script = format!(
        "for d in /sys/block/dm-*; do [ -e \"$d/dm/uuid\" ] || continue; \
         case \"$(cat $d/dm/uuid)\" in mpath-*{hex}*) echo \"${{d##*/}} $(ls $d/slaves | wc -l)\";; esac; done"
    );
    let out = guest.run(&["sh", "-c", &script]).await?;
    out.lines()
        .map(|l| {
            let (dm, n) = l.split_once(' ').context("dm line")?;
            Ok((dm.to_owned(), n.trim().parse()?))
        })
        .collect()
}
