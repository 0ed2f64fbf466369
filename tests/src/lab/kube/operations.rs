//! The operations users fear, on the driver as it is installed: an agent
//! killed in the middle of a NodeStage, a node drained, and a rolling
//! upgrade (and rollback) of the DaemonSet and the Deployment while Pods
//! on every node write and verify continuously.

use std::time::{Duration, Instant};

use anyhow::Context;
use csi_scsi_proxy::device::Phase;
use csi_scsi_proxy::resources::SCSIDevice;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;

use super::api::{Typed, deleting, name_of, pod_phase, scheduled_on, uid_of};
use super::scenario::{
    NS, WAIT, Workload, attached, attachment, attachment_status, bound_pv, delete_workloads, exec,
    node_of, one_replica, phase, pod, pvc, volume_handle, wait_running,
};
use super::{KubeLab, LAB_TAG, pods};
use crate::disks::Fault;
use crate::kube::Kubectl;

/// The agent's container is SIGKILLed while a NodeStage is in flight:
/// every pool LUN stalls (a path in transition), so the stage blocks on
/// its first read of the new volume's device, and the kill lands there.
/// The stall is lifted; kubelet restarts the agent and retries; the call
/// converges and the LUN is formatted once. Without the failing disks (a
/// lab kept with `--keep`) the kill comes as soon as the volume is
/// attached, and the step says where the stage was.
pub async fn agent_crash(lab: &mut KubeLab, node: &str) -> anyhow::Result<String> {
    let k = lab.kubectl.clone();
    // The pool LUNs no volume holds: the new volume gets one of them, and
    // no other I/O (a bound LUN's writeback) meets the stall.
    let available: Vec<String> = super::scenario::pool_devices(&k)?
        .iter()
        .filter(|d| phase(d) == Some(Phase::Available))
        .map(|d| format!("c{}", d.spec.lun))
        .collect();
    let disks = lab.lab.disks.as_deref().cloned();
    if let Some(d) = &disks {
        for name in &available {
            d.inject(name, Fault::Stall)?;
        }
    }
    let crashed = async {
        k.apply_object(&pvc("crash", "lab-pool", "Filesystem", "32Mi"))?;
        k.apply_object(&pod(
            "crash",
            node,
            "crash",
            false,
            "echo crash-marker > /data/m && sync && sleep 100000",
        ))?;
        let pv = k
            .wait_for("PVC crash bound", WAIT, |k| Ok(bound_pv(k, "crash").ok()))
            .await?;
        let agent = pods::agent_on(&k, &lab.namespace, node)?;
        let id = pods::container_id(&agent, "csi-scsi-agent")?;
        k.wait_for("the VolumeAttachment attached", WAIT, |k| {
            Ok(attachment(k, &pv, node)?.filter(attached).map(drop))
        })
        .await?;
        let stalled = match &disks {
            Some(d) => {
                let handle = volume_handle(&k, &pv)?;
                let wwid = handle.split(':').next().unwrap_or_default();
                let lun = super::scenario::pool_devices(&k)?
                    .iter()
                    .find(|d| d.spec.wwid == wwid)
                    .map(|d| d.spec.lun)
                    .with_context(|| format!("no pool SCSIDevice {wwid}"))?;
                let name = format!("c{lun}");
                d.until_stalled(&name, WAIT).await?;
                Some(name)
            }
            None => None,
        };
        // kubelet's log says where its NodeStage (MountDevice) was: the
        // agent logs nothing before a stage's first read.
        let at_kill = lab.kubelet_log(node)?;
        lab.kill_container(node, &id)?;
        anyhow::Ok((pv, stalled, at_kill))
    }
    .await;
    if let Some(d) = &disks {
        d.heal_all();
    }
    let (pv, stalled, at_kill) = crashed?;
    let killed = Instant::now();
    let handle = volume_handle(&k, &pv)?;
    let said = |log: &str, what: &str| log.lines().any(|l| l.contains(&handle) && l.contains(what));
    let started = said(&at_kill, "MountVolume.WaitForAttach succeeded");
    let finished = said(&at_kill, "MountVolume.MountDevice succeeded");
    wait_running(&k, "crash").await?;
    let running = killed.elapsed();
    let broken = said(&lab.kubelet_log(node)?, "MountVolume.MountDevice failed");
    let got = exec(&k, "crash", &["cat", "/data/m"])?;
    anyhow::ensure!(got.trim() == "crash-marker", "marker read back as {got:?}");
    let log = lab.agent_log(node)?;
    let formats = log
        .lines()
        .filter(|l| l.contains(&handle) && l.contains("creating filesystem"))
        .count();
    anyhow::ensure!(
        formats == 1,
        "volume {handle} was formatted {formats} times across the agent's restart"
    );
    let agent = pods::agent_on(&k, &lab.namespace, node)?;
    let restarts = pods::restarts(&agent, "csi-scsi-agent");
    anyhow::ensure!(restarts >= 1, "kubelet did not restart the agent");
    if disks.is_some() {
        anyhow::ensure!(
            started && !finished && broken,
            "the kill did not land in a NodeStage (kubelet: called {started}, done before the kill {finished}, failed by it {broken})"
        );
    }
    delete_workloads(&k, &["crash"], &["crash"])?;
    Ok(format!(
        "agent on {node} SIGKILLed {}; kubelet restarted it (restarts {restarts}); the Pod Running {:.1}s after the kill, its data read back; formatted once",
        match (&stalled, started, finished) {
            (Some(lun), _, _) => format!(
                "with kubelet's NodeStage in flight, blocked on LUN {lun}'s stalled read (lifted after the kill; kubelet's call failed, its retry staged)"
            ),
            (None, true, false) => "with its NodeStage in flight".into(),
            (None, true, true) => "after its NodeStage had finished".into(),
            (None, false, _) => "before kubelet called NodeStage".into(),
        },
        running.as_secs_f64()
    ))
}

/// A Deployment's Pod with a volume of StorageClass `class` on a node
/// that is drained restarts on another node, with its data.
pub async fn drain(lab: &mut KubeLab, class: &str) -> anyhow::Result<String> {
    let k = lab.kubectl.clone();
    k.apply_object(&pvc("moved", class, "Filesystem", "32Mi"))?;
    k.apply(&one_replica(
        Workload::Deployment,
        "mover",
        "moved",
        "if [ -f /data/marker ]; then cat /data/marker > /data/seen; else echo drain-marker > /data/marker; sync; fi; sleep 100000",
    )?)?;
    let first = mover(&k).await?;
    let from = scheduled_on(&first).context("mover's node")?.to_owned();
    let first_name = pods::name(&first);
    let pv = bound_pv(&k, "moved")?;
    let t = Instant::now();
    // Only the Deployment's Pod: the lab's bare Pods would make drain
    // refuse without --force (which would delete them for good).
    let drained = k.run(&[
        "drain",
        &from,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--pod-selector=app=mover",
        "--timeout=180s",
    ]);
    let moved = async {
        drained?;
        let second = k
            .wait_for("the mover Pod running on another node", WAIT, |k| {
                let list = k.objects::<Pod>(&["-n", NS, "-l", "app=mover"])?;
                Ok(list.into_iter().find(|p| {
                    pod_phase(p) == "Running" && name_of(p) != first_name && !deleting(p)
                }))
            })
            .await?;
        anyhow::Ok(second)
    }
    .await;
    let _ = k.run(&["uncordon", &from]);
    let second = moved?;
    let again = t.elapsed();
    let to = scheduled_on(&second).context("node")?.to_owned();
    anyhow::ensure!(to != from, "the drained Pod came back on {from}");
    let name = pods::name(&second);
    let seen = k
        .wait_for("the new Pod to read its predecessor's marker", WAIT, |k| {
            Ok(exec(k, &name, &["cat", "/data/seen"]).ok())
        })
        .await?;
    anyhow::ensure!(
        seen.trim() == "drain-marker",
        "the Pod on {to} read {seen:?}"
    );
    anyhow::ensure!(
        attachment(&k, &pv, &from)?.is_none(),
        "the volume is still attached to the drained {from}"
    );
    k.run(&[
        "delete",
        "deployment",
        "mover",
        "-n",
        NS,
        "--wait=true",
        "--timeout=120s",
    ])?;
    delete_workloads(&k, &[], &["moved"])?;
    Ok(format!(
        "drained {from}: the Pod ran again on {to} {:.1}s after the drain began (detach from {from}, attach to {to}), and read the marker its predecessor wrote",
        again.as_secs_f64()
    ))
}

async fn mover(k: &Kubectl) -> anyhow::Result<Pod> {
    k.wait_for("the mover Pod running", WAIT, |k| {
        let list = k.objects::<Pod>(&["-n", NS, "-l", "app=mover"])?;
        Ok(list.into_iter().find(|p| pod_phase(p) == "Running"))
    })
    .await
}

/// Writes 64 KiB blocks of random data, each fsynced, read back and
/// compared, forever, with `pause` seconds between blocks (none at 0);
/// `/data/progress` holds "<blocks> <errors>".
fn load_script(pause: u32) -> String {
    let pause = if pause == 0 {
        String::new()
    } else {
        format!("\n  sleep {pause}")
    };
    format!(
        r#"n=0; e=0; while true; do
  dd if=/dev/urandom of=/tmp/b bs=65536 count=1 2>/dev/null
  s=$(md5sum < /tmp/b)
  f=/data/b.$((n % 16))
  if dd if=/tmp/b of=$f bs=65536 conv=fsync 2>/dev/null && [ "$(md5sum < $f)" = "$s" ]; then n=$((n+1)); else e=$((e+1)); fi
  echo "$n $e" > /data/p.tmp && mv /data/p.tmp /data/progress{pause}
done"#
    )
}

/// (blocks written and verified, errors) of a load Pod.
pub(super) fn progress(k: &Kubectl, pod: &str) -> anyhow::Result<(u64, u64)> {
    let text = exec(k, pod, &["cat", "/data/progress"])?;
    let mut it = text.split_whitespace().map(str::parse::<u64>);
    match (it.next(), it.next()) {
        (Some(Ok(n)), Some(Ok(e))) => Ok((n, e)),
        _ => anyhow::bail!("{pod}: progress {text:?}"),
    }
}

/// Load Pods ([`load_script`]), one per node, each on a claim of its own.
pub(super) struct Loads {
    /// The Pods' (and their claims') names, `load-<node>`.
    pub(super) names: Vec<String>,
    /// The Pods' UIDs.
    pub(super) uids: Vec<String>,
    /// The claims' PVs.
    pub(super) pvs: Vec<String>,
}

impl Loads {
    /// Creates a claim of `class` and `size` and a load Pod on each of
    /// `nodes`, pausing `pause` seconds between blocks, and waits for them
    /// Running.
    pub(super) async fn start(
        k: &Kubectl,
        class: &str,
        size: &str,
        nodes: &[String],
        pause: u32,
    ) -> anyhow::Result<Self> {
        let names: Vec<String> = nodes.iter().map(|n| format!("load-{n}")).collect();
        for (name, node) in names.iter().zip(nodes) {
            k.apply_object(&pvc(name, class, "Filesystem", size))?;
            k.apply_object(&pod(name, node, name, false, &load_script(pause)))?;
        }
        for name in &names {
            wait_running(k, name).await?;
        }
        let uids = names
            .iter()
            .map(|p| Ok(uid_of(&k.object::<Pod>(p, Some(NS))?).to_owned()))
            .collect::<anyhow::Result<_>>()?;
        let pvs = names
            .iter()
            .map(|c| bound_pv(k, c))
            .collect::<anyhow::Result<_>>()?;
        Ok(Self { names, uids, pvs })
    }

    /// The UIDs of the PVs' VolumeAttachments to `nodes` (in order), each
    /// attached and not going.
    pub(super) fn attachments(&self, k: &Kubectl, nodes: &[String]) -> anyhow::Result<Vec<String>> {
        self.pvs
            .iter()
            .zip(nodes)
            .map(|(pv, n)| {
                let va =
                    attachment(k, pv, n)?.with_context(|| format!("{pv} not attached to {n}"))?;
                anyhow::ensure!(
                    attached(&va) && !deleting(&va),
                    "{pv}'s attachment to {n} is going: {}",
                    attachment_status(&va)
                );
                Ok(uid_of(&va).to_owned())
            })
            .collect()
    }

    /// Fails if `log` (node `node`'s kubelet) unmounts one of the PVs.
    pub(super) fn not_torn_down(&self, node: &str, log: &str) -> anyhow::Result<()> {
        let torn: Vec<&str> = log
            .lines()
            .filter(|l| {
                self.pvs.iter().any(|pv| l.contains(pv.as_str()))
                    && (l.contains("UnmountVolume") || l.contains("UnmountDevice"))
            })
            .collect();
        anyhow::ensure!(
            torn.is_empty(),
            "kubelet on {node} tore a writer's volume down during the rollouts: {}",
            torn.join("; ")
        );
        Ok(())
    }
}

/// The image tag the upgrade rolls to.
pub(super) const NEXT_TAG: &str = "dev2";

/// Rolls the DaemonSet and the Deployment to rebuilt images with another
/// tag, then back, while Pods on every node write and verify.
pub async fn upgrade(lab: &mut KubeLab) -> anyhow::Result<String> {
    let k = lab.kubectl.clone();
    let ns = lab.namespace.clone();
    let nodes: Vec<String> = lab.nodes.iter().map(|n| n.name.clone()).collect();
    let loads = Loads::start(&k, "lab-pool", "32Mi", &nodes, 0).await?;
    let (load, uids) = (loads.names.clone(), loads.uids.clone());
    // The evidence that outlives the agents' Pods (whose logs go with
    // them): kubelet's logs from here on, and the VolumeAttachments.
    let attached = loads.attachments(&k, &nodes)?;
    let kubelet_from: Vec<usize> = nodes
        .iter()
        .map(|n| Ok(lab.kubelet_log(n)?.len()))
        .collect::<anyhow::Result<_>>()?;
    let start: Vec<(u64, u64)> = load
        .iter()
        .map(|p| progress(&k, p))
        .collect::<anyhow::Result<_>>()?;

    // The "registry": the rebuilt images, imported into every node.
    let built = crate::images::build(&crate::images::ImageOptions {
        out: lab.lab.config.dir.join("kube/images-next"),
        tag: NEXT_TAG.into(),
        profile: "debug".into(),
        pins: crate::images::Pins::Check,
        recipes: None,
    })?;
    for b in built.iter().filter(|b| b.reference.contains(NEXT_TAG)) {
        for n in &nodes {
            let i = lab.node_index(n)?;
            super::node::import_image(lab.nodes[i].containerd_socket(), &b.archive)?;
        }
    }
    let max_unavailable = k
        .object::<DaemonSet>("csi-scsi-node", Some(&ns))?
        .spec
        .and_then(|s| s.update_strategy?.rolling_update?.max_unavailable);
    let max_unavailable = serde_json::to_string(&max_unavailable)?;
    let up = roll(lab, NEXT_TAG, Roll::Upgrade).await?;
    let after_up = check_load(lab, &load, &uids, &start).await?;
    let down = roll(lab, LAB_TAG, Roll::Rollback).await?;
    let after_down = check_load(lab, &load, &uids, &after_up).await?;
    anyhow::ensure!(
        loads.attachments(&k, &nodes)? == attached,
        "a writer's VolumeAttachment was replaced during the rollouts"
    );
    for (n, from) in nodes.iter().zip(&kubelet_from) {
        let log = lab.kubelet_log(n)?;
        loads.not_torn_down(n, log.get(*from..).unwrap_or_default())?;
    }
    // Every agent rebuilt its state from the live sessions and mounts.
    let mut rebuilt = Vec::new();
    for (n, name) in nodes.iter().zip(&load) {
        let pv = bound_pv(&k, name)?;
        let status = lab.agent_status(n).await?;
        // Published entries carry the PV's name (from the target path);
        // a staged one only kubelet's hash of it: match them by WWID.
        let volumes = &status.volumes;
        let wwid = volumes
            .published
            .iter()
            .find(|v| v.volume == pv)
            .map(|v| v.wwid.clone())
            .with_context(|| format!("the agent on {n} does not list {pv} as published"))?;
        let staged = volumes.staged.iter().any(|v| v.wwid == wwid);
        anyhow::ensure!(
            staged,
            "the agent on {n} does not list {pv} ({wwid:?}) as staged"
        );
        rebuilt.push(format!("{n}: {} staged", volumes.staged.len()));
    }
    let bytes: u64 = after_down.iter().map(|(b, _)| b).sum::<u64>() * 65536
        - start.iter().map(|(b, _)| b).sum::<u64>() * 65536;
    delete_workloads(
        &k,
        &load.iter().map(String::as_str).collect::<Vec<_>>(),
        &load.iter().map(String::as_str).collect::<Vec<_>>(),
    )?;
    Ok(format!(
        "3 Pods wrote and verified {:.1} MiB in 64 KiB fsynced blocks during both rollouts, 0 errors; same Pods, same VolumeAttachments, no unmount in kubelet's logs\n      to {NEXT_TAG}: {up}\n      back to {LAB_TAG} (rollback): {down}\n      DaemonSet maxUnavailable {max_unavailable}; agents rebuilt their state: {}",
        bytes as f64 / (1 << 20) as f64,
        rebuilt.join(", ")
    ))
}

/// How a rollout is started.
#[derive(Clone, Copy, Debug)]
pub(super) enum Roll {
    /// To the new tag (`kubectl set image`, or `helm upgrade`).
    Upgrade,
    /// Back to the previous revision (`kubectl rollout undo`, or `helm
    /// rollback`).
    Rollback,
}

/// Rolls the driver's images to `tag` (`how`, by the path it was
/// installed), waits for both rollouts and returns what they took; checks
/// the DaemonSet never had more agents unavailable than its maxUnavailable
/// allows (1 of 3 at 10%, rounded up).
pub(super) async fn roll(lab: &KubeLab, tag: &str, how: Roll) -> anyhow::Result<String> {
    let k = &lab.kubectl;
    let ns = &lab.namespace;
    let t = Instant::now();
    match how {
        Roll::Upgrade => lab.installer.upgrade(ns, tag)?,
        Roll::Rollback => lab.installer.rollback(ns)?,
    }
    // Under TCG a guest takes a minute or more to replace its agent.
    let rollout_bound = Duration::from_secs(if lab.lab.config.vm { 900 } else { 300 });
    let mut most_unavailable = 0;
    let ds = loop {
        let ds = k.object::<DaemonSet>("csi-scsi-node", Some(ns))?;
        let st = ds.status.unwrap_or_default();
        most_unavailable = most_unavailable.max(st.number_unavailable.unwrap_or(0));
        let done = st.observed_generation == ds.metadata.generation
            && st.updated_number_scheduled == Some(st.desired_number_scheduled)
            && st.number_available == Some(st.desired_number_scheduled);
        if done {
            break t.elapsed();
        }
        anyhow::ensure!(
            t.elapsed() < rollout_bound,
            "the DaemonSet rollout to {tag} did not finish: {}",
            serde_json::to_string(&st)?
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    anyhow::ensure!(
        most_unavailable <= 1,
        "{most_unavailable} agents were unavailable at once (maxUnavailable 10%, rounded up, allows 1)"
    );
    k.run(&[
        "rollout",
        "status",
        "-n",
        ns,
        "deployment/csi-scsi-controller",
        "--timeout=300s",
    ])?;
    let deploy = t.elapsed();
    lab.wait_installed().await?;
    let images: Vec<String> = pods::list(k, ns, pods::AGENT_SELECTOR)?
        .iter()
        .chain(pods::list(k, ns, pods::CONTROLLER_SELECTOR)?.iter())
        .filter_map(|p| p.spec.as_ref()?.containers.first()?.image.clone())
        .collect();
    anyhow::ensure!(
        images.iter().all(|i| i.ends_with(&format!(":{tag}"))),
        "Pods still run other images: {images:?}"
    );
    Ok(format!(
        "DaemonSet rolled in {:.1}s (at most {most_unavailable} agent unavailable at once), Deployment in {:.1}s, every agent registered again at {:.1}s",
        ds.as_secs_f64(),
        deploy.as_secs_f64(),
        t.elapsed().as_secs_f64()
    ))
}

/// The load Pods are the same, still writing, with no error since `from`.
pub(super) async fn check_load(
    lab: &KubeLab,
    load: &[String],
    uids: &[String],
    from: &[(u64, u64)],
) -> anyhow::Result<Vec<(u64, u64)>> {
    let k = &lab.kubectl;
    // A few more blocks each, so a stalled writer shows.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut now = Vec::new();
    for ((p, uid), (n0, _)) in load.iter().zip(uids).zip(from) {
        let pod = k.object::<Pod>(p, Some(NS))?;
        anyhow::ensure!(uid_of(&pod) == uid, "{p} was replaced");
        anyhow::ensure!(pods::restarts(&pod, "c") == 0, "{p} restarted");
        let (n, e) = progress(k, p)?;
        anyhow::ensure!(e == 0, "{p}: {e} write or verify errors");
        anyhow::ensure!(n > *n0, "{p} stopped writing ({n0} -> {n} blocks)");
        now.push((n, e));
    }
    Ok(now)
}

/// Uninstalls the driver as docs/kubernetes.md says (the CRDs, the
/// namespace and its Secrets stay) and installs it again: bound volumes
/// keep their data and their inventory, and the reinstalled driver serves
/// the existing PersistentVolumes.
pub async fn reinstall(lab: &mut KubeLab) -> anyhow::Result<String> {
    let k = lab.kubectl.clone();
    let ns = lab.namespace.clone();
    let bound = |k: &Kubectl| -> anyhow::Result<Vec<(String, String)>> {
        let mut v: Vec<(String, String)> = k
            .objects::<SCSIDevice>(&[])?
            .into_iter()
            .filter(|d| phase(d) == Some(Phase::Bound))
            .map(|d| {
                let volume = d.status.as_ref().and_then(|s| s.binding.as_ref());
                let volume = volume.map(|b| b.volume_name.clone()).unwrap_or_default();
                (name_of(&d).to_owned(), volume)
            })
            .collect();
        v.sort();
        Ok(v)
    };
    let before = bound(&k)?;
    let pv = bound_pv(&k, "data")?;
    let t = Instant::now();
    // docs/kubernetes.md, "Uninstall", step 2, by the path it was installed.
    lab.installer.uninstall(&ns)?;
    let left = pods::list(&k, &ns, pods::AGENT_SELECTOR)?.len()
        + pods::list(&k, &ns, pods::CONTROLLER_SELECTOR)?.len();
    anyhow::ensure!(left == 0, "{left} driver Pods left after the uninstall");
    let removed = t.elapsed();
    // Uninstalled: the running Pod keeps its mounted volume.
    let got = exec(&k, "reader", &["cat", "/data/marker"])?;
    anyhow::ensure!(
        got.trim() == "lab-marker-1",
        "with the driver uninstalled, the mounted volume read {got:?}"
    );
    let during = bound(&k)?;
    anyhow::ensure!(during == before, "the uninstall changed the inventory");
    // Install again, exactly as the first time.
    lab.installer.install(|_| Ok(()))?;
    lab.wait_installed().await?;
    let reinstalled = t.elapsed();
    anyhow::ensure!(bound(&k)? == before, "the reinstall changed the inventory");
    // The existing PV, served by the new driver: the reader goes, a new Pod
    // on another node mounts it (detach, attach, stage, publish).
    let from = node_of(&k, "reader", NS).context("reader's node")?;
    let to = lab
        .nodes
        .iter()
        .map(|n| n.name.clone())
        .find(|n| *n != from)
        .context("another node")?;
    k.run(&[
        "delete",
        "pod",
        "reader",
        "-n",
        NS,
        "--wait=true",
        "--timeout=120s",
    ])?;
    k.apply_object(&pod("reader", &to, "data", false, "sleep 100000"))?;
    wait_running(&k, "reader").await?;
    let got = exec(&k, "reader", &["cat", "/data/marker"])?;
    anyhow::ensure!(
        got.trim() == "lab-marker-1",
        "{pv} on {to} after the reinstall read {got:?}"
    );
    Ok(format!(
        "uninstalled by {} (docs/kubernetes.md: workloads, RBAC, CSIDriver; CRDs, namespace, Secrets kept) in {:.1}s; the mounted volume readable meanwhile; reinstalled and Ready at {:.1}s; {} Bound SCSIDevices unchanged; {pv} moved {from} -> {to} by the new driver, marker intact",
        lab.installer.via,
        removed.as_secs_f64(),
        reinstalled.as_secs_f64(),
        before.len()
    ))
}

impl KubeLab {
    /// kubelet's log on `node` (a host process's file here).
    pub fn kubelet_log(&self, node: &str) -> anyhow::Result<String> {
        let i = self.node_index(node)?;
        Ok(self.nodes[i].kubelet.log())
    }

    /// The agent's `/status` on `node` (its status listener, the node's
    /// address: what an operator's `csi-scsi --url` reads).
    pub async fn agent_status(
        &self,
        node: &str,
    ) -> anyhow::Result<csi_scsi_status::agent::Document> {
        let i = self.node_index(node)?;
        let url = format!("http://{}/status", self.lab.nodes[i].status);
        let out = crate::lab::net::sh("curl", &["-sf", "-m", "5", &url])?;
        serde_json::from_str(&out).with_context(|| format!("{url} answered {out:?}"))
    }
}
