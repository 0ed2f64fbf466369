//! Installs the driver the way a user does: `kubectl kustomize` renders
//! `deploy/overlays/lab`, and the real kubectl applies it, the Deployment
//! and the DaemonSet included. The examples' site objects (SCSITargets,
//! CHAP Secret, StorageClasses) are left out: the lab's steps make their
//! own through the API.

use std::path::Path;

use anyhow::{Context, bail};

use crate::kube::Kubectl;

/// What the rendered install holds that the lab's steps read.
#[derive(Clone, Debug)]
pub struct Rendered {
    /// The driver's namespace.
    pub namespace: String,
    /// The ClusterRoles and Roles it grants (the lab checks each is used).
    pub roles: Vec<serde_json::Value>,
}

/// Renders `overlay` and applies it: CRDs first, then everything else but
/// the workloads, then `before_workloads(namespace)` (the certificate
/// Secret), then the Deployment and the DaemonSet.
pub fn install(
    kubectl: &Kubectl,
    overlay: &Path,
    before_workloads: impl FnOnce(&str) -> anyhow::Result<()>,
) -> anyhow::Result<Rendered> {
    let yaml = kubectl.run(&["kustomize", &overlay.display().to_string()])?;
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&yaml).context("parsing the rendered overlay")?;
    let mut apply = Vec::new();
    let mut workloads = Vec::new();
    let mut namespace = None;
    let mut roles = Vec::new();
    for doc in docs {
        let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
        match kind.as_str() {
            "Deployment" | "DaemonSet" => {
                namespace = doc["metadata"]["namespace"].as_str().map(str::to_owned);
                workloads.push(doc);
            }
            // The lab's steps create their own.
            "SCSITarget" | "Secret" | "StorageClass" => {}
            "ClusterRole" | "Role" => {
                roles.push(doc.clone());
                apply.push(doc);
            }
            _ => apply.push(doc),
        }
    }
    if workloads.len() != 2 {
        bail!(
            "the overlay renders {} workloads, not a Deployment and a DaemonSet",
            workloads.len()
        );
    }
    let namespace = namespace.context("the workloads' namespace")?;
    // CRDs first, established before anything names their kinds.
    let (crds, rest): (Vec<_>, Vec<_>) = apply
        .into_iter()
        .partition(|d| d["kind"] == "CustomResourceDefinition");
    kubectl.apply(&list(crds))?;
    kubectl.run(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd",
        "--all",
    ])?;
    kubectl.apply(&list(rest))?;
    before_workloads(&namespace)?;
    kubectl.apply(&list(workloads))?;
    Ok(Rendered { namespace, roles })
}

fn list(items: Vec<serde_json::Value>) -> String {
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}
