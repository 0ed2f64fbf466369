//! The Kubernetes store's own behaviour: what it sends (method, path,
//! resourceVersion precondition, body), that reads come from watch caches
//! with the caller's writes overlaid, how a 409 re-reads, the target status
//! a discovery round writes, the leader fence, resize requests beside their
//! claim, and Events. What every store does is the contract
//! (`inventory/contract.rs`), run over this store in the `inventory` binary.
//! On the real kube-apiserver, but for the request bodies and a write the
//! watch never delivers, which only the fake shows.

use std::sync::Arc;
use std::time::Duration;

use csi_scsi_proxy::device::{DiscoveryRound, Phase, ResizeRequest};
use csi_scsi_proxy::events::{ClaimRef, VolumeEvents};
use csi_scsi_proxy::inventory::{Inventory, InventoryError, KubeInventory, KubeInventoryConfig};
use csi_scsi_proxy::leader::LeaderHandle;
use csi_scsi_proxy::resources::{DEVICE_FINALIZER, PendingResizeRequest, SCSIDevice, SCSITarget};
use csi_scsi_proxy::selector::Selector;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::{Value, json};

use crate::devices::{bind_req, labels, lun, publication, round, wwid};
use crate::eventually;
use crate::fake_api::{FakeApi, Logged};
use crate::real_api::{admin_logging, claimed_volume, erased, until, writes};
use crate::real_kube;

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

/// Creates `body` (a [`device`] or a [`target`]) on the real server, then
/// its status, which a create drops.
pub async fn create(client: &kube::Client, body: Value) -> DynamicObject {
    let kind = match body["kind"].as_str() {
        Some("SCSIDevice") => erased::<SCSIDevice>(),
        Some("SCSITarget") => erased::<SCSITarget>(),
        other => panic!("not a csi-scsi.io kind: {other:?}"),
    };
    let api = Api::<DynamicObject>::all_with(client.clone(), &kind);
    let object: DynamicObject = serde_json::from_value(body.clone()).unwrap();
    let mut created = api.create(&PostParams::default(), &object).await.unwrap();
    if body.get("status").is_none() {
        return created;
    }
    created.data["status"] = body["status"].clone();
    let name = created.metadata.name.clone().unwrap();
    api.replace_status(&name, &PostParams::default(), &created)
        .await
        .unwrap()
}

/// The server's copy of the cluster-scoped object `name` of kind `K`, as JSON.
pub async fn stored<K: kube::Resource<DynamicType = ()>>(
    client: &kube::Client,
    name: &str,
) -> Value {
    let object = Api::<DynamicObject>::all_with(client.clone(), &erased::<K>())
        .get(name)
        .await
        .unwrap();
    serde_json::to_value(object).unwrap()
}

/// The inventory over the store over `api`, once its caches listed.
async fn start(api: &FakeApi) -> Inventory {
    let store = KubeInventory::start(
        api.client(),
        KubeInventoryConfig {
            namespace: "csi-scsi".into(),
            sync_timeout: Duration::from_secs(10),
            leader: None,
            events: None,
        },
    );
    store.wait_until_ready().await.unwrap();
    Inventory::new(Arc::new(store))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn reads_come_from_the_watch_cache_not_a_list_per_call() {
    let _only = real_kube::exclusive().await;
    let admin = real_kube::admin().await;
    create(&admin, device(1, 1 << 30, &["node-a"], None)).await;
    let (client, log) = admin_logging().await;
    let store = real_kube::store(client, None).await;
    let inv = Inventory::new(Arc::new(store.clone()));
    eventually("the synced flag", || store.is_synced()).await;
    let requests = || log.lock().unwrap().clone();
    eventually("the three watches", || {
        requests()
            .iter()
            .filter(|r| r.contains("watch=true"))
            .count()
            == 3
    })
    .await;
    let lists_before = requests().len();
    for _ in 0..20 {
        assert!(inv.device(&wwid(1)).await.unwrap().is_some());
        inv.devices(None, 10).await.unwrap();
        inv.capacity(&[], &Selector::default(), 0).await.unwrap();
    }
    assert_eq!(requests().len(), lists_before, "reads sent requests");
    assert!(
        requests()
            .iter()
            .any(|r| r.contains(&format!("{DEVICES}?")) && r.contains("watch=true")),
        "no watch: {:?}",
        requests()
    );
}

// On the fake: it reads the bodies the store sent (their resourceVersions).
#[tokio::test]
async fn discovery_creates_a_device_then_writes_its_status_subresource() {
    let api = FakeApi::start().await;
    api.put("scsitargets", target("t1"));
    let inv = start(&api).await;
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
    let created = api.get("scsidevices", "", wwid(1).as_str()).unwrap();
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
    // A whole-status replace with the version read.
    let t_write = api
        .writes()
        .into_iter()
        .find(|w| w.path.ends_with("/scsitargets/t1/status"))
        .unwrap();
    assert_eq!(t_write.method, "PUT");
    assert!(t_write.body["metadata"]["resourceVersion"].is_string());
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

// On the fake: it reads the bodies the store sent (their resourceVersions).
#[tokio::test]
async fn bind_replaces_the_status_with_the_resource_version_it_read() {
    let api = FakeApi::start().await;
    let small = api.put("scsidevices", device(1, 1 << 30, &["node-a"], None));
    api.put("scsidevices", device(2, 4 << 30, &["node-a"], None));
    let inv = start(&api).await;
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
        rv(&api.get("scsidevices", "", wwid(1).as_str()).unwrap())
    );
    // A retry of the same name binds nothing new.
    let retry = inv.bind(bind_req("pv-1", &[], "")).await.unwrap();
    assert_eq!(retry.wwid, wwid(1));
    assert_eq!(api.writes().into_iter().filter(is_device_write).count(), 2);
}

// On the fake: another writer's change the watch never delivers (`put_silently`).
#[tokio::test]
async fn a_conflict_re_reads_and_binds_another_device_never_the_same_twice() {
    let api = FakeApi::start().await;
    let stale = api.put("scsidevices", device(1, 1 << 30, &["node-a"], None));
    api.put("scsidevices", device(2, 2 << 30, &["node-a"], None));
    let inv = start(&api).await;
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
    let one = api.get("scsidevices", "", wwid(1).as_str()).unwrap();
    assert_eq!(one["status"]["binding"]["volumeName"], "other-pv");
    let two = api.get("scsidevices", "", wwid(2).as_str()).unwrap();
    assert_eq!(two["status"]["binding"]["volumeName"], "pv-1");
    // And this process now knows who holds device 1.
    let seen = inv.device(&wwid(1)).await.unwrap().unwrap();
    assert_eq!(seen.binding.unwrap().volume_name, "other-pv");
}

// On the fake: another writer's change the watch never delivers (`put_silently`).
#[tokio::test]
async fn an_update_that_loses_on_the_server_re_reads_and_reports_a_conflict() {
    let api = FakeApi::start().await;
    api.put("scsidevices", device(1, 1 << 30, &["node-a"], Some("pv-1")));
    let inv = start(&api).await;
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
    let stored = api.get("scsidevices", "", wwid(1).as_str()).unwrap();
    assert_eq!(rv(&stored), written.generation.to_string());
    assert_eq!(
        stored["status"]["published"],
        json!([{"node": "node-a", "access": "mount:ext4:SINGLE_NODE_WRITER"}])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn a_round_writes_who_answered_and_its_label_conflicts_into_the_target_status() {
    let _only = real_kube::exclusive().await;
    let admin = real_kube::admin().await;
    create(&admin, target("t1")).await;
    create(&admin, target("t2")).await;
    let inv = real_kube::inventory(admin.clone()).await;
    let status = |name: &'static str| {
        let admin = admin.clone();
        async move { stored::<SCSITarget>(&admin, name).await["status"].clone() }
    };
    inv.apply_discovery(round("t1", &[("node-a", vec![lun(1, 1 << 30)])], &[]))
        .await
        .unwrap();
    // t2 (the same array) reaches the same LUN but labels it otherwise;
    // node-c is silent.
    inv.apply_discovery(DiscoveryRound {
        device_labels: labels(&[("tier", "slow")]),
        same_array: ["t1".to_owned()].into(),
        ..round("t2", &[("node-b", vec![lun(1, 1 << 30)])], &["node-c"])
    })
    .await
    .unwrap();
    let t2 = status("t2").await;
    assert_eq!(t2["phase"], "Degraded");
    assert_eq!(t2["reachableNodes"], 1);
    assert_eq!(
        t2["nodes"],
        json!([
            {"node": "node-b", "answered": true, "luns": 1},
            {"node": "node-c", "answered": false, "luns": 0},
        ])
    );
    assert_eq!(
        t2["labelConflicts"],
        json!([format!(
            "{}: tier=fast (kept), this target says tier=slow",
            wwid(1)
        )])
    );
    assert_eq!(t2["conditions"][0]["type"], "Discovered");
    assert_eq!(t2["conditions"][0]["status"], "True");
    assert!(status("t1").await["labelConflicts"].is_null());
    // Nobody answers: Unreachable, the condition turns False.
    inv.apply_discovery(round("t2", &[], &["node-b", "node-c"]))
        .await
        .unwrap();
    let t2 = status("t2").await;
    assert_eq!(t2["phase"], "Unreachable");
    assert_eq!(t2["reachableNodes"], 0);
    assert_eq!(t2["conditions"][0]["status"], "False");
    assert_eq!(t2["conditions"][0]["reason"], "NoAgentAnswered");
    // The device kept its first label.
    let d = inv.device(&wwid(1)).await.unwrap().unwrap();
    assert_eq!(d.labels, labels(&[("tier", "fast")]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn a_resolved_label_conflict_and_silent_nodes_leave_the_target_status() {
    let _only = real_kube::exclusive().await;
    let admin = real_kube::admin().await;
    create(&admin, target("t1")).await;
    create(&admin, target("t2")).await;
    let (client, log) = admin_logging().await;
    let inv = real_kube::inventory(client).await;
    let status = || {
        let admin = admin.clone();
        async move { stored::<SCSITarget>(&admin, "t2").await["status"].clone() }
    };
    inv.apply_discovery(round("t1", &[("node-a", vec![lun(1, 1 << 30)])], &[]))
        .await
        .unwrap();
    let slow = || DiscoveryRound {
        device_labels: labels(&[("tier", "slow")]),
        same_array: ["t1".to_owned()].into(),
        ..round("t2", &[("node-b", vec![lun(1, 1 << 30)])], &[])
    };
    inv.apply_discovery(slow()).await.unwrap();
    let s = status().await;
    assert_eq!(s["labelConflicts"].as_array().map(Vec::len), Some(1));
    // The operator relabels t2 like t1: the conflict is resolved.
    inv.apply_discovery(round("t2", &[("node-b", vec![lun(1, 1 << 30)])], &[]))
        .await
        .unwrap();
    let s = status().await;
    assert!(s["labelConflicts"].is_null(), "{s}");
    assert_eq!(s["phase"], "Ready");
    // No node matches t2 any more: its node list empties.
    inv.apply_discovery(round("t2", &[], &[])).await.unwrap();
    let s = status().await;
    assert!(s["nodes"].is_null(), "{s}");
    assert_eq!(s["phase"], "Unreachable");
    // Whole-status replaces (with the version read: `discovery_creates_...`
    // on the fake sees the body), by the proxy.
    let requests = log.lock().unwrap().clone();
    let t2_writes: Vec<_> = requests
        .iter()
        .filter(|r| !r.starts_with("GET ") && r.contains("/scsitargets/t2/status"))
        .collect();
    // Three rounds; a 409 from a cache behind the last write adds a retry.
    assert!(t2_writes.len() >= 3, "{t2_writes:?}");
    assert!(
        t2_writes.iter().all(|w| w.starts_with("PUT ")),
        "{t2_writes:?}"
    );
    // Every write the store sent names the proxy as its field manager.
    let unnamed: Vec<_> = requests
        .iter()
        .filter(|r| !r.starts_with("GET ") && !r.starts_with("DELETE "))
        .filter(|r| !r.contains("fieldManager=csi-scsi-proxy"))
        .collect();
    assert!(unnamed.is_empty(), "{unnamed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn a_non_leader_refuses_to_write() {
    let _only = real_kube::exclusive().await;
    create(
        &real_kube::admin().await,
        device(1, 1 << 30, &["node-a"], None),
    )
    .await;
    let (_tx, rx) = tokio::sync::watch::channel(false);
    let never = LeaderHandle::from_receiver(rx);
    let (client, log) = admin_logging().await;
    let inv = Inventory::new(Arc::new(real_kube::store(client, Some(never)).await));
    let err = inv.bind(bind_req("pv-1", &[], "")).await.unwrap_err();
    assert!(
        matches!(err, InventoryError::Store(ref m) if m.contains("not the leader")),
        "{err}"
    );
    assert!(
        inv.device(&wwid(1)).await.unwrap().is_some(),
        "reads still work"
    );
    assert!(writes(&log).is_empty(), "{:?}", writes(&log));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn a_resize_request_lands_beside_the_claim() {
    let _only = real_kube::exclusive().await;
    let admin = real_kube::admin().await;
    create(&admin, device(1, 1 << 30, &["node-a"], Some("pv-beside"))).await;
    claimed_volume(&admin, "apps", "pv-beside").await;
    let (client, log) = admin_logging().await;
    let inv = real_kube::inventory(client).await;
    let request = ResizeRequest {
        name: "resize-pv-beside".into(),
        volume_id: format!("{}:uid-pv-beside", wwid(1)),
        wwid: wwid(1).to_string(),
        requested_bytes: 2 << 30,
        current_bytes: 1 << 30,
        created: 0,
        done: false,
    };
    inv.put_resize(request.clone()).await.unwrap();
    let requests = Api::<DynamicObject>::namespaced_with(
        admin.clone(),
        "apps",
        &erased::<PendingResizeRequest>(),
    );
    let obj = requests.get("resize-pv-beside").await.unwrap().data;
    assert_eq!(obj["spec"]["claimName"], "data");
    assert_eq!(obj["spec"]["volumeName"], "pv-beside");
    assert_eq!(obj["spec"]["requestedBytes"], 2u64 << 30);
    assert_eq!(obj["status"]["currentBytes"], 1u64 << 30);
    assert_eq!(obj["status"]["done"], false);
    const REQUESTS: &str = "/apis/csi-scsi.io/v1alpha1/namespaces/apps/pendingresizerequests";
    assert_eq!(
        writes(&log),
        [
            format!("POST {REQUESTS}"),
            format!("PATCH {REQUESTS}/resize-pv-beside/status"),
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
    assert_eq!(listed[0].name, "resize-pv-beside");
    assert_eq!(listed[0].requested_bytes, 2 << 30);
    // Done: the status says so, then the request goes.
    inv.put_resize(ResizeRequest {
        done: true,
        current_bytes: 2 << 30,
        ..request
    })
    .await
    .unwrap();
    assert_eq!(
        writes(&log)[2..],
        [
            format!("PATCH {REQUESTS}/resize-pv-beside/status"),
            format!("DELETE {REQUESTS}/resize-pv-beside"),
        ]
    );
    assert!(
        requests
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn failures_become_events_on_the_claim_and_the_volume() {
    let _only = real_kube::exclusive().await;
    let admin = real_kube::admin().await;
    create(&admin, device(1, 1 << 30, &["node-a"], Some("pv-events"))).await;
    let (claim_uid, volume_uid) = claimed_volume(&admin, "apps-events", "pv-events").await;
    let events = VolumeEvents::new(admin.clone(), "csi-scsi.io", Some("proxy-0".into()));
    let store = KubeInventory::start(
        admin.clone(),
        KubeInventoryConfig {
            namespace: real_kube::NAMESPACE.into(),
            sync_timeout: Duration::from_secs(30),
            leader: None,
            events: Some(events.clone()),
        },
    );
    store.wait_until_ready().await.unwrap();
    let inv = Inventory::new(Arc::new(store));

    // CreateVolume's failure: the caller knows the claim from its parameters.
    let claim = ClaimRef {
        namespace: "apps-events".into(),
        name: "data".into(),
    };
    events
        .no_device_fits(&claim, "1073741824 bytes or more")
        .await;
    // A pending resize and a failed wipe: the inventory reports what it writes.
    inv.put_resize(ResizeRequest {
        name: "resize-pv-events".into(),
        volume_id: format!("{}:uid-pv-events", wwid(1)),
        wwid: wwid(1).to_string(),
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

    // Ours: no other test reports Events on this server.
    let ours = || events_of(&admin, "csi-scsi.io");
    until("three Events", 10, || async { ours().await.len() == 3 }).await;
    let all = ours().await;
    let by_reason = |r: &str| all.iter().find(|e| e["reason"] == r).cloned().unwrap();
    let nofit = by_reason("NoDeviceFits");
    assert_eq!(nofit["type"], "Warning");
    assert_eq!(
        nofit["regarding"],
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": "data", "namespace": "apps-events", "uid": claim_uid})
    );
    assert_eq!(nofit["metadata"]["namespace"], "apps-events");
    assert_eq!(nofit["reportingController"], "csi-scsi.io");
    let resize = by_reason("ResizePending");
    assert_eq!(resize["regarding"]["uid"], claim_uid);
    assert_eq!(resize["related"]["kind"], "SCSIDevice");
    assert!(resize["note"].as_str().unwrap().contains("grow the LUN"));
    assert_eq!(resize["metadata"]["namespace"], "apps-events");
    let wipe = by_reason("WipeFailed");
    assert_eq!(wipe["regarding"]["kind"], "PersistentVolume");
    assert_eq!(wipe["regarding"]["uid"], volume_uid);
    assert!(wipe["note"].as_str().unwrap().contains("device busy"));
    // A cluster-scoped object's Events go to the default namespace.
    assert_eq!(wipe["metadata"]["namespace"], "default");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn many_callers_waiting_for_the_first_list_all_get_through() {
    let _only = real_kube::exclusive().await;
    let admin = real_kube::admin().await;
    create(&admin, device(1, 1 << 30, &["node-a"], None)).await;
    let store = KubeInventory::start(
        admin,
        KubeInventoryConfig {
            namespace: real_kube::NAMESPACE.into(),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn a_wwid_another_array_reports_is_a_condition_and_an_event_on_the_device() {
    let _only = real_kube::exclusive().await;
    let admin = real_kube::admin().await;
    // Its own reporting controller: the other Event test counts its own.
    let events = VolumeEvents::new(
        admin.clone(),
        "conflicts.csi-scsi.io",
        Some("proxy-0".into()),
    );
    let store = KubeInventory::start(
        admin.clone(),
        KubeInventoryConfig {
            namespace: real_kube::NAMESPACE.into(),
            sync_timeout: Duration::from_secs(30),
            leader: None,
            events: Some(events),
        },
    );
    store.wait_until_ready().await.unwrap();
    let inv = Inventory::new(Arc::new(store));
    inv.apply_discovery(round("t1", &[("node-a", vec![lun(1, 1 << 30)])], &[]))
        .await
        .unwrap();
    let out = inv
        .apply_discovery(round("t2", &[("node-c", vec![lun(1, 1 << 30)])], &[]))
        .await
        .unwrap();
    assert_eq!(out.conflicts, [wwid(1)], "{out:?}");
    let obj = stored::<SCSIDevice>(&admin, wwid(1).as_str()).await;
    assert_eq!(obj["spec"]["target"], "t1");
    assert_eq!(obj["status"]["nodeNames"], json!(["node-a"]));
    assert_eq!(obj["status"]["conflicts"][0]["target"], "t2");
    assert_eq!(obj["status"]["conflicts"][0]["nodes"], json!(["node-c"]));
    let conditions = obj["status"]["conditions"].as_array().unwrap();
    let conflict = conditions
        .iter()
        .find(|c| c["type"] == "TargetConflict")
        .expect("the TargetConflict condition");
    assert_eq!(conflict["status"], "True");
    assert!(conflict["message"].as_str().unwrap().contains("target t2"));
    assert_eq!(
        conditions.iter().find(|c| c["type"] == "Usable").unwrap()["status"],
        "True"
    );
    let ours = || events_of(&admin, "conflicts.csi-scsi.io");
    until("the TargetConflict Event", 10, || async {
        !ours().await.is_empty()
    })
    .await;
    let all = ours().await;
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(all[0]["reason"], "TargetConflict");
    assert_eq!(all[0]["type"], "Warning");
    assert_eq!(all[0]["regarding"]["kind"], "SCSIDevice");
    assert_eq!(all[0]["regarding"]["name"], wwid(1).as_str());
    assert_eq!(all[0]["regarding"]["uid"], obj["metadata"]["uid"]);
    // node-c answers t2 without it: the condition goes.
    inv.apply_discovery(round("t2", &[("node-c", vec![])], &[]))
        .await
        .unwrap();
    let obj = stored::<SCSIDevice>(&admin, wwid(1).as_str()).await;
    assert!(obj["status"]["conflicts"].is_null(), "{obj}");
    let conditions = obj["status"]["conditions"].as_array().unwrap();
    assert!(conditions.iter().all(|c| c["type"] != "TargetConflict"));
}

/// Every Event on the API server that `controller` reported, as JSON.
async fn events_of(admin: &kube::Client, controller: &str) -> Vec<serde_json::Value> {
    Api::<Event>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reporting_controller.as_deref() == Some(controller))
        .map(|e| serde_json::to_value(e).unwrap())
        .collect()
}
