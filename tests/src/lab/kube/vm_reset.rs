//! The hard-reset step of `lab up --kubernetes --vm`: a guest loses its
//! power (qemu's `system_reset`: no shutdown, no sync, its tmpfs root and
//! every session gone) while a Pod on it writes fsynced blocks. The guest
//! boots again; kubelet finds the Pod bound to its Node and the agent
//! finds no device: the proxy's next discovery pass logs the node in
//! again, kubelet's NodeStageVolume retry finds the map, mounts the
//! filesystem (no format: it carries one) and the Pod runs again, where
//! every block fsynced before the reset must read back. All the while the
//! volume is attached to that node alone.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{Pod, Toleration};
use k8s_openapi::api::storage::v1::VolumeAttachment;

use super::KubeLab;
use super::api::{Typed, node_ready, pod_node, pod_phase, pod_ready, uid_of};
use super::scenario::{
    NS, WAIT, attached, bound_pv, chrono_now, delete_workloads, exec, pod, pv_wwid, pvc,
    volume_handle, wait_all_released, wait_running,
};
use super::shutdown::published_to;
use super::vm_scenario::staged_map;
use crate::lab::node_name;

/// The claim and the Pod.
const NAME: &str = "resetter";

/// The bound on the whole return: boot, Node Ready, the next discovery
/// pass under TCG, kubelet's retry back-off (up to about two minutes).
const RETURN: Duration = Duration::from_secs(900);

/// The Pod's command. On its first start it writes 64 KiB blocks
/// (`/data/load/b.<n>`, each "block <n>" repeated), each fsynced, and
/// counts them in `/data/load/progress`; started again after the reset it
/// writes nothing (the blocks are the evidence), unless its start mark was
/// lost, which it records.
const LOAD: &str = r#"if [ -e /data/load/started ]; then exec sleep 100000; fi
if [ -e /data/load ]; then : | dd of=/data/load/lost-start-mark conv=fsync 2>/dev/null; exec sleep 100000; fi
mkdir -p /data/load && : | dd of=/data/load/started conv=fsync 2>/dev/null
n=0; while true; do
  if yes "block $n" | head -c 65536 | dd of=/data/load/b.$n conv=fsync 2>/dev/null; then n=$((n+1)); fi
  echo "$n" > /data/load/p.tmp && mv /data/load/p.tmp /data/load/progress
done"#;

/// Counts, of blocks `0..$1`, those missing or differing from what was
/// written; says whether the start mark was lost.
const VERIFY: &str = r#"n=$1; i=0; bad=0; while [ $i -lt $n ]; do
  yes "block $i" | head -c 65536 | cmp -s - /data/load/b.$i || bad=$((bad+1)); i=$((i+1)); done
lost=0; [ -e /data/load/lost-start-mark ] && lost=1; echo "$bad $lost""#;

/// The step: see the module's doc. `class`: an ext4 StorageClass of the
/// VM nodes; the Pod runs on node-a.
pub async fn hard_reset(lab: &mut KubeLab, class: &str) -> anyhow::Result<String> {
    let k = lab.kubectl.clone();
    let node = node_name(0);
    k.apply_object(&pvc(NAME, class, "Filesystem", "400Mi"))?;
    let mut p = pod(NAME, &node, NAME, false, LOAD);
    // Kept bound to its node through the outage (the default 300 s may
    // not cover boot, discovery and kubelet's back-off under TCG): this
    // step is about the node coming back, not about eviction (the fast
    // lab's out-of-service step moves a Pod off a dead node).
    if let Some(spec) = p.spec.as_mut() {
        spec.tolerations = Some(
            [
                "node.kubernetes.io/not-ready",
                "node.kubernetes.io/unreachable",
            ]
            .iter()
            .map(|key| Toleration {
                key: Some((*key).into()),
                operator: Some("Exists".into()),
                effect: Some("NoExecute".into()),
                toleration_seconds: Some(RETURN.as_secs() as i64),
                ..Toleration::default()
            })
            .collect(),
        );
    }
    k.apply_object(&p)?;
    wait_running(&k, NAME).await?;
    let uid = uid_of(&k.object::<Pod>(NAME, Some(NS))?).to_owned();
    let pv = bound_pv(&k, NAME)?;
    let handle = volume_handle(&k, &pv)?;
    let wwid = pv_wwid(&k, &pv)?;
    let map_before = staged_map(lab, 0, &wwid).await?;
    let progress = |k: &crate::kube::Kubectl| -> anyhow::Result<u64> {
        let text = exec(k, NAME, &["cat", "/data/load/progress"])?;
        text.trim()
            .parse()
            .with_context(|| format!("progress {text:?}"))
    };
    k.wait_for("the Pod's first 20 fsynced blocks", WAIT, |k| {
        if exec(k, NAME, &["test", "-e", "/data/load/progress"]).is_err() {
            return Ok(None);
        }
        Ok((progress(k)? >= 20).then_some(()))
    })
    .await?;
    // Every block below this count was fsynced before the reset.
    let fsynced = progress(&k)?;
    let va_before = only_attachment(&k, &pv, &node)?;

    let vm = lab.lab.nodes[0].vm.as_ref().context("a VM node")?;
    let reset_at = chrono_now(&k)?;
    vm.system_reset().await?;
    let reset = Instant::now();
    let mut not_ready = None;
    let mut checks = 0;
    let back = loop {
        // One node only, all along: the VolumeAttachment from before,
        // and the SCSIDevice published to node-a alone.
        let va = only_attachment(&k, &pv, &node)?;
        anyhow::ensure!(
            uid_of(&va) == uid_of(&va_before) && attached(&va),
            "{pv}'s VolumeAttachment changed during the outage: {}",
            serde_json::to_string(&va.status)?
        );
        let published = published_to(&k, &handle)?;
        anyhow::ensure!(
            published == [node.clone()],
            "{pv} published to {published:?} during the outage, not {node} alone"
        );
        checks += 1;
        let n = k.object::<k8s_openapi::api::core::v1::Node>(&node, None)?;
        if not_ready.is_none() && !node_ready(&n) {
            not_ready = Some(reset.elapsed());
        }
        let p = k.object::<Pod>(NAME, Some(NS))?;
        anyhow::ensure!(
            uid_of(&p) == uid && pod_node(&p) == node,
            "{NAME} was replaced or moved during the outage"
        );
        // A blank node's kubelet counts no restart: the container's start
        // time tells it is a new one.
        let restarted = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .and_then(|c| c.state.as_ref()?.running.as_ref()?.started_at.as_ref())
            .is_some_and(|t| t.0.as_second() > reset_at.as_second());
        if restarted && pod_phase(&p) == "Running" && pod_ready(&p) && node_ready(&n) {
            break reset.elapsed();
        }
        if reset.elapsed() > RETURN {
            let events = k
                .run(&["get", "events", "-n", NS, "--sort-by=.lastTimestamp"])
                .unwrap_or_default();
            bail!(
                "{NAME} was not running again on {node} {RETURN:?} after the reset (Node NotReady at {not_ready:?}); events in {NS}:\n{events}"
            );
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    };
    let verdict = exec(
        &k,
        NAME,
        &["sh", "-c", VERIFY, "verify", &fsynced.to_string()],
    )?;
    let (bad, lost) = match verdict
        .split_whitespace()
        .map(str::parse::<u64>)
        .collect::<Result<Vec<_>, _>>()
        .as_deref()
    {
        Ok([bad, lost]) => (*bad, *lost),
        _ => bail!("the verify script said {verdict:?}"),
    };
    anyhow::ensure!(
        lost == 0,
        "the load's start mark, fsynced before the reset, was lost"
    );
    anyhow::ensure!(
        bad == 0,
        "{bad} of the {fsynced} blocks fsynced before the reset are missing or differ"
    );
    let map_after = staged_map(lab, 0, &wwid).await?;
    delete_workloads(&k, &[NAME], &[NAME])?;
    let available = wait_all_released(&k).await?;
    Ok(format!(
        "{node} reset under {NAME} ({pv}, {map_before}) after {fsynced} fsynced blocks of 64 KiB; Node NotReady at {}; the Pod (same UID, same node) running again at {:.1}s, staged again on {map_after}; all {fsynced} blocks read back; {checks} checks of one VolumeAttachment (unchanged) and the SCSIDevice published to {node} alone; {available} devices Available after",
        not_ready.map_or("never seen".to_owned(), |t| format!(
            "{:.1}s",
            t.as_secs_f64()
        )),
        back.as_secs_f64(),
    ))
}

/// The one VolumeAttachment of `pv`: it must be `node`'s.
fn only_attachment(
    k: &crate::kube::Kubectl,
    pv: &str,
    node: &str,
) -> anyhow::Result<VolumeAttachment> {
    let mut of_pv: Vec<VolumeAttachment> = k
        .objects::<VolumeAttachment>(&[])?
        .into_iter()
        .filter(|va| va.spec.source.persistent_volume_name.as_deref() == Some(pv))
        .collect();
    match (of_pv.pop(), of_pv.is_empty()) {
        (Some(va), true) if va.spec.node_name == node => Ok(va),
        (Some(va), true) => bail!("{pv} is attached to {}, not {node}", va.spec.node_name),
        (None, _) => bail!("{pv} has no VolumeAttachment"),
        (Some(_), false) => bail!("{pv} has more than one VolumeAttachment"),
    }
}
