//! Storage capacity steering the scheduler: the external-provisioner
//! (`--enable-capacity`) publishes, per StorageClass and node, a
//! CSIStorageCapacity from GetCapacity, and the scheduler (CSIDriver
//! `storageCapacity: true`) places a Pod whose WaitForFirstConsumer claim
//! fits only a LUN one node sees on that node, at the first try.
//!
//! The lab's Fibre Channel LUN fc1 (512 MiB) is zoned to node-b and node-c
//! only (node-a has no HBA): the step declares its SCSITarget (`array=fc`,
//! as the embedded lab does) and a class selecting it, so for a 400 MiB
//! claim node-b has a LUN and node-a none. The Pod may run on node-a or
//! node-b and prefers node-a: without capacity the scheduler would pick
//! node-a, CreateVolume would find nothing there (RESOURCE_EXHAUSTED, a
//! ProvisioningFailed Event) and the scheduler would pick node-a again, so
//! the Pod would never reach node-b in time. (array-b, whose ACL leaves
//! node-c out, is no use here: the Kubernetes lab's nodes reach none of
//! its LUNs.) The target stays: the last steps expect its LUN wiped and
//! Available.

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use csi_scsi_proxy::resources::{FibreChannelSpec, SCSITarget, SCSITargetSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Event, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PersistentVolumeClaim, Pod, PreferredSchedulingTerm,
};
use k8s_openapi::api::storage::v1::CSIStorageCapacity;

use super::KubeLab;
use super::api::{Typed, message, reason};
use super::scenario::{NS, WAIT, delete_workloads, pod, pvc, storage_class};
use crate::lab::node_name;
use crate::lab::scenario::NODE_KEY;

/// The class: the Fibre Channel LUN.
const CLASS: &str = "lab-capacity";
/// The lab's Fibre Channel target: its port, as the embedded lab's
/// targets file names it.
const FC_TARGET: &str = "fc-1";
const FC_WWPN: &str = "50:0a:09:81:89:1b:8d:c5";
/// The claim: fc1 (512 MiB) holds it.
const CLAIM_SIZE: &str = "400Mi";
const CLAIM_BYTES: u64 = 400 << 20;
/// The claim's and the Pod's name.
const NAME: &str = "capacity";
/// The annotation the scheduler sets on a claim for the node it picked.
const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// The Deployment that owns the CSIStorageCapacity objects
/// (`--capacity-ownerref-level=2`).
const OWNER: &str = "csi-scsi-controller";

/// Runs the step; the summary gives each node's numbers and where the Pod went.
pub async fn steers_the_scheduler(lab: &KubeLab) -> anyhow::Result<String> {
    let k = &lab.kubectl;
    let (node_a, node_b, node_c) = (node_name(0), node_name(1), node_name(2));
    k.apply_object(&SCSITarget::new(
        FC_TARGET,
        SCSITargetSpec {
            fibre_channel: Some(FibreChannelSpec {
                wwpns: vec![FC_WWPN.into()],
            }),
            nodes: vec![node_b.clone(), node_c.clone()],
            device_labels: BTreeMap::from([
                ("array".into(), "fc".into()),
                ("tier".into(), "fast".into()),
            ]),
            ..SCSITargetSpec::default()
        },
    ))?;
    k.apply_object(&storage_class(CLASS, "array=fc", "ext4", "discard"))?;
    // One object per node segment, each with the largest LUN the class
    // selects that the node sees (GetCapacity's maximum_volume_size).
    let mut seen = BTreeMap::new();
    let per_node = k
        .wait_for(
            &format!(
                "CSIStorageCapacity for {CLASS}: {node_b} and {node_c} {CLAIM_SIZE} or more, {node_a} less"
            ),
            WAIT,
            |k| {
                let found = largest_per_node(k, &lab.namespace)?;
                let fits = |n: &str| found.get(n).is_some_and(|b| *b >= CLAIM_BYTES);
                let ready = found.len() == lab.nodes.len()
                    && fits(&node_b)
                    && fits(&node_c)
                    && found.get(&node_a).is_some_and(|b| *b < CLAIM_BYTES);
                seen.clone_from(&found);
                Ok(ready.then_some(found))
            },
        )
        .await
        .with_context(|| {
            let all = k
                .run(&["get", "csistoragecapacities", "-A", "-o", "yaml"])
                .unwrap_or_default();
            format!(
                "maximumVolumeSize per node last seen: {seen:?}; every CSIStorageCapacity:\n{all}"
            )
        })?;
    k.apply_object(&pvc(NAME, CLASS, "Filesystem", CLAIM_SIZE))?;
    k.apply_object(&steered_pod(&node_b, &node_a))?;
    let (on, selected) = k
        .wait_for(
            &format!("PVC {NAME} bound and Pod {NAME} on a node"),
            WAIT,
            |k| {
                let claim = k.object::<PersistentVolumeClaim>(NAME, Some(NS))?;
                let bound = claim.status.and_then(|s| s.phase).as_deref() == Some("Bound");
                let p = k.object::<Pod>(NAME, Some(NS))?;
                let on = p.spec.and_then(|s| s.node_name).unwrap_or_default();
                let selected = claim
                    .metadata
                    .annotations
                    .and_then(|a| a.get(SELECTED_NODE).cloned())
                    .unwrap_or_default();
                Ok((bound && !on.is_empty()).then_some((on, selected)))
            },
        )
        .await?;
    // Placed where the LUN is, at the first try: no CreateVolume went to
    // node-a.
    let failed: Vec<String> = k
        .objects::<Event>(&[
            "-n",
            NS,
            "--field-selector",
            &format!("involvedObject.name={NAME},involvedObject.kind=PersistentVolumeClaim"),
        ])?
        .iter()
        .filter(|e| reason(e) == "ProvisioningFailed")
        .map(|e| message(e).to_owned())
        .collect();
    if on != node_b || selected != node_b || !failed.is_empty() {
        bail!(
            "the Pod went to {on:?} (the claim's selected node {selected:?}), not {node_b}; ProvisioningFailed: {failed:?}"
        );
    }
    delete_workloads(k, &[NAME], &[NAME])?;
    let numbers = per_node
        .iter()
        .map(|(n, b)| format!("{n} {} MiB", b >> 20))
        .collect::<Vec<_>>()
        .join(", ");
    Ok(format!(
        "maximumVolumeSize for {CLASS}: {numbers}; the {CLAIM_SIZE} claim's Pod (preferring {node_a}) placed on {on} at the first try"
    ))
}

/// The largest volume per node that the CSIStorageCapacity objects of
/// [`CLASS`] allow, each owned by the controller's Deployment.
fn largest_per_node(
    k: &crate::kube::Kubectl,
    namespace: &str,
) -> anyhow::Result<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    for c in k.objects::<CSIStorageCapacity>(&["-n", namespace])? {
        if c.storage_class_name != CLASS {
            continue;
        }
        let owner = c.metadata.owner_references.as_deref().unwrap_or_default();
        if !owner
            .iter()
            .any(|o| o.kind == "Deployment" && o.name == OWNER)
        {
            bail!(
                "CSIStorageCapacity {:?} is not owned by Deployment {OWNER}: {owner:?}",
                c.metadata.name
            );
        }
        let node = c
            .node_topology
            .as_ref()
            .and_then(|t| t.match_labels.as_ref())
            .and_then(|l| l.get(NODE_KEY))
            .context("a CSIStorageCapacity without the node key")?;
        let max = c
            .maximum_volume_size
            .as_ref()
            .context("a CSIStorageCapacity without maximumVolumeSize")?;
        out.insert(node.clone(), binary_bytes(&max.0)?);
    }
    Ok(out)
}

/// A Pod with the claim that may run on `fits` or `lacks` and prefers `lacks`.
fn steered_pod(fits: &str, lacks: &str) -> Pod {
    let hostname = |values: Vec<String>| NodeSelectorRequirement {
        key: "kubernetes.io/hostname".into(),
        operator: "In".into(),
        values: Some(values),
    };
    let mut p = pod(NAME, fits, NAME, false, "sleep 100000");
    if let Some(spec) = p.spec.as_mut() {
        spec.node_selector = None;
        spec.affinity = Some(Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![hostname(vec![
                            fits.to_owned(),
                            lacks.to_owned(),
                        ])]),
                        ..NodeSelectorTerm::default()
                    }],
                }),
                preferred_during_scheduling_ignored_during_execution: Some(vec![
                    PreferredSchedulingTerm {
                        weight: 100,
                        preference: NodeSelectorTerm {
                            match_expressions: Some(vec![hostname(vec![lacks.to_owned()])]),
                            ..NodeSelectorTerm::default()
                        },
                    },
                ]),
            }),
            ..Affinity::default()
        });
    }
    p
}

/// Bytes of a quantity as the provisioner writes them (binary SI: an
/// integer, with a suffix Ki to Ei or none).
fn binary_bytes(q: &str) -> anyhow::Result<u64> {
    let suffixes = [
        ("Ki", 10),
        ("Mi", 20),
        ("Gi", 30),
        ("Ti", 40),
        ("Pi", 50),
        ("Ei", 60),
    ];
    let (digits, shift) = suffixes
        .iter()
        .find_map(|(s, shift)| q.strip_suffix(s).map(|d| (d, *shift)))
        .unwrap_or((q, 0));
    let n: u64 = digits
        .parse()
        .with_context(|| format!("quantity {q:?} is not binary SI"))?;
    n.checked_mul(1 << shift)
        .with_context(|| format!("quantity {q:?} overflows"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_si_quantities_read_as_bytes() {
        let cases = [
            ("0", Some(0)),
            ("1Gi", Some(1 << 30)),
            ("512Mi", Some(512 << 20)),
            ("1536Mi", Some(1536 << 20)),
            ("1073741825", Some(1_073_741_825)),
            ("1G", None),
            ("1.5Gi", None),
            ("Gi", None),
            ("16Ei", None),
        ];
        for (q, want) in cases {
            assert_eq!(binary_bytes(q).ok(), want, "{q}");
        }
    }
}
