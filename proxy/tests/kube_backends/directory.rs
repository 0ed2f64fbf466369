//! The agent directory from the agent DaemonSet's Pods, and which nodes
//! still exist from the Node objects, on the real kube-apiserver. There is
//! no kubelet: a test sets a Pod's readiness and IP through the status
//! subresource, and a Pod deleted with a grace period stays terminating.

use std::sync::Arc;
use std::time::Duration;

use csi_scsi_daemon::Check;
use csi_scsi_proxy::directory::{
    AgentDirectory, DirectoryCheck, NodeAgent, PodDirectory, PodDirectoryConfig,
};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::devices::node;
use crate::eventually;
use crate::real_api::{Log, admin_logging};
use crate::real_kube;

/// An agent Pod on `node`, Ready or not (its status is written apart).
pub fn pod(name: &str, node: &str, ip: &str, ready: bool) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/name": "csi-scsi-node"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "csi-scsi-node",
                                 "uid": "ds-uid", "controller": true}],
            "annotations": {"big": "x".repeat(1000)},
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "registrar", "image": "r"},
                {"name": "agent", "image": "a", "ports": [{"name": "agent-api", "containerPort": 9811}, {"name": "healthz", "containerPort": 9808}]},
            ],
        },
        "status": pod_status(ip, ready),
    })
}

/// What kubelet would report of a running Pod.
fn pod_status(ip: &str, ready: bool) -> Value {
    let ready = if ready { "True" } else { "False" };
    json!({
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": ready}],
    })
}

/// The taint Kubernetes' non-graceful node shutdown asks the operator to
/// set on a node once it is fenced.
pub const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";

/// The taint the node lifecycle controller sets on a NotReady node.
const UNREACHABLE: &str = "node.kubernetes.io/unreachable";

/// Node objects are cluster-wide and these tests name theirs alike
/// (`node-a`...): one test at a time holds them.
static NODES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A test's agent Pods, in a namespace of its own, and its Nodes (every
/// `node-*` Node of an earlier test deleted first).
pub struct Agents {
    pub namespace: String,
    pods: Api<Pod>,
    nodes: Api<Node>,
    _nodes: tokio::sync::MutexGuard<'static, ()>,
}

impl Agents {
    /// Takes the Nodes (after [`real_kube::exclusive`], if the test holds
    /// that too) and creates `namespace`.
    pub async fn new(namespace: &str) -> Self {
        let guard = NODES.lock().await;
        let admin = real_kube::admin().await;
        let nodes = Api::<Node>::all(admin.clone());
        for n in nodes.list(&ListParams::default()).await.unwrap() {
            let name = n.metadata.name.unwrap_or_default();
            if name.starts_with("node-") {
                nodes.delete(&name, &DeleteParams::default()).await.unwrap();
            }
        }
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": namespace}})).unwrap();
        Api::<Namespace>::all(admin.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        // No controller-manager makes it, and Pods need it.
        let sa: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap();
        Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
            .create(&PostParams::default(), &sa)
            .await
            .unwrap();
        Self {
            namespace: namespace.into(),
            pods: Api::namespaced(admin, namespace),
            nodes,
            _nodes: guard,
        }
    }

    /// Creates Node `name` in `rack`.
    pub async fn node(&self, name: &str, rack: &str) {
        let node: Node =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": {"rack": rack}}}))
                .unwrap();
        self.nodes
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
    }

    /// Sets Node `name`'s taints to `taints` (`(key, value, effect)`),
    /// replacing any it had: `&[]` removes them all.
    pub async fn taint(&self, name: &str, taints: &[(&str, &str, &str)]) {
        let taints: Vec<Value> = taints
            .iter()
            .map(|(key, value, effect)| json!({"key": key, "value": value, "effect": effect}))
            .collect();
        self.nodes
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"taints": taints}})),
            )
            .await
            .unwrap();
    }

    /// Node `name` goes NotReady as the node lifecycle controller shows it
    /// when kubelet stops: the Ready condition Unknown, the unreachable
    /// taints.
    pub async fn node_not_ready(&self, name: &str) {
        self.nodes
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"conditions": [
                    {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}
                ]}})),
            )
            .await
            .unwrap();
        self.taint(
            name,
            &[
                (UNREACHABLE, "", "NoSchedule"),
                (UNREACHABLE, "", "NoExecute"),
            ],
        )
        .await;
    }

    pub async fn delete_node(&self, name: &str) {
        self.nodes
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }

    /// A Ready agent Pod `name` on `node` at 127.0.0.1, whose agent port is
    /// a listener that answers nothing and counts connections: the
    /// returned closure gives the count of connections since the last call.
    pub async fn put_counting_agent(&self, name: &str, node: &str) -> impl Fn() -> usize {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let mut body = pod(name, node, "127.0.0.1", true);
        body["spec"]["containers"][1]["ports"][0]["containerPort"] =
            json!(listener.local_addr().unwrap().port());
        self.put(body).await;
        move || {
            let mut n = 0;
            while listener.accept().is_ok() {
                n += 1;
            }
            n
        }
    }

    /// Creates the Pod `body` (from [`pod`]) unless it exists, then writes
    /// its status as kubelet would.
    pub async fn put(&self, body: Value) {
        let name = body["metadata"]["name"].as_str().unwrap().to_owned();
        if self.pods.get_opt(&name).await.unwrap().is_none() {
            let pod: Pod = serde_json::from_value(body.clone()).unwrap();
            self.pods
                .create(&PostParams::default(), &pod)
                .await
                .unwrap();
        }
        self.pods
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": body["status"]})),
            )
            .await
            .unwrap();
    }

    /// Writes `node-<x>`'s agent Pod `agent-<x>`, Ready or not, at
    /// 127.0.9.<n> (n: the letter's place, so node-a's agent is .1).
    pub async fn agent(&self, node: &str, ready: bool) {
        let x = node.strip_prefix("node-").expect("a node-<x> name");
        let n = x.bytes().next().map_or(0, |b| b - b'a' + 1);
        self.put(pod(
            &format!("agent-{x}"),
            node,
            &format!("127.0.9.{n}"),
            ready,
        ))
        .await;
    }

    /// Removes the Pod at once, as kubelet does once its containers stopped.
    pub async fn delete_pod(&self, name: &str) {
        let now = DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        self.pods.delete(name, &now).await.unwrap();
    }

    /// Deletes the Pod with a grace period: with no kubelet to finish the
    /// job, it stays terminating.
    pub async fn terminate_pod(&self, name: &str) {
        self.pods
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
        let pod = self.pods.get(name).await.unwrap();
        assert!(pod.metadata.deletion_timestamp.is_some(), "{pod:?}");
    }

    /// The directory over this namespace's agent Pods, as `client`, once
    /// both watches listed.
    pub async fn ready_directory(&self, client: kube::Client) -> Arc<PodDirectory> {
        let dir = self.spawn(client);
        tokio::time::timeout(crate::patience(), dir.wait_until_ready())
            .await
            .unwrap();
        dir
    }

    /// The directory over this namespace's agent Pods, as `client`, listed
    /// or not.
    pub fn spawn(&self, client: kube::Client) -> Arc<PodDirectory> {
        PodDirectory::spawn(
            client,
            PodDirectoryConfig {
                namespace: self.namespace.clone(),
                selector: "app.kubernetes.io/name=csi-scsi-node".into(),
                port: 9810,
                settle: Duration::from_millis(10),
                daemonset: "csi-scsi-node".into(),
            },
        )
    }

    /// A client as service account `account` of this namespace, granted
    /// `list` and `watch` on the Nodes or not, and on the namespace's Pods
    /// once [`Agents::grant_pods`] ran; the log of its requests.
    pub async fn restricted_client(
        &self,
        account: &str,
        nodes: bool,
        dir: &std::path::Path,
    ) -> (kube::Client, Log) {
        let plane = real_kube::plane().await;
        let (k, ns) = (&plane.admin, self.namespace.as_str());
        k.run(&["create", "serviceaccount", account, "-n", ns])
            .unwrap();
        k.run(&[
            "create",
            "role",
            "pods",
            "-n",
            ns,
            "--verb=list,watch",
            "--resource=pods",
        ])
        .unwrap();
        if nodes {
            // Cluster-wide: an earlier test may have made it.
            let _ = k.run(&[
                "create",
                "clusterrole",
                "directory-nodes",
                "--verb=list,watch",
                "--resource=nodes",
            ]);
            k.run(&[
                "create",
                "clusterrolebinding",
                &format!("{ns}-{account}"),
                "--clusterrole=directory-nodes",
                &format!("--serviceaccount={ns}:{account}"),
            ])
            .unwrap();
        }
        let config = plane
            .service_account_kubeconfig(ns, account, &dir.join(format!("{account}.kubeconfig")))
            .unwrap();
        let log = Log::default();
        (
            real_kube::client_logging(&config, Some(log.clone())).await,
            log,
        )
    }

    /// Lets `account` list and watch this namespace's Pods.
    pub async fn grant_pods(&self, account: &str) {
        let ns = self.namespace.as_str();
        real_kube::plane()
            .await
            .admin
            .run(&[
                "create",
                "rolebinding",
                account,
                "-n",
                ns,
                "--role=pods",
                &format!("--serviceaccount={ns}:{account}"),
            ])
            .unwrap();
    }
}

/// What the directory says about `node`.
pub fn locate(dir: &PodDirectory, name: &str) -> NodeAgent {
    (dir as &dyn AgentDirectory).locate(&node(name))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_pods_map_their_node_to_ip_and_port_and_a_deleted_pod_drops_out() {
    let agents = Agents::new("directory-map").await;
    agents.node("node-a", "r1").await;
    agents.node("node-b", "r2").await;
    agents.agent("node-a", true).await;
    agents.agent("node-b", false).await;
    // Another DaemonSet's Pod in the namespace: not selected.
    let mut other = pod("other", "node-b", "127.0.9.9", true);
    other["metadata"]["labels"] = json!({"app": "other"});
    agents.put(other).await;
    let (client, log) = admin_logging().await;
    // Ready: both lists are in. Before that a snapshot may hold node-a's
    // Pod without its Node's labels (the Pod watch listed first).
    let dir = agents.ready_directory(client).await;
    let mut rx = dir.subscribe();
    eventually("node-a's agent", || {
        dir.snapshot().contains_key(&node("node-a"))
    })
    .await;
    let snap = dir.snapshot();
    assert_eq!(
        snap.len(),
        1,
        "a Pod that is not Ready is no agent: {snap:?}"
    );
    assert_eq!(
        snap[&node("node-a")].address,
        "127.0.9.1:9811",
        "the agent-api port wins"
    );
    assert_eq!(
        snap[&node("node-a")].labels.get("rack").map(String::as_str),
        Some("r1")
    );

    // The watch asked for the agent Pods only, in their namespace (the
    // client's own requests: the server keeps no record of queries).
    let requests = log.lock().unwrap().clone();
    let pod_calls: Vec<_> = requests.iter().filter(|r| r.contains("/pods")).collect();
    assert!(!pod_calls.is_empty());
    assert!(
        pod_calls
            .iter()
            .all(|r| r.contains("/api/v1/namespaces/directory-map/pods?")
                && r.contains("labelSelector=app.kubernetes.io%2Fname%3Dcsi-scsi-node")),
        "{pod_calls:?}"
    );
    assert!(
        requests
            .iter()
            .any(|r| r.contains("/api/v1/nodes?") && r.contains("watch=true")),
        "nodes are watched, not listed per call: {requests:?}"
    );

    // node-b's agent becomes Ready: it appears, and subscribers hear of it.
    rx.borrow_and_update();
    agents.agent("node-b", true).await;
    eventually("node-b's agent", || {
        dir.snapshot().contains_key(&node("node-b"))
    })
    .await;
    assert!(rx.has_changed().unwrap());
    assert_eq!(dir.snapshot()[&node("node-b")].address, "127.0.9.2:9811");

    // A deleted Pod drops out.
    agents.delete_pod("agent-a").await;
    eventually("node-a gone", || {
        !dir.snapshot().contains_key(&node("node-a"))
    })
    .await;
    assert_eq!(dir.snapshot().keys().collect::<Vec<_>>(), ["node-b"]);

    // A terminating Pod drops out too.
    agents.terminate_pod("agent-b").await;
    eventually("node-b gone", || dir.snapshot().is_empty()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_directory_is_ready_once_both_watches_listed() {
    let agents = Agents::new("directory-ready").await;
    agents.put(pod("agent-a", "node-a", "fd00::1", true)).await;
    let dir = agents.spawn(real_kube::admin().await);
    tokio::time::timeout(crate::patience(), dir.wait_until_ready())
        .await
        .unwrap();
    eventually("node-a's agent", || {
        dir.snapshot().contains_key(&node("node-a"))
    })
    .await;
    assert_eq!(
        dir.snapshot()[&node("node-a")].address,
        "[fd00::1]:9811",
        "IPv6 addresses are bracketed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_agent_is_not_ready_is_unreachable_not_gone() {
    let agents = Agents::new("directory-unready").await;
    agents.node("node-a", "r1").await;
    agents.node("node-b", "r1").await;
    agents.agent("node-a", true).await;
    agents.agent("node-b", false).await;
    let dir = agents.ready_directory(real_kube::admin().await).await;
    eventually("node-a's agent", || {
        matches!(locate(&dir, "node-a"), NodeAgent::Listed(_))
    })
    .await;
    let NodeAgent::Listed(a) = locate(&dir, "node-a") else {
        unreachable!()
    };
    assert_eq!(a.address, "127.0.9.1:9811");
    assert_eq!(locate(&dir, "node-b"), NodeAgent::Unreachable);
    assert_eq!(locate(&dir, "node-z"), NodeAgent::Gone, "no such Node");

    // node-a goes NotReady (its kubelet stops): its agent Pod turns
    // not Ready, the node stays.
    agents.agent("node-a", false).await;
    eventually("node-a's agent not ready", || {
        !dir.snapshot().contains_key(&node("node-a"))
    })
    .await;
    assert_eq!(locate(&dir, "node-a"), NodeAgent::Unreachable);
    // Its agent Pod deleted (evicted, drained): still not gone.
    agents.delete_pod("agent-a").await;
    agents.delete_pod("agent-b").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(locate(&dir, "node-a"), NodeAgent::Unreachable);
    assert_eq!(locate(&dir, "node-b"), NodeAgent::Unreachable);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_is_gone_once_its_node_object_is_deleted() {
    let agents = Agents::new("directory-gone").await;
    agents.node("node-a", "r1").await;
    agents.node("node-b", "r1").await;
    agents.agent("node-a", false).await;
    agents.agent("node-b", true).await;
    let dir = agents.ready_directory(real_kube::admin().await).await;
    eventually("node-b's agent", || {
        dir.snapshot().contains_key(&node("node-b"))
    })
    .await;
    assert_eq!(locate(&dir, "node-a"), NodeAgent::Unreachable);

    agents.delete_node("node-a").await;
    eventually("node-a gone", || locate(&dir, "node-a") == NodeAgent::Gone).await;
    // A listed agent is called even when its Node object is deleted: only
    // an agent can say what is attached there.
    agents.delete_node("node-b").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(matches!(locate(&dir, "node-b"), NodeAgent::Listed(_)));
    agents.delete_pod("agent-b").await;
    eventually("node-b gone", || locate(&dir, "node-b") == NodeAgent::Gone).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_the_nodes_are_listed_no_node_is_gone() {
    let agents = Agents::new("directory-no-nodes").await;
    agents.agent("node-a", true).await;
    // The Node list fails: the proxy's account lacks the RBAC rule.
    let scratch = tempfile::tempdir().unwrap();
    let (client, log) = agents
        .restricted_client("proxy", false, scratch.path())
        .await;
    agents.grant_pods("proxy").await;
    let dir = agents.spawn(client);
    eventually("the Pod list", || {
        log.lock()
            .unwrap()
            .iter()
            .any(|r| r.contains("/api/v1/namespaces/directory-no-nodes/pods?"))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!dir.is_ready());
    assert_eq!(locate(&dir, "node-z"), NodeAgent::NotSynced);
    let check = DirectoryCheck(dir.clone());
    assert!(check.check().is_err(), "ready before the Nodes were listed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_daemonsets_ready_pods_serve_and_every_unready_one_is_looked_at() {
    let agents = Agents::new("directory-impostors").await;
    for n in ["node-a", "node-b", "node-c"] {
        agents.node(n, "r1").await;
    }
    agents.agent("node-a", true).await;
    // An agent still enrolling: not Ready, listed as unready.
    agents.agent("node-b", false).await;
    // Pods with the agents' labels that the DaemonSet does not control: a
    // Ready one (its readiness passed without a certificate) never serves;
    // an unready one is listed for the enroller, whose token check
    // refuses it (proxy/tests/kube_backends/enrolment.rs).
    let mut impostor = pod("impostor", "node-c", "127.0.9.3", true);
    impostor["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "ConfigMap",
        "name": "x", "uid": "cm-uid", "controller": true}]);
    agents.put(impostor).await;
    let mut bare = pod("bare", "node-a", "127.0.9.4", false);
    bare["metadata"]["ownerReferences"] = json!(null);
    agents.put(bare).await;
    let dir = agents.spawn(real_kube::admin().await);
    eventually("node-a's agent and the two unready Pods", || {
        dir.snapshot().contains_key(&node("node-a")) && dir.unready().len() == 2
    })
    .await;
    // Settle: the impostors are in the cache by now, and stay out.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(dir.snapshot().keys().collect::<Vec<_>>(), ["node-a"]);
    let mut unready: Vec<_> = dir.unready().into_iter().map(|u| u.node).collect();
    unready.sort();
    assert_eq!(unready, ["node-a", "node-b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_tainted_out_of_service_is_gone_even_with_a_ready_agent_until_the_taint_is_removed()
{
    let agents = Agents::new("directory-out-of-service").await;
    for n in ["node-a", "node-b", "node-c"] {
        agents.node(n, "r1").await;
    }
    // node-a and node-c serve; node-b is NotReady (kubelet stopped).
    agents.agent("node-a", true).await;
    agents.agent("node-b", false).await;
    agents.agent("node-c", true).await;
    agents.node_not_ready("node-b").await;
    let dir = agents.ready_directory(real_kube::admin().await).await;
    eventually("node-a's and node-c's agents", || dir.snapshot().len() == 2).await;
    assert_eq!(
        locate(&dir, "node-b"),
        NodeAgent::Unreachable,
        "NotReady, with the lifecycle controller's taints, is not gone"
    );

    // node-a dies while its agent Pod still looks Ready (nobody updates a
    // dead node's Pods); the operator fences it, then taints it.
    agents
        .taint("node-a", &[(OUT_OF_SERVICE, "nodeshutdown", "NoExecute")])
        .await;
    eventually("node-a gone", || locate(&dir, "node-a") == NodeAgent::Gone).await;
    eventually("node-a's agent out of the snapshot", || {
        !dir.snapshot().contains_key(&node("node-a"))
    })
    .await;
    // Either effect Kubernetes documents; any value, or none.
    let mut tainted = vec![(UNREACHABLE, "", "NoExecute")];
    tainted.push((OUT_OF_SERVICE, "", "NoSchedule"));
    agents.taint("node-b", &tainted).await;
    eventually("node-b gone", || locate(&dir, "node-b") == NodeAgent::Gone).await;
    // PreferNoSchedule is no fencing Kubernetes knows of.
    agents
        .taint(
            "node-c",
            &[(OUT_OF_SERVICE, "nodeshutdown", "PreferNoSchedule")],
        )
        .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(matches!(locate(&dir, "node-c"), NodeAgent::Listed(_)));

    // Repaired and back: the taint removed, each node is what its agent
    // says again.
    agents.taint("node-a", &[]).await;
    agents.node_not_ready("node-b").await;
    eventually("node-a's agent back", || {
        matches!(locate(&dir, "node-a"), NodeAgent::Listed(_))
    })
    .await;
    eventually("node-b unreachable again", || {
        locate(&dir, "node-b") == NodeAgent::Unreachable
    })
    .await;
}
