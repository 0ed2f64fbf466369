//! The agent directory from the agent DaemonSet's Pods: a kube-runtime
//! reflector on the Pods (one namespace, a label selector) maps each Ready
//! Pod's `spec.nodeName` to `status.podIP` and the agent port, and a
//! reflector on the Nodes supplies node labels for targets' node selectors,
//! says which nodes still exist and which the operator fenced. Objects are
//! trimmed before they are cached (no managedFields, annotations, Node
//! status, or unused spec), which is what keeps 5,000 agent Pods and Nodes
//! cheap. A Pod that is deleted, terminating or not Ready drops out; the
//! snapshot is republished only when it changes. A node is gone only by the
//! operator's word: its Node object deleted, or the Node tainted
//! `node.kubernetes.io/out-of-service` (Kubernetes' non-graceful node
//! shutdown: the operator fenced the node, then tainted it). NotReady alone
//! never makes a node gone.

use crate::reflect::Wake;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use csi_scsi_contract::NodeName;
use k8s_openapi::api::core::v1::{Node, NodeSpec, Pod, PodSpec, PodStatus};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use super::{AgentDirectory, AgentEntry, Agents, LabelSource, Standing, Unready};

/// Name of the agent container port; its number wins over the configured one.
pub const AGENT_PORT_NAME: &str = "agent-api";

/// The taint an operator puts on a Node after fencing it (powered off, cut
/// from the SAN) so that its volumes can be detached and used elsewhere
/// (Kubernetes' non-graceful node shutdown). Any value; effect NoExecute or
/// NoSchedule, as Kubernetes documents.
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";

/// Where the agent Pods are.
#[derive(Clone, Debug)]
pub struct PodDirectoryConfig {
    /// Namespace of the agent DaemonSet.
    pub namespace: String,
    /// Label selector of its Pods, e.g. `app.kubernetes.io/name=csi-scsi-node`.
    pub selector: String,
    /// Agent API port when the Pod declares no port named `agent-api`.
    pub port: u16,
    /// The agent DaemonSet: a Ready Pod serves as its node's agent only if
    /// the DaemonSet controls it (another Pod with the agents' labels could
    /// otherwise take a node's place in the directory).
    pub daemonset: String,
    /// Shortest time between two republished snapshots (events are batched).
    pub settle: Duration,
}

/// Agents found through their Pods.
pub struct PodDirectory {
    tx: watch::Sender<Agents>,
    /// The Node objects (metadata and the out-of-service taint): which
    /// nodes exist, and which are fenced.
    nodes: Store<Node>,
    /// Agent Pods that run but are not Ready.
    unready: watch::Sender<Vec<Unready>>,
    /// Whether a snapshot built after both watches listed once is out.
    synced: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

// === impl PodDirectory ===

impl PodDirectory {
    /// Starts the reflectors; the directory is empty until they have listed.
    pub fn spawn(client: Client, config: PodDirectoryConfig) -> Arc<Self> {
        let pods_api: Api<Pod> = Api::namespaced(client.clone(), &config.namespace);
        let nodes_api: Api<Node> = Api::all(client);
        let (pods, pods_writer) = reflector::store();
        let (nodes, nodes_writer) = reflector::store();
        let changed = Arc::new(Notify::new());
        // How many of the two watches have listed once (the stores' own
        // `wait_until_ready` wakes only the last of several waiters).
        let (listed, _) = watch::channel(0usize);
        let (synced, _) = watch::channel(false);
        let (tx, _) = watch::channel(Arc::new(BTreeMap::new()));
        let (unready_tx, _) = watch::channel(Vec::new());

        let pod_task = crate::reflect::spawn(
            pods_api,
            watcher::Config::default().labels(&config.selector),
            pods_writer,
            trim_pod,
            Wake::EveryChange(changed.clone()),
            listed.clone(),
        );
        let node_task = crate::reflect::spawn(
            nodes_api,
            watcher::Config::default(),
            nodes_writer,
            trim_node,
            Wake::EveryChange(changed.clone()),
            listed.clone(),
        );

        let publisher = {
            let (tx, unready_tx, synced, pods, nodes, port, settle, daemonset) = (
                tx.clone(),
                unready_tx.clone(),
                synced.clone(),
                pods.clone(),
                nodes.clone(),
                config.port,
                config.settle,
                config.daemonset.clone(),
            );
            tokio::spawn(async move {
                loop {
                    changed.notified().await;
                    // Read before building: then the snapshot is built
                    // from stores that hold both first lists.
                    let complete = *listed.borrow() >= WATCHES;
                    let agents = build(&pods, &nodes, port, &daemonset);
                    let waiting = unready(&pods, &nodes, port);
                    unready_tx.send_if_modified(|current| {
                        let changed = *current != waiting;
                        *current = waiting;
                        changed
                    });
                    tx.send_if_modified(|current| {
                        if **current == agents {
                            return false;
                        }
                        tracing::info!(agents = agents.len(), "agent directory changed");
                        *current = Arc::new(agents);
                        true
                    });
                    if complete {
                        synced.send_if_modified(|s| !std::mem::replace(s, true));
                    }
                    // Batch bursts (a relist, a rolling update) into one snapshot.
                    tokio::time::sleep(settle).await;
                }
            })
        };
        Arc::new(Self {
            tx,
            nodes,
            unready: unready_tx,
            synced,
            tasks: vec![pod_task, node_task, publisher],
        })
    }

    /// Waits until both reflectors have listed once and a snapshot of
    /// both lists is out.
    pub async fn wait_until_ready(&self) {
        let mut rx = self.synced.subscribe();
        // The sender lives in `self`: the channel cannot close meanwhile.
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Whether both reflectors have listed once and a snapshot of both
    /// lists is out.
    pub fn is_ready(&self) -> bool {
        *self.synced.borrow()
    }
}

/// The reflectors that must list before the directory is complete: Pods
/// and Nodes.
const WATCHES: usize = 2;

impl Drop for PodDirectory {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl AgentDirectory for PodDirectory {
    fn snapshot(&self) -> Agents {
        self.tx.borrow().clone()
    }

    fn subscribe(&self) -> watch::Receiver<Agents> {
        self.tx.subscribe()
    }

    fn is_synced(&self) -> bool {
        self.is_ready()
    }

    fn label_source(&self) -> LabelSource {
        LabelSource::NodeObjects
    }

    /// Removed once its Node object is deleted, fenced while the Node
    /// carries the out-of-service taint; before the lists are in, a member.
    fn standing(&self, node: &NodeName) -> Standing {
        if !self.is_ready() {
            return Standing::Member;
        }
        match self.nodes.get(&ObjectRef::new(node.as_str())) {
            None => Standing::Removed,
            Some(n) if fenced(&n) => Standing::Fenced,
            Some(_) => Standing::Member,
        }
    }

    fn unready(&self) -> Vec<Unready> {
        self.unready.borrow().clone()
    }

    fn subscribe_unready(&self) -> Option<watch::Receiver<Vec<Unready>>> {
        Some(self.unready.subscribe())
    }
}

/// The directory the caches describe now. When two Ready Pods claim one
/// node (a surge during a rolling update), the newer one wins. A fenced
/// node's agent is left out whatever its Pod says: the node is down, and
/// its Pod's Ready is a stale status.
fn build(
    pods: &Store<Pod>,
    nodes: &Store<Node>,
    default_port: u16,
    daemonset: &str,
) -> BTreeMap<NodeName, AgentEntry> {
    let nodes = nodes.state();
    let node_labels: BTreeMap<String, (BTreeMap<String, String>, Option<String>)> = nodes
        .iter()
        .map(|n| (n.name_any(), (n.labels().clone(), n.uid())))
        .collect();
    let fenced: BTreeSet<String> = nodes
        .iter()
        .filter(|n| fenced(n))
        .map(|n| n.name_any())
        .collect();
    let mut chosen: BTreeMap<NodeName, Arc<Pod>> = BTreeMap::new();
    for pod in pods
        .state()
        .into_iter()
        .filter(|p| controlled_by(p, daemonset))
    {
        let Some(node) = serving_node(&pod).filter(|n| !fenced.contains(n.as_str())) else {
            continue;
        };
        let newer = chosen
            .get(&node)
            .is_none_or(|old| old.metadata.creation_timestamp < pod.metadata.creation_timestamp);
        if newer {
            chosen.insert(node, pod);
        }
    }
    chosen
        .into_iter()
        .filter_map(|(node, pod)| {
            let address = pod_address(&pod, default_port)?;
            let (labels, node_uid) = node_labels.get(node.as_str()).cloned().unwrap_or_default();
            Some((
                node,
                AgentEntry {
                    address,
                    labels,
                    node_uid,
                },
            ))
        })
        .collect()
}

/// `ip:port` of a Pod's agent API.
fn pod_address(pod: &Pod, default_port: u16) -> Option<String> {
    let ip = pod.status.as_ref()?.pod_ip.clone()?;
    let port = agent_port(pod).unwrap_or(default_port);
    Some(if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    })
}

/// The agent Pods that run (scheduled, an IP, not terminating) but are
/// not Ready: an agent enrolling is one.
fn unready(pods: &Store<Pod>, nodes: &Store<Node>, default_port: u16) -> Vec<Unready> {
    // Whatever controls them: a Pod that is not the DaemonSet's is refused
    // by the enrolment check itself, with a reason in the proxy's log (a
    // signal worth having), and can never serve (`build`).
    pods.state()
        .iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none() && serving_node(pod).is_none())
        .filter_map(|pod| {
            let node = scheduled_node(pod)?;
            let address = pod_address(pod, default_port)?;
            let node_uid = nodes
                .get(&ObjectRef::new(node.as_str()))
                .and_then(|n| n.uid());
            Some(Unready {
                node,
                address,
                node_uid,
            })
        })
        .collect()
}

/// Whether DaemonSet `name` controls the Pod.
fn controlled_by(pod: &Pod, name: &str) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.kind == "DaemonSet" && o.name == name)
}

/// The node a Pod is scheduled on. A name that is no node name (the API
/// server validates it, so none is) leaves the Pod unscheduled here.
fn scheduled_node(pod: &Pod) -> Option<NodeName> {
    let name = pod.spec.as_ref()?.node_name.as_deref()?;
    NodeName::parse(name).ok()
}

/// The node a Pod serves, if it is scheduled, Ready, has an IP and is not
/// terminating.
fn serving_node(pod: &Pod) -> Option<NodeName> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let node = scheduled_node(pod)?;
    let status = pod.status.as_ref()?;
    status.pod_ip.as_ref().filter(|ip| !ip.is_empty())?;
    let ready = status
        .conditions
        .as_ref()?
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    ready.then_some(node)
}

/// The container port named `agent-api`.
fn agent_port(pod: &Pod) -> Option<u16> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some(AGENT_PORT_NAME))
        .and_then(|p| u16::try_from(p.container_port).ok())
}

/// Whether the operator fenced the node: it carries the out-of-service
/// taint with an effect that keeps Pods off it.
fn fenced(node: &Node) -> bool {
    node.spec
        .iter()
        .flat_map(|s| s.taints.iter().flatten())
        .any(|t| {
            t.key == OUT_OF_SERVICE_TAINT && matches!(t.effect.as_str(), "NoExecute" | "NoSchedule")
        })
}

/// Keeps only what the directory reads of a Node: its name, UID and
/// labels, and the out-of-service taint (its status, by far the largest
/// part, goes).
fn trim_node(node: &mut Node) {
    node.metadata.managed_fields = None;
    node.metadata.annotations = None;
    node.status = None;
    let taints = node
        .spec
        .take()
        .and_then(|s| s.taints)
        .map(|ts| {
            ts.into_iter()
                .filter(|t| t.key == OUT_OF_SERVICE_TAINT)
                .collect::<Vec<_>>()
        })
        .filter(|ts| !ts.is_empty());
    node.spec = taints.map(|taints| NodeSpec {
        taints: Some(taints),
        ..NodeSpec::default()
    });
}

/// Keeps only what `build` reads.
fn trim_pod(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    pod.metadata.annotations = None;
    // Only the controller's reference (`controlled_by` reads it).
    if let Some(owners) = pod.metadata.owner_references.as_mut() {
        owners.retain(|o| o.controller == Some(true));
    }
    if let Some(spec) = pod.spec.take() {
        let containers = spec
            .containers
            .into_iter()
            .map(|c| k8s_openapi::api::core::v1::Container {
                name: c.name,
                ports: c.ports.map(|ps| {
                    ps.into_iter()
                        .filter(|p| p.name.as_deref() == Some(AGENT_PORT_NAME))
                        .collect()
                }),
                ..Default::default()
            })
            .collect();
        pod.spec = Some(PodSpec {
            node_name: spec.node_name,
            containers,
            ..PodSpec::default()
        });
    }
    if let Some(status) = pod.status.take() {
        pod.status = Some(PodStatus {
            pod_ip: status.pod_ip,
            conditions: status
                .conditions
                .map(|cs| cs.into_iter().filter(|c| c.type_ == "Ready").collect()),
            ..PodStatus::default()
        });
    }
}
