//! The agent directory: node name -> agent address, watchable, and which
//! nodes still exist. Backends: a file (embedded mode) and the agent
//! DaemonSet's Pods with the Node objects (Kubernetes mode).

mod file;
mod kube;

use std::collections::BTreeMap;
use std::sync::Arc;

use csi_scsi_contract::NodeName;
use tokio::sync::watch;

pub use file::{DEFAULT_REMOVAL_GRACE, DirectoryError, FileDirectory};
pub use kube::{AGENT_PORT_NAME, OUT_OF_SERVICE_TAINT, PodDirectory, PodDirectoryConfig};

/// One agent: where it listens and its node's labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentEntry {
    /// `host:port` of the agent API.
    pub address: String,
    /// Node labels (for targets' node selectors).
    pub labels: BTreeMap<String, String>,
    /// The Node object's UID, when the backend has Node objects: a
    /// certificate issued to an older Node of that name is refused.
    pub node_uid: Option<String>,
}

/// An agent Pod that is not serving yet (not Ready): a node the enroller
/// may have to give its first certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unready {
    /// The node it runs on.
    pub node: NodeName,
    /// `host:port` of its agent API.
    pub address: String,
    /// Its Node object's UID, when known.
    pub node_uid: Option<String>,
}

/// A snapshot of the directory.
pub type Agents = Arc<BTreeMap<NodeName, AgentEntry>>;

/// A watchable map of agents.
pub trait AgentDirectory: Send + Sync {
    /// The agents now.
    fn snapshot(&self) -> Agents;
    /// A receiver that sees every new snapshot.
    fn subscribe(&self) -> watch::Receiver<Agents>;
    /// Whether the snapshot reflects a complete first list of the
    /// backend; before that an agent missing from it says nothing.
    fn is_synced(&self) -> bool;
    /// Who wrote the node labels it hands out.
    fn label_source(&self) -> LabelSource;
    /// What the backend says of `node` itself, whatever its agent's state;
    /// [`Standing::Member`] while the backend cannot tell yet.
    fn standing(&self, node: &NodeName) -> Standing;
    /// Agents that run but do not serve (an agent with no certificate
    /// yet is not Ready); none when the backend cannot tell.
    fn unready(&self) -> Vec<Unready> {
        Vec::new()
    }
    /// A receiver that sees every change of [`AgentDirectory::unready`];
    /// `None` when the backend has no such agents.
    fn subscribe_unready(&self) -> Option<watch::Receiver<Vec<Unready>>> {
        None
    }
}

/// Who wrote a directory's node labels, and so which keys a target's
/// `nodeSelector` may rest on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelSource {
    /// The operator, in the agents file: no node can change them.
    AgentsFile,
    /// The Node objects, whose labels a node's kubelet may edit (except
    /// the keys NodeRestriction keeps from it).
    NodeObjects,
}

/// What a backend says of a node itself, apart from its agent. Only the
/// operator's own act makes a node anything but a member: a node that
/// merely stopped answering may still write to its volumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Part of the cluster, or not known to have left it (including while
    /// the backend cannot tell yet).
    Member,
    /// Removed by the operator: its Node object deleted, or its line out of
    /// every clean read of the agents file for the whole grace period.
    Removed,
    /// Out of the agents file, but not yet for the whole grace period (or
    /// since the proxy started): not known to be gone, and not a node the
    /// directory lists either.
    Leaving,
    /// Fenced by the operator (Kubernetes' `node.kubernetes.io/out-of-service`
    /// taint): down and cut off from its storage, whatever its agent last
    /// looked like.
    Fenced,
}

/// What the directory says about one node's agent (`locate`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeAgent {
    /// The node's agent is listed: call it.
    Listed(AgentEntry),
    /// The node exists but no agent is listed for it (NotReady,
    /// partitioned, agent restarting): it may still be using its volumes.
    Unreachable,
    /// The node left the cluster, or its operator fenced it: nothing can
    /// be attached there any more.
    Gone,
    /// The node is not in the agents file, but not for long enough to be
    /// gone: nothing can be attached there (the directory does not list
    /// it), yet records of it are kept, as for [`NodeAgent::Unreachable`].
    Unlisted,
    /// The directory has not listed once yet: nothing is known about the
    /// node, so a call for it waits (UNAVAILABLE) rather than guess.
    NotSynced,
}

/// Readiness: the directory has listed once (the CSI Probe and `/readyz`).
pub struct DirectoryCheck(pub Arc<dyn AgentDirectory>);

impl csi_scsi_daemon::Check for DirectoryCheck {
    fn name(&self) -> &str {
        "agent-directory"
    }

    fn check(&self) -> Result<(), String> {
        if self.0.is_synced() {
            Ok(())
        } else {
            Err(
                "the agent directory has not listed the agent Pods and the Nodes yet \
                 (may the proxy list and watch them?)"
                    .into(),
            )
        }
    }
}

impl dyn AgentDirectory {
    /// Where `node`'s agent stands. The one place that decides a node is
    /// gone: a node whose agent is merely missing (not Ready, partitioned)
    /// may still write to its volumes, so only the operator's word makes it
    /// gone: the node removed ([`Standing::Removed`]: Node object deleted,
    /// or out of the agents file for the grace period) and no agent of it
    /// listed, or the node fenced ([`Standing::Fenced`]), listed or not.
    pub fn locate(&self, node: &NodeName) -> NodeAgent {
        let listed = self.snapshot().get(node).cloned();
        match (self.standing(node), listed) {
            // A fenced node is powered off or cut from the SAN: an agent
            // that still looks Ready is a stale status (its kubelet is down
            // too), and a call to it would only time out.
            (Standing::Fenced, _) => NodeAgent::Gone,
            // A listed agent is called even on a removed node: only an
            // agent can say what is attached there.
            (_, Some(entry)) => NodeAgent::Listed(entry),
            (_, None) if !self.is_synced() => NodeAgent::NotSynced,
            (Standing::Member, None) => NodeAgent::Unreachable,
            (Standing::Leaving, None) => NodeAgent::Unlisted,
            (Standing::Removed, None) => NodeAgent::Gone,
        }
    }
}
