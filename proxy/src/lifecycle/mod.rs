//! The volume life cycle on the controller side: create (bind a LUN),
//! delete (release, and one wipe attempt for the release workers), publish/unpublish (attach/detach on a node),
//! expand, the read-only queries, and the probe that proves a new LUN
//! blank before it is offered. No gRPC types cross into here except
//! the agent API's messages; the CSI layer parses and maps.

mod create;
mod delete;
mod expand;
mod publish;
mod qualify;
mod query;
mod read_back;

use crate::events::VolumeEvents;
use std::sync::Arc;
use std::time::Duration;

use csi_scsi_contract::{NodeName, Wwid};
use csi_scsi_daemon::{KeyGuard, KeyedLocks};
use csi_scsi_proto::agent;

use crate::agents::{AgentPool, deadline};
use crate::device::{Device, SelectorKeys, Target, Transport};
use crate::directory::LabelSource;
use crate::error::ProxyError;
use crate::inventory::Inventory;
use crate::secrets::SecretSource;

pub use create::CreateRequest;
pub use delete::{Released, Releases};
pub use qualify::Probed;
pub use query::VolumeView;

/// The topology key every node reports in NodeGetInfo.
pub const NODE_TOPOLOGY_KEY: &str = csi_scsi_daemon::NODE_TOPOLOGY_KEY;

/// How long an operation waits for another one on the same key.
const LOCK_WAIT: Duration = Duration::from_secs(20);

/// What an operation holds while it runs: operations on one key run one
/// at a time, different keys in parallel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum LockKey {
    /// A volume's LUN (publish, unpublish, expand, delete).
    Lun(Wwid),
    /// A CreateVolume name, before (and while) it has a LUN.
    Name(String),
}

impl std::fmt::Display for LockKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Lun(wwid) => wwid.fmt(f),
            Self::Name(name) => write!(f, "name/{name}"),
        }
    }
}

/// The controller's state and collaborators.
pub struct Lifecycle {
    inventory: Arc<Inventory>,
    agents: Arc<AgentPool>,
    secrets: Arc<dyn SecretSource>,
    /// Operations on one volume (or one request name) run one at a time;
    /// different keys run in parallel.
    locks: KeyedLocks<LockKey>,
    /// Releases asked for by DeleteVolume and run by the release workers.
    releases: Releases,
    /// Events on claims (the Kubernetes backend; none in embedded mode).
    events: Option<VolumeEvents>,
    /// `--allow-kubelet-settable-selectors`: targets may select nodes by
    /// Node labels their kubelets can set themselves.
    kubelet_settable_selectors: bool,
}

impl Lifecycle {
    /// A controller over `inventory`, calling agents through `agents`.
    pub fn new(
        inventory: Arc<Inventory>,
        agents: Arc<AgentPool>,
        secrets: Arc<dyn SecretSource>,
    ) -> Self {
        Self {
            inventory,
            agents,
            secrets,
            locks: KeyedLocks::default(),
            releases: Releases::default(),
            events: None,
            kubelet_settable_selectors: false,
        }
    }

    /// Lets targets' `nodeSelector`s rest on Node labels a kubelet can set
    /// on its own Node (warned about at each discovery pass) when `allow`.
    pub fn allow_kubelet_settable_selectors(mut self, allow: bool) -> Self {
        self.kubelet_settable_selectors = allow;
        self
    }

    /// Which label keys a target's `nodeSelector` may rest on: any, when
    /// the operator wrote the labels (agents file) or allowed it; else only
    /// keys a node's kubelet cannot set on itself.
    pub fn selector_keys(&self) -> SelectorKeys {
        match (
            self.agents.directory().label_source(),
            self.kubelet_settable_selectors,
        ) {
            (LabelSource::AgentsFile, _) | (LabelSource::NodeObjects, true) => SelectorKeys::Any,
            (LabelSource::NodeObjects, false) => SelectorKeys::AdminOnly,
        }
    }

    /// Publishes Events on claims through `events` (a claim that cannot
    /// be provisioned says why where its owner looks).
    pub fn with_events(mut self, events: VolumeEvents) -> Self {
        self.events = Some(events);
        self
    }

    /// The inventory.
    pub fn inventory(&self) -> &Arc<Inventory> {
        &self.inventory
    }

    /// The releases asked for and running.
    pub fn releases(&self) -> &Releases {
        &self.releases
    }

    /// The agent pool.
    pub fn agents(&self) -> &Arc<AgentPool> {
        &self.agents
    }

    /// Waits for `key` up to [`LOCK_WAIT`], or until the CSI caller's
    /// deadline: an answer of ABORTED still reaches the caller.
    async fn lock(&self, key: LockKey) -> Result<KeyGuard<LockKey>, ProxyError> {
        let now = tokio::time::Instant::now();
        let wait = deadline::effective(LOCK_WAIT, now).saturating_duration_since(now);
        let busy = ProxyError::Busy(key.to_string());
        self.locks.lock_timeout(key, wait).await.map_err(|_| busy)
    }

    /// The agent API's description of the targets `device` is reachable
    /// through on `node` (with CHAP credentials resolved).
    async fn targets_for(
        &self,
        device: &Device,
        node: &NodeName,
    ) -> Result<Vec<agent::Target>, ProxyError> {
        let specs = self.target_specs_for(device, node).await?;
        self.agent_targets(&specs).await
    }

    /// `specs` as the agent API describes them, CHAP included.
    async fn agent_targets(&self, specs: &[Target]) -> Result<Vec<agent::Target>, ProxyError> {
        let mut out = Vec::with_capacity(specs.len());
        for t in specs {
            out.push(self.agent_target(t).await?);
        }
        Ok(out)
    }

    /// The targets `device` is reached through from `node` (its views
    /// there, or else its first target), as the inventory holds them: no
    /// secret read yet.
    async fn target_specs_for(
        &self,
        device: &Device,
        node: &NodeName,
    ) -> Result<Vec<Target>, ProxyError> {
        let specs = self.inventory.targets().await?;
        let mut names: Vec<&str> = device
            .nodes
            .iter()
            .filter(|v| &v.node == node)
            .map(|v| v.target.as_str())
            .collect();
        if names.is_empty() {
            names.push(device.target.as_str());
        }
        names.sort();
        names.dedup();
        // A target being deleted is still listed (its finalizer holds it
        // while a bound device is reached through it); one that is gone
        // cannot be logged into or out of.
        let mut out = Vec::with_capacity(names.len());
        for n in names {
            match specs.iter().find(|t| t.name == n) {
                Some(t) => out.push(t.clone()),
                None => {
                    tracing::warn!(wwid = %device.wwid, %node, target = %n, "the device's SCSITarget no longer exists; it is left out")
                }
            }
        }
        Ok(out)
    }

    /// A target as the agent API describes it, CHAP included.
    pub async fn agent_target(&self, t: &Target) -> Result<agent::Target, ProxyError> {
        let transport = match &t.transport {
            Transport::Iscsi(iscsi) => {
                let chap = match &iscsi.chap_secret_ref {
                    Some(r) => Some(self.secrets.chap(r).await?),
                    None => None,
                };
                agent::target::Transport::Iscsi(agent::IscsiTarget {
                    portals: iscsi.portals.clone(),
                    iqn: iscsi.iqn.clone(),
                    chap,
                })
            }
            Transport::FibreChannel(fc) => {
                agent::target::Transport::FibreChannel(agent::FibreChannelTarget {
                    wwpns: fc.wwpns.clone(),
                })
            }
        };
        Ok(agent::Target {
            name: t.name.clone(),
            transport: Some(transport),
        })
    }
}
