//! `lab up --kubernetes`: the same storage, nodes and agents as the
//! embedded lab, under a real Kubernetes control plane, with a real
//! containerd and kubelet on every node, the driver installed from
//! `deploy/`, and the proxy with the real CSI sidecars driving it.

pub mod images;
pub mod install;
pub mod node;
pub mod rbac;
pub mod scenario;
pub mod targets;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::{Lab, LabConfig, Manifest};
use crate::binaries::binary;
use crate::daemon::Daemon;
use crate::kube::{ControlPlane, ControlPlaneConfig, GoTools, Kubectl};
use node::{KubeNode, NodeSpec};

/// The Go tools the Kubernetes lab runs.
pub const TOOLS: &[&str] = &[
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kubelet",
    "csi-provisioner",
    "csi-attacher",
    "csi-resizer",
];

/// The sidecars of the controller Deployment the lab runs beside the proxy.
pub(crate) const SIDECARS: &[&str] = &["csi-provisioner", "csi-attacher", "csi-resizer"];

/// A running Kubernetes lab.
pub struct KubeLab {
    /// The storage, network, nodes and agents (the embedded lab's, without its proxy).
    pub lab: Lab,
    /// etcd, API server, controller manager, scheduler.
    pub plane: ControlPlane,
    /// containerd and kubelet per node.
    pub nodes: Vec<KubeNode>,
    /// The controller replicas: each a proxy (kubernetes backend) and its sidecars.
    pub controller: Vec<Replica>,
    /// The rendered overlay (the Deployment's containers), to start more replicas.
    pub rendered: install::Rendered,
    /// kubectl as cluster-admin: what a user of the lab runs.
    pub kubectl: Kubectl,
    /// The driver's namespace.
    pub namespace: String,
}

/// One controller replica: what one Pod of the Deployment would run.
pub struct Replica {
    /// `csi-scsi-controller-<index>`: its POD_NAME, the proxy's Lease
    /// identity and the sidecars' hostname (their Lease identity).
    pub pod: String,
    /// The proxy.
    pub proxy: Daemon,
    /// The sidecars by name.
    pub sidecars: Vec<(String, Daemon)>,
}

impl Replica {
    /// The proxy's PID.
    pub fn pid(&self) -> u32 {
        self.proxy.pid()
    }

    /// Every process of the replica.
    pub fn pids(&self) -> Vec<u32> {
        std::iter::once(self.proxy.pid())
            .chain(self.sidecars.iter().map(|(_, d)| d.pid()))
            .collect()
    }
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
}

impl KubeLab {
    /// Builds and starts everything; `progress` hears about each step.
    pub async fn up(mut config: LabConfig, progress: &mut dyn FnMut(&str)) -> anyhow::Result<Self> {
        config.embedded_proxy = false;
        // The raw-block volume and the two-replica batch (6) on the pool.
        config.pool_luns = config.pool_luns.max(8);
        progress(
            "Go tools: Kubernetes 1.33, etcd and the CSI sidecars from tools/ (cached after the first build)",
        );
        let tools = GoTools::build(TOOLS)?;
        let lab = Lab::up(config, progress).await?;
        let dir = lab.config.dir.clone();
        let mut lab = Some(lab);
        match Self::start(&mut lab, tools, progress).await {
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
        progress: &mut dyn FnMut(&str),
    ) -> anyhow::Result<Self> {
        let lab = slot.as_mut().context("the lab")?;
        let dir = lab.config.dir.clone();
        let subnet = lab.config.subnet;

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
        let kubectl = plane.admin.clone();

        progress(
            "nodes: containerd, the lab's images (busybox), kubelet per node; waiting for Ready",
        );
        sh_ok("mount", &["--make-rshared", "/"])?;
        let images = images::build(&dir.join("kube"))?;
        let mut nodes = Vec::new();
        for (i, n) in lab.nodes.iter().enumerate() {
            let spec = NodeSpec {
                name: &n.name,
                ip: n.ip.parse()?,
                netns: &lab.net.netns(i),
                base: &dir.join("nodes").join(&n.name),
                kubelet_dir: &n.kubelet,
                pod_subnet: format!("198.19.{subnet}.{}/28", 16 * (i + 1)),
                cgroup_root: format!("/csi-scsi-{}-{}", lab.config.prefix, n.name),
            };
            let node = KubeNode::start(&spec, &plane, &tools, &images).await?;
            nodes.push(node);
        }
        for n in &nodes {
            lab.record_pids(&n.pids())?;
            lab.record_cgroup(&n.cgroup_root)?;
        }
        for n in &nodes {
            kubectl
                .wait_for(
                    &format!("Node {} Ready", n.name),
                    Duration::from_secs(120),
                    |k| {
                        let node = k.get_json(&["node", &n.name])?;
                        Ok(condition_true(&node, "Ready").then_some(()))
                    },
                )
                .await
                .with_context(|| tail(&n.kubelet.log()))?;
        }

        progress("driver: deploy/overlays/lab applied with kubectl (CRDs, RBAC, CSIDriver)");
        let overlay = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/overlays/lab");
        let rendered = install::install(&kubectl, &overlay)?;
        let namespace = rendered.namespace.clone();

        progress(
            "controller: csi-scsi-proxy (kubernetes backend, its ServiceAccount's token) and the sidecars, with the Deployment's flags",
        );
        let mut this = Self {
            lab: slot.take().context("the lab")?,
            plane,
            nodes,
            controller: Vec::new(),
            kubectl,
            namespace,
            rendered: rendered.clone(),
        };
        match this.install(&rendered, progress).await {
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

    /// The controller and the nodes' registration.
    async fn install(
        &mut self,
        rendered: &install::Rendered,
        progress: &mut dyn FnMut(&str),
    ) -> anyhow::Result<()> {
        self.start_controller(rendered, "0").await?;

        progress("registration: kubelet registers the agent on every node (CSINode)");
        for n in &self.nodes {
            self.kubectl
                .wait_for(
                    &format!("CSINode {} with csi-scsi.io", n.name),
                    Duration::from_secs(60),
                    |k| {
                        let csinode = k.get_json(&["csinode", &n.name])?;
                        let has = csinode["spec"]["drivers"]
                            .as_array()
                            .is_some_and(|d| d.iter().any(|d| d["name"] == "csi-scsi.io"));
                        Ok(has.then_some(()))
                    },
                )
                .await?;
        }
        Ok(())
    }

    /// Starts one controller replica (`index`): the proxy and its sidecars.
    pub(crate) async fn start_controller(
        &mut self,
        rendered: &install::Rendered,
        index: &str,
    ) -> anyhow::Result<()> {
        let dir = self.lab.config.dir.join(format!("controller-{index}"));
        std::fs::create_dir_all(&dir)?;
        let kubeconfig = self.plane.service_account_kubeconfig(
            &self.namespace,
            "csi-scsi-controller",
            &dir.join("controller.kubeconfig"),
        )?;
        let socket = dir.join("csi.sock");
        let pod = format!("csi-scsi-controller-{index}");
        let ns = self.namespace.clone();
        let env: [(&str, &str); 2] = [("POD_NAMESPACE", &ns), ("POD_NAME", &pod)];
        let labdir = &self.lab.config.dir;
        let proxy_spec = rendered
            .controller
            .get("csi-scsi-proxy")
            .context("no csi-scsi-proxy container in the Deployment")?;
        let mut proxy_args = proxy_spec.args_for_lab(
            &env,
            &[
                ("--csi-endpoint", format!("unix://{}", socket.display())),
                (
                    "--tls-dir",
                    labdir.join("pki/proxy-tls").display().to_string(),
                ),
                (
                    "--secrets-dir",
                    labdir.join("secrets").display().to_string(),
                ),
                (
                    "--status-listen",
                    format!(
                        "{}:{}",
                        self.lab.net.host_ip(),
                        9812 + index.parse::<u16>().unwrap_or(0) * 10
                    ),
                ),
            ],
        );
        // The agents run as host processes here (the DaemonSet is the
        // next step), so the proxy finds them in a file, not as Pods.
        proxy_args.push(format!(
            "--agents-file={}",
            labdir.join("agents.txt").display()
        ));
        let env_owned: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .chain([("KUBECONFIG".to_owned(), kubeconfig.display().to_string())])
            .collect();
        let proxy = Daemon::spawn_with(
            &binary("csi-scsi-proxy"),
            &proxy_args,
            &env_owned,
            &dir.join("proxy.log"),
        );
        self.lab.record_pids(&[proxy.pid()])?;
        for _ in 0..400 {
            if socket.exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::ensure!(
            socket.exists(),
            "the proxy did not serve {}:\n{}",
            socket.display(),
            tail(&proxy.log())
        );
        let mut sidecars = Vec::new();
        for name in SIDECARS {
            let spec = rendered
                .controller
                .get(*name)
                .with_context(|| format!("no {name} container in the Deployment"))?;
            let mut args =
                spec.args_for_lab(&env, &[("--csi-address", socket.display().to_string())]);
            // In a Pod the sidecars use the in-cluster config of the same
            // ServiceAccount; here its token comes in a kubeconfig.
            args.push(format!("--kubeconfig={}", kubeconfig.display()));
            // Their Lease identity is the hostname (the Pod's name in a
            // Pod): a UTS namespace of their own gives each replica its
            // own, else two replicas on this host would share one identity
            // and both lead. `exec` keeps the PID the sidecar's.
            let mut wrapped: Vec<String> = vec![
                "--uts".into(),
                "sh".into(),
                "-c".into(),
                r#"hostname "$0" && exec "$@""#.into(),
                pod.clone(),
                self.plane.tools.path(name).display().to_string(),
            ];
            wrapped.extend(args);
            let sidecar = Daemon::spawn_with(
                Path::new("unshare"),
                &wrapped,
                &env_owned,
                &dir.join(format!("{name}.log")),
            );
            self.lab.record_pids(&[sidecar.pid()])?;
            sidecars.push(((*name).to_owned(), sidecar));
        }
        self.controller.push(Replica {
            pod,
            proxy,
            sidecars,
        });
        Ok(())
    }

    /// `lab.json` for this lab.
    pub fn manifest(&self) -> KubeManifest {
        KubeManifest {
            lab: self.lab.manifest(),
            kubeconfig: self.kubectl.kubeconfig().to_owned(),
            kubectl: self.plane.tools.path("kubectl").to_owned(),
        }
    }
}

/// Whether `object.status.conditions` has `kind` = True.
pub fn condition_true(object: &serde_json::Value, kind: &str) -> bool {
    object["status"]["conditions"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["type"] == kind && c["status"] == "True"))
}

fn sh_ok(program: &str, args: &[&str]) -> anyhow::Result<()> {
    super::net::sh(program, args).map(drop)
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

impl KubeLab {
    /// Leaves everything running after this handle is dropped.
    pub fn keep(self) -> KubeManifest {
        let m = self.manifest();
        let Self {
            lab,
            plane,
            nodes,
            controller,
            ..
        } = self;
        for r in controller {
            r.proxy.detach();
            for (_, d) in r.sidecars {
                d.detach();
            }
        }
        for n in nodes {
            n.detach();
        }
        plane.detach();
        lab.keep();
        m
    }
}
