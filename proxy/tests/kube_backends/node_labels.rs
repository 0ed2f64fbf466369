//! A target's `nodeSelector` decides who gets its CHAP credentials and its
//! LUNs, so it must rest on Node labels a node cannot give itself. On the
//! real kube-apiserver (NodeRestriction on), a node labels its own Node
//! with its kubelet's credentials; the proxy's discovery and publish over
//! the agent Pods and Nodes then send nothing to it.

use std::sync::Arc;

use csi_scsi_proxy::device::{Access, AccessMode};
use csi_scsi_proxy::directory::NodeAgent;
use csi_scsi_proxy::reconcile::discovery;
use csi_scsi_proxy::resources::{SCSIDevice, SCSITarget};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use tonic::{Code, Status};

use crate::devices::{node, wwid};
use crate::directory::{Agents, locate};
use crate::eventually;
use crate::inventory::{create, device, stored, target};
use crate::lifecycle_support::lifecycle;
use crate::real_kube;

/// The label a storage admin might pick, which any kubelet can set.
const SETTABLE: &str = "storage.example.com/array1";
/// The same under the prefix NodeRestriction keeps from kubelets.
const PROTECTED: &str = "node-restriction.kubernetes.io/array1";

/// Discovery as deployed.
const SETTINGS: discovery::PassSettings = discovery::PassSettings {
    concurrency: 4,
    forget_after: None,
};

/// A client with node `node`'s kubelet credentials (system:node:<node> in
/// system:nodes, as the Node authorizer and NodeRestriction expect).
async fn kubelet_of(node: &str, dir: &std::path::Path) -> kube::Client {
    let plane = real_kube::plane().await;
    let creds = plane
        .pki
        .client(
            &format!("kubelet-{node}"),
            &format!("system:node:{node}"),
            &["system:nodes"],
        )
        .unwrap();
    let config = dir.join(format!("{node}.kubeconfig"));
    plane
        .pki
        .kubeconfig_cert(&config, &plane.server, &creds)
        .unwrap();
    real_kube::client_for(&config).await
}

/// Patches Node `node`'s labels with `client`.
async fn label(client: &kube::Client, node: &str, labels: Value) -> Result<Node, kube::Error> {
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": labels}})),
        )
        .await
}

/// Makes target t1's nodeSelector `{key: "true"}` alone and waits until
/// the inventory reads it.
async fn select(admin: &kube::Client, inventory: &csi_scsi_proxy::inventory::Inventory, key: &str) {
    let api = Api::<SCSITarget>::all(admin.clone());
    let mut t = api.get("t1").await.unwrap();
    t.spec.node_selector = [(key.to_owned(), "true".to_owned())].into();
    api.replace("t1", &Default::default(), &t).await.unwrap();
    let want = t.spec.node_selector;
    let deadline = tokio::time::Instant::now() + crate::patience();
    loop {
        let t = inventory.targets().await.unwrap();
        if t.iter().any(|t| t.name == "t1" && t.node_selector == want) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "selector unseen");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Node-a's kubelet labels its own Node with the key target t1 selects
/// on; NodeRestriction lets it, but the proxy, by default, takes such a
/// selector for none: discovery dials no agent (no Discover, no CHAP),
/// the target's status says Refused and why, the bound LUN's records stay,
/// and a publish to node-a through t1 is refused before its agent is
/// dialled. The kubelet cannot set the protected key; once the admin sets
/// it and t1 selects on it, node-a is asked again. With
/// `--allow-kubelet-settable-selectors` the settable key selects, as
/// before. (Before: node-a's agent got the Discover, and the Attach, with
/// t1's credentials.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_selecting_on_a_label_a_kubelet_can_set_selects_no_node() {
    let _only = real_kube::exclusive().await;
    let admin = real_kube::admin().await;
    let agents = Agents::new("node-labels").await;
    agents.node("node-a", "r1").await;
    let scratch = tempfile::tempdir().unwrap();
    let kubelet = kubelet_of("node-a", scratch.path()).await;
    label(&kubelet, "node-a", json!({SETTABLE: "true"}))
        .await
        .expect("NodeRestriction lets a kubelet set this key on its own Node");
    let refused = label(&kubelet, "node-a", json!({PROTECTED: "true"}))
        .await
        .expect_err("NodeRestriction keeps this key from kubelets");
    assert!(
        matches!(&refused, kube::Error::Api(s) if s.code == 403),
        "{refused:?}"
    );
    // node-a's agent listens where every connection is counted.
    let connections = agents.put_counting_agent("agent-a", "node-a").await;
    let mut t1 = target("t1");
    t1["spec"]["nodeSelector"] = json!({SETTABLE: "true"});
    create(&admin, t1).await;
    let mut bound = device(1, 1 << 30, &["node-a"], Some("pv-1"));
    bound["status"]["binding"]["capabilities"] = json!(["mount:ext4:SINGLE_NODE_WRITER"]);
    create(&admin, bound).await;
    let inventory = Arc::new(real_kube::inventory(admin.clone()).await);
    let directory = agents.ready_directory(admin.clone()).await;
    eventually("node-a's agent", || {
        matches!(locate(&directory, "node-a"), NodeAgent::Listed(_))
    })
    .await;
    let life = lifecycle(inventory.clone(), directory.clone(), scratch.path());

    let pass = discovery::reconcile_once(&life, &SETTINGS).await.unwrap();
    assert_eq!((pass.refused_targets, pass.targets), (1, 0), "{pass:?}");
    assert_eq!(connections(), 0, "no Discover went to node-a");
    let status = stored::<SCSITarget>(&admin, "t1").await["status"].clone();
    assert_eq!(status["phase"], "Refused", "{status}");
    let said = status["conditions"][0]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        said.contains(SETTABLE) && said.contains("kubelet can set"),
        "{status}"
    );
    // The records stay: nothing Lost, no view dropped.
    let dev = stored::<SCSIDevice>(&admin, wwid(1).as_str()).await;
    assert_eq!(dev["status"]["phase"], "Bound");
    assert_eq!(dev["status"]["nodeNames"], json!(["node-a"]));

    let writer = Access {
        block: false,
        fs_type: None,
        mode: AccessMode::SingleNodeWriter,
    };
    let id = format!("{}:uid-pv-1", wwid(1));
    let publish = Status::from(
        life.publish(&id, &node("node-a"), &writer, "t")
            .await
            .unwrap_err(),
    );
    assert_eq!(publish.code(), Code::FailedPrecondition, "{publish:?}");
    assert!(publish.message().contains(SETTABLE), "{publish:?}");
    assert_eq!(connections(), 0, "no Attach went to node-a");
    let dev = inventory.device(&wwid(1)).await.unwrap().unwrap();
    assert!(dev.published_nodes().is_empty(), "nothing recorded");

    // The operator's opt-in: the settable key selects node-a again.
    let trusting = lifecycle(inventory.clone(), directory.clone(), scratch.path())
        .allow_kubelet_settable_selectors(true);
    let pass = discovery::reconcile_once(&trusting, &SETTINGS)
        .await
        .unwrap();
    assert_eq!((pass.refused_targets, pass.targets), (0, 1), "{pass:?}");
    assert!(connections() > 0, "node-a's agent was dialled");

    // The admin labels node-a with the protected key; t1 selects on it.
    label(&admin, "node-a", json!({PROTECTED: "true"}))
        .await
        .unwrap();
    select(&admin, &inventory, PROTECTED).await;
    eventually("node-a's protected label", || {
        matches!(locate(&directory, "node-a"), NodeAgent::Listed(e) if e.labels.contains_key(PROTECTED))
    })
    .await;
    let pass = discovery::reconcile_once(&life, &SETTINGS).await.unwrap();
    assert_eq!((pass.refused_targets, pass.targets), (0, 1), "{pass:?}");
    assert!(connections() > 0, "node-a's agent was dialled");
}
