//! Installs, upgrades and uninstalls the driver the way a user does, by
//! either path of docs/kubernetes.md §3: kustomize (`kubectl kustomize
//! deploy/overlays/lab`, applied with the real kubectl) or the Helm chart
//! (`helm install` with `deploy/chart/csi-scsi/ci/lab-values.yaml`, which
//! deploy/parity.py holds equal to that overlay). The overlay's examples
//! (SCSITargets, CHAP Secret, StorageClasses) are left out: the lab's steps
//! make their own through the API.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::DynamicObject;

use super::api::Typed;
use super::rbac::GrantingRole;
use crate::kube::{Helm, Kubectl};

/// The namespace and release name a Helm install uses (docs/kubernetes.md).
const RELEASE: &str = "csi-scsi";

/// The driver's two workloads, as `kubectl` names them.
const WORKLOADS: [&str; 2] = ["daemonset/csi-scsi-node", "deployment/csi-scsi-controller"];

/// Which of docs/kubernetes.md's install paths the lab takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Via {
    /// `deploy/overlays/lab` with kubectl.
    #[default]
    Kustomize,
    /// `deploy/chart/csi-scsi` with helm.
    Helm,
}

impl FromStr for Via {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "kustomize" => Ok(Self::Kustomize),
            "helm" => Ok(Self::Helm),
            other => bail!("--via {other:?}: kustomize or helm"),
        }
    }
}

impl std::fmt::Display for Via {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Kustomize => "kustomize (deploy/overlays/lab)",
            Self::Helm => "helm (deploy/chart/csi-scsi, ci/lab-values.yaml)",
        })
    }
}

/// What the installed release holds that the lab's steps read.
#[derive(Clone, Debug)]
pub struct Rendered {
    /// The driver's namespace.
    pub namespace: String,
    /// The ClusterRoles and Roles it grants (the lab checks each is used).
    pub roles: Vec<GrantingRole>,
}

/// Installs the driver by one path, and later upgrades, rolls back,
/// uninstalls and reinstalls it by the same path.
#[derive(Clone, Debug)]
pub struct Installer {
    /// The path taken.
    pub via: Via,
    /// The kustomize overlay under `deploy/overlays`.
    overlay: &'static str,
    kubectl: Kubectl,
    helm: Option<Helm>,
}

impl Installer {
    /// An installer by `via`; `helm` is needed for [`Via::Helm`] only.
    pub fn new(via: Via, kubectl: &Kubectl, helm: Option<Helm>) -> anyhow::Result<Self> {
        if via == Via::Helm && helm.is_none() {
            bail!("installing with helm needs the helm binary");
        }
        Ok(Self {
            via,
            overlay: "lab",
            kubectl: kubectl.clone(),
            helm,
        })
    }

    /// The same install for the lab whose nodes are qemu guests:
    /// `deploy/overlays/lab-vm` (no kernel stand-in seam; the controller on
    /// the control-plane node).
    pub fn on_vm_nodes(mut self) -> Self {
        self.overlay = "lab-vm";
        self
    }

    fn helm(&self) -> anyhow::Result<&Helm> {
        self.helm.as_ref().context("helm was not built")
    }

    /// Installs the driver: everything but the workloads first, then
    /// `before_workloads(namespace)` (the certificate Secret), then the
    /// Deployment and the DaemonSet (with Helm: the namespace and the
    /// Secret first, then the release, as docs/kubernetes.md says).
    pub fn install(
        &self,
        before_workloads: impl FnOnce(&str) -> anyhow::Result<()>,
    ) -> anyhow::Result<Rendered> {
        match self.via {
            Via::Kustomize => self.apply_overlay(before_workloads),
            Via::Helm => self.helm_install(before_workloads),
        }
    }

    fn apply_overlay(
        &self,
        before_workloads: impl FnOnce(&str) -> anyhow::Result<()>,
    ) -> anyhow::Result<Rendered> {
        let kubectl = &self.kubectl;
        let overlay = deploy_dir().join("overlays").join(self.overlay);
        let yaml = kubectl.run(&["kustomize", &overlay.display().to_string()])?;
        let docs = objects(&yaml).context("parsing the rendered overlay")?;
        let mut apply = Vec::new();
        let mut workloads = Vec::new();
        for doc in docs {
            match kind(&doc) {
                "Deployment" | "DaemonSet" => workloads.push(doc),
                // The install's own Secret: the sidecars' token.
                "Secret" if is_token_secret(&doc)? => apply.push(doc),
                // The examples': the lab's steps create their own.
                "SCSITarget" | "Secret" | "StorageClass" => {}
                _ => apply.push(doc),
            }
        }
        let rendered = rendered(&workloads.iter().chain(&apply).cloned().collect::<Vec<_>>())?;
        // CRDs first, established before anything names their kinds.
        let (crds, rest): (Vec<_>, Vec<_>) = apply
            .into_iter()
            .partition(|d| kind(d) == "CustomResourceDefinition");
        kubectl.apply(&list(&crds)?)?;
        kubectl.run(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd",
            "--all",
        ])?;
        kubectl.apply(&list(&rest)?)?;
        before_workloads(&rendered.namespace)?;
        kubectl.apply(&list(&workloads)?)?;
        Ok(rendered)
    }

    fn helm_install(
        &self,
        before_workloads: impl FnOnce(&str) -> anyhow::Result<()>,
    ) -> anyhow::Result<Rendered> {
        let kubectl = &self.kubectl;
        // docs/kubernetes.md §1 and §3 (Helm): the namespace exists before
        // the release (helm keeps its record there), labelled for the
        // privileged node plugin; the proxy's Secret is in it.
        kubectl.apply_object(&namespace(RELEASE))?;
        before_workloads(RELEASE)?;
        let chart = deploy_dir().join("chart/csi-scsi");
        let values = chart.join("ci/lab-values.yaml");
        self.helm()?.run(&[
            "install",
            RELEASE,
            &chart.display().to_string(),
            "--namespace",
            RELEASE,
            "--values",
            &values.display().to_string(),
            "--set",
            "namespace.create=false",
        ])?;
        let manifest = self
            .helm()?
            .run(&["get", "manifest", RELEASE, "--namespace", RELEASE])?;
        let docs = objects(&manifest).context("parsing the release's manifest")?;
        rendered(&docs)
    }

    /// Rolls both workloads to the driver's images tagged `tag`: `kubectl
    /// set image`, or `helm upgrade --reuse-values` with the new tags.
    pub fn upgrade(&self, namespace: &str, tag: &str) -> anyhow::Result<()> {
        match self.via {
            Via::Kustomize => {
                for (workload, container, image) in [
                    (WORKLOADS[0], "csi-scsi-agent", "csi-scsi/agent"),
                    (WORKLOADS[1], "csi-scsi-proxy", "csi-scsi/proxy"),
                ] {
                    self.kubectl.run(&[
                        "set",
                        "image",
                        "-n",
                        namespace,
                        workload,
                        &format!("{container}={image}:{tag}"),
                    ])?;
                }
            }
            Via::Helm => {
                self.helm()?.run(&[
                    "upgrade",
                    RELEASE,
                    &deploy_dir().join("chart/csi-scsi").display().to_string(),
                    "--namespace",
                    namespace,
                    "--reuse-values",
                    "--set",
                    &format!("controller.image.tag={tag}"),
                    "--set",
                    &format!("node.image.tag={tag}"),
                ])?;
            }
        }
        Ok(())
    }

    /// Back to the previous revision: `kubectl rollout undo` of each
    /// workload, or `helm rollback`.
    pub fn rollback(&self, namespace: &str) -> anyhow::Result<()> {
        match self.via {
            Via::Kustomize => {
                for workload in WORKLOADS {
                    self.kubectl
                        .run(&["rollout", "undo", "-n", namespace, workload])?;
                }
            }
            Via::Helm => {
                self.helm()?
                    .run(&["rollback", RELEASE, "--namespace", namespace])?;
            }
        }
        Ok(())
    }

    /// Removes the driver as docs/kubernetes.md's "Uninstall" step 2 says,
    /// keeping the CRDs (the inventory), the namespace and its Secrets:
    /// the workloads first and their Pods waited out (a stopping proxy
    /// still releases its Lease, which its Role must allow), then the rest.
    pub fn uninstall(&self, namespace: &str) -> anyhow::Result<()> {
        let k = &self.kubectl;
        let label = "app.kubernetes.io/part-of=csi-scsi";
        match self.via {
            Via::Kustomize => {
                k.run(&[
                    "-n",
                    namespace,
                    "delete",
                    "deployment,daemonset",
                    "-l",
                    label,
                ])?;
                self.wait_pods_gone(namespace, DRIVER_PODS)?;
                k.run(&[
                    "-n",
                    namespace,
                    "delete",
                    "serviceaccount,role,rolebinding",
                    "-l",
                    label,
                ])?;
                k.run(&[
                    "delete",
                    "csidriver,clusterrole,clusterrolebinding",
                    "-l",
                    label,
                ])?;
            }
            // helm uninstall deletes the Role with the Deployment, without
            // waiting for its Pods: the controller goes to zero replicas
            // first. The agents need no role.
            Via::Helm => {
                k.run(&[
                    "-n",
                    namespace,
                    "scale",
                    "deployment/csi-scsi-controller",
                    "--replicas=0",
                ])?;
                self.wait_pods_gone(namespace, "app.kubernetes.io/name=csi-scsi-controller")?;
                self.helm()?.run(&[
                    "uninstall",
                    RELEASE,
                    "--namespace",
                    namespace,
                    "--wait",
                    "--timeout=120s",
                ])?;
                self.wait_pods_gone(namespace, DRIVER_PODS)?;
            }
        }
        Ok(())
    }

    /// `kubectl wait --for=delete` of the Pods `selector` matches; none
    /// left is done too (kubectl may say "no matching resources").
    fn wait_pods_gone(&self, namespace: &str, selector: &str) -> anyhow::Result<()> {
        match self.kubectl.run(&[
            "-n",
            namespace,
            "wait",
            "--for=delete",
            "pod",
            "--timeout=120s",
            "-l",
            selector,
        ]) {
            Err(e) if !e.to_string().contains("no matching resources") => Err(e),
            _ => Ok(()),
        }
    }
}

/// The driver's Pods, both workloads'.
const DRIVER_PODS: &str = "app.kubernetes.io/name in (csi-scsi-controller,csi-scsi-node)";

/// The repository's `deploy/`.
fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// The namespace and roles of an install's objects, which must hold
/// exactly a Deployment and a DaemonSet.
fn rendered(docs: &[DynamicObject]) -> anyhow::Result<Rendered> {
    let workloads: Vec<_> = docs
        .iter()
        .filter(|d| matches!(kind(d), "Deployment" | "DaemonSet"))
        .collect();
    if workloads.len() != 2 {
        bail!(
            "the install has {} workloads, not a Deployment and a DaemonSet",
            workloads.len()
        );
    }
    let namespace = workloads[0]
        .metadata
        .namespace
        .clone()
        .context("the workloads' namespace")?;
    let roles = docs
        .iter()
        .filter_map(|d| GrantingRole::from_object(d).transpose())
        .collect::<anyhow::Result<_>>()?;
    Ok(Rendered { namespace, roles })
}

/// The objects of a multi-document YAML stream (empty documents skipped).
fn objects(yaml: &str) -> anyhow::Result<Vec<DynamicObject>> {
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(yaml)?;
    docs.into_iter()
        .filter(|d| !d.is_null())
        .map(|d| Ok(serde_json::from_value(d)?))
        .collect()
}

/// An object's kind (empty when it names none).
fn kind(object: &DynamicObject) -> &str {
    object.types.as_ref().map_or("", |t| t.kind.as_str())
}

/// Whether a Secret is a ServiceAccount's token (the install's own).
fn is_token_secret(object: &DynamicObject) -> anyhow::Result<bool> {
    let secret: Secret = object.clone().try_parse()?;
    Ok(secret.type_.as_deref() == Some("kubernetes.io/service-account-token"))
}

/// The driver's namespace as docs/kubernetes.md has users make it for a
/// Helm install: labelled for the privileged node plugin.
fn namespace(name: &str) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                [(
                    "pod-security.kubernetes.io/enforce".to_owned(),
                    "privileged".to_owned(),
                )]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    }
}

/// `items` as one `v1/List`, for one `kubectl apply`.
fn list(items: &[DynamicObject]) -> anyhow::Result<String> {
    Ok(serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string())
}
