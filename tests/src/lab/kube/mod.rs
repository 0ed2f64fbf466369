//! `lab up --kubernetes`: the same storage and nodes as the embedded lab,
//! under a real Kubernetes control plane, with a real containerd, kubelet
//! and kube-proxy on every node, and the driver installed the way users
//! install it: images built here and imported into each node's containerd,
//! `deploy/overlays/lab` applied with kubectl (or, with `--via helm`, the
//! chart installed with helm), the agent running as the DaemonSet and the
//! proxy with the real CSI sidecars as the Deployment.

pub mod api;
pub mod array_admin;
pub mod audit;
pub mod ca_rotation;
pub mod capacity;
pub mod cni;
pub mod enrolment;
pub mod identities;
pub mod images;
pub mod install;
pub mod kubelet_unit;
pub mod node;
pub mod node_config;
pub mod node_fs;
pub mod node_labels;
pub mod node_shell;
pub mod operations;
pub mod pods;
pub mod quick_start;
pub mod rbac;
pub mod scenario;
pub mod shutdown;
pub mod stale_leader;
pub mod targets;
pub mod vm_node;
pub mod vm_reset;
pub mod vm_scenario;
pub mod vm_storage_e2e;
pub mod vm_upgrade;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use serde::{Deserialize, Serialize};

use super::{Lab, LabConfig, Manifest};
use crate::binaries::binary;
use crate::kube::{ControlPlane, ControlPlaneConfig, GoTools, Helm, KubeMinor, Kubectl};
use api::Typed;
use install::{Installer, Via};
use node::{KubeNode, NodeSpec};
use node_fs::NodeFs;
use node_shell::NodeShell;

/// The Go tools the Kubernetes lab runs.
pub const TOOLS: &[&str] = &[
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kubelet",
    "kube-proxy",
    "csi-provisioner",
    "csi-attacher",
    "csi-resizer",
];

/// The sidecars of the controller Deployment.
pub(crate) const SIDECARS: &[&str] = &["csi-provisioner", "csi-attacher", "csi-resizer"];

/// The tag the lab overlay gives the driver's images.
pub const LAB_TAG: &str = "dev";

/// A running Kubernetes lab.
pub struct KubeLab {
    /// The storage, network and nodes (the embedded lab's, without its
    /// proxy and agents).
    pub lab: Lab,
    /// etcd, API server, controller manager, scheduler.
    pub plane: ControlPlane,
    /// containerd, kubelet and kube-proxy per node.
    pub nodes: Vec<KubeNode>,
    /// What the install holds (its RBAC roles).
    pub rendered: install::Rendered,
    /// How the driver was installed, and is upgraded and reinstalled.
    pub installer: Installer,
    /// kubectl as cluster-admin: what a user of the lab runs.
    pub kubectl: Kubectl,
    /// The driver's namespace.
    pub namespace: String,
    /// The image archives every node imported.
    pub images: Vec<PathBuf>,
    /// The nodes' shell (SSH as root, with this lab's key).
    pub shell: NodeShell,
}

/// `lab.json` of a Kubernetes lab: the embedded lab's, plus the kubeconfig.
#[derive(Debug, Serialize, Deserialize)]
pub struct KubeManifest {
    /// The storage, nodes and agents.
    #[serde(flatten)]
    pub lab: Manifest,
    /// An admin kubeconfig (`kubectl --kubeconfig <this> get pvc -A`).
    pub kubeconfig: PathBuf,
    /// The real kubectl it was built with.
    pub kubectl: PathBuf,
    /// The private key that logs in to the nodes' shells as root (SSH to
    /// a Node's InternalIP; `KUBE_SSH_KEY_PATH` of the e2e suite).
    #[serde(default)]
    pub ssh_key: Option<PathBuf>,
}

impl KubeLab {
    /// Builds and starts everything; `progress` hears about each step.
    /// `minor`: the Kubernetes minor of the control plane, kubelets and
    /// kubectl (`None`: the newest supported).
    pub async fn up(
        mut config: LabConfig,
        via: Via,
        minor: Option<KubeMinor>,
        progress: &mut dyn FnMut(&str),
    ) -> anyhow::Result<Self> {
        config.embedded_proxy = false;
        config.agents_as_pods = true;
        if config.vm && via != Via::Kustomize {
            anyhow::bail!(
                "the lab on VM nodes installs with deploy/overlays/lab-vm (kustomize) only"
            );
        }
        // On the pool: the raw-block volume, the two-replica batch (6), the
        // crash, drain and NotReady volumes and the upgrade's writers (3),
        // with room for LUNs still being wiped. On VM nodes only the
        // storage e2e step uses a pool, a small one that only it declares
        // (targets::Pool::Later): under TCG every LUN a guest logs in to
        // costs udev and multipath work (14 more maps starved the guests).
        if config.vm {
            config.pool_luns = config.pool_luns.max(vm_storage_e2e::POOL_LUNS);
            config.large_pool_luns = config.large_pool_luns.max(vm_storage_e2e::LARGE_POOL_LUNS);
        } else {
            config.pool_luns = config.pool_luns.max(14);
        }
        let mut tools = TOOLS.to_vec();
        if via == Via::Helm {
            tools.push("helm");
        }
        let tools = GoTools::build_at(minor, &tools)?;
        progress(&format!(
            "Go tools: Kubernetes {}, etcd and the CSI sidecars from tools/ (cached after the first build)",
            tools.kubernetes()
        ));
        let lab = Lab::up(config, progress).await?;
        let dir = lab.config.dir.clone();
        let mut lab = Some(lab);
        match Self::start(&mut lab, tools, via, progress).await {
            Ok(this) => Ok(this),
            Err(e) => {
                // Keep the files (logs) for a look; `lab down` removes them.
                if let Some(lab) = lab {
                    lab.keep();
                }
                Err(e.context(format!(
                    "logs kept in {}; `lab down` removes them",
                    dir.display()
                )))
            }
        }
    }

    async fn start(
        slot: &mut Option<Lab>,
        tools: GoTools,
        via: Via,
        progress: &mut dyn FnMut(&str),
    ) -> anyhow::Result<Self> {
        let lab = slot.as_mut().context("the lab")?;
        let dir = lab.config.dir.clone();
        let subnet = lab.config.subnet;
        let this_is_vm = lab.config.vm;

        progress(
            "control plane: etcd, kube-apiserver (client certs, Node+RBAC), controller manager, scheduler",
        );
        let plane = ControlPlane::start(
            ControlPlaneConfig {
                dir: dir.join("kube"),
                address: lab.net.host_ip().parse()?,
                controllers: true,
                service_cidr: format!("198.19.{subnet}.0/28"),
            },
            tools.clone(),
        )
        .await?;
        lab.record_pids(&plane.pids())?;
        let version = plane.git_version()?;
        anyhow::ensure!(
            plane.tools.kubernetes().matches(&version),
            "the control plane was built at Kubernetes {} but serves {version}",
            plane.tools.kubernetes()
        );
        progress(&format!("control plane serving Kubernetes {version}"));
        let kubectl = plane.admin.clone();

        progress(
            "images: the driver's (proxy, agent) and the sidecars', built here as docker archives (lab images), and the workloads' busybox",
        );
        sh_ok("mount", &["--make-rshared", "/"])?;
        let mut archives = vec![images::build(&dir.join("kube"))?];
        let built: Vec<crate::images::BuiltImage> =
            crate::images::build(&crate::images::ImageOptions {
                out: dir.join("kube/images"),
                tag: LAB_TAG.into(),
                profile: "debug".into(),
                pins: crate::images::Pins::Check,
                recipes: None,
            })?;
        archives.extend(built.iter().map(|b| b.archive.clone()));

        let shell = NodeShell::prepare(&dir.join("kube"))?;
        let nodes = match lab.config.vm {
            false => {
                progress(
                    "nodes: a mount namespace each (deploy/'s hostPaths), containerd with the images imported, kubelet, kube-proxy, sshd (the node's shell); waiting for Ready",
                );
                host_nodes(lab, &plane, &tools, &archives, &shell, &kubectl).await?
            }
            true => {
                vm_cluster(
                    lab,
                    &plane,
                    &tools,
                    &built,
                    &archives[0],
                    &shell,
                    &kubectl,
                    progress,
                )
                .await?
            }
        };

        let source = if this_is_vm {
            "kustomize (deploy/overlays/lab-vm)".to_owned()
        } else {
            via.to_string()
        };
        progress(&format!(
            "driver: installed with {source}; the proxy's certificate Secret as docs/kubernetes.md makes it; DaemonSet and Deployment Pods Ready"
        ));
        let helm = (via == Via::Helm).then(|| {
            Helm::new(
                tools.path("helm"),
                kubectl.kubeconfig(),
                &dir.join("kube/helm"),
            )
        });
        let mut installer = Installer::new(via, &kubectl, helm)?;
        if this_is_vm {
            installer = installer.on_vm_nodes();
        }
        let ca = lab.pki.ca_dir();
        let rendered = installer.install(|ns| proxy_secret(&kubectl, &ca, ns))?;
        let namespace = rendered.namespace.clone();
        let this = Self {
            lab: slot.take().context("the lab")?,
            plane,
            nodes,
            kubectl,
            namespace,
            rendered,
            installer,
            images: archives,
            shell,
        };
        match this.wait_installed().await {
            Ok(()) => Ok(this),
            Err(e) => {
                let dir = this.lab.config.dir.clone();
                this.keep();
                Err(e.context(format!(
                    "logs kept in {}; `lab down` removes them",
                    dir.display()
                )))
            }
        }
    }

    /// Waits for the driver's Pods and the nodes' registration.
    pub async fn wait_installed(&self) -> anyhow::Result<()> {
        let k = &self.kubectl;
        let ns = &self.namespace;
        // The agents' nodes: every lab node (on VM nodes, not the
        // controller's host-side node).
        let nodes = self.lab.nodes.len();
        // Under TCG a guest takes minutes to create and start a container.
        let within = Duration::from_secs(if self.lab.config.vm { 420 } else { 180 });
        k.wait_for(
            &format!("DaemonSet csi-scsi-node: {nodes} Pods ready"),
            within,
            |k| {
                let ds = k.object::<DaemonSet>("csi-scsi-node", Some(ns))?;
                let st = ds.status.unwrap_or_default();
                let nodes = i32::try_from(nodes)?;
                Ok((st.number_ready == nodes
                    && st.updated_number_scheduled == Some(nodes)
                    && st.observed_generation == ds.metadata.generation)
                    .then_some(()))
            },
        )
        .await
        .with_context(|| pods::describe(k, ns))?;
        k.wait_for(
            "Deployment csi-scsi-controller available",
            Duration::from_secs(180),
            |k| {
                let d = k.object::<Deployment>("csi-scsi-controller", Some(ns))?;
                let want = d.spec.and_then(|s| s.replicas);
                let st = d.status.unwrap_or_default();
                Ok((st.available_replicas == want
                    && st.updated_replicas == want
                    && st.observed_generation == d.metadata.generation)
                    .then_some(()))
            },
        )
        .await
        .with_context(|| pods::describe(k, ns))?;
        for n in &self.lab.nodes {
            k.wait_for(
                &format!("CSINode {} with csi-scsi.io", n.name),
                Duration::from_secs(60),
                |k| {
                    let csinode = k.object::<CSINode>(&n.name, None)?;
                    Ok(scenario::has_driver(&csinode).then_some(()))
                },
            )
            .await?;
        }
        Ok(())
    }

    /// The index of node `name`.
    pub fn node_index(&self, name: &str) -> anyhow::Result<usize> {
        self.nodes
            .iter()
            .position(|n| n.name == name)
            .with_context(|| format!("no lab node {name}"))
    }

    /// `lab.json` for this lab.
    pub fn manifest(&self) -> KubeManifest {
        KubeManifest {
            lab: self.lab.manifest(),
            kubeconfig: self.kubectl.kubeconfig().to_owned(),
            kubectl: self.plane.tools.path("kubectl").to_owned(),
            ssh_key: Some(self.shell.key()),
        }
    }
}

/// The Kubernetes lab's nodes on this host: one per lab node, each in its
/// network and mount namespaces, Ready.
async fn host_nodes(
    lab: &mut Lab,
    plane: &ControlPlane,
    tools: &GoTools,
    archives: &[PathBuf],
    shell: &NodeShell,
    kubectl: &Kubectl,
) -> anyhow::Result<Vec<KubeNode>> {
    let dir = lab.config.dir.clone();
    let subnet = lab.config.subnet;
    let cluster_cidr = format!("198.19.{subnet}.0/24");
    let mut nodes = Vec::new();
    let mut routes = Vec::new();
    let (block, prefix_len) = pod_block(lab.nodes.len());
    for (i, n) in lab.nodes.iter().enumerate() {
        let base = dir.join("nodes").join(&n.name);
        let fs = NodeFs::create(&base)?;
        let pod_subnet = format!("198.19.{subnet}.{}/{prefix_len}", block * (i + 1));
        routes.push((pod_subnet.clone(), n.ip.clone()));
        let spec = NodeSpec {
            name: &n.name,
            ip: n.ip.parse()?,
            netns: &lab.net.netns(i),
            base: &base,
            fs: &fs,
            pod_subnet,
            cluster_cidr: cluster_cidr.clone(),
            cgroup_root: format!("/csi-scsi-{}-{}", lab.config.prefix, n.name),
            shell,
        };
        nodes.push(KubeNode::start(&spec, plane, tools, archives).await?);
    }
    for n in &nodes {
        lab.record_pids(&n.pids())?;
        lab.record_cgroup(&n.cgroup_root)?;
    }
    route_pod_subnets(lab, &routes)?;
    for n in &nodes {
        kubectl
            .wait_for(
                &format!("Node {} Ready", n.name),
                Duration::from_secs(120),
                |k| {
                    let node = k.object::<Node>(&n.name, None)?;
                    Ok(api::node_ready(&node).then_some(()))
                },
            )
            .await
            .with_context(|| crate::tail::tail(&n.kubelet.log(), 40))?;
    }

    Ok(nodes)
}

/// The name of the host-side node that runs the controller in the lab on
/// VM nodes.
pub const CONTROL_NODE: &str = "control-plane";

/// The lab on VM nodes: every lab node a qemu guest that is a Kubernetes
/// node ([`vm_node`]), and one host-side node, `control-plane`, labelled
/// and tainted as a control-plane node, where the controller Deployment
/// runs (deploy/overlays/lab-vm places it there, and the agents on the
/// guests only). Returns the host-side node.
#[allow(clippy::too_many_arguments)]
async fn vm_cluster(
    lab: &mut Lab,
    plane: &ControlPlane,
    tools: &GoTools,
    built: &[crate::images::BuiltImage],
    workloads: &Path,
    shell: &NodeShell,
    kubectl: &Kubectl,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<Vec<KubeNode>> {
    let dir = lab.config.dir.clone();
    let subnet = lab.config.subnet;
    let guests = lab.config.nodes;
    let (block, prefix_len) = pod_block(guests + 1);
    let pod_subnet = |i: usize| format!("198.19.{subnet}.{}/{prefix_len}", block * (i + 1));
    progress(
        "control-plane node: on this host in a namespace of its own (containerd with the controller's images, kubelet, kube-proxy), labelled and tainted node-role.kubernetes.io/control-plane",
    );
    let c = guests;
    lab.net.add_node(c)?;
    let base = dir.join("nodes").join(CONTROL_NODE);
    let fs = NodeFs::create(&base)?;
    let mut archives = vec![workloads.to_owned()];
    archives.extend(built.iter().map(|b| b.archive.clone()));
    let spec = NodeSpec {
        name: CONTROL_NODE,
        ip: lab.net.node_ip(c).parse()?,
        netns: &lab.net.netns(c),
        base: &base,
        fs: &fs,
        pod_subnet: pod_subnet(c),
        cluster_cidr: format!("198.19.{subnet}.0/24"),
        cgroup_root: format!("/csi-scsi-{}-{CONTROL_NODE}", lab.config.prefix),
        shell,
    };
    let control = KubeNode::start(&spec, plane, tools, &archives).await?;
    lab.record_pids(&control.pids())?;
    lab.record_cgroup(&control.cgroup_root)?;
    kubectl
        .wait_for(
            &format!("Node {CONTROL_NODE} Ready"),
            Duration::from_secs(120),
            |k| {
                let node = k.object::<Node>(CONTROL_NODE, None)?;
                Ok(api::node_ready(&node).then_some(()))
            },
        )
        .await
        .with_context(|| crate::tail::tail(&control.kubelet.log(), 40))?;
    // What a kubelet may not set on itself (NodeRestriction): the admin does.
    kubectl.run(&[
        "label",
        "node",
        CONTROL_NODE,
        "node-role.kubernetes.io/control-plane=",
    ])?;
    kubectl.run(&[
        "taint",
        "node",
        CONTROL_NODE,
        "node-role.kubernetes.io/control-plane=:NoSchedule",
    ])?;

    let t = std::time::Instant::now();
    let agent = built
        .iter()
        .find(|b| b.reference.contains("csi-scsi/agent"))
        .context("the agent's image")?;
    progress(&format!(
        "VM nodes: {guests} qemu guests (TCG) of Debian's kernel with the real initiator, udev and dm-multipath, each a Kubernetes node: containerd, runc, CNI and kubelet {} inside, the agent's and the workloads' images imported",
        tools.kubernetes()
    ));
    let guest_archives = vec![workloads.to_owned(), agent.archive.clone()];
    let subnets: Vec<String> = (0..guests).map(pod_subnet).collect();
    vm_node::boot_guests(lab, plane, tools, &guest_archives, &subnets)?;
    // The controller's Pods answer the agents from the control node's Pod
    // subnet: the host and each guest's namespace route it there.
    route_pod_subnets(lab, &[(pod_subnet(c), lab.net.node_ip(c))])?;
    let figures = vm_node::wait_ready(lab, kubectl, t, Duration::from_secs(420)).await?;
    for (name, secs, rss) in &figures.nodes {
        progress(&format!(
            "{name}: Node Ready {secs:.1}s after the guests began to boot; qemu RSS {rss} MiB (guest memory {} MiB)",
            crate::vm::KUBE_GUEST_MEMORY_MIB
        ));
    }
    Ok(vec![control])
}

/// The trust material the driver's Pods mount, made as docs/kubernetes.md
/// says: the CA as the signer's Secret and the agents' ConfigMap
/// (`csi-scsi-certs ca-manifests`), and the proxy's client certificate
/// (`csi-scsi-certs issue-proxy --format secret`). No agent certificate:
/// the agents enrol.
fn proxy_secret(kubectl: &Kubectl, ca: &Path, namespace: &str) -> anyhow::Result<()> {
    let certs = binary("csi-scsi-certs").display().to_string();
    let ca_objects = super::net::sh(
        &certs,
        &[
            "ca-manifests",
            "--ca",
            &ca.display().to_string(),
            "--namespace",
            namespace,
        ],
    )?;
    kubectl.apply(&ca_objects)?;
    let secret = super::net::sh(
        &certs,
        &[
            "issue-proxy",
            "--ca",
            &ca.display().to_string(),
            "--format",
            "secret",
            "--namespace",
            namespace,
            "--out",
            "-",
        ],
    )?;
    kubectl.apply(&secret)?;
    Ok(())
}

/// The size and prefix length of each node's Pod subnet: the largest block
/// that fits the cluster's /24 once per node, after the first block (which
/// holds the Service range, `.0/28`). Three nodes get a /26 (62 Pods each:
/// the storage e2e suite's parallel specs start many), eight a /28.
fn pod_block(nodes: usize) -> (usize, u32) {
    let mut block = 256;
    while block * (nodes + 1) > 256 {
        block /= 2;
    }
    (block, 32 - block.trailing_zeros())
}

/// Routes every node's Pod subnet through that node, on the host (the API
/// server answers Pods that reach it through the `kubernetes` Service) and
/// on every other node: a flat Pod network, as a cluster's CNI provides.
fn route_pod_subnets(lab: &Lab, routes: &[(String, String)]) -> anyhow::Result<()> {
    for (subnet, via) in routes {
        sh_ok("ip", &["route", "replace", subnet, "via", via])?;
        for (i, n) in lab.nodes.iter().enumerate() {
            if n.ip != *via {
                sh_ok(
                    "ip",
                    &[
                        "netns",
                        "exec",
                        &lab.net.netns(i),
                        "ip",
                        "route",
                        "replace",
                        subnet,
                        "via",
                        via,
                    ],
                )?;
            }
        }
    }
    Ok(())
}

fn sh_ok(program: &str, args: &[&str]) -> anyhow::Result<()> {
    super::net::sh(program, args).map(drop)
}

impl KubeLab {
    /// Leaves everything running after this handle is dropped.
    pub fn keep(self) -> KubeManifest {
        let m = self.manifest();
        let Self {
            lab, plane, nodes, ..
        } = self;
        for n in nodes {
            n.detach();
        }
        plane.detach();
        lab.keep();
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_node_gets_the_largest_pod_block_that_fits_after_the_services() {
        for (nodes, want) in [(1, (128, 25)), (3, (64, 26)), (4, (32, 27)), (8, (16, 28))] {
            assert_eq!(pod_block(nodes), want, "{nodes} nodes");
            let (block, _) = want;
            assert!(block * (nodes + 1) <= 256 && block >= 16);
        }
    }
}
