//! Installs, upgrades and uninstalls the driver the way a user does, by
//! either path of docs/kubernetes.md §3: kustomize (`kubectl kustomize
//! deploy/overlays/lab`, applied with the real kubectl) or the Helm chart
//! (`helm install` with `deploy/chart/csi-scsi/ci/lab-values.yaml`, which
//! deploy/parity.py holds equal to that overlay). With Helm, every install
//! after the first (the reinstall step) goes through a parent chart,
//! `tests/fixtures/subchart`, with csi-scsi as its dependency and the same
//! values under its key: the chart installed as a subchart, which
//! deploy/parity.py also holds equal to the overlay. The overlay's examples
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

/// The parent chart's name for its csi-scsi dependency: the key its
/// values for csi-scsi go under (tests/fixtures/subchart/Chart.yaml).
const SUBCHART: &str = "csi-scsi";

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
            Self::Helm => {
                "helm (deploy/chart/csi-scsi, ci/lab-values.yaml; a reinstall as the subchart of tests/fixtures/subchart)"
            }
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
    /// Installs done so far: with Helm, the first is the chart's own, the
    /// later ones the parent chart's.
    installs: u32,
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
            installs: 0,
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
    /// Secret first, then the release, as docs/kubernetes.md says; the
    /// chart itself the first time, the parent chart with csi-scsi as its
    /// subchart every later time).
    pub fn install(
        &mut self,
        before_workloads: impl FnOnce(&str) -> anyhow::Result<()>,
    ) -> anyhow::Result<Rendered> {
        let rendered = match self.via {
            Via::Kustomize => self.apply_overlay(before_workloads),
            Via::Helm if self.installs == 0 => self.helm_install(before_workloads),
            Via::Helm => self.helm_install_as_subchart(before_workloads),
        }?;
        self.installs += 1;
        Ok(rendered)
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
        // privileged node plugin; the proxy's Secret is in it. The chart
        // renders no Namespace (namespace.create is false by default).
        kubectl.apply_object(&namespace(RELEASE))?;
        before_workloads(RELEASE)?;
        let chart = deploy_dir().join("chart/csi-scsi");
        let manifest = self.helm_release(&chart, &lab_values())?;
        rendered(&objects(&manifest).context("parsing the release's manifest")?)
    }

    /// The same install as [`Self::helm_install`] through the parent chart
    /// `tests/fixtures/subchart`, csi-scsi its dependency: the fixture and
    /// the chart copied into a temporary directory as the repository lays
    /// them out (the fixture names `file://../../../deploy/chart/csi-scsi`),
    /// `helm dependency build` there (never in the tree), and
    /// `ci/lab-values.yaml` under the parent's key for csi-scsi.
    fn helm_install_as_subchart(
        &self,
        before_workloads: impl FnOnce(&str) -> anyhow::Result<()>,
    ) -> anyhow::Result<Rendered> {
        self.kubectl.apply_object(&namespace(RELEASE))?;
        before_workloads(RELEASE)?;
        let dir = tempfile::tempdir().context("a directory for the parent chart")?;
        let parent = dir.path().join("tests/fixtures/subchart");
        copy_dir(&fixture_dir(), &parent)?;
        copy_dir(
            &deploy_dir().join("chart/csi-scsi"),
            &dir.path().join("deploy/chart/csi-scsi"),
        )?;
        self.helm()?
            .run(&["dependency", "build", &parent.display().to_string()])?;
        let lab = lab_values();
        let values = dir.path().join("values.yaml");
        let text =
            std::fs::read_to_string(&lab).with_context(|| format!("reading {}", lab.display()))?;
        std::fs::write(&values, nested(&text, SUBCHART))?;
        let manifest = self.helm_release(&parent, &values)?;
        // The release is the parent's, its objects csi-scsi's templates.
        let source = format!("# Source: csi-scsi-parent/charts/{SUBCHART}/templates/");
        anyhow::ensure!(
            manifest.contains(&source),
            "the release installed through tests/fixtures/subchart has no object from {source:?}"
        );
        rendered(&objects(&manifest).context("parsing the release's manifest")?)
    }

    /// `helm install` of `chart` with `values` as the release `csi-scsi`
    /// in its namespace; the release's manifest.
    fn helm_release(&self, chart: &Path, values: &Path) -> anyhow::Result<String> {
        self.helm()?.run(&[
            "install",
            RELEASE,
            &chart.display().to_string(),
            "--namespace",
            RELEASE,
            "--values",
            &values.display().to_string(),
        ])?;
        self.helm()?
            .run(&["get", "manifest", RELEASE, "--namespace", RELEASE])
    }

    /// Rolls both workloads to the driver's images tagged `tag`: `kubectl
    /// set image`, or `helm upgrade --reset-then-reuse-values` (what
    /// docs/upgrade.md tells users: the new chart's defaults, the release's
    /// values over them) with the new tags (of
    /// the chart's own release: the lab upgrades before it reinstalls).
    pub fn upgrade(&self, namespace: &str, tag: &str) -> anyhow::Result<()> {
        if self.via == Via::Helm && self.installs > 1 {
            bail!(
                "the release is the parent chart's (tests/fixtures/subchart, the reinstall): upgrade runs before the reinstall"
            );
        }
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
                    "--reset-then-reuse-values",
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
                    "service,serviceaccount,role,rolebinding",
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

/// The project lab's values for the chart.
fn lab_values() -> PathBuf {
    deploy_dir().join("chart/csi-scsi/ci/lab-values.yaml")
}

/// The parent chart with csi-scsi as its dependency.
fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/subchart")
}

/// A values file under one key (`key:`, then every line indented): what a
/// parent chart's user writes for its dependency `key` (as
/// deploy/parity.py's `nest`).
fn nested(values: &str, key: &str) -> String {
    let mut out = format!("{key}:\n");
    for line in values.lines() {
        if !line.trim().is_empty() {
            out.push_str("  ");
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

/// Copies the directory `from` to `to`, recursively (files and
/// directories only: the charts hold nothing else).
fn copy_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if entry.file_type()?.is_dir() {
            copy_dir(&src, &dst)?;
        } else {
            std::fs::copy(&src, &dst)
                .with_context(|| format!("copying {} to {}", src.display(), dst.display()))?;
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::nested;

    #[test]
    fn values_nested_under_a_key_read_as_the_same_values_under_it() {
        let values = "# a comment\nlogFormat: text\ncontroller:\n  extraArgs: [--a=1]\n\n  resources:\n    limits: null\n";
        let got: serde_json::Value =
            serde_saphyr::from_str(&nested(values, "csi-scsi")).expect("YAML");
        let want: serde_json::Value = serde_saphyr::from_str(values).expect("YAML");
        assert_eq!(got, serde_json::json!({ "csi-scsi": want }));
        assert_eq!(want["controller"]["extraArgs"][0], "--a=1");
    }
}
