//! Installs the driver the way a user does: `kubectl kustomize` renders
//! `deploy/overlays/lab`, and the real kubectl applies it. The controller
//! Deployment's containers and the node DaemonSet are not applied here:
//! the lab runs the proxy and its sidecars as host processes with exactly
//! the Deployment's arguments (read from the rendered objects), and the
//! agents as host processes (the DaemonSet as Pods is the next step).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, bail};

use crate::kube::Kubectl;

/// One container of the rendered controller Deployment.
#[derive(Clone, Debug)]
pub struct ContainerSpec {
    /// Its arguments, as rendered.
    pub args: Vec<String>,
}

/// What the rendered install holds for the lab to run by hand.
#[derive(Clone, Debug)]
pub struct Rendered {
    /// The controller Deployment's containers by name.
    pub controller: BTreeMap<String, ContainerSpec>,
    /// The driver's namespace.
    pub namespace: String,
    /// The ClusterRoles and Roles it grants (the lab checks each is used).
    pub roles: Vec<serde_json::Value>,
}

/// Renders `overlay`, applies everything but the workloads and the
/// examples' site objects, and returns the controller's containers.
pub fn install(kubectl: &Kubectl, overlay: &Path) -> anyhow::Result<Rendered> {
    let yaml = kubectl.run(&["kustomize", &overlay.display().to_string()])?;
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&yaml).context("parsing the rendered overlay")?;
    let mut apply = Vec::new();
    let mut controller = BTreeMap::new();
    let mut namespace = None;
    let mut roles = Vec::new();
    for doc in docs {
        let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
        match kind.as_str() {
            "Deployment" => {
                namespace = doc["metadata"]["namespace"].as_str().map(str::to_owned);
                for c in doc["spec"]["template"]["spec"]["containers"]
                    .as_array()
                    .context("Deployment containers")?
                {
                    let name = c["name"].as_str().context("container name")?.to_owned();
                    let args = c["args"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|v| v.as_str().map(str::to_owned))
                                .collect()
                        })
                        .unwrap_or_default();
                    controller.insert(name, ContainerSpec { args });
                }
            }
            // Run as host processes in this lab; the targets, Secret and
            // StorageClasses are the lab's own.
            "DaemonSet" | "SCSITarget" | "Secret" | "StorageClass" => {}
            "ClusterRole" | "Role" => {
                roles.push(doc.clone());
                apply.push(doc);
            }
            _ => apply.push(doc),
        }
    }
    if controller.is_empty() {
        bail!("the overlay renders no controller Deployment");
    }
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
    Ok(Rendered {
        controller,
        namespace: namespace.context("the Deployment's namespace")?,
        roles,
    })
}

fn list(items: Vec<serde_json::Value>) -> String {
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}

impl ContainerSpec {
    /// The arguments with `$(VAR)` expanded and each `--flag=value` whose
    /// flag is in `replace` given the lab's value instead.
    pub fn args_for_lab(&self, env: &[(&str, &str)], replace: &[(&str, String)]) -> Vec<String> {
        self.args
            .iter()
            .map(|a| {
                let mut a = a.clone();
                for (k, v) in env {
                    a = a.replace(&format!("$({k})"), v);
                }
                if let Some((flag, _)) = a.split_once('=')
                    && let Some((_, value)) = replace.iter().find(|(f, _)| *f == flag)
                {
                    return format!("{flag}={value}");
                }
                a
            })
            .collect()
    }
}
