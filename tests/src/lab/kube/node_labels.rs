//! A node labelling itself gets nothing: with its own kubelet's
//! credentials, node-c adds to its Node the label a new SCSITarget (array-a,
//! with CHAP) selects on. NodeRestriction lets it; the proxy takes that
//! selector for none (its status says Refused), so no Discover, and no
//! CHAP, goes to any node through it. The kubelet cannot set the protected
//! key (`node-restriction.kubernetes.io/`).

use anyhow::{Context, bail};

use csi_scsi_proxy::resources::SCSITarget;

use super::KubeLab;
use super::api::Typed;
use super::scenario::WAIT;
use super::targets::lab_target;

/// A key any kubelet can set on its own Node.
const SETTABLE: &str = "storage.example.com/array1";
/// The key under the prefix NodeRestriction keeps from kubelets.
const PROTECTED: &str = "node-restriction.kubernetes.io/array1";

/// Runs the step on `node`; the summary says what each side got.
pub async fn a_node_labelling_itself_gets_nothing(
    lab: &KubeLab,
    node: &str,
) -> anyhow::Result<String> {
    let k = &lab.kubectl;
    let kubelet = k.with_kubeconfig(
        &lab.lab
            .config
            .dir
            .join("nodes")
            .join(node)
            .join("runtime/kubelet.kubeconfig"),
    );
    kubelet
        .run(&["label", "node", node, &format!("{SETTABLE}=true")])
        .context("the kubelet labels its own Node with an unprotected key")?;
    if let Ok(out) = kubelet.run(&["label", "node", node, &format!("{PROTECTED}=true")]) {
        bail!("the kubelet set {PROTECTED} on its own Node: {out}");
    }
    let mut target = lab_target(lab, "self-labelled", "array-a", Some(&lab.namespace));
    target.spec.node_selector = [(SETTABLE.to_owned(), "true".to_owned())].into();
    k.apply_object(&target)?;
    let message = k
        .wait_for("SCSITarget self-labelled Refused", WAIT, |k| {
            let t = k.object::<SCSITarget>("self-labelled", None)?;
            let status = t.status.unwrap_or_default();
            if status.phase.as_deref() != Some("Refused") {
                return Ok(None);
            }
            // Never discovered through: no node in its status.
            anyhow::ensure!(
                status.nodes.is_empty(),
                "nodes discovered through a refused target: {}",
                serde_json::to_string(&status)?
            );
            Ok(status.conditions.first().map(|c| c.message.clone()))
        })
        .await?;
    anyhow::ensure!(message.contains(SETTABLE), "status says {message:?}");
    k.run(&["delete", "scsitarget", "self-labelled", "--wait=true"])?;
    k.run(&["label", "node", node, &format!("{SETTABLE}-")])?;
    Ok(format!(
        "{node}'s kubelet set {SETTABLE} (not {PROTECTED}); the target selecting on it: Refused, no node discovered"
    ))
}
