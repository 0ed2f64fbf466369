//! `ProxyError`: what can go wrong on the controller side. Mapped to gRPC
//! codes in exactly one place, `csi/status.rs`.

use csi_scsi_contract::NodeName;

use crate::agents::AgentError;
use crate::device::KubeletSettableSelector;
use crate::inventory::InventoryError;
use crate::parameters::InvalidParameter;
use crate::secrets::SecretError;

/// A controller-side failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// A request field is missing or malformed.
    #[error("invalid {field}: {reason}")]
    InvalidArgument {
        /// The field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A StorageClass parameter is refused.
    #[error(transparent)]
    Parameter(#[from] InvalidParameter),
    /// No such volume.
    #[error("volume {0} does not exist")]
    VolumeNotFound(String),
    /// The node is gone by its operator's word: its Node object deleted,
    /// fenced with the out-of-service taint, or out of the agents file for
    /// the removal grace period.
    #[error(
        "node {0} is gone (no Node object, tainted node.kubernetes.io/out-of-service, \
         or out of the agents file for --node-removal-grace)"
    )]
    NodeNotFound(NodeName),
    /// The node exists but no agent of it is listed (NotReady,
    /// partitioned, agent restarting): it may still be using the volume,
    /// so the request waits for the agent rather than take the node for gone.
    #[error(
        "node {node} exists but its agent is not ready (node NotReady or partitioned?): {consequence}"
    )]
    NodeUnreachable {
        /// The node.
        node: NodeName,
        /// What that means for this request.
        consequence: String,
    },
    /// The agent directory has not listed once yet (proxy start-up, or
    /// the Pod or Node list refused): nothing is known about any node.
    #[error("the agent directory has not listed the agents and nodes yet: {consequence}")]
    DirectoryNotSynced {
        /// What that means for this request.
        consequence: String,
    },
    /// A volume with this name exists with other parameters.
    #[error("volume {name} already exists with different parameters: {difference}")]
    NameConflict {
        /// The request name.
        name: String,
        /// What differs.
        difference: String,
    },
    /// No Available device fits now.
    #[error("no available device fits: {0}")]
    NoDeviceFits(String),
    /// No device could ever fit the requested size.
    #[error("no device of the requested size exists: {0}")]
    CapacityOutOfRange(String),
    /// The volume is published where the request does not allow it.
    #[error("volume {volume} is published to {}: {reason}", comma_separated(.nodes))]
    PublishedElsewhere {
        /// The volume.
        volume: String,
        /// Where it is published.
        nodes: Vec<NodeName>,
        /// Why that blocks the request.
        reason: &'static str,
    },
    /// Already published to that node with another capability or
    /// readonly flag.
    #[error(
        "volume {volume} is already published to node {node} as {recorded}, not as {asked}: unpublish it first"
    )]
    PublishedIncompatibly {
        /// The volume.
        volume: String,
        /// The node.
        node: NodeName,
        /// How it is published there.
        recorded: String,
        /// How the request asks for it.
        asked: String,
    },
    /// The LUN is smaller than asked and cannot grow by itself.
    #[error(
        "LUN {wwid} has {have} bytes, {want} requested: recorded resize request {request}; grow the LUN on the array and the resize completes on retry"
    )]
    ResizePending {
        /// The LUN.
        wwid: String,
        /// Its size.
        have: u64,
        /// The requested size.
        want: u64,
        /// The PendingResizeRequest name.
        request: String,
    },
    /// The device is not in a state that allows the operation now.
    #[error("device {wwid} is {state}: {reason}")]
    DeviceState {
        /// The device.
        wwid: String,
        /// Its phase.
        state: String,
        /// What to do.
        reason: String,
    },
    /// A wipe answered done but is not proven: it did not cover the size
    /// the inventory records, or another node reads the LUN otherwise.
    #[error("the wipe of {wwid} is not proven: {reason}")]
    WipeUnproven {
        /// The device.
        wwid: String,
        /// What disagrees.
        reason: String,
    },
    /// An agent call did not do what was asked.
    #[error(transparent)]
    Agent(#[from] AgentError),
    /// No agent that could do the work answered.
    #[error("no agent reachable for {what}: {detail}")]
    AgentsUnavailable {
        /// What was attempted.
        what: String,
        /// Per-node failures.
        detail: String,
    },
    /// Another operation on the same volume held it too long.
    #[error("another operation on {0} is in progress; retry")]
    Busy(String),
    /// A publish to a node that a target the LUN is reached through does
    /// not select (its `nodes` or `nodeSelector`): the target's CHAP
    /// credentials are never sent there.
    #[error(
        "node {node} is not selected by target {target} (its nodes or nodeSelector), through which LUN {wwid} is reached: nothing is sent to it"
    )]
    TargetNotForNode {
        /// The node asked for.
        node: NodeName,
        /// The target that does not select it.
        target: String,
        /// The LUN.
        wwid: String,
    },
    /// A target the LUN is reached through selects nodes by a label a
    /// node's kubelet can set on itself: it selects no node.
    #[error(transparent)]
    SelectorNotProtected(#[from] KubeletSettableSelector),
    /// A CHAP Secret could not be used (never its content).
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// The inventory failed.
    #[error(transparent)]
    Inventory(#[from] InventoryError),
}

/// `a,b,c`: nodes as a message lists them.
fn comma_separated(nodes: &[NodeName]) -> String {
    nodes
        .iter()
        .map(NodeName::as_str)
        .collect::<Vec<_>>()
        .join(",")
}

impl ProxyError {
    /// Whether this failure of an Attach call proves nothing was attached:
    /// the agent refused, or the call never left the proxy. A timeout, a
    /// lost connection or a busy answer proves nothing.
    pub fn attach_surely_refused(&self) -> bool {
        match self {
            Self::Agent(e) => e.surely_did_nothing(),
            Self::NodeNotFound(_)
            | Self::NodeUnreachable { .. }
            | Self::DirectoryNotSynced { .. }
            | Self::TargetNotForNode { .. }
            | Self::SelectorNotProtected(_) => true,
            _ => false,
        }
    }
}
