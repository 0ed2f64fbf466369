//! The Kubernetes store's own behaviour: what it sends (method, path,
//! resourceVersion precondition, body), that reads come from watch caches
//! with the caller's writes overlaid, how a 409 re-reads, the target status
//! a discovery round writes, the leader fence, resize requests beside their
//! claim, and Events. What every store does is the contract
//! (`inventory/contract.rs`), run over this store in the `inventory` binary.

use std::sync::Arc;
use std::time::Duration;

use csi_scsi_proxy::device::{DiscoveryRound, Phase, ResizeRequest};
use csi_scsi_proxy::events::{ClaimRef, VolumeEvents};
use csi_scsi_proxy::inventory::{Inventory, InventoryError, KubeInventory, KubeInventoryConfig};
use csi_scsi_proxy::leader::LeaderHandle;
use csi_scsi_proxy::resources::DEVICE_FINALIZER;
use csi_scsi_proxy::selector::Selector;
use serde_json::{Value, json};

use crate::devices::{bind_req, labels, lun, publication, round, wwid};
use crate::eventually;
use crate::fake_api::{FakeApi, Logged};

const DEVICES: &str = "/apis/csi-scsi.io/v1alpha1/scsidevices";

/// An SCSIDevice as the API server would hold it.
pub fn device(i: u32, size: u64, nodes: &[&str], bound_to: Option<&str>) -> Value {
    let mut status = json!({
        "phase": if bound_to.is_some() { "Bound" } else { "Available" },
        "nodes": nodes.iter().map(|n| json!({"node": n, "target": "t1", "paths": ["p"]})).collect::<Vec<_>>(),
        "nodeNames": nodes,
    });
    if let Some(name) = bound_to {
        status["binding"] = json!({"uid": format!("uid-{name}"), "volumeName": name, "requiredBytes": 1, "cleanup": "zero"});
        status["volumeId"] = json!(format!("{}:uid-{name}", wwid(i)));
    }
    json!({
        "apiVersion": "csi-scsi.io/v1alpha1",
        "kind": "SCSIDevice",
        "metadata": {"name": wwid(i)},
        "spec": {"wwid": wwid(i), "target": "t1", "lun": i, "sizeBytes": size, "labels": {"tier": "fast"}},
        "status": status,
    })
}

/// An iSCSI SCSITarget.
pub fn target(name: &str) -> Value {
    json!({
        "apiVersion": "csi-scsi.io/v1alpha1",
        "kind": "SCSITarget",
        "metadata": {"name": name},
        "spec": {"iscsi": {"portals": ["198.18.0.1:3260"], "iqn": "iqn.2026-01.io.csi-scsi:a"}},
    })
}

/// The store over `api`, once its caches listed, and the inventory over it.
pub async fn start(api: &FakeApi, leader: Option<LeaderHandle>) -> (KubeInventory, Arc<Inventory>) {
    start_with(api, leader, None).await
}

async fn start_with(
    api: &FakeApi,
    leader: Option<LeaderHandle>,
    events: Option<VolumeEvents>,
) -> (KubeInventory, Arc<Inventory>) {
    let store = KubeInventory::start(
        api.client(),
        KubeInventoryConfig {
            namespace: "csi-scsi".into(),
            sync_timeout: Duration::from_secs(10),
            leader,
            events,
        },
    );
    store.wait_until_ready().await.unwrap();
    let inv = Arc::new(Inventory::new(Arc::new(store.clone())));
    (store, inv)
}

fn rv(v: &Value) -> String {
    v["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn is_device_write(r: &Logged) -> bool {
    r.method != "GET" && r.path.starts_with(DEVICES)
}

#[tokio::test]
async fn reads_come_from_the_watch_cache_not_a_list_per_call() {
    let api = FakeApi::start().await;
    api.put("scsidevices", device(1, 1 << 30, &["node-a"], None));
    let (store, inv) = start(&api, None).await;
    eventually("the synced flag", || store.is_synced()).await;
    eventually("the devices watch", || {
        api.requests()
            .iter()
            .filter(|r| r.query.get("watch").map(String::as_str) == Some("true"))
            .count()
            == 3
    })
    .await;
    let lists_before = api.requests().len();
    for _ in 0..20 {
        assert!(inv.device(&wwid(1)).await.unwrap().is_some());
        inv.devices(None, 10).await.unwrap();
        inv.capacity(&[], &Selector::default()).await.unwrap();
    }
    assert_eq!(api.requests().len(), lists_before, "reads sent requests");
    let lists: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|r| r.path == DEVICES)
        .collect();
    assert!(
        lists
            .iter()
            .any(|r| r.query.get("watch").map(String::as_str) == Some("true")),
        "no watch: {lists:?}"
    );
}

#[tokio::test]
async fn discovery_creates_a_device_then_writes_its_status_subresource() {
    let api = FakeApi::start().await;
    api.put("scsitargets", target("t1"));
    let (_, inv) = start(&api, None).await;
    let out = inv
        .apply_discovery(round(
            "t1",
            &[
                ("node-a", vec![lun(1, 1 << 30)]),
                ("node-b", vec![lun(1, 1 << 30), lun(2, 2 << 30)]),
            ],
            &[],
        ))
        .await
        .unwrap();
    assert_eq!(out.added, vec![wwid(1), wwid(2)]);
    let writes: Vec<_> = api.writes().into_iter().filter(is_device_write).collect();
    let shape: Vec<_> = writes
        .iter()
        .map(|w| format!("{} {}", w.method, w.path))
        .collect();
    assert_eq!(
        shape,
        [
            format!("POST {DEVICES}"),
            format!("PUT {DEVICES}/{}/status", wwid(1)),
            format!("POST {DEVICES}"),
            format!("PUT {DEVICES}/{}/status", wwid(2)),
        ]
    );
    // The status replace carries the version the create returned.
    let created = api.get("scsidevices", "", &wwid(1)).unwrap();
    assert_eq!(
        writes[1].body["metadata"]["resourceVersion"],
        json!((rv(&created).parse::<u64>().unwrap() - 1).to_string())
    );
    assert_eq!(created["status"]["phase"], "Available");
    assert_eq!(created["status"]["nodeNames"], json!(["node-a", "node-b"]));
    assert_eq!(created["spec"]["labels"]["tier"], "fast");
    // Read-your-writes before the watch catches up, and after.
    let d1 = inv.device(&wwid(1)).await.unwrap().unwrap();
    assert_eq!(d1.phase, Phase::Available);
    assert_eq!(d1.node_names(), vec!["node-a", "node-b"]);
    // The target's status says who answered.
    let t = api.get("scsitargets", "", "t1").unwrap();
    assert_eq!(t["status"]["phase"], "Ready");
    assert_eq!(t["status"]["reachableNodes"], 2);
    // A second identical pass writes nothing.
    let before = api.writes().iter().filter(|w| is_device_write(w)).count();
    inv.apply_discovery(round(
        "t1",
        &[
            ("node-a", vec![lun(1, 1 << 30)]),
            ("node-b", vec![lun(1, 1 << 30), lun(2, 2 << 30)]),
        ],
        &[],
    ))
    .await
    .unwrap();
    assert_eq!(
        api.writes().iter().filter(|w| is_device_write(w)).count(),
        before,
        "an unchanged pass wrote devices"
    );
}

#[tokio::test]
async fn bind_replaces_the_status_with_the_resource_version_it_read() {
    let api = FakeApi::start().await;
    let small = api.put("scsidevices", device(1, 1 << 30, &["node-a"], None));
    api.put("scsidevices", device(2, 4 << 30, &["node-a"], None));
    let (_, inv) = start(&api, None).await;
    let d = inv.bind(bind_req("pv-1", &[], "")).await.unwrap();
    assert_eq!(d.wwid, wwid(1), "smallest fit");
    let writes: Vec<_> = api.writes().into_iter().filter(is_device_write).collect();
    assert_eq!(writes.len(), 2, "{writes:?}");
    // First the bound-volume finalizer, conditional on the version read...
    let f = &writes[0];
    assert_eq!(
        (f.method.as_str(), f.path.clone()),
        ("PUT", format!("{DEVICES}/{}", wwid(1)))
    );
    assert_eq!(
        f.body["metadata"]["resourceVersion"],
        json!(rv(&small)),
        "the precondition is the version read"
    );
    assert_eq!(f.body["metadata"]["finalizers"], json!([DEVICE_FINALIZER]));
    // ...then the status, on the version that write made.
    let w = &writes[1];
    assert_eq!(
        (w.method.as_str(), w.path.clone()),
        ("PUT", format!("{DEVICES}/{}/status", wwid(1)))
    );
    assert_ne!(w.body["metadata"]["resourceVersion"], json!(rv(&small)));
    assert_eq!(w.body["status"]["phase"], "Bound");
    assert_eq!(w.body["status"]["binding"]["volumeName"], "pv-1");
    assert_eq!(
        w.body["status"]["volumeId"],
        json!(format!("{}:uid-pv-1", wwid(1)))
    );
    // The caller reads its own write at once.
    let again = inv.bound_to_name("pv-1").await.unwrap().unwrap();
    assert_eq!(again.wwid, wwid(1));
    assert_eq!(
        again.generation.to_string(),
        rv(&api.get("scsidevices", "", &wwid(1)).unwrap())
    );
    // A retry of the same name binds nothing new.
    let retry = inv.bind(bind_req("pv-1", &[], "")).await.unwrap();
    assert_eq!(retry.wwid, wwid(1));
    assert_eq!(api.writes().into_iter().filter(is_device_write).count(), 2);
}

#[tokio::test]
async fn a_conflict_re_reads_and_binds_another_device_never_the_same_twice() {
    let api = FakeApi::start().await;
    let stale = api.put("scsidevices", device(1, 1 << 30, &["node-a"], None));
    api.put("scsidevices", device(2, 2 << 30, &["node-a"], None));
    let (_, inv) = start(&api, None).await;
    // Another writer binds device 1; this process's cache does not see it.
    api.put_silently(
        "scsidevices",
        device(1, 1 << 30, &["node-a"], Some("other-pv")),
    );
    let d = inv.bind(bind_req("pv-1", &[], "")).await.unwrap();
    assert_eq!(d.wwid, wwid(2));
    let calls: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|r| r.path.starts_with(&format!("{DEVICES}/")))
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert_eq!(
        calls,
        [
            format!("PUT {DEVICES}/{}", wwid(1)),
            format!("GET {DEVICES}/{}", wwid(1)),
            format!("PUT {DEVICES}/{}", wwid(2)),
            format!("PUT {DEVICES}/{}/status", wwid(2)),
        ],
        "stale bind (its finalizer write refused), re-read, bind elsewhere"
    );
    let first_put = api.writes().into_iter().find(is_device_write).unwrap();
    assert_eq!(
        first_put.body["metadata"]["resourceVersion"],
        json!(rv(&stale))
    );
    // Device 1 still belongs to the other writer.
    let one = api.get("scsidevices", "", &wwid(1)).unwrap();
    assert_eq!(one["status"]["binding"]["volumeName"], "other-pv");
    let two = api.get("scsidevices", "", &wwid(2)).unwrap();
    assert_eq!(two["status"]["binding"]["volumeName"], "pv-1");
    // And this process now knows who holds device 1.
    let seen = inv.device(&wwid(1)).await.unwrap().unwrap();
    assert_eq!(seen.binding.unwrap().volume_name, "other-pv");
}

#[tokio::test]
async fn an_update_that_loses_on_the_server_re_reads_and_reports_a_conflict() {
    let api = FakeApi::start().await;
    api.put("scsidevices", device(1, 1 << 30, &["node-a"], Some("pv-1")));
    let (_, inv) = start(&api, None).await;
    let mut d = inv.device(&wwid(1)).await.unwrap().unwrap();
    api.put_silently(
        "scsidevices",
        device(1, 1 << 30, &["node-a", "node-b"], Some("pv-1")),
    );
    d.published = vec![publication("node-a")];
    let err = inv.update(d).await.unwrap_err();
    assert!(matches!(err, InventoryError::Conflict(_)), "{err}");
    // The caller's re-read sees the winner.
    let fresh = inv.device(&wwid(1)).await.unwrap().unwrap();
    assert_eq!(fresh.node_names(), vec!["node-a", "node-b"]);
    assert!(fresh.published.is_empty());
    let mut retry = fresh;
    retry.published = vec![publication("node-a")];
    let written = inv.update(retry).await.unwrap();
    // What lands in the status: the publication with its capability.
    let stored = api.get("scsidevices", "", &wwid(1)).unwrap();
    assert_eq!(rv(&stored), written.generation.to_string());
    assert_eq!(
        stored["status"]["published"],
        json!([{"node": "node-a", "access": "mount:ext4:SINGLE_NODE_WRITER"}])
    );
}

#[tokio::test]
async fn a_round_writes_who_answered_and_its_label_conflicts_into_the_target_status() {
    let api = FakeApi::start().await;
    api.put("scsitargets", target("t1"));
    api.put("scsitargets", target("t2"));
    let (_, inv) = start(&api, None).await;
    inv.apply_discovery(round("t1", &[("node-a", vec![lun(1, 1 << 30)])], &[]))
        .await
        .unwrap();
    // t2 reaches the same LUN but labels it otherwise; node-c is silent.
    inv.apply_discovery(DiscoveryRound {
        device_labels: labels(&[("tier", "slow")]),
        ..round("t2", &[("node-b", vec![lun(1, 1 << 30)])], &["node-c"])
    })
    .await
    .unwrap();
    let t2 = api.get("scsitargets", "", "t2").unwrap();
    let status = &t2["status"];
    assert_eq!(status["phase"], "Degraded");
    assert_eq!(status["reachableNodes"], 1);
    assert_eq!(
        status["nodes"],
        json!([
            {"node": "node-b", "answered": true, "luns": 1},
            {"node": "node-c", "answered": false, "luns": 0},
        ])
    );
    assert_eq!(
        status["labelConflicts"],
        json!([format!(
            "{}: tier=fast (kept), this target says tier=slow",
            wwid(1)
        )])
    );
    assert_eq!(status["conditions"][0]["type"], "Discovered");
    assert_eq!(status["conditions"][0]["status"], "True");
    assert!(api.get("scsitargets", "", "t1").unwrap()["status"]["labelConflicts"].is_null());
    // Nobody answers: Unreachable, the condition turns False.
    inv.apply_discovery(round("t2", &[], &["node-b", "node-c"]))
        .await
        .unwrap();
    let status = api.get("scsitargets", "", "t2").unwrap()["status"].clone();
    assert_eq!(status["phase"], "Unreachable");
    assert_eq!(status["reachableNodes"], 0);
    assert_eq!(status["conditions"][0]["status"], "False");
    assert_eq!(status["conditions"][0]["reason"], "NoAgentAnswered");
    // The device kept its first label.
    let d = inv.device(&wwid(1)).await.unwrap().unwrap();
    assert_eq!(d.labels, labels(&[("tier", "fast")]));
}

#[tokio::test]
async fn a_resolved_label_conflict_and_silent_nodes_leave_the_target_status() {
    let api = FakeApi::start().await;
    api.put("scsitargets", target("t1"));
    api.put("scsitargets", target("t2"));
    let (_, inv) = start(&api, None).await;
    inv.apply_discovery(round("t1", &[("node-a", vec![lun(1, 1 << 30)])], &[]))
        .await
        .unwrap();
    let slow = || DiscoveryRound {
        device_labels: labels(&[("tier", "slow")]),
        ..round("t2", &[("node-b", vec![lun(1, 1 << 30)])], &[])
    };
    inv.apply_discovery(slow()).await.unwrap();
    let status = api.get("scsitargets", "", "t2").unwrap()["status"].clone();
    assert_eq!(status["labelConflicts"].as_array().map(Vec::len), Some(1));
    // The operator relabels t2 like t1: the conflict is resolved.
    inv.apply_discovery(round("t2", &[("node-b", vec![lun(1, 1 << 30)])], &[]))
        .await
        .unwrap();
    let status = api.get("scsitargets", "", "t2").unwrap()["status"].clone();
    assert!(status["labelConflicts"].is_null(), "{status}");
    assert_eq!(status["phase"], "Ready");
    // No node matches t2 any more: its node list empties.
    inv.apply_discovery(round("t2", &[], &[])).await.unwrap();
    let status = api.get("scsitargets", "", "t2").unwrap()["status"].clone();
    assert!(status["nodes"].is_null(), "{status}");
    assert_eq!(status["phase"], "Unreachable");
    // Whole-status replaces with the version read, by the proxy.
    let writes: Vec<_> = api
        .writes()
        .into_iter()
        .filter(|w| w.path.ends_with("/scsitargets/t2/status"))
        .collect();
    // Three rounds; a 409 from a cache behind the last write adds a retry.
    assert!(writes.len() >= 3, "{writes:?}");
    for w in &writes {
        assert_eq!(w.method, "PUT");
        assert!(w.body["metadata"]["resourceVersion"].is_string());
        assert_eq!(
            w.query.get("fieldManager").map(String::as_str),
            Some("csi-scsi-proxy")
        );
    }
    // Every write the store sent names the proxy as its field manager.
    let unnamed: Vec<_> = api
        .writes()
        .into_iter()
        .filter(|w| w.method != "DELETE")
        .filter(|w| w.query.get("fieldManager").map(String::as_str) != Some("csi-scsi-proxy"))
        .map(|w| format!("{} {}", w.method, w.path))
        .collect();
    assert!(unnamed.is_empty(), "{unnamed:?}");
}

#[tokio::test]
async fn a_non_leader_refuses_to_write() {
    let api = FakeApi::start().await;
    api.put("scsidevices", device(1, 1 << 30, &["node-a"], None));
    let (_tx, rx) = tokio::sync::watch::channel(false);
    let never = LeaderHandle::from_receiver(rx);
    let (_, inv) = start(&api, Some(never)).await;
    let err = inv.bind(bind_req("pv-1", &[], "")).await.unwrap_err();
    assert!(
        matches!(err, InventoryError::Store(ref m) if m.contains("not the leader")),
        "{err}"
    );
    assert!(
        inv.device(&wwid(1)).await.unwrap().is_some(),
        "reads still work"
    );
    assert!(api.writes().is_empty());
}

#[tokio::test]
async fn a_resize_request_lands_beside_the_claim() {
    let api = FakeApi::start().await;
    api.put("scsidevices", device(1, 1 << 30, &["node-a"], Some("pv-1")));
    api.put(
        "persistentvolumes",
        json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-1"},
               "spec": {"claimRef": {"namespace": "apps", "name": "data"}}}),
    );
    let (_, inv) = start(&api, None).await;
    let request = ResizeRequest {
        name: "resize-pv-1".into(),
        volume_id: format!("{}:uid-pv-1", wwid(1)),
        wwid: wwid(1),
        requested_bytes: 2 << 30,
        current_bytes: 1 << 30,
        created: 0,
        done: false,
    };
    inv.put_resize(request.clone()).await.unwrap();
    let obj = api
        .get("pendingresizerequests", "apps", "resize-pv-1")
        .unwrap();
    assert_eq!(obj["spec"]["claimName"], "data");
    assert_eq!(obj["spec"]["volumeName"], "pv-1");
    assert_eq!(obj["spec"]["requestedBytes"], 2u64 << 30);
    assert_eq!(obj["status"]["currentBytes"], 1u64 << 30);
    assert_eq!(obj["status"]["done"], false);
    let paths: Vec<_> = api
        .writes()
        .iter()
        .map(|w| format!("{} {}", w.method, w.path))
        .collect();
    assert_eq!(
        paths,
        [
            "POST /apis/csi-scsi.io/v1alpha1/namespaces/apps/pendingresizerequests",
            "PATCH /apis/csi-scsi.io/v1alpha1/namespaces/apps/pendingresizerequests/resize-pv-1/status",
        ]
    );
    let deadline = tokio::time::Instant::now() + crate::patience();
    while inv.resizes().await.unwrap().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the resize request never reached the cache"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let listed = inv.resizes().await.unwrap();
    assert_eq!(listed[0].name, "resize-pv-1");
    assert_eq!(listed[0].requested_bytes, 2 << 30);
    // Done: the status says so, then the request goes.
    inv.put_resize(ResizeRequest {
        done: true,
        current_bytes: 2 << 30,
        ..request
    })
    .await
    .unwrap();
    let last: Vec<_> = api
        .writes()
        .iter()
        .skip(2)
        .map(|w| format!("{} {}", w.method, w.path))
        .collect();
    assert_eq!(
        last,
        [
            "PATCH /apis/csi-scsi.io/v1alpha1/namespaces/apps/pendingresizerequests/resize-pv-1/status",
            "DELETE /apis/csi-scsi.io/v1alpha1/namespaces/apps/pendingresizerequests/resize-pv-1",
        ]
    );
    assert!(api.all("pendingresizerequests").is_empty());
}

#[tokio::test]
async fn failures_become_events_on_the_claim_and_the_volume() {
    let api = FakeApi::start().await;
    api.put("scsidevices", device(1, 1 << 30, &["node-a"], Some("pv-1")));
    api.put(
        "persistentvolumes",
        json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-1", "uid": "pv-uid"},
               "spec": {"claimRef": {"namespace": "apps", "name": "data"}}}),
    );
    api.put(
        "persistentvolumeclaims",
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data", "namespace": "apps", "uid": "pvc-uid"}}),
    );
    let events = VolumeEvents::new(api.client(), "csi-scsi.io", Some("proxy-0".into()));
    let (_, inv) = start_with(&api, None, Some(events.clone())).await;

    // CreateVolume's failure: the caller knows the claim from its parameters.
    let claim = ClaimRef {
        namespace: "apps".into(),
        name: "data".into(),
    };
    events
        .no_device_fits(&claim, "1073741824 bytes or more")
        .await;
    // A pending resize and a failed wipe: the inventory reports what it writes.
    inv.put_resize(ResizeRequest {
        name: "resize-pv-1".into(),
        volume_id: format!("{}:uid-pv-1", wwid(1)),
        wwid: wwid(1),
        requested_bytes: 2 << 30,
        current_bytes: 1 << 30,
        created: 0,
        done: false,
    })
    .await
    .unwrap();
    let mut d = inv.device(&wwid(1)).await.unwrap().unwrap();
    d.phase = Phase::Failed;
    d.reason = "wipe on node-a failed: device busy".into();
    inv.update(d).await.unwrap();

    eventually("three Events", || api.all("events").len() == 3).await;
    let all = api.all("events");
    let by_reason = |r: &str| all.iter().find(|e| e["reason"] == r).cloned().unwrap();
    let nofit = by_reason("NoDeviceFits");
    assert_eq!(nofit["type"], "Warning");
    assert_eq!(
        nofit["regarding"],
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": "data", "namespace": "apps", "uid": "pvc-uid"})
    );
    assert_eq!(nofit["metadata"]["namespace"], "apps");
    assert_eq!(nofit["reportingController"], "csi-scsi.io");
    let resize = by_reason("ResizePending");
    assert_eq!(resize["regarding"]["uid"], "pvc-uid");
    assert_eq!(resize["related"]["kind"], "SCSIDevice");
    assert!(resize["note"].as_str().unwrap().contains("grow the LUN"));
    let wipe = by_reason("WipeFailed");
    assert_eq!(wipe["regarding"]["kind"], "PersistentVolume");
    assert_eq!(wipe["regarding"]["uid"], "pv-uid");
    assert!(wipe["note"].as_str().unwrap().contains("device busy"));
    let posts: Vec<_> = api
        .writes()
        .into_iter()
        .filter(|w| w.path.contains("/events"))
        .map(|w| w.path)
        .collect();
    assert!(
        posts.contains(&"/apis/events.k8s.io/v1/namespaces/apps/events".to_owned()),
        "{posts:?}"
    );
    assert!(
        posts.contains(&"/apis/events.k8s.io/v1/namespaces/default/events".to_owned()),
        "{posts:?}"
    );
}

#[tokio::test]
async fn many_callers_waiting_for_the_first_list_all_get_through() {
    let api = FakeApi::start().await;
    api.put("scsidevices", device(1, 1 << 30, &["node-a"], None));
    let store = KubeInventory::start(
        api.client(),
        KubeInventoryConfig {
            namespace: "csi-scsi".into(),
            sync_timeout: Duration::from_secs(30),
            leader: None,
            events: None,
        },
    );
    let inv = Inventory::new(Arc::new(store.clone()));
    // Called before the caches have listed, concurrently.
    let one = wwid(1);
    let reads = (0..8).map(|_| inv.device(&one));
    let all = tokio::time::timeout(Duration::from_secs(5), futures::future::join_all(reads))
        .await
        .expect("a waiter was never woken");
    assert!(all.into_iter().all(|r| r.unwrap().is_some()));
    assert!(store.is_synced());
}
