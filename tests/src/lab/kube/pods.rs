//! The driver's Pods as the lab's steps look at them: which Pod runs where,
//! its logs, its containers' processes (through the node's containerd, as
//! an operator on the node would with `ctr`).

use anyhow::Context;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

use super::KubeLab;
use super::api::{Typed, deleting, name_of, owner_kind, pod_node};
use crate::kube::Kubectl;

/// The agent DaemonSet's label.
pub const AGENT_SELECTOR: &str = "app.kubernetes.io/name=csi-scsi-node";
/// The controller Deployment's label.
pub const CONTROLLER_SELECTOR: &str = "app.kubernetes.io/name=csi-scsi-controller";

/// The driver's Pods with `selector`.
pub fn list(k: &Kubectl, ns: &str, selector: &str) -> anyhow::Result<Vec<Pod>> {
    k.objects(&["-n", ns, "-l", selector])
}

/// The agent Pod on `node` (the DaemonSet's, not being deleted).
pub fn agent_on(k: &Kubectl, ns: &str, node: &str) -> anyhow::Result<Pod> {
    list(k, ns, AGENT_SELECTOR)?
        .into_iter()
        .find(|p| pod_node(p) == node && !deleting(p) && owner_kind(p) == "DaemonSet")
        .with_context(|| format!("no agent Pod on {node}"))
}

/// The Pod's name.
pub fn name(pod: &Pod) -> String {
    name_of(pod).to_owned()
}

/// The status of `container` in `pod`, once the kubelet reported it.
pub fn status_of<'p>(pod: &'p Pod, container: &str) -> Option<&'p ContainerStatus> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_deref()?
        .iter()
        .find(|c| c.name == container)
}

/// The containerd ID of `container` in `pod` (`containerd://<id>`).
pub fn container_id(pod: &Pod, container: &str) -> anyhow::Result<String> {
    status_of(pod, container)
        .and_then(|c| c.container_id.as_deref())
        .and_then(|id| id.strip_prefix("containerd://"))
        .map(str::to_owned)
        .with_context(|| format!("{} has no running {container}", name(pod)))
}

/// The restart count of `container` in `pod`.
pub fn restarts(pod: &Pod, container: &str) -> u64 {
    status_of(pod, container).map_or(0, |c| u64::try_from(c.restart_count).unwrap_or(0))
}

/// Every driver Pod's phase, conditions and container states, and the
/// namespace's Events: what to read when the install does not come up.
pub fn describe(k: &Kubectl, ns: &str) -> String {
    let pods = k
        .run(&["get", "pods", "-n", ns, "-o", "wide"])
        .unwrap_or_default();
    let events = k
        .run(&["get", "events", "-n", ns, "--sort-by=.lastTimestamp"])
        .unwrap_or_default();
    format!(
        "Pods:\n{pods}\nEvents (last 30):\n{}",
        crate::tail::tail(&events, 30)
    )
}

impl KubeLab {
    /// `ctr` against node `node`'s containerd, in the CRI namespace.
    pub fn ctr(&self, node: &str, args: &[&str]) -> anyhow::Result<String> {
        let i = self.node_index(node)?;
        super::node::ctr_at(self.nodes[i].containerd_socket(), args)
    }

    /// The host PID of a container's main process.
    pub fn container_pid(&self, node: &str, id: &str) -> anyhow::Result<u32> {
        let tasks = self.ctr(node, &["tasks", "ls"])?;
        tasks
            .lines()
            .find_map(|l| {
                let mut f = l.split_whitespace();
                (f.next() == Some(id)).then(|| f.next().and_then(|p| p.parse().ok()))?
            })
            .with_context(|| format!("container {id} has no task on {node}"))
    }

    /// SIGKILLs a container's process (kubelet restarts it).
    pub fn kill_container(&self, node: &str, id: &str) -> anyhow::Result<()> {
        self.ctr(node, &["tasks", "kill", "--signal", "SIGKILL", id])
            .map(drop)
    }

    /// Freezes a container's processes (cgroup freezer): alive, holding
    /// their sockets and Leases, but silent, as on a stalled node.
    pub fn freeze_container(&self, node: &str, id: &str) -> anyhow::Result<()> {
        self.ctr(node, &["tasks", "pause", id]).map(drop)
    }

    /// Thaws a container [`Self::freeze_container`] froze.
    pub fn thaw_container(&self, node: &str, id: &str) -> anyhow::Result<()> {
        self.ctr(node, &["tasks", "resume", id]).map(drop)
    }

    /// Freezes the containers `ids` on `node` in order, stopping at the
    /// first that fails: the ones frozen (to thaw whatever happens next)
    /// and whether all were.
    pub fn freeze_containers(
        &self,
        node: &str,
        ids: &[String],
    ) -> (Vec<String>, anyhow::Result<()>) {
        let mut frozen = Vec::new();
        for id in ids {
            if let Err(e) = self.freeze_container(node, id) {
                return (frozen, Err(e));
            }
            frozen.push(id.clone());
        }
        (frozen, Ok(()))
    }

    /// Thaws every container of `ids` on `node`; the failures, as text.
    pub fn thaw_containers(&self, node: &str, ids: &[String]) -> Vec<String> {
        ids.iter()
            .filter_map(|id| self.thaw_container(node, id).err())
            .map(|e| format!("{e:#}"))
            .collect()
    }

    /// The agent's log on `node`, every container instance of every agent
    /// Pod it ran, read from the node's `/var/log/pods` as an operator on
    /// the node would (kubelet need not be up). No log file is an error,
    /// never an empty log: counting calls in nothing would say "none".
    pub fn agent_log(&self, node: &str) -> anyhow::Result<String> {
        self.container_logs(&[node], "csi-scsi-node-", "csi-scsi-agent")
    }

    /// Every csi-scsi-proxy container's log still on a node (the
    /// controller Pods' current and previous instances).
    pub fn proxy_logs(&self) -> anyhow::Result<String> {
        let nodes: Vec<&str> = self.nodes.iter().map(|n| n.name.as_str()).collect();
        self.container_logs(&nodes, "csi-scsi-controller-", "csi-scsi-proxy")
    }

    /// The proxy's log in controller Pod `pod` on `node`, every instance.
    pub fn proxy_log_of(&self, node: &str, pod: &str) -> anyhow::Result<String> {
        self.container_logs(&[node], &format!("{pod}_"), "csi-scsi-proxy")
    }

    /// The logs of `container` in the driver's Pods named `pod_prefix...`
    /// on `nodes`, oldest file first.
    fn container_logs(
        &self,
        nodes: &[&str],
        pod_prefix: &str,
        container: &str,
    ) -> anyhow::Result<String> {
        let prefix = format!("{}_{pod_prefix}", self.namespace);
        let mut files: Vec<std::path::PathBuf> = Vec::new();
        for node in nodes {
            let pods = self
                .lab
                .config
                .dir
                .join("nodes")
                .join(node)
                .join("host/var/log/pods");
            files.extend(
                std::fs::read_dir(&pods)
                    .with_context(|| format!("reading {}", pods.display()))?
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                    .flat_map(|e| {
                        std::fs::read_dir(e.path().join(container))
                            .into_iter()
                            .flatten()
                            .flatten()
                    })
                    .map(|e| e.path()),
            );
        }
        anyhow::ensure!(
            !files.is_empty(),
            "no {container} log on {}",
            nodes.join(", ")
        );
        files.sort_by_key(|f| std::fs::metadata(f).and_then(|m| m.modified()).ok());
        files
            .iter()
            .map(|f| std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display())))
            .collect()
    }
}
