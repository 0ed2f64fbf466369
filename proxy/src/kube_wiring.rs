//! Everything the proxy needs to run against the Kubernetes API, built in
//! one call for `serve.rs`: the inventory on custom resources, the agent
//! directory from the agent Pods, the Lease election and the Event
//! publisher. Embedded mode needs none of it.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::api::{PatchParams, PostParams};
use tokio::sync::Notify;

use crate::config::AgentSource;
use crate::directory::{AgentDirectory, FileDirectory, PodDirectory, PodDirectoryConfig};
use crate::events::VolumeEvents;
use crate::inventory::{Inventory, KubeInventory, KubeInventoryConfig};
use crate::leader::{LeaderElection, LeaderHandle, LeaseConfig, LeaseConfigError};
use crate::secrets::{KubeSecrets, SecretSource};

/// The field manager of every object the proxy writes, so that
/// `kubectl get --show-managed-fields` names the proxy, not a user agent.
pub(crate) const FIELD_MANAGER: &str = "csi-scsi-proxy";

/// Create and replace parameters carrying [`FIELD_MANAGER`].
pub(crate) fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    }
}

/// Patch parameters carrying [`FIELD_MANAGER`].
pub(crate) fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    }
}

/// The settings `serve.rs` takes from its flags.
#[derive(Clone, Debug)]
pub(crate) struct KubeOptions {
    /// The driver's namespace (agent Pods, the Lease, fallback for resize
    /// requests).
    pub namespace: String,
    /// The one namespace CHAP Secrets are read from.
    pub chap_secret_namespace: String,
    /// Where the agents are listed (their Pods, or a file).
    pub agents: AgentSource,
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
pub(crate) struct KubeBackends {
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
    /// CHAP Secrets, read through the API from the driver's namespace.
    pub secrets: Arc<dyn SecretSource>,
    /// The client they use (enrolment's TokenReviews).
    pub client: Client,
}

/// Why the backends could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum KubeWiringError {
    /// No in-cluster or kubeconfig credentials.
    #[error("Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// The agents file could not be read.
    #[error("agents file: {0}")]
    AgentsFile(#[source] crate::directory::DirectoryError),
    /// Bad Lease settings.
    #[error("leader election: {0}")]
    Lease(#[from] LeaseConfigError),
}

/// Connects with the in-cluster service account (or `$KUBECONFIG`) and
/// starts every backend.
pub(crate) async fn kube_backends(options: KubeOptions) -> Result<KubeBackends, KubeWiringError> {
    let client = Client::try_default()
        .await
        .map_err(KubeWiringError::Client)?;
    kube_backends_with(client, options)
}

/// As `kube_backends`, over a given client (tests, custom configs).
pub(crate) fn kube_backends_with(
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
    let secrets: Arc<dyn SecretSource> = Arc::new(KubeSecrets::new(
        client.clone(),
        &options.chap_secret_namespace,
    ));
    let directory: Arc<dyn AgentDirectory> = match options.agents {
        AgentSource::Pods {
            selector,
            port,
            daemonset,
        } => PodDirectory::spawn(
            client.clone(),
            PodDirectoryConfig {
                namespace: options.namespace,
                selector,
                port,
                daemonset,
                settle: Duration::from_millis(500),
            },
        ),
        AgentSource::File(file) => {
            let directory = FileDirectory::load_with_grace(&file.path, file.removal_grace)
                .map_err(KubeWiringError::AgentsFile)?;
            directory.watch(Duration::from_secs(30));
            directory
        }
    };
    Ok(KubeBackends {
        inventory: Arc::new(Inventory::new(Arc::new(kube_inventory.clone()))),
        targets_changed: kube_inventory.targets_changed(),
        kube_inventory,
        directory,
        leader,
        election,
        events,
        secrets,
        client,
    })
}
