//! The agent directory from the agent DaemonSet's Pods, and which nodes
//! still exist from the Node objects.

use std::sync::Arc;
use std::time::Duration;

use csi_scsi_daemon::Check;
use csi_scsi_proxy::directory::{
    AgentDirectory, DirectoryCheck, NodeAgent, PodDirectory, PodDirectoryConfig,
};
use serde_json::{Value, json};

use crate::eventually;
use crate::fake_api::FakeApi;

/// An agent Pod on `node`, Ready or not.
pub fn pod(name: &str, node: &str, ip: &str, ready: bool) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "csi-scsi",
            "labels": {"app.kubernetes.io/name": "csi-scsi-node"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "csi-scsi-node",
                                 "uid": "ds-uid", "controller": true}],
            "managedFields": [{"manager": "kubelet", "operation": "Update"}],
            "annotations": {"big": "x".repeat(1000)},
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "registrar", "image": "r"},
                {"name": "agent", "image": "a", "ports": [{"name": "agent-api", "containerPort": 9811}, {"name": "healthz", "containerPort": 9808}]},
            ],
        },
        "status": {
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
        },
    })
}

/// A Node object.
pub fn node(name: &str, rack: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"rack": rack}}})
}

/// The directory over `api`'s agent Pods, once both watches listed.
pub async fn ready_directory(api: &FakeApi) -> Arc<PodDirectory> {
    let dir = spawn(api);
    tokio::time::timeout(crate::patience(), dir.wait_until_ready())
        .await
        .unwrap();
    dir
}

/// The directory over `api`'s agent Pods, listed or not.
pub fn spawn(api: &FakeApi) -> Arc<PodDirectory> {
    PodDirectory::spawn(
        api.client(),
        PodDirectoryConfig {
            namespace: "csi-scsi".into(),
            selector: "app.kubernetes.io/name=csi-scsi-node".into(),
            port: 9810,
            settle: Duration::from_millis(10),
            daemonset: "csi-scsi-node".into(),
        },
    )
}

/// What the directory says about `node`.
pub fn locate(dir: &PodDirectory, node: &str) -> NodeAgent {
    (dir as &dyn AgentDirectory).locate(node)
}

#[tokio::test]
async fn ready_pods_map_their_node_to_ip_and_port_and_a_deleted_pod_drops_out() {
    let api = FakeApi::start().await;
    api.put("nodes", node("node-a", "r1"));
    api.put("nodes", node("node-b", "r2"));
    api.put("pods", pod("agent-a", "node-a", "10.0.0.1", true));
    api.put("pods", pod("agent-b", "node-b", "10.0.0.2", false));
    // Another DaemonSet's Pod in the namespace: not selected.
    let mut other = pod("other", "node-b", "10.0.0.9", true);
    other["metadata"]["labels"] = json!({"app": "other"});
    api.put("pods", other);
    let dir = spawn(&api);
    let mut rx = dir.subscribe();
    eventually("node-a's agent", || dir.snapshot().contains_key("node-a")).await;
    let snap = dir.snapshot();
    assert_eq!(
        snap.len(),
        1,
        "a Pod that is not Ready is no agent: {snap:?}"
    );
    assert_eq!(
        snap["node-a"].address, "10.0.0.1:9811",
        "the agent-api port wins"
    );
    assert_eq!(
        snap["node-a"].labels.get("rack").map(String::as_str),
        Some("r1")
    );

    // The watch asked for the agent Pods only, in their namespace.
    let pod_calls: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|r| r.path == "/api/v1/namespaces/csi-scsi/pods")
        .collect();
    assert!(!pod_calls.is_empty());
    assert!(
        pod_calls
            .iter()
            .all(|r| r.query.get("labelSelector").map(String::as_str)
                == Some("app.kubernetes.io/name=csi-scsi-node"))
    );
    assert!(
        api.requests().iter().any(|r| r.path == "/api/v1/nodes"
            && r.query.get("watch").map(String::as_str) == Some("true")),
        "nodes are watched, not listed per call"
    );

    // node-b's agent becomes Ready: it appears, and subscribers hear of it.
    rx.borrow_and_update();
    api.put("pods", pod("agent-b", "node-b", "10.0.0.2", true));
    eventually("node-b's agent", || dir.snapshot().contains_key("node-b")).await;
    assert!(rx.has_changed().unwrap());
    assert_eq!(dir.snapshot()["node-b"].address, "10.0.0.2:9811");

    // A deleted Pod drops out.
    api.delete("pods", "csi-scsi", "agent-a");
    eventually("node-a gone", || !dir.snapshot().contains_key("node-a")).await;
    assert_eq!(dir.snapshot().keys().collect::<Vec<_>>(), ["node-b"]);

    // A terminating Pod drops out too.
    let mut leaving = pod("agent-b", "node-b", "10.0.0.2", true);
    leaving["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    api.put("pods", leaving);
    eventually("node-b gone", || dir.snapshot().is_empty()).await;
}

#[tokio::test]
async fn the_directory_is_ready_once_both_watches_listed() {
    let api = FakeApi::start().await;
    api.put("pods", pod("agent-a", "node-a", "fd00::1", true));
    let dir = spawn(&api);
    tokio::time::timeout(crate::patience(), dir.wait_until_ready())
        .await
        .unwrap();
    eventually("node-a's agent", || dir.snapshot().contains_key("node-a")).await;
    assert_eq!(
        dir.snapshot()["node-a"].address,
        "[fd00::1]:9811",
        "IPv6 addresses are bracketed"
    );
}

#[tokio::test]
async fn a_node_whose_agent_is_not_ready_is_unreachable_not_gone() {
    let api = FakeApi::start().await;
    api.put("nodes", node("node-a", "r1"));
    api.put("nodes", node("node-b", "r1"));
    api.put("pods", pod("agent-a", "node-a", "10.0.0.1", true));
    api.put("pods", pod("agent-b", "node-b", "10.0.0.2", false));
    let dir = ready_directory(&api).await;
    eventually("node-a's agent", || {
        matches!(locate(&dir, "node-a"), NodeAgent::Listed(_))
    })
    .await;
    let NodeAgent::Listed(a) = locate(&dir, "node-a") else {
        unreachable!()
    };
    assert_eq!(a.address, "10.0.0.1:9811");
    assert_eq!(locate(&dir, "node-b"), NodeAgent::Unreachable);
    assert_eq!(locate(&dir, "node-z"), NodeAgent::Gone, "no such Node");

    // node-a goes NotReady (its kubelet stops): its agent Pod turns
    // not Ready, the node stays.
    api.put("pods", pod("agent-a", "node-a", "10.0.0.1", false));
    eventually("node-a's agent not ready", || {
        !dir.snapshot().contains_key("node-a")
    })
    .await;
    assert_eq!(locate(&dir, "node-a"), NodeAgent::Unreachable);
    // Its agent Pod deleted (evicted, drained): still not gone.
    api.delete("pods", "csi-scsi", "agent-a");
    api.delete("pods", "csi-scsi", "agent-b");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(locate(&dir, "node-a"), NodeAgent::Unreachable);
    assert_eq!(locate(&dir, "node-b"), NodeAgent::Unreachable);
}

#[tokio::test]
async fn a_node_is_gone_once_its_node_object_is_deleted() {
    let api = FakeApi::start().await;
    api.put("nodes", node("node-a", "r1"));
    api.put("nodes", node("node-b", "r1"));
    api.put("pods", pod("agent-a", "node-a", "10.0.0.1", false));
    api.put("pods", pod("agent-b", "node-b", "10.0.0.2", true));
    let dir = ready_directory(&api).await;
    eventually("node-b's agent", || dir.snapshot().contains_key("node-b")).await;
    assert_eq!(locate(&dir, "node-a"), NodeAgent::Unreachable);

    api.delete("nodes", "", "node-a");
    eventually("node-a gone", || locate(&dir, "node-a") == NodeAgent::Gone).await;
    // A listed agent is called even when its Node object is deleted: only
    // an agent can say what is attached there.
    api.delete("nodes", "", "node-b");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(matches!(locate(&dir, "node-b"), NodeAgent::Listed(_)));
    api.delete("pods", "csi-scsi", "agent-b");
    eventually("node-b gone", || locate(&dir, "node-b") == NodeAgent::Gone).await;
}

#[tokio::test]
async fn before_the_nodes_are_listed_no_node_is_gone() {
    let api = FakeApi::start().await;
    api.put("pods", pod("agent-a", "node-a", "10.0.0.1", true));
    // The Node list fails (an RBAC rule missing, the API server busy).
    api.rule(Box::new(|r| (r.path == "/api/v1/nodes").then_some(403)));
    let dir = spawn(&api);
    eventually("the Pod list", || {
        api.requests()
            .iter()
            .any(|r| r.path == "/api/v1/namespaces/csi-scsi/pods")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!dir.is_ready());
    assert_eq!(locate(&dir, "node-z"), NodeAgent::NotSynced);
    let check = DirectoryCheck(dir.clone());
    assert!(check.check().is_err(), "ready before the Nodes were listed");
}

#[tokio::test]
async fn only_the_daemonsets_ready_pods_serve_and_every_unready_one_is_looked_at() {
    let api = FakeApi::start().await;
    for n in ["node-a", "node-b", "node-c"] {
        api.put("nodes", node(n, "r1"));
    }
    api.put("pods", pod("agent-a", "node-a", "10.0.0.1", true));
    // An agent still enrolling: not Ready, listed as unready.
    api.put("pods", pod("agent-b", "node-b", "10.0.0.2", false));
    // Pods with the agents' labels that the DaemonSet does not control: a
    // Ready one (its readiness passed without a certificate) never serves;
    // an unready one is listed for the enroller, whose token check
    // refuses it (proxy/tests/kube_backends/enrolment.rs).
    let mut impostor = pod("impostor", "node-c", "10.0.0.3", true);
    impostor["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "ConfigMap",
        "name": "x", "uid": "cm-uid", "controller": true}]);
    api.put("pods", impostor);
    let mut bare = pod("bare", "node-a", "10.0.0.4", false);
    bare["metadata"]["ownerReferences"] = json!(null);
    api.put("pods", bare);
    let dir = spawn(&api);
    eventually("node-a's agent and the two unready Pods", || {
        dir.snapshot().contains_key("node-a") && dir.unready().len() == 2
    })
    .await;
    // Settle: the impostors are in the cache by now, and stay out.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(dir.snapshot().keys().collect::<Vec<_>>(), ["node-a"]);
    let mut unready: Vec<_> = dir.unready().into_iter().map(|u| u.node).collect();
    unready.sort();
    assert_eq!(unready, ["node-a", "node-b"]);
}
