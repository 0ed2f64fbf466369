//! The agent directory: node name -> agent address, watchable. Backends: a
//! file (embedded mode; this module) and, later, the agent DaemonSet's Pods.

mod file;
mod kube;

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::watch;

pub use file::FileDirectory;
pub use kube::{AGENT_PORT_NAME, PodDirectory, PodDirectoryConfig};

/// One agent: where it listens and its node's labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentEntry {
    /// `host:port` of the agent API.
    pub address: String,
    /// Node labels (for targets' node selectors).
    pub labels: BTreeMap<String, String>,
}

/// A snapshot of the directory.
pub type Agents = Arc<BTreeMap<String, AgentEntry>>;

/// A watchable map of agents.
pub trait AgentDirectory: Send + Sync {
    /// The agents now.
    fn snapshot(&self) -> Agents;
    /// A receiver that sees every new snapshot.
    fn subscribe(&self) -> watch::Receiver<Agents>;
}
