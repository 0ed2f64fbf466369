//! ControllerUnpublish against the Kubernetes backends: a node that is only
//! NotReady is not gone, so its publish record stays until its Node object
//! is deleted or the operator fences it (the out-of-service taint); before
//! the directory's first list nothing is known, so calls wait; discovery
//! drops the views of deleted Nodes only. On the real kube-apiserver, Nodes
//! and agent Pods as in `directory.rs`.

use std::sync::Arc;
use std::time::Duration;

use csi_scsi_daemon::Check;
use csi_scsi_proxy::device::{Access, AccessMode};
use csi_scsi_proxy::directory::{DirectoryCheck, NodeAgent};
use csi_scsi_proxy::reconcile::discovery;
use csi_scsi_proxy::resources::SCSIDevice;
use serde_json::json;
use tonic::{Code, Status};

use crate::devices::{node, wwid};
use crate::directory::{Agents, OUT_OF_SERVICE, locate};
use crate::eventually;
use crate::inventory::{create, device, stored, target};
use crate::lifecycle_support::lifecycle;
use crate::real_kube;
use csi_scsi_contract::NodeName;

/// A node whose agent is not Ready, that no record of the volume names:
/// nothing of the volume was attached there (a publish records its node
/// before it attaches), so unpublishing from it is OK at once, and the
/// record of the node it is published to stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpublish_from_a_not_ready_node_no_record_names_is_ok_at_once() {
    let _only = real_kube::exclusive().await;
    let admin = real_kube::admin().await;
    let agents = Agents::new("unpublish-unnamed").await;
    agents.node("node-a", "r1").await;
    agents.node("node-b", "r1").await;
    agents.agent("node-a", true).await;
    agents.agent("node-b", false).await;
    let p = Published::new(&admin, &agents, &["node-a", "node-b"], "node-a").await;
    assert_eq!(locate(&p.directory, "node-b"), NodeAgent::Unreachable);
    p.life
        .unpublish(&p.id, Some(&node("node-b")), "t")
        .await
        .expect("nothing was attached on node-b");
    assert_eq!(p.nodes().await, ["node-a"], "node-a's record is kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpublish_from_a_not_ready_node_is_unavailable_until_its_node_object_is_deleted() {
    let _only = real_kube::exclusive().await;
    let admin = real_kube::admin().await;
    let agents = Agents::new("unpublish-not-ready").await;
    agents.node("node-a", "r1").await;
    agents.node("node-b", "r1").await;
    agents.agent("node-a", true).await;
    // node-b is NotReady (its kubelet stopped): its agent Pod is not Ready.
    agents.agent("node-b", false).await;
    let p = Published::new(&admin, &agents, &["node-a", "node-b"], "node-b").await;
    let (life, id, directory) = (&p.life, p.id.clone(), p.directory.clone());
    let published_to = || p.nodes();

    let refused = Status::from(
        life.unpublish(&id, Some(&node("node-b")), "t")
            .await
            .unwrap_err(),
    );
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("node node-b exists"),
        "{refused:?}"
    );
    assert_eq!(published_to().await, ["node-b"], "the record is kept");
    assert_eq!(
        stored::<SCSIDevice>(&admin, wwid(1).as_str()).await["status"]["published"][0]["node"],
        "node-b"
    );
    // Meanwhile the volume is neither attached elsewhere nor deleted (wiped).
    let writer = Access {
        block: false,
        fs_type: None,
        mode: AccessMode::SingleNodeWriter,
    };
    let elsewhere = Status::from(
        life.publish(&id, &node("node-a"), &writer, "t")
            .await
            .unwrap_err(),
    );
    assert_eq!(elsewhere.code(), Code::FailedPrecondition, "{elsewhere:?}");
    let delete = Status::from(life.delete(&id, "t").await.unwrap_err());
    assert_eq!(delete.code(), Code::FailedPrecondition, "{delete:?}");
    // Publishing to the NotReady node waits for it, too.
    let to_b = Status::from(
        life.publish(&id, &node("node-b"), &writer, "t")
            .await
            .unwrap_err(),
    );
    assert_eq!(to_b.code(), Code::Unavailable, "{to_b:?}");

    // The Node object is deleted: node-b is gone, nothing is attached there.
    agents.delete_node("node-b").await;
    eventually("node-b gone", || {
        locate(&directory, "node-b") == NodeAgent::Gone
    })
    .await;
    life.unpublish(&id, Some(&node("node-b")), "t")
        .await
        .unwrap();
    assert!(published_to().await.is_empty(), "the record is dropped");
    let gone = Status::from(
        life.publish(&id, &node("node-b"), &writer, "t")
            .await
            .unwrap_err(),
    );
    assert_eq!(gone.code(), Code::NotFound, "{gone:?}");
}

fn writer() -> Access {
    Access {
        block: false,
        fs_type: None,
        mode: AccessMode::SingleNodeWriter,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_the_agent_pods_are_listed_publish_and_unpublish_wait_and_the_proxy_is_not_ready() {
    let _only = real_kube::exclusive().await;
    let admin = real_kube::admin().await;
    let agents = Agents::new("unpublish-unlisted").await;
    agents.node("node-a", "r1").await;
    agents.agent("node-a", true).await;
    let mut published = device(1, 1 << 30, &["node-a", "node-b"], Some("pv-1"));
    published["status"]["binding"]["capabilities"] = json!(["mount:ext4:SINGLE_NODE_WRITER"]);
    // node-b has no Node object: once listed, it is gone.
    published["status"]["published"] =
        json!([{"node": "node-b", "access": "mount:ext4:SINGLE_NODE_WRITER"}]);
    create(&admin, published).await;
    let inventory = Arc::new(real_kube::inventory(admin).await);
    // The Pod list is refused (an RBAC rule missing) until granted below.
    let scratch = tempfile::tempdir().unwrap();
    let (client, log) = agents
        .restricted_client("proxy", true, scratch.path())
        .await;
    let directory = agents.spawn(client);
    let check = DirectoryCheck(directory.clone());
    eventually("the Node list", || {
        log.lock()
            .unwrap()
            .iter()
            .any(|r| r.contains("/api/v1/nodes?"))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(check.check().is_err(), "ready without the agent Pods");
    let life = lifecycle(inventory.clone(), directory.clone(), scratch.path());
    let id = format!("{}:uid-pv-1", wwid(1));

    // node-b looks gone and node-a agentless, but nothing is known yet.
    let refused = Status::from(
        life.unpublish(&id, Some(&node("node-b")), "t")
            .await
            .unwrap_err(),
    );
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("not listed"), "{refused:?}");
    let stored = inventory.device(&wwid(1)).await.unwrap().unwrap();
    assert_eq!(stored.published_nodes(), ["node-b"], "the record is kept");
    let to_b = Status::from(
        life.publish(&id, &node("node-b"), &writer(), "t")
            .await
            .unwrap_err(),
    );
    assert_eq!(to_b.code(), Code::Unavailable, "{to_b:?}");
    // Discovery waits too: no views are judged.
    let waits = discovery::reconcile_once(&life, &SETTINGS)
        .await
        .unwrap_err();
    assert!(waits.to_string().contains("not listed"), "{waits}");

    // The Pods arrive: ready, and node-b is gone.
    agents.grant_pods("proxy").await;
    eventually("the directory's first list", || check.check().is_ok()).await;
    assert!(matches!(locate(&directory, "node-a"), NodeAgent::Listed(_)));
    assert_eq!(locate(&directory, "node-b"), NodeAgent::Gone);
    life.unpublish(&id, Some(&node("node-b")), "t")
        .await
        .unwrap();
}

/// Discovery as deployed, forgetting after a week.
const SETTINGS: discovery::PassSettings = discovery::PassSettings {
    concurrency: 4,
    forget_after: Some(std::time::Duration::from_secs(7 * 24 * 3600)),
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_drops_the_views_of_a_deleted_node_and_keeps_an_unreachable_ones() {
    let _only = real_kube::exclusive().await;
    let admin = real_kube::admin().await;
    let agents = Agents::new("unpublish-discovery").await;
    create(&admin, target("t1")).await;
    // node-a exists, its agent not Ready (unreachable); node-b was deleted.
    agents.node("node-a", "r1").await;
    agents.agent("node-a", false).await;
    create(
        &admin,
        device(1, 1 << 30, &["node-a", "node-b"], Some("pv-1")),
    )
    .await;
    let inventory = Arc::new(real_kube::inventory(admin.clone()).await);
    let directory = agents.ready_directory(admin.clone()).await;
    let scratch = tempfile::tempdir().unwrap();
    let life = lifecycle(inventory.clone(), directory.clone(), scratch.path());

    discovery::reconcile_once(&life, &SETTINGS).await.unwrap();
    let dev = inventory.device(&wwid(1)).await.unwrap().unwrap();
    assert_eq!(dev.node_names(), ["node-a"]);
    let stored = stored::<SCSIDevice>(&admin, wwid(1).as_str()).await;
    assert_eq!(stored["status"]["nodeNames"], json!(["node-a"]));
    assert_eq!(stored["status"]["phase"], "Bound");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpublish_from_a_node_tainted_out_of_service_drops_the_record_without_calling_its_agent() {
    let _only = real_kube::exclusive().await;
    let admin = real_kube::admin().await;
    let agents = Agents::new("unpublish-out-of-service").await;
    agents.node("node-a", "r1").await;
    // node-a's agent Pod still looks Ready, at an address where a listener
    // counts the connections and answers nothing (a dead node's socket
    // would not even do that).
    let connections = agents.put_counting_agent("agent-a", "node-a").await;
    let p = Published::new(&admin, &agents, &["node-a"], "node-a").await;
    let (life, id, directory) = (&p.life, p.id.clone(), p.directory.clone());
    let published_to = || p.nodes();

    // The node dies: its agent does not answer, so the record stays.
    let refused = Status::from(
        life.unpublish(&id, Some(&node("node-a")), "t")
            .await
            .unwrap_err(),
    );
    assert!(
        matches!(refused.code(), Code::Unavailable | Code::DeadlineExceeded),
        "{refused:?}"
    );
    assert_eq!(published_to().await, ["node-a"], "the record is kept");
    assert!(connections() > 0, "the listed agent was called");

    // The operator fences node-a, then taints it: its volumes are free.
    agents
        .taint("node-a", &[(OUT_OF_SERVICE, "nodeshutdown", "NoExecute")])
        .await;
    eventually("node-a gone", || {
        locate(&directory, "node-a") == NodeAgent::Gone
    })
    .await;
    life.unpublish(&id, Some(&node("node-a")), "t")
        .await
        .unwrap();
    assert!(published_to().await.is_empty(), "the record is dropped");
    assert_eq!(connections(), 0, "the fenced node's agent is not called");
    // Nothing is attached to a fenced node.
    let refused = Status::from(
        life.publish(&id, &node("node-a"), &writer(), "t")
            .await
            .unwrap_err(),
    );
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
    assert!(refused.message().contains("out-of-service"), "{refused:?}");
    assert!(published_to().await.is_empty());
    assert_eq!(connections(), 0);

    // Repaired, the taint removed: node-a is itself again.
    agents.taint("node-a", &[]).await;
    eventually("node-a's agent back", || {
        matches!(locate(&directory, "node-a"), NodeAgent::Listed(_))
    })
    .await;
}

/// Volume pv-1 on LUN 1, seen from `seen` and published to `on` (single
/// node writer, ext4) in the real API server, with a life cycle over it
/// and `agents`' directory, once node-a's agent is listed.
struct Published {
    inventory: Arc<csi_scsi_proxy::inventory::Inventory>,
    directory: Arc<csi_scsi_proxy::directory::PodDirectory>,
    life: csi_scsi_proxy::lifecycle::Lifecycle,
    id: String,
    _scratch: tempfile::TempDir,
}

impl Published {
    async fn new(admin: &kube::Client, agents: &Agents, seen: &[&str], on: &str) -> Self {
        let mut published = device(1, 1 << 30, seen, Some("pv-1"));
        published["status"]["binding"]["capabilities"] = json!(["mount:ext4:SINGLE_NODE_WRITER"]);
        published["status"]["published"] =
            json!([{"node": on, "access": "mount:ext4:SINGLE_NODE_WRITER"}]);
        create(admin, published).await;
        let inventory = Arc::new(real_kube::inventory(admin.clone()).await);
        let directory = agents.ready_directory(admin.clone()).await;
        eventually("node-a's agent", || {
            matches!(locate(&directory, "node-a"), NodeAgent::Listed(_))
        })
        .await;
        let scratch = tempfile::tempdir().unwrap();
        let life = lifecycle(inventory.clone(), directory.clone(), scratch.path());
        Self {
            inventory,
            directory,
            life,
            id: format!("{}:uid-pv-1", wwid(1)),
            _scratch: scratch,
        }
    }

    /// The nodes the stored record says it is published to.
    async fn nodes(&self) -> Vec<NodeName> {
        self.inventory
            .device(&wwid(1))
            .await
            .unwrap()
            .unwrap()
            .published_nodes()
    }
}
