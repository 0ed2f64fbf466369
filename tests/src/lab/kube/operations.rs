//! The operations users fear, on the driver as it is installed: an agent
//! killed in the middle of a NodeStage, a node drained, and a rolling
//! upgrade (and rollback) of the DaemonSet and the Deployment while Pods
//! on every node write and verify continuously.

use std::time::{Duration, Instant};

use anyhow::Context;

use super::scenario::{
    NS, WAIT, agent_calls, agent_detaches, attachment, bound_pv, delete_workloads, exec, pod, pvc,
    wait_running,
};
use super::{KubeLab, LAB_TAG, pods};
use crate::kube::Kubectl;

/// The agent's container is SIGKILLed as soon as the volume is attached
/// (kubelet's NodeStage follows at once); kubelet retries, the call
/// converges, the LUN is formatted once.
pub async fn agent_crash(lab: &mut KubeLab, node: &str) -> anyhow::Result<String> {
    let k = lab.kubectl.clone();
    k.apply(&pvc("crash", "lab-pool", "Filesystem", "32Mi"))?;
    k.apply(&pod(
        "crash",
        node,
        "crash",
        false,
        "echo crash-marker > /data/m && sync && sleep 100000",
    ))?;
    let pv = k
        .wait_for("PVC crash bound", WAIT, |k| Ok(bound_pv(k, "crash").ok()))
        .await?;
    let handle = k.get_json(&["pv", &pv])?["spec"]["csi"]["volumeHandle"]
        .as_str()
        .context("volumeHandle")?
        .to_owned();
    let agent = pods::agent_on(&k, &lab.namespace, node)?;
    let id = pods::container_id(&agent, "csi-scsi-agent")?;
    k.wait_for("the VolumeAttachment attached", WAIT, |k| {
        Ok(attachment(k, &pv, node)?
            .filter(|va| va["status"]["attached"] == true)
            .map(drop))
    })
    .await?;
    let before = lab.agent_log(node);
    let stage_started = |log: &str| {
        log.lines()
            .any(|l| l.contains("NodeStageVolume{volume_id=") && l.contains(&handle))
    };
    let started_before_kill = stage_started(&before);
    lab.kill_container(node, &id)?;
    let killed = Instant::now();
    let at_kill = lab.agent_log(node);
    let in_flight = stage_started(&at_kill)
        && !at_kill
            .lines()
            .any(|l| l.contains(&handle) && l.contains("ok rpc=\"NodeStageVolume\""));
    wait_running(&k, "crash").await?;
    let running = killed.elapsed();
    let got = exec(&k, "crash", &["cat", "/data/m"])?;
    anyhow::ensure!(got.trim() == "crash-marker", "marker read back as {got:?}");
    let log = lab.agent_log(node);
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
    delete_workloads(&k, &["crash"], &["crash"])?;
    Ok(format!(
        "agent on {node} SIGKILLed once the volume was attached (NodeStage {}); kubelet restarted it (restarts {restarts}); the Pod Running {:.1}s after the kill, its data read back; formatted once",
        match (started_before_kill, in_flight) {
            (_, true) => "in flight at the kill",
            (true, false) => "already done at the kill",
            (false, false) => "not yet called at the kill",
        },
        running.as_secs_f64()
    ))
}

/// A Deployment's Pod with a volume on a node that is drained restarts on
/// another node, with its data.
pub async fn drain(lab: &mut KubeLab) -> anyhow::Result<String> {
    let k = lab.kubectl.clone();
    k.apply(&pvc("moved", "lab-pool", "Filesystem", "32Mi"))?;
    let script = serde_json::to_string(
        "if [ -f /data/marker ]; then cat /data/marker > /data/seen; else echo drain-marker > /data/marker; sync; fi; sleep 100000",
    )?;
    k.apply(&format!(
        r#"{{"apiVersion":"apps/v1","kind":"Deployment","metadata":{{"name":"mover","namespace":"{NS}"}},
            "spec":{{"replicas":1,"selector":{{"matchLabels":{{"app":"mover"}}}},"strategy":{{"type":"Recreate"}},
            "template":{{"metadata":{{"labels":{{"app":"mover"}}}},"spec":{{"terminationGracePeriodSeconds":1,
            "automountServiceAccountToken":false,
            "containers":[{{"name":"c","image":"{}","imagePullPolicy":"Never","command":["sh","-c",{script}],
                           "volumeMounts":[{{"name":"v","mountPath":"/data"}}]}}],
            "volumes":[{{"name":"v","persistentVolumeClaim":{{"claimName":"moved"}}}}]}}}}}}}}"#,
        super::images::BUSYBOX
    ))?;
    let first = mover(&k).await?;
    let from = first["spec"]["nodeName"]
        .as_str()
        .context("mover's node")?
        .to_owned();
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
                let list = k.get_json(&["pods", "-n", NS, "-l", "app=mover"])?;
                Ok(list["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|p| {
                        p["status"]["phase"] == "Running"
                            && p["metadata"]["name"] != first_name.as_str()
                            && p["metadata"]["deletionTimestamp"].is_null()
                    })
                    .cloned())
            })
            .await?;
        anyhow::Ok(second)
    }
    .await;
    let _ = k.run(&["uncordon", &from]);
    let second = moved?;
    let again = t.elapsed();
    let to = second["spec"]["nodeName"]
        .as_str()
        .context("node")?
        .to_owned();
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

async fn mover(k: &Kubectl) -> anyhow::Result<serde_json::Value> {
    k.wait_for("the mover Pod running", WAIT, |k| {
        let list = k.get_json(&["pods", "-n", NS, "-l", "app=mover"])?;
        Ok(list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["status"]["phase"] == "Running")
            .cloned())
    })
    .await
}

/// Writes 64 KiB blocks of random data, each fsynced, read back and
/// compared, forever; `/data/progress` holds "<blocks> <errors>".
const LOAD: &str = r#"n=0; e=0; while true; do
  dd if=/dev/urandom of=/tmp/b bs=65536 count=1 2>/dev/null
  s=$(md5sum < /tmp/b)
  f=/data/b.$((n % 16))
  if dd if=/tmp/b of=$f bs=65536 conv=fsync 2>/dev/null && [ "$(md5sum < $f)" = "$s" ]; then n=$((n+1)); else e=$((e+1)); fi
  echo "$n $e" > /data/p.tmp && mv /data/p.tmp /data/progress
done"#;

/// (blocks written and verified, errors) of a load Pod.
fn progress(k: &Kubectl, pod: &str) -> anyhow::Result<(u64, u64)> {
    let text = exec(k, pod, &["cat", "/data/progress"])?;
    let mut it = text.split_whitespace().map(str::parse::<u64>);
    match (it.next(), it.next()) {
        (Some(Ok(n)), Some(Ok(e))) => Ok((n, e)),
        _ => anyhow::bail!("{pod}: progress {text:?}"),
    }
}

/// The image tag the upgrade rolls to.
const NEXT_TAG: &str = "dev2";

/// Rolls the DaemonSet and the Deployment to rebuilt images with another
/// tag, then back, while Pods on every node write and verify.
pub async fn upgrade(lab: &mut KubeLab) -> anyhow::Result<String> {
    let k = lab.kubectl.clone();
    let ns = lab.namespace.clone();
    let nodes: Vec<String> = lab.nodes.iter().map(|n| n.name.clone()).collect();
    let load: Vec<String> = nodes.iter().map(|n| format!("load-{n}")).collect();
    for (name, node) in load.iter().zip(&nodes) {
        k.apply(&pvc(name, "lab-pool", "Filesystem", "32Mi"))?;
        k.apply(&pod(name, node, name, false, LOAD))?;
    }
    for name in &load {
        wait_running(&k, name).await?;
    }
    let uids: Vec<serde_json::Value> = load
        .iter()
        .map(|p| Ok(k.get_json(&["pod", p, "-n", NS])?["metadata"]["uid"].clone()))
        .collect::<anyhow::Result<_>>()?;
    let calls = |lab: &KubeLab| -> Vec<(usize, usize, usize)> {
        nodes
            .iter()
            .map(|n| {
                (
                    agent_calls(lab, n, "NodeUnstageVolume"),
                    agent_calls(lab, n, "NodeUnpublishVolume"),
                    agent_detaches(lab, n),
                )
            })
            .collect()
    };
    let before_calls = calls(lab);
    let start: Vec<(u64, u64)> = load
        .iter()
        .map(|p| progress(&k, p))
        .collect::<anyhow::Result<_>>()?;

    // The "registry": the rebuilt images, imported into every node.
    let built = crate::images::build(&crate::images::ImageOptions {
        out: lab.lab.config.dir.join("kube/images-next"),
        tag: NEXT_TAG.into(),
        profile: "debug".into(),
    })?;
    for b in built.iter().filter(|b| b.reference.contains(NEXT_TAG)) {
        for n in &nodes {
            lab.ctr(
                n,
                &[
                    "images",
                    "import",
                    "--no-unpack",
                    &b.archive.display().to_string(),
                ],
            )?;
        }
    }
    let max_unavailable = k.get_json(&["daemonset", "csi-scsi-node", "-n", &ns])?["spec"]
        ["updateStrategy"]["rollingUpdate"]["maxUnavailable"]
        .clone();
    let up = roll(lab, NEXT_TAG).await?;
    let after_up = check_load(lab, &load, &uids, &start).await?;
    let down = roll(lab, LAB_TAG).await?;
    let after_down = check_load(lab, &load, &uids, &after_up).await?;
    let after_calls = calls(lab);
    anyhow::ensure!(
        after_calls == before_calls,
        "volumes were torn down during the rollouts: (NodeUnstage, NodeUnpublish, Detach) per node {before_calls:?} -> {after_calls:?}"
    );
    // Every agent rebuilt its state from the live sessions and mounts.
    let mut rebuilt = Vec::new();
    for (n, name) in nodes.iter().zip(&load) {
        let pv = bound_pv(&k, name)?;
        let status = lab.agent_status(n).await?;
        let staged = status["volumes"]["staged"]
            .as_array()
            .is_some_and(|v| v.iter().any(|v| v["volume"] == pv.as_str()));
        anyhow::ensure!(staged, "the agent on {n} does not list {pv} as staged");
        rebuilt.push(format!(
            "{n}: {} staged",
            status["volumes"]["staged"].as_array().map_or(0, Vec::len)
        ));
    }
    let bytes: u64 = after_down.iter().map(|(b, _)| b).sum::<u64>() * 65536
        - start.iter().map(|(b, _)| b).sum::<u64>() * 65536;
    delete_workloads(
        &k,
        &load.iter().map(String::as_str).collect::<Vec<_>>(),
        &load.iter().map(String::as_str).collect::<Vec<_>>(),
    )?;
    Ok(format!(
        "3 Pods wrote and verified {:.1} MiB in 64 KiB fsynced blocks during both rollouts, 0 errors; same Pods, no NodeUnstage/NodeUnpublish/Detach\n      to {NEXT_TAG}: {up}\n      back to {LAB_TAG} (rollback): {down}\n      DaemonSet maxUnavailable {max_unavailable}; agents rebuilt their state: {}",
        bytes as f64 / (1 << 20) as f64,
        rebuilt.join(", ")
    ))
}

/// Sets the driver's images to `tag`, waits for both rollouts and returns
/// what they took; checks the DaemonSet never had more agents unavailable
/// than its maxUnavailable allows (1 of 3 at 10%, rounded up).
async fn roll(lab: &KubeLab, tag: &str) -> anyhow::Result<String> {
    let k = &lab.kubectl;
    let ns = &lab.namespace;
    let t = Instant::now();
    k.run(&[
        "set",
        "image",
        "-n",
        ns,
        "daemonset/csi-scsi-node",
        &format!("csi-scsi-agent=csi-scsi/agent:{tag}"),
    ])?;
    k.run(&[
        "set",
        "image",
        "-n",
        ns,
        "deployment/csi-scsi-controller",
        &format!("csi-scsi-proxy=csi-scsi/proxy:{tag}"),
    ])?;
    let mut most_unavailable = 0;
    let ds = loop {
        let ds = k.get_json(&["daemonset", "csi-scsi-node", "-n", ns])?;
        let st = &ds["status"];
        most_unavailable = most_unavailable.max(st["numberUnavailable"].as_u64().unwrap_or(0));
        let done = st["observedGeneration"] == ds["metadata"]["generation"]
            && st["updatedNumberScheduled"] == st["desiredNumberScheduled"]
            && st["numberAvailable"] == st["desiredNumberScheduled"];
        if done {
            break t.elapsed();
        }
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(300),
            "the DaemonSet rollout to {tag} did not finish: {}",
            st
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    anyhow::ensure!(
        most_unavailable <= 1,
        "{most_unavailable} agents were unavailable at once (maxUnavailable 10% of 3 allows 1)"
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
        .filter_map(|p| {
            p["spec"]["containers"][0]["image"]
                .as_str()
                .map(str::to_owned)
        })
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
async fn check_load(
    lab: &KubeLab,
    load: &[String],
    uids: &[serde_json::Value],
    from: &[(u64, u64)],
) -> anyhow::Result<Vec<(u64, u64)>> {
    let k = &lab.kubectl;
    // A few more blocks each, so a stalled writer shows.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut now = Vec::new();
    for ((p, uid), (n0, _)) in load.iter().zip(uids).zip(from) {
        let pod = k.get_json(&["pod", p, "-n", NS])?;
        anyhow::ensure!(pod["metadata"]["uid"] == *uid, "{p} was replaced");
        anyhow::ensure!(pods::restarts(&pod, "c") == 0, "{p} restarted");
        let (n, e) = progress(k, p)?;
        anyhow::ensure!(e == 0, "{p}: {e} write or verify errors");
        anyhow::ensure!(n > *n0, "{p} stopped writing ({n0} -> {n} blocks)");
        now.push((n, e));
    }
    Ok(now)
}

impl KubeLab {
    /// The agent's `/status` on `node` (its status listener, the node's
    /// address: what an operator's `csi-scsi --url` reads).
    pub async fn agent_status(&self, node: &str) -> anyhow::Result<serde_json::Value> {
        let i = self.node_index(node)?;
        let url = format!("http://{}/status", self.lab.nodes[i].status);
        let out = crate::lab::net::sh("curl", &["-sf", "-m", "5", &url])?;
        serde_json::from_str(&out).with_context(|| format!("{url} answered {out:?}"))
    }
}
