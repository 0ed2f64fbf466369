//! The proxy's `/status` document reads back whole in the types the
//! `csi-scsi` CLI reads it with (`csi-scsi-status`), and names a target's
//! CHAP Secret without its contents.
#![allow(clippy::unwrap_used)]

#[path = "support/lifecycle.rs"]
mod lifecycle_support;

use std::sync::Arc;
use std::time::Duration;

use csi_scsi_daemon::{Metrics, StatusSource};
use csi_scsi_proxy::directory::FileDirectory;
use csi_scsi_proxy::inventory::{EmbeddedInventory, Inventory};
use csi_scsi_proxy::status::ProxyStatus;
use csi_scsi_status::{SCHEMA, Status, proxy};
use serde_json::json;

#[tokio::test]
async fn the_document_reads_back_in_the_clis_types() {
    let dir = tempfile::tempdir().unwrap();
    let inv = Inventory::new(Arc::new(
        EmbeddedInventory::open(&dir.path().join("inventory.db")).unwrap(),
    ));
    // As the SCSITarget resource spells them.
    inv.put_target(
        serde_json::from_value(json!({
            "name": "array-a",
            "iscsi": {"portals": ["198.18.0.1:3260"], "iqn": "iqn.2026-01.io.csi-scsi:a",
                      "chapSecretRef": {"name": "chap-a", "namespace": "storage"}},
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    inv.put_resize(
        serde_json::from_value(json!({
            "name": "resize-pv-1", "volumeId": "naa.1:u", "wwid": "naa.1",
            "requestedBytes": 2048, "currentBytes": 1024, "created": 1, "done": false,
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    // node-a is listed at an address where nothing listens.
    let silent = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let agents_file = dir.path().join("agents");
    std::fs::write(&agents_file, format!("node-a {silent}\n")).unwrap();
    let agents = FileDirectory::load(&agents_file).unwrap();
    let life = lifecycle_support::lifecycle(Arc::new(inv), agents, dir.path());
    let metrics = Metrics::new("proxy", "test", None);
    let source = ProxyStatus::new(Arc::new(life), metrics.clone());

    let read = |doc: Status| {
        let served = serde_json::to_value(&doc).expect("write");
        let doc: Status = serde_json::from_value(served.clone()).expect("the CLI reads it");
        assert_eq!(serde_json::to_value(&doc).unwrap(), served, "lossless");
        match doc {
            Status::Proxy(p) => p,
            Status::Agent(_) => panic!("not the proxy's document: {served}"),
        }
    };
    let p = read(source.status().await);
    assert_eq!(p.schema, SCHEMA);
    assert_eq!(p.leader.mode, "single-replica");
    assert_eq!(
        p.inventory.devices_by_phase.keys().collect::<Vec<_>>(),
        ["Available", "Bound", "Failed", "Lost", "Releasing"]
    );
    assert_eq!(p.agents.len(), 1);
    assert_eq!(p.agents[0].reachable, None, "not probed yet");
    assert_eq!(p.pending_resizes.len(), 1);
    assert_eq!(p.pending_resizes[0].requested_bytes, 2048);
    // The gauges follow the same reading.
    let text = metrics.encode();
    for series in [
        "csi_scsi_devices{phase=\"Releasing\"} 0",
        "csi_scsi_agents{state=\"unknown\"} 1",
        "csi_scsi_agents{state=\"reachable\"} 0",
        "csi_scsi_resize_requests_pending 1",
        "csi_scsi_releases_running 0",
    ] {
        assert!(text.contains(series), "{series} in {text}");
    }
    let chap = p.targets[0].iscsi.as_ref().unwrap().chap_secret_ref.clone();
    assert_eq!(
        chap,
        Some(proxy::SecretRef {
            name: "chap-a".into(),
            namespace: "storage".into()
        })
    );

    // A probe that fails fills the agent's optional fields.
    let _prober = source.spawn_prober(Duration::from_millis(50), Duration::from_millis(500), 1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let agent = loop {
        let p = read(source.status().await);
        if p.agents[0].reachable.is_some() {
            break p.agents[0].clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "never probed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(agent.reachable, Some(false));
    assert!(agent.round_trip_ms.is_some() && agent.last_probe.is_some());
    assert!(agent.error.is_some_and(|e| !e.is_empty()));
}
