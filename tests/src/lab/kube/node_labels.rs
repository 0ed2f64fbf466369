//! A node labelling itself gets nothing: with its own kubelet's
//! credentials, node-c adds to its Node the label a new SCSITarget (array-a,
//! with CHAP) selects on. NodeRestriction lets it; the proxy takes that
//! selector for none (its status says Refused), so no Discover, and no
//! CHAP, goes to any node through it. The kubelet cannot set the protected
//! key (`node-restriction.kubernetes.io/`).

use anyhow::{Context, bail};

use super::KubeLab;
use super::scenario::WAIT;
use crate::lab::LAB_ARRAY;

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
    let portal = format!("{}:3260", lab.lab.net.host_ip());
    let ns = &lab.namespace;
    k.apply(&format!(
        r#"{{"apiVersion":"csi-scsi.io/v1alpha1","kind":"SCSITarget","metadata":{{"name":"self-labelled"}},
            "spec":{{"iscsi":{{"portals":["{portal}"],"iqn":"iqn.2026-11.io.csi-scsi.lab:array-a",
            "chapSecretRef":{{"name":"chap-array-a","namespace":"{ns}"}}}},
            "nodeSelector":{{"{SETTABLE}":"true"}},"array":"{LAB_ARRAY}"}}}}"#
    ))?;
    let message = k
        .wait_for("SCSITarget self-labelled Refused", WAIT, |k| {
            let t = k.get_json(&["scsitarget", "self-labelled"])?;
            let status = &t["status"];
            if status["phase"] != "Refused" {
                return Ok(None);
            }
            // Never discovered through: no node in its status.
            anyhow::ensure!(
                status["nodes"].as_array().is_none_or(Vec::is_empty),
                "nodes discovered through a refused target: {status}"
            );
            Ok(status["conditions"][0]["message"]
                .as_str()
                .map(str::to_owned))
        })
        .await?;
    anyhow::ensure!(message.contains(SETTABLE), "status says {message:?}");
    k.run(&["delete", "scsitarget", "self-labelled", "--wait=true"])?;
    k.run(&["label", "node", node, &format!("{SETTABLE}-")])?;
    Ok(format!(
        "{node}'s kubelet set {SETTABLE} (not {PROTECTED}); the target selecting on it: Refused, no node discovered"
    ))
}
