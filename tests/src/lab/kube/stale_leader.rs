//! A stale leader cannot wipe (docs/architecture.md, "Fencing a stale
//! leader"): the leading proxy reads a deleted volume's LUN and is frozen
//! before its Wipe call goes out; the other replica takes the Lease, wipes
//! the LUN and binds it to a new claim, whose Pod writes a marker; the old
//! leader, thawed, sends its Wipe with its old epoch and the agent refuses
//! it. The proxy's own check (it leads no more) is bypassed by a
//! deliberate defect, so the node's fence is what is shown; the window is
//! another (`proxy/src/fault.rs`: `stale-wipe`, `skip-leader-check`), on
//! only for this step.

use std::time::{Duration, Instant};

use std::collections::BTreeMap;

use anyhow::Context;
use csi_scsi_proxy::device::Phase;
use csi_scsi_proxy::resources::SCSIDevice;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::KubeLab;
use super::api::{Typed, deleting};
use super::pods;
use super::scenario::{
    NS, WAIT, bound_pv, excerpt, lease_holder, node_of, phase, pod, pv_wwid, pvc, volume_handle,
    wait_running,
};
use crate::lab::node_name;
use crate::lab::scenario::lun_file;

/// The proxy's deliberate defects during this step.
const FAULTS: &str = "stale-wipe,skip-leader-check";
/// The class both claims use: the pool, bound at once (no Pod needed to
/// provision), zeroed on delete.
const CLASS: &str = "lab-stale";
/// What the proxy logs when it holds a Wipe back, sends it, and after.
const HOLDING: &str = "FAULT stale-wipe: the device is read; holding the Wipe call back";
const SENDING: &str = "FAULT stale-wipe: sending the held-back Wipe";
const NOT_DONE: &str = "FAULT stale-wipe: the held-back Wipe was not done";
/// What the agent logs when its fence refuses a call.
const REFUSED: &str = "call refused by the leader fence";

/// Runs the step; returns its result lines.
pub async fn stale_leader(lab: &KubeLab) -> anyhow::Result<String> {
    let k = lab.kubectl.clone();
    let ns = lab.namespace.clone();
    let faults_on = Instant::now();
    set_faults(lab, Some(FAULTS)).await?;
    let faults_on = faults_on.elapsed();
    k.apply_object(&StorageClass {
        metadata: ObjectMeta {
            name: Some(CLASS.into()),
            ..ObjectMeta::default()
        },
        provisioner: "csi-scsi.io".into(),
        volume_binding_mode: Some("Immediate".into()),
        reclaim_policy: Some("Delete".into()),
        parameters: Some(BTreeMap::from([
            ("deviceSelector".into(), "tier=pool".into()),
            ("cleanup".into(), "zero".into()),
        ])),
        ..StorageClass::default()
    })?;
    k.apply_object(&pvc("stale-old", CLASS, "Block", "32Mi"))?;
    let old_pv = k
        .wait_for("PVC stale-old Bound", WAIT, |k| {
            Ok(bound_pv(k, "stale-old").ok())
        })
        .await?;
    let wwid = pv_wwid(&k, &old_pv)?;
    let (lun, file) =
        lun_file(&lab.lab, &wwid).with_context(|| format!("no lab LUN has {wwid}"))?;

    // The leader deletes the volume and reads the LUN; its release holds
    // the Wipe back, and says so.
    let leader = lease_holder(&k, &ns, "csi-scsi-proxy")?;
    let victim_node = node_of(&k, &leader, &ns).context("the leader's node")?;
    k.run(&["delete", "pvc", "stale-old", "-n", NS, "--wait=false"])?;
    let request_id = k
        .wait_for(
            &format!("{leader} holding back the Wipe of {lun}"),
            Duration::from_secs(30),
            |_| {
                let log = lab.proxy_log_of(&victim_node, &leader)?;
                Ok(log
                    .lines()
                    .find(|l| l.contains(HOLDING) && l.contains(&wwid))
                    .and_then(|l| field(l, "request_id")))
            },
        )
        .await?;

    // Every container of the leading Pod frozen, as in the two-replicas
    // step: alive, holding its Leases, silent.
    let containers: Vec<&str> = std::iter::once("csi-scsi-proxy")
        .chain(super::SIDECARS.iter().copied())
        .collect();
    let victim = k.object::<Pod>(&leader, Some(&ns))?;
    let ids = containers
        .iter()
        .map(|c| pods::container_id(&victim, c))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let (frozen, froze) = lab.freeze_containers(&victim_node, &ids);
    let frozen_since = Instant::now();
    let marker = format!("stale-leader lab marker {request_id}");
    let node_c = node_name(2);
    let claims: std::sync::Mutex<Vec<String>> = std::sync::Mutex::default();
    let takeover = async {
        froze?;
        let log = lab.proxy_log_of(&victim_node, &leader)?;
        anyhow::ensure!(
            !log.lines()
                .any(|l| l.contains(SENDING) && l.contains(&request_id)),
            "{leader} sent its held-back Wipe before it was frozen"
        );
        let survivor = k
            .wait_for("the proxy Lease taken by the other replica", WAIT, |k| {
                let holder = lease_holder(k, &ns, "csi-scsi-proxy")?;
                Ok((holder != leader).then_some(holder))
            })
            .await?;
        let took_over = frozen_since.elapsed();
        k.wait_for(&format!("{lun} wiped and Available again"), WAIT, |k| {
            Ok((phase(&device(k, &wwid)?) == Some(Phase::Available)).then_some(()))
        })
        .await?;
        let released = frozen_since.elapsed();
        // Claims until one binds the LUN: the bind order (smallest, fewest
        // failed wipes, WWID) may put another free pool LUN first.
        let mut found = None;
        for n in 0..MAX_CLAIMS {
            let claim = format!("stale-new-{n}");
            k.apply_object(&pvc(&claim, CLASS, "Block", "32Mi"))?;
            lock(&claims).push(claim.clone());
            let pv = k
                .wait_for(&format!("PVC {claim} Bound"), WAIT, |k| {
                    Ok(bound_pv(k, &claim).ok())
                })
                .await?;
            if pv_wwid(&k, &pv)? == wwid {
                found = Some((claim, pv));
                break;
            }
        }
        let (claim, new_pv) = found.with_context(|| {
            format!("none of {MAX_CLAIMS} new claims bound {lun} ({wwid}) again")
        })?;
        k.apply_object(&pod(
            "stale-new",
            &node_c,
            &claim,
            true,
            &format!(
                "echo '{marker}' | dd of=/dev/xvda bs=512 conv=fsync 2>/dev/null && sleep 100000"
            ),
        ))?;
        wait_running(&k, "stale-new").await?;
        anyhow::ensure!(
            holds(&file, &marker)?,
            "the marker the Pod wrote is not on {lun}"
        );
        anyhow::Ok((
            survivor,
            took_over,
            released,
            new_pv,
            frozen_since.elapsed(),
        ))
    }
    .await;
    let thawed = lab.thaw_containers(&victim_node, &frozen);
    let thawed_at = frozen_since.elapsed();
    let (survivor, took_over, released, new_pv, written) = takeover?;
    anyhow::ensure!(thawed.is_empty(), "thawing {leader}: {}", thawed.join("; "));

    // The thawed leader sends its Wipe: who refused it, or whether it
    // wiped the new tenant's marker.
    let refusal = k
        .wait_for(
            &format!("the outcome of {leader}'s held-back Wipe ({request_id})"),
            WAIT,
            |_| {
                if !holds(&file, &marker)? {
                    return Ok(Some(Err(format!(
                        "{lun}'s marker is gone after the thaw: {leader}'s stale Wipe went through"
                    ))));
                }
                for n in &lab.nodes {
                    let agent = lab.agent_log(&n.name)?;
                    if let Some(l) = agent
                        .lines()
                        .find(|l| l.contains(REFUSED) && l.contains(&request_id))
                    {
                        return Ok(Some(Ok(format!(
                            "the agent on {} refused it: \"{}\"",
                            n.name,
                            excerpt(field_text(l, "error"), 160)
                        ))));
                    }
                }
                let proxy = lab.proxy_log_of(&victim_node, &leader)?;
                Ok(proxy
                    .lines()
                    .find(|l| l.contains(NOT_DONE) && l.contains(&request_id))
                    .map(|l| {
                        Ok(format!(
                            "{leader} did not send it: \"{}\"",
                            excerpt(field_text(l, "error"), 160)
                        ))
                    }))
            },
        )
        .await?
        .map_err(anyhow::Error::msg)?;
    let outcome_at = frozen_since.elapsed();
    anyhow::ensure!(
        holds(&file, &marker)?,
        "{lun}'s marker is gone after the thaw: {leader}'s stale Wipe went through"
    );
    let handle = volume_handle(&k, &new_pv)?;
    let dev = device(&k, &wwid)?;
    let status = dev.status.unwrap_or_default();
    anyhow::ensure!(
        status.phase == Phase::Bound && status.volume_id.as_deref() == Some(handle.as_str()),
        "{lun} should stay Bound to {handle}: {}",
        serde_json::to_string(&status)?
    );

    // The defects off again (the thawed replica is replaced too), and the
    // claim released.
    let faults_off = Instant::now();
    set_faults(lab, None).await?;
    let faults_off = faults_off.elapsed();
    let claims = lock(&claims).clone();
    let claims: Vec<&str> = claims.iter().map(String::as_str).collect();
    super::scenario::delete_workloads(&k, &["stale-new"], &claims)?;
    Ok(format!(
        "faults {FAULTS} on the proxy ({:.1}s rollout); {leader} read {lun} for its release and held the Wipe back ({request_id}); all its containers frozen\n      \
         {survivor} took the proxy Lease {:.1}s later, wiped {lun} (Available at {:.1}s); a new claim bound {lun} again and a Pod on {node_c} wrote a marker ({:.1}s)\n      \
         thawed at {:.1}s: {refusal} ({:.1}s); the marker intact, {lun} Bound to the new volume; faults off ({:.1}s rollout)",
        faults_on.as_secs_f64(),
        took_over.as_secs_f64(),
        released.as_secs_f64(),
        written.as_secs_f64(),
        thawed_at.as_secs_f64(),
        outcome_at.as_secs_f64(),
        faults_off.as_secs_f64(),
    ))
}

/// Sets (or removes) `CSI_SCSI_FAULT` on the proxy container and waits
/// for the rollout, the driver's Pods and a leader that runs with it.
async fn set_faults(lab: &KubeLab, faults: Option<&str>) -> anyhow::Result<()> {
    let k = &lab.kubectl;
    let ns = &lab.namespace;
    let env = faults.map_or_else(
        || "CSI_SCSI_FAULT-".to_owned(),
        |f| format!("CSI_SCSI_FAULT={f}"),
    );
    k.run(&[
        "set",
        "env",
        "-n",
        ns,
        "deployment/csi-scsi-controller",
        "-c",
        "csi-scsi-proxy",
        &env,
    ])?;
    k.run(&[
        "rollout",
        "status",
        "-n",
        ns,
        "deployment/csi-scsi-controller",
        "--timeout=120s",
    ])?;
    lab.wait_installed().await?;
    k.wait_for("a leader of the new revision, Ready", WAIT, |k| {
        let holder = lease_holder(k, ns, "csi-scsi-proxy")?;
        let p = k.object::<Pod>(&holder, Some(ns))?;
        let set = p
            .spec
            .as_ref()
            .and_then(|s| s.containers.iter().find(|c| c.name == "csi-scsi-proxy"))
            .and_then(|c| c.env.as_deref())
            .and_then(|env| env.iter().find(|e| e.name == "CSI_SCSI_FAULT"))
            .and_then(|e| e.value.as_deref());
        let ready = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_deref())
            .is_some_and(|all| !all.is_empty() && all.iter().all(|s| s.ready));
        Ok((set == faults && ready && !deleting(&p)).then_some(()))
    })
    .await
}

/// The SCSIDevice of `wwid`.
fn device(k: &crate::kube::Kubectl, wwid: &str) -> anyhow::Result<SCSIDevice> {
    let device = wwid.strip_prefix("naa.").unwrap_or(wwid);
    k.objects::<SCSIDevice>(&[])?
        .into_iter()
        .find(|d| d.spec.wwid.contains(device))
        .with_context(|| format!("no SCSIDevice has {wwid}"))
}

/// Whether the LUN's file begins with `marker` (the Pod wrote it at byte 0).
fn holds(file: &std::path::Path, marker: &str) -> anyhow::Result<bool> {
    use std::io::Read;
    let mut head = vec![0; marker.len()];
    std::fs::File::open(file)
        .and_then(|mut f| f.read_exact(&mut head))
        .with_context(|| format!("reading {}", file.display()))?;
    Ok(head == marker.as_bytes())
}

/// A `key=value` field of a text log line (up to the next space).
fn field(line: &str, key: &str) -> Option<String> {
    let at = line.find(&format!(" {key}="))? + key.len() + 2;
    line[at..].split_whitespace().next().map(str::to_owned)
}

/// A `key=value` field that runs to the end of the line (a message).
fn field_text<'a>(line: &'a str, key: &str) -> &'a str {
    line.find(&format!(" {key}="))
        .map_or(line, |at| &line[at + key.len() + 2..])
}

/// The most claims the step makes to bind the wiped LUN again (the lab's
/// pool has 14 LUNs).
const MAX_CLAIMS: usize = 14;

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
