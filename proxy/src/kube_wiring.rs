//! Everything the proxy needs to run against the Kubernetes API, built in
//! one call for `serve.rs`: the inventory on custom resources, the agent
//! directory from the agent Pods, the Lease election and the Event
//! publisher. Embedded mode needs none of it.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tokio::sync::Notify;

use crate::directory::{AgentDirectory, PodDirectory, PodDirectoryConfig};
use crate::events::VolumeEvents;
use crate::inventory::{Inventory, KubeInventory, KubeInventoryConfig};
use crate::leader::{LeaderElection, LeaderHandle, LeaseConfig, LeaseConfigError};

/// The settings `serve.rs` takes from its flags.
#[derive(Clone, Debug)]
pub struct KubeOptions {
    /// The driver's namespace (agent Pods, the Lease, fallback for resize requests).
    pub namespace: String,
    /// Label selector of the agent Pods.
    pub agent_selector: String,
    /// Agent API port when an agent Pod declares no `agent-api` port.
    pub agent_port: u16,
    /// The Lease's name.
    pub lease_name: String,
    /// This replica's identity in the Lease (its pod name).
    pub identity: String,
    /// Reporting controller of Events (the driver name).
    pub driver_name: String,
    /// How long reads wait for the watch caches' first list.
    pub sync_timeout: Duration,
}

/// The Kubernetes backends, ready to hand to `Lifecycle` and the servers.
pub struct KubeBackends {
    /// The inventory on SCSITarget/SCSIDevice/PendingResizeRequest objects.
    pub inventory: Arc<Inventory>,
    /// The same, typed (readiness, `targets_changed`).
    pub kube_inventory: KubeInventory,
    /// Agents from their Pods.
    pub directory: Arc<dyn AgentDirectory>,
    /// Whether this replica leads.
    pub leader: LeaderHandle,
    /// The election; `step_down()` on shutdown releases the Lease.
    pub election: LeaderElection,
    /// Events on PVCs for failures (CreateVolume's "no device fits" is the
    /// caller's to publish: only it knows the PVC).
    pub events: VolumeEvents,
    /// Notified when SCSITargets change: trigger a discovery pass.
    pub targets_changed: Arc<Notify>,
}

/// Why the backends could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KubeWiringError {
    /// No in-cluster or kubeconfig credentials.
    #[error("Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// Bad Lease settings.
    #[error("leader election: {0}")]
    Lease(#[from] LeaseConfigError),
}

/// Connects with the in-cluster service account (or `$KUBECONFIG`) and
/// starts every backend.
pub async fn kube_backends(options: KubeOptions) -> Result<KubeBackends, KubeWiringError> {
    let client = Client::try_default()
        .await
        .map_err(KubeWiringError::Client)?;
    kube_backends_with(client, options)
}

/// As `kube_backends`, over a given client (tests, custom configs).
pub fn kube_backends_with(
    client: Client,
    options: KubeOptions,
) -> Result<KubeBackends, KubeWiringError> {
    let election = LeaderElection::spawn(
        client.clone(),
        LeaseConfig::new(&options.namespace, &options.lease_name, &options.identity),
    )?;
    let leader = election.handle();
    let events = VolumeEvents::new(
        client.clone(),
        &options.driver_name,
        Some(options.identity.clone()),
    );
    let kube_inventory = KubeInventory::start(
        client.clone(),
        KubeInventoryConfig {
            namespace: options.namespace.clone(),
            sync_timeout: options.sync_timeout,
            leader: Some(leader.clone()),
            events: Some(events.clone()),
        },
    );
    let directory = PodDirectory::spawn(
        client,
        PodDirectoryConfig {
            namespace: options.namespace,
            selector: options.agent_selector,
            port: options.agent_port,
            settle: Duration::from_millis(500),
        },
    );
    Ok(KubeBackends {
        inventory: Arc::new(Inventory::new(Arc::new(kube_inventory.clone()))),
        targets_changed: kube_inventory.targets_changed(),
        kube_inventory,
        directory,
        leader,
        election,
        events,
    })
}
