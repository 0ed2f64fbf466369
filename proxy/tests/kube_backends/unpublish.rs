//! ControllerUnpublish against the Kubernetes backends: a node that is only
//! NotReady is not gone, so its publish record stays until its Node object
//! is deleted; before the directory's first list nothing is known, so calls
//! wait; discovery drops the views of deleted Nodes only.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use csi_scsi_daemon::Check;
use csi_scsi_proxy::device::{Access, Mode};
use csi_scsi_proxy::directory::{DirectoryCheck, NodeAgent};
use csi_scsi_proxy::reconcile::discovery;
use serde_json::json;
use tonic::{Code, Status};

use crate::devices::wwid;
use crate::directory::{locate, node, pod, ready_directory, spawn};
use crate::eventually;
use crate::fake_api::FakeApi;
use crate::inventory::{device, start, target};
use crate::lifecycle_support::lifecycle;

#[tokio::test]
async fn unpublish_from_a_not_ready_node_is_unavailable_until_its_node_object_is_deleted() {
    let api = FakeApi::start().await;
    api.put("nodes", node("node-a", "r1"));
    api.put("nodes", node("node-b", "r1"));
    api.put("pods", pod("agent-a", "node-a", "10.0.0.1", true));
    // node-b is NotReady (its kubelet stopped): its agent Pod is not Ready.
    api.put("pods", pod("agent-b", "node-b", "10.0.0.2", false));
    let mut published = device(1, 1 << 30, &["node-a", "node-b"], Some("pv-1"));
    published["status"]["binding"]["capabilities"] = json!(["mount:ext4:SINGLE_NODE_WRITER"]);
    published["status"]["published"] =
        json!([{"node": "node-b", "access": "mount:ext4:SINGLE_NODE_WRITER"}]);
    api.put("scsidevices", published);
    let (_, inventory) = start(&api, None).await;
    let directory = ready_directory(&api).await;
    eventually("node-a's agent", || {
        matches!(locate(&directory, "node-a"), NodeAgent::Listed(_))
    })
    .await;
    let scratch = tempfile::tempdir().unwrap();
    let life = lifecycle(inventory.clone(), directory.clone(), scratch.path());
    let id = format!("{}:uid-pv-1", wwid(1));
    let published_to = || async {
        inventory
            .device(&wwid(1))
            .await
            .unwrap()
            .unwrap()
            .published_nodes()
    };

    let refused = Status::from(life.unpublish(&id, "node-b", "t").await.unwrap_err());
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("node node-b exists"),
        "{refused:?}"
    );
    assert_eq!(published_to().await, ["node-b"], "the record is kept");
    assert_eq!(
        api.get("scsidevices", "", &wwid(1)).unwrap()["status"]["published"][0]["node"],
        "node-b"
    );
    // Meanwhile the volume is neither attached elsewhere nor deleted (wiped).
    let writer = Access {
        block: false,
        fs_type: None,
        mode: Mode::SingleNodeWriter,
    };
    let elsewhere = Status::from(
        life.publish(&id, "node-a", &writer, false, "t")
            .await
            .unwrap_err(),
    );
    assert_eq!(elsewhere.code(), Code::FailedPrecondition, "{elsewhere:?}");
    let delete = Status::from(life.delete(&id, "t").await.unwrap_err());
    assert_eq!(delete.code(), Code::FailedPrecondition, "{delete:?}");
    // Publishing to the NotReady node waits for it, too.
    let to_b = Status::from(
        life.publish(&id, "node-b", &writer, false, "t")
            .await
            .unwrap_err(),
    );
    assert_eq!(to_b.code(), Code::Unavailable, "{to_b:?}");

    // The Node object is deleted: node-b is gone, nothing is attached there.
    api.delete("nodes", "", "node-b");
    eventually("node-b gone", || {
        locate(&directory, "node-b") == NodeAgent::Gone
    })
    .await;
    life.unpublish(&id, "node-b", "t").await.unwrap();
    assert!(published_to().await.is_empty(), "the record is dropped");
    let gone = Status::from(
        life.publish(&id, "node-b", &writer, false, "t")
            .await
            .unwrap_err(),
    );
    assert_eq!(gone.code(), Code::NotFound, "{gone:?}");
}

fn writer() -> Access {
    Access {
        block: false,
        fs_type: None,
        mode: Mode::SingleNodeWriter,
    }
}

#[tokio::test]
async fn until_the_agent_pods_are_listed_publish_and_unpublish_wait_and_the_proxy_is_not_ready() {
    let api = FakeApi::start().await;
    api.put("nodes", node("node-a", "r1"));
    api.put("pods", pod("agent-a", "node-a", "10.0.0.1", true));
    let mut published = device(1, 1 << 30, &["node-a", "node-b"], Some("pv-1"));
    published["status"]["binding"]["capabilities"] = json!(["mount:ext4:SINGLE_NODE_WRITER"]);
    // node-b has no Node object: once listed, it is gone.
    published["status"]["published"] =
        json!([{"node": "node-b", "access": "mount:ext4:SINGLE_NODE_WRITER"}]);
    api.put("scsidevices", published);
    let (_, inventory) = start(&api, None).await;
    // The Pod list is held back (a slow API server, an RBAC rule missing).
    let hold = Arc::new(AtomicBool::new(true));
    let held = hold.clone();
    api.rule(Box::new(move |r| {
        (held.load(Ordering::SeqCst) && r.path == "/api/v1/namespaces/csi-scsi/pods").then_some(503)
    }));
    let directory = spawn(&api);
    let check = DirectoryCheck(directory.clone());
    eventually("the Node list", || {
        api.requests().iter().any(|r| r.path == "/api/v1/nodes")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(check.check().is_err(), "ready without the agent Pods");
    let scratch = tempfile::tempdir().unwrap();
    let life = lifecycle(inventory.clone(), directory.clone(), scratch.path());
    let id = format!("{}:uid-pv-1", wwid(1));

    // node-b looks gone and node-a agentless, but nothing is known yet.
    let refused = Status::from(life.unpublish(&id, "node-b", "t").await.unwrap_err());
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("not listed"), "{refused:?}");
    let stored = inventory.device(&wwid(1)).await.unwrap().unwrap();
    assert_eq!(stored.published_nodes(), ["node-b"], "the record is kept");
    let to_b = Status::from(
        life.publish(&id, "node-b", &writer(), false, "t")
            .await
            .unwrap_err(),
    );
    assert_eq!(to_b.code(), Code::Unavailable, "{to_b:?}");
    // Discovery waits too: no views are judged.
    let waits = discovery::reconcile_once(&life, 4).await.unwrap_err();
    assert!(waits.to_string().contains("not listed"), "{waits}");

    // The Pods arrive: ready, and node-b is gone.
    hold.store(false, Ordering::SeqCst);
    eventually("the directory's first list", || check.check().is_ok()).await;
    assert!(matches!(locate(&directory, "node-a"), NodeAgent::Listed(_)));
    assert_eq!(locate(&directory, "node-b"), NodeAgent::Gone);
    life.unpublish(&id, "node-b", "t").await.unwrap();
}

#[tokio::test]
async fn discovery_drops_the_views_of_a_deleted_node_and_keeps_an_unreachable_ones() {
    let api = FakeApi::start().await;
    api.put("scsitargets", target("t1"));
    // node-a exists, its agent not Ready (unreachable); node-b was deleted.
    api.put("nodes", node("node-a", "r1"));
    api.put("pods", pod("agent-a", "node-a", "10.0.0.1", false));
    api.put(
        "scsidevices",
        device(1, 1 << 30, &["node-a", "node-b"], Some("pv-1")),
    );
    let (_, inventory) = start(&api, None).await;
    let directory = ready_directory(&api).await;
    let scratch = tempfile::tempdir().unwrap();
    let life = lifecycle(inventory.clone(), directory.clone(), scratch.path());

    discovery::reconcile_once(&life, 4).await.unwrap();
    let dev = inventory.device(&wwid(1)).await.unwrap().unwrap();
    assert_eq!(dev.node_names(), ["node-a"]);
    let stored = api.get("scsidevices", "", &wwid(1)).unwrap();
    assert_eq!(stored["status"]["nodeNames"], json!(["node-a"]));
    assert_eq!(stored["status"]["phase"], "Bound");
}
