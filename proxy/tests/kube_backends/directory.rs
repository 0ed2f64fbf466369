//! The agent directory from the agent DaemonSet's Pods.

use std::time::Duration;

use csi_scsi_proxy::directory::{AgentDirectory, PodDirectory, PodDirectoryConfig};
use serde_json::{Value, json};

use crate::eventually;
use crate::fake_api::FakeApi;

fn pod(name: &str, node: &str, ip: &str, ready: bool) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "csi-scsi",
            "labels": {"app.kubernetes.io/name": "csi-scsi-node"},
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

fn node(name: &str, rack: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"rack": rack}}})
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
    let dir = PodDirectory::spawn(
        api.client(),
        PodDirectoryConfig {
            namespace: "csi-scsi".into(),
            selector: "app.kubernetes.io/name=csi-scsi-node".into(),
            port: 9810,
            settle: Duration::from_millis(10),
        },
    );
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
    let dir = PodDirectory::spawn(
        api.client(),
        PodDirectoryConfig {
            namespace: "csi-scsi".into(),
            selector: "app.kubernetes.io/name=csi-scsi-node".into(),
            port: 9810,
            settle: Duration::from_millis(10),
        },
    );
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
