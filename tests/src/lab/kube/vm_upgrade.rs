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

use super::node::ctr_at;
use super::operations::{Loads, NEXT_TAG, Roll, check_load, progress, roll};
use super::scenario::{delete_workloads, wait_all_released};
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
    // A block a second: unpaced, the loop's processes keep a guest's one
    // emulated vCPU busy and starve everything else on it, the agent too.
    let loads = Loads::start(&k, class, "400Mi", &nodes, 1).await?;
    let (load, uids) = (loads.names.clone(), loads.uids.clone());
    let before = loads.attachments(&k, &nodes)?;
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
        loads.attachments(&k, &nodes)? == before,
        "a writer's VolumeAttachment was replaced during the rollouts"
    );
    for ((log, from), n) in kubelet_logs.iter().zip(&from).zip(&nodes) {
        let text = String::from_utf8_lossy(&std::fs::read(log)?).into_owned();
        loads.not_torn_down(n, text.get(*from..).unwrap_or_default())?;
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
