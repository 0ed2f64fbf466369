//! Kubernetes' non-graceful node shutdown (docs/operations.md, "A node
//! that fails: fence, then taint"): a node with a Pod's volume loses its
//! power; while it is only NotReady the driver keeps the volume published
//! there; once the operator taints it `node.kubernetes.io/out-of-service`,
//! Kubernetes deletes its Pods and detaches their volumes, and the Pod's
//! volume moves to another node with its data.

use std::time::{Duration, Instant};

use anyhow::Context;

use k8s_openapi::api::core::v1::Pod;

use super::api::{Typed, deleting, pod_node, pod_phase, pod_ready, uid_of};
use super::scenario::{
    NS, WAIT, Workload, attached, attachment, attachment_status, bound_pv, chrono_now,
    delete_workloads, device_of_volume, exec, lease_holder, node_of, one_replica, pvc,
    volume_handle, wait_back_in_views, wait_lease_renewed, wait_node_ready,
};
use super::{KubeLab, api, pods};
use crate::kube::Kubectl;

/// The StatefulSet and its claim.
const NAME: &str = "fenced";
/// Its Pod.
const POD: &str = "fenced-0";
/// The operator's taint (docs/operations.md's runbook, step 3).
const TAINT: &str = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute";
/// How long the volume must stay published to the NotReady node.
const HOLD: Duration = Duration::from_secs(45);
/// The bound on the move after the taint: Pod GC (a 20 s period), the
/// detach, the attach elsewhere, a new Pod staged and started.
const MOVE: Duration = Duration::from_secs(180);

/// A StatefulSet's Pod writes a random marker on one node; the node is
/// powered off, held while NotReady, tainted out-of-service: the Pod and
/// its volume move, the marker reads back; the node comes back, the taint
/// goes, its agent is listed again.
pub async fn out_of_service(lab: &mut KubeLab) -> anyhow::Result<String> {
    let k = lab.kubectl.clone();
    // Not the node of the proxy's leader: a leader's death is the two
    // replicas step's subject; here the driver must keep running.
    let leader = lease_holder(&k, &lab.namespace, "csi-scsi-proxy")?;
    let leader_node = node_of(&k, &leader, &lab.namespace).context("the leader's node")?;
    let nodes: Vec<String> = lab.nodes.iter().map(|n| n.name.clone()).collect();
    let dead = nodes
        .iter()
        .rev()
        .find(|n| **n != leader_node)
        .context("a node without the proxy's leader")?
        .clone();
    let i = lab.node_index(&dead)?;

    // The Pod on `dead`: the other nodes cordoned while it schedules (the
    // StatefulSet's Pod must be free to move later, so no nodeSelector).
    k.apply_object(&pvc(NAME, "lab-pool", "Filesystem", "32Mi"))?;
    let others: Vec<&String> = nodes.iter().filter(|n| **n != dead).collect();
    for n in &others {
        k.run(&["cordon", n])?;
    }
    let placed = async {
        k.apply(&one_replica(
            Workload::StatefulSet,
            NAME,
            NAME,
            "sleep 100000",
        )?)?;
        new_pod_running(&k, None, WAIT).await
    }
    .await;
    for n in &others {
        let _ = k.run(&["uncordon", n]);
    }
    let (first_uid, on) = placed?;
    anyhow::ensure!(on == dead, "{POD} was scheduled on {on}, not {dead}");
    let marker = exec(
        &k,
        POD,
        &[
            "sh",
            "-c",
            "head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n' > /data/marker && sync && cat /data/marker",
        ],
    )?;
    anyhow::ensure!(marker.trim().len() == 32, "marker written as {marker:?}");
    let pv = bound_pv(&k, NAME)?;
    let handle = volume_handle(&k, &pv)?;
    anyhow::ensure!(
        published_to(&k, &handle)? == [dead.clone()],
        "{pv} is not published to {dead} alone"
    );

    let cut = lab.nodes[i].power_off().await;
    let t = Instant::now();
    let down = async {
        let cut = cut?;
        wait_node_ready(&k, &dead, false).await?;
        let not_ready = t.elapsed();
        // NotReady is not gone: the volume stays published to the node.
        let hold = Instant::now();
        let mut checks = 0;
        while hold.elapsed() < HOLD {
            let va = attachment(&k, &pv, &dead)?
                .with_context(|| format!("the VolumeAttachment of {pv} on NotReady {dead} went"))?;
            anyhow::ensure!(
                attached(&va) && !deleting(&va),
                "{pv}'s VolumeAttachment on NotReady {dead} is being detached: {}",
                attachment_status(&va)
            );
            let published = published_to(&k, &handle)?;
            anyhow::ensure!(
                published.contains(&dead),
                "the SCSIDevice of {pv} no longer lists NotReady {dead} as published: {published:?}"
            );
            checks += 1;
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        let held = hold.elapsed();
        // The operator's word (the runbook's step 3), the node fenced.
        k.run(&["taint", "nodes", &dead, TAINT])?;
        let tainted = Instant::now();
        let (_, to) = new_pod_running(&k, Some(first_uid.as_str()), MOVE).await?;
        let running = tainted.elapsed();
        anyhow::ensure!(to != dead, "{POD} came back on the fenced {dead}");
        let published = k
            .wait_for(&format!("{pv} published to {to} only"), WAIT, |k| {
                let published = published_to(k, &handle)?;
                let va_gone = attachment(k, &pv, &dead)?.is_none();
                let va_new = attachment(k, &pv, &to)?.is_some_and(|va| attached(&va));
                Ok((va_gone && va_new && published == [to.clone()]).then_some(published))
            })
            .await?;
        let moved = tainted.elapsed();
        let got = exec(&k, POD, &["cat", "/data/marker"])?;
        anyhow::ensure!(
            got.trim() == marker.trim(),
            "the marker on {to} read {got:?}, written {marker:?} on {dead}"
        );
        let dropped = lab
            .proxy_logs()?
            .lines()
            .filter(|l| {
                l.contains("node is gone; dropping its publish record") && l.contains(&dead)
            })
            .count();
        anyhow::ensure!(
            dropped > 0,
            "no proxy log says it dropped {dead}'s publish record without its agent"
        );
        anyhow::Ok((
            cut, not_ready, held, checks, to, running, moved, published, dropped,
        ))
    }
    .await;

    // Back whatever happened: the later steps need every node. The
    // runbook's order: repaired (Ready) first, then the taint removed.
    let since = chrono_now(&k)?;
    let powered = Instant::now();
    let pids = lab.nodes[i].power_on().await?;
    lab.lab.record_pids(&pids)?;
    let ready = async {
        wait_lease_renewed(&k, &dead, since).await?;
        wait_node_ready(&k, &dead, true).await
    }
    .await;
    let untainted = k.run(&["taint", "nodes", &dead, &format!("{TAINT}-")]);
    let (cut, not_ready, held, checks, to, running, moved, published, dropped) = down?;
    ready?;
    untainted?;
    let ns = lab.namespace.clone();
    k.wait_for(&format!("the agent Pod on {dead} Ready"), WAIT, |k| {
        let agent = pods::agent_on(k, &ns, &dead)?;
        Ok(api::pod_ready(&agent).then_some(()))
    })
    .await?;
    let views = wait_back_in_views(&k, &dead).await?;
    let back = powered.elapsed();
    // Its Pods were deleted while it was off: kubelet tears their stale
    // mounts down (NodeUnpublish, NodeUnstage on its agent), the
    // filesystems shut down at the power cut writing nothing.
    let node = &lab.nodes[i];
    k.wait_for(
        &format!("{dead}'s kubelet to unstage the volumes of its deleted Pods"),
        WAIT,
        |_| {
            let left: Vec<String> = node.staged_filesystems()?;
            Ok(cut
                .filesystems
                .iter()
                .all(|f| !left.contains(f))
                .then_some(()))
        },
    )
    .await?;
    let cleaned = powered.elapsed();
    // The moved Pod stays where it is, with its data.
    let p = k.object::<Pod>(POD, Some(NS))?;
    anyhow::ensure!(
        pod_node(&p) == to && !deleting(&p),
        "{POD} did not stay on {to}: {}",
        pod_node(&p)
    );
    let got = exec(&k, POD, &["cat", "/data/marker"])?;
    anyhow::ensure!(
        got.trim() == marker.trim(),
        "the marker on {to} read {got:?} after {dead} came back"
    );
    k.run(&[
        "delete",
        "statefulset",
        NAME,
        "-n",
        NS,
        "--wait=true",
        "--timeout=120s",
    ])?;
    delete_workloads(&k, &[], &[NAME])?;
    Ok(format!(
        "{dead} powered off ({} volume filesystems shut down, {} shims and {} Pod processes killed, kubelet, kube-proxy and containerd SIGKILLed) under {POD} ({pv}, marker {})\n      NotReady after {:.1}s; held for {:.1}s ({checks} checks: VolumeAttachment attached, SCSIDevice published to {dead}); tainted out-of-service: {POD} Running on {to} {:.1}s after the taint, the attachment moved (published {published:?}) at {:.1}s, marker intact; the proxy logged {dropped} dropped publish record(s) of {dead}\n      {dead} powered on, Ready, untainted: its agent Ready and in all {views} pool devices' views {:.1}s later, the {} stale mounts unstaged at {:.1}s; {POD} stays on {to}",
        cut.filesystems.len(),
        cut.shims,
        cut.pod_processes,
        marker.trim(),
        not_ready.as_secs_f64(),
        held.as_secs_f64(),
        running.as_secs_f64(),
        moved.as_secs_f64(),
        back.as_secs_f64(),
        cut.filesystems.len(),
        cleaned.as_secs_f64(),
    ))
}

/// Waits for the StatefulSet's Pod (another than `old`, when given)
/// Running and Ready; returns its UID and node.
async fn new_pod_running(
    k: &Kubectl,
    old: Option<&str>,
    bound: Duration,
) -> anyhow::Result<(String, String)> {
    k.wait_for(&format!("Pod {POD} Running (a new one)"), bound, |k| {
        let Ok(p) = k.object::<Pod>(POD, Some(NS)) else {
            return Ok(None);
        };
        let fresh = old.is_none_or(|uid| uid_of(&p) != uid);
        let up = pod_phase(&p) == "Running" && pod_ready(&p);
        Ok((fresh && up).then(|| (uid_of(&p).to_owned(), pod_node(&p).to_owned())))
    })
    .await
}

/// The nodes the SCSIDevice holding volume `handle` is published to.
pub(super) fn published_to(k: &Kubectl, handle: &str) -> anyhow::Result<Vec<String>> {
    let device = device_of_volume(k, handle)?;
    Ok(device
        .status
        .into_iter()
        .flat_map(|s| s.published)
        .map(|p| p.node.to_string())
        .collect())
}
