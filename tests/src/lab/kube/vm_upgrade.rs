//! The upgrade-under-load step of `lab up --kubernetes --vm`: a Pod on
//! every guest writes and verifies fsynced blocks while the DaemonSet
//! (the agents, on the guests' real kernel) and the Deployment roll to
//! another tag and back, as in the fast Kubernetes lab
//! ([`super::operations::upgrade`]). The guests have no registry and get
//! their images in their initramfs, so the other tag names the same build
//! (`ctr images tag` in each guest's and the control-plane node's
//! containerd): what is tried is the rollout (every agent Pod replaced
//! under mounted volumes), not a change of code.

use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;

use super::api::{Typed, uid_of};
use super::node::ctr_at;
use super::operations::{LOAD, NEXT_TAG, Roll, check_load, progress, roll};
use super::scenario::{
    NS, attached, attachment, bound_pv, delete_workloads, pod, pvc, wait_all_released, wait_running,
};
use super::{KubeLab, LAB_TAG};
use crate::lab::node_name;

/// The images the driver's workloads run, as containerd names them.
const AGENT: &str = "docker.io/csi-scsi/agent";
const PROXY: &str = "docker.io/csi-scsi/proxy";

/// The step: see the module's doc. `class`: a filesystem StorageClass
/// every guest can attach.
pub async fn upgrade_under_load(lab: &mut KubeLab, class: &str) -> anyhow::Result<String> {
    let k = lab.kubectl.clone();
    let guests = lab.lab.nodes.len();
    let nodes: Vec<String> = (0..guests).map(node_name).collect();
    let load: Vec<String> = nodes.iter().map(|n| format!("load-{n}")).collect();
    for (name, node) in load.iter().zip(&nodes) {
        k.apply_object(&pvc(name, class, "Filesystem", "400Mi"))?;
        k.apply_object(&pod(name, node, name, false, LOAD))?;
    }
    for name in &load {
        wait_running(&k, name).await?;
    }
    let uids: Vec<String> = load
        .iter()
        .map(|p| Ok(uid_of(&k.object::<Pod>(p, Some(NS))?).to_owned()))
        .collect::<anyhow::Result<_>>()?;
    let pvs: Vec<String> = load
        .iter()
        .map(|c| bound_pv(&k, c))
        .collect::<anyhow::Result<_>>()?;
    let attachments = |k: &crate::kube::Kubectl| -> anyhow::Result<Vec<String>> {
        pvs.iter()
            .zip(&nodes)
            .map(|(pv, n)| {
                let va =
                    attachment(k, pv, n)?.with_context(|| format!("{pv} not attached to {n}"))?;
                anyhow::ensure!(attached(&va), "{pv}'s attachment to {n} is not attached");
                Ok(uid_of(&va).to_owned())
            })
            .collect()
    };
    let before = attachments(&k)?;
    // kubelet's log in each guest (its serial port, a file here): the
    // evidence that outlives the agents' Pods.
    let kubelet_logs: Vec<std::path::PathBuf> = lab
        .lab
        .nodes
        .iter()
        .map(|n| {
            let vm = n.vm.as_ref().context("a VM node")?;
            Ok(vm.console.with_file_name("kubelet.log"))
        })
        .collect::<anyhow::Result<_>>()?;
    let from: Vec<usize> = kubelet_logs
        .iter()
        .map(|l| Ok(std::fs::read(l)?.len()))
        .collect::<anyhow::Result<_>>()?;
    // Let every load Pod write a few blocks first.
    k.wait_for(
        "every load Pod's first blocks",
        super::scenario::WAIT,
        |k| {
            for p in &load {
                if super::scenario::exec(k, p, &["test", "-e", "/data/progress"]).is_err() {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        },
    )
    .await?;
    let start: Vec<(u64, u64)> = load
        .iter()
        .map(|p| progress(&k, p))
        .collect::<anyhow::Result<_>>()?;

    // The other tag: the agent's image in every guest, the proxy's on the
    // control-plane node.
    for n in &lab.lab.nodes {
        let vm = n.vm.as_ref().context("a VM node")?;
        vm.guest
            .run(&[
                "ctr",
                "-n",
                "k8s.io",
                "images",
                "tag",
                "--force",
                &format!("{AGENT}:{LAB_TAG}"),
                &format!("{AGENT}:{NEXT_TAG}"),
            ])
            .await
            .with_context(|| format!("tagging the agent's image in {}", n.name))?;
    }
    for n in &lab.nodes {
        ctr_at(
            n.containerd_socket(),
            &[
                "images",
                "tag",
                "--force",
                &format!("{PROXY}:{LAB_TAG}"),
                &format!("{PROXY}:{NEXT_TAG}"),
            ],
        )?;
    }
    let up = roll(lab, NEXT_TAG, Roll::Upgrade).await?;
    let after_up = check_load(lab, &load, &uids, &start).await?;
    let down = roll(lab, LAB_TAG, Roll::Rollback).await?;
    let after_down = check_load(lab, &load, &uids, &after_up).await?;
    anyhow::ensure!(
        attachments(&k)? == before,
        "a writer's VolumeAttachment was replaced during the rollouts"
    );
    for ((log, from), n) in kubelet_logs.iter().zip(&from).zip(&nodes) {
        let text = String::from_utf8_lossy(&std::fs::read(log)?).into_owned();
        let torn: Vec<&str> = text
            .get(*from..)
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                pvs.iter().any(|pv| l.contains(pv.as_str()))
                    && (l.contains("UnmountVolume") || l.contains("UnmountDevice"))
            })
            .collect();
        anyhow::ensure!(
            torn.is_empty(),
            "kubelet on {n} tore a writer's volume down during the rollouts: {}",
            torn.join("; ")
        );
    }
    let blocks: u64 =
        after_down.iter().map(|(b, _)| b).sum::<u64>() - start.iter().map(|(b, _)| b).sum::<u64>();
    let names: Vec<&str> = load.iter().map(String::as_str).collect();
    delete_workloads(&k, &names, &names)?;
    let available = wait_all_released(&k).await?;
    Ok(format!(
        "{guests} Pods wrote and verified {blocks} fsynced blocks of 64 KiB during both rollouts, 0 errors; same Pods, same VolumeAttachments, no unmount in the guests' kubelet logs\n      to {NEXT_TAG} (the same build, tagged in each containerd): {up}\n      back to {LAB_TAG} (rollback): {down}\n      {available} devices Available after"
    ))
}
