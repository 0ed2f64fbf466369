//! A SCSITarget whose IQN or portal does not parse (the CRD's rule only
//! checks the `iqn.` prefix) is refused by the proxy when discovery reads
//! it, with the reason on its status, and no agent is asked: before, every
//! agent refused it on every Discover.

use std::sync::Arc;

use csi_scsi_proxy::directory::NodeAgent;
use csi_scsi_proxy::reconcile::discovery;
use csi_scsi_proxy::resources::SCSITarget;
use serde_json::json;

use crate::directory::{Agents, locate};
use crate::eventually;
use crate::inventory::{create, stored, target};
use crate::lifecycle_support::lifecycle;
use crate::real_kube;

/// Discovery as deployed.
const SETTINGS: discovery::PassSettings = discovery::PassSettings {
    concurrency: 4,
    forget_after: None,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_whose_iqn_or_portal_does_not_parse_is_refused_on_its_status() {
    let _only = real_kube::exclusive().await;
    let admin = real_kube::admin().await;
    let agents = Agents::new("target-refusal").await;
    agents.node("node-a", "r1").await;
    let connections = agents.put_counting_agent("agent-a", "node-a").await;
    let mut bad_iqn = target("bad-iqn");
    bad_iqn["spec"]["iscsi"]["iqn"] = json!("iqn.2026-1.io.csi-scsi:a");
    create(&admin, bad_iqn).await;
    let mut bad_portal = target("bad-portal");
    bad_portal["spec"]["iscsi"]["portals"] = json!(["198.18.0.1:0"]);
    create(&admin, bad_portal).await;
    let scratch = tempfile::tempdir().unwrap();
    let inventory = Arc::new(real_kube::inventory(admin.clone()).await);
    let directory = agents.ready_directory(admin.clone()).await;
    eventually("node-a's agent", || {
        matches!(locate(&directory, "node-a"), NodeAgent::Listed(_))
    })
    .await;
    let life = lifecycle(inventory.clone(), directory.clone(), scratch.path());

    let pass = discovery::reconcile_once(&life, &SETTINGS).await.unwrap();
    assert_eq!((pass.refused_targets, pass.targets), (2, 0), "{pass:?}");
    assert_eq!(connections(), 0, "no Discover went to node-a");
    for (name, said) in [
        (
            "bad-iqn",
            "iscsi.iqn \"iqn.2026-1.io.csi-scsi:a\" is not of the form",
        ),
        (
            "bad-portal",
            "iscsi.portals: invalid portal \"198.18.0.1:0\": port 0",
        ),
    ] {
        let status = stored::<SCSITarget>(&admin, name).await["status"].clone();
        assert_eq!(status["phase"], "Refused", "{status}");
        let discovered = &status["conditions"][0];
        assert_eq!(discovered["type"], "Discovered", "{status}");
        assert_eq!(discovered["status"], "False", "{status}");
        assert_eq!(discovered["reason"], "InvalidTransport", "{status}");
        let message = discovered["message"].as_str().unwrap_or_default();
        assert!(message.contains(said), "{message}");
    }
}
