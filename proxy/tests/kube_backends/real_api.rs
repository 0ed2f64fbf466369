//! The Kubernetes backends against a real kube-apiserver and etcd
//! (`support/real_kube.rs`): what the fake server cannot show. The CRDs'
//! schema and CEL rules, the status subresource, optimistic concurrency
//! between two proxies, a watch whose resourceVersion the server no longer
//! serves, paged lists, the Lease between two replicas, and RBAC.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_scsi_contract::{LeaderEpoch, Wwid};
use csi_scsi_proxy::device::{Phase, ResizeRequest, policy};
use csi_scsi_proxy::inventory::{Inventory, InventoryError};
use csi_scsi_proxy::leader::{LeaderElection, LeaderHandle, LeaseConfig};
use csi_scsi_proxy::resources::{
    DEVICE_FINALIZER, PendingResizeRequest, SCSIDevice, SCSITarget, TARGET_FINALIZER,
};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
    WatchEvent, WatchParams,
};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::devices::{bind_req, lun, round, wwid};
use crate::real_kube::{self, NAMESPACE};

const GIB: u64 = 1 << 30;

pub(crate) fn erased<K: kube::Resource<DynamicType = ()>>() -> ApiResource {
    ApiResource::erase::<K>(&())
}

/// A cluster-scoped object of kind `K` with `body` (spec, status) as JSON.
pub(crate) fn object<K: kube::Resource<DynamicType = ()>>(
    name: &str,
    body: Value,
) -> DynamicObject {
    DynamicObject::new(name, &erased::<K>()).data(body)
}

/// The finalizers the server holds on device object `name`.
async fn finalizers(devices: &Api<SCSIDevice>, name: &str) -> Option<Vec<String>> {
    devices.get(name).await.unwrap().metadata.finalizers
}

pub(crate) fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// What a logging client asked for.
pub(crate) type Log = Arc<Mutex<Vec<String>>>;

/// A cluster-admin client that logs its requests: the server keeps no
/// record of a client's queries, nor says which of them wrote.
pub(crate) async fn admin_logging() -> (kube::Client, Log) {
    let log = Log::default();
    let plane = real_kube::plane().await;
    let client = real_kube::client_logging(plane.admin.kubeconfig(), Some(log.clone())).await;
    (client, log)
}

/// The writes in `log`, as "METHOD path" (no query).
pub(crate) fn writes(log: &Log) -> Vec<String> {
    log.lock()
        .unwrap()
        .iter()
        .filter_map(|r| {
            let (method, uri) = r.split_once(' ')?;
            let uri: tonic::codegen::http::Uri = uri.parse().ok()?;
            (method != "GET").then(|| format!("{method} {}", uri.path()))
        })
        .collect()
}

/// Namespace `ns` (made if missing), claim `data` in it and
/// PersistentVolume `volume` bound to it by its claimRef (no controller
/// binds them here); the claim's uid and the volume's.
pub(crate) async fn claimed_volume(
    admin: &kube::Client,
    ns: &str,
    volume: &str,
) -> (String, String) {
    let _ = Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await;
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "storageClassName": "none"}
    }))
    .unwrap();
    let claim = Api::<PersistentVolumeClaim>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
    let claim_uid = claim.metadata.uid.unwrap();
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": volume},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "none",
            "csi": {"driver": "csi-scsi.io", "volumeHandle": "h"},
            "claimRef": {"namespace": ns, "name": "data", "uid": claim_uid}
        }
    }))
    .unwrap();
    let pv = Api::<PersistentVolume>::all(admin.clone())
        .create(&PostParams::default(), &pv)
        .await
        .unwrap();
    (claim_uid, pv.metadata.uid.unwrap())
}

/// Polls `check` (async) until it holds, or fails after `secs`.
pub(crate) async fn until<F, Fut>(what: &str, secs: u64, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// === schema, CEL, status subresource ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_crd_rules_reject_invalid_targets_with_422() {
    let _only = real_kube::exclusive().await;
    let admin = real_kube::admin().await;
    let targets: Api<DynamicObject> = Api::all_with(admin, &erased::<SCSITarget>());
    let iscsi = json!({"portals": ["198.18.0.1:3260"], "iqn": "iqn.2026-01.io.csi-scsi:a"});
    let fc = json!({"wwpns": ["50:01:43:80:12:34:56:78"]});
    let one_of = "exactly one of iscsi or fibreChannel must be set";
    for (name, spec, why) in [
        (
            "both",
            json!({"iscsi": iscsi.clone(), "fibreChannel": fc.clone()}),
            one_of,
        ),
        ("neither", json!({"nodes": ["node-a"]}), one_of),
        (
            "bad-iqn",
            json!({"iscsi": {"portals": ["198.18.0.1:3260"], "iqn": "target-a"}}),
            "must be an iqn., eui. or naa. name",
        ),
        (
            "no-portals",
            json!({"iscsi": {"portals": [], "iqn": "iqn.2026-01.io.csi-scsi:a"}}),
            "spec.iscsi.portals",
        ),
        ("Upper-Case", json!({"iscsi": iscsi.clone()}), "RFC 1123"),
    ] {
        let err = targets
            .create(
                &PostParams::default(),
                &object::<SCSITarget>(name, json!({ "spec": spec })),
            )
            .await
            .expect_err(name);
        assert_eq!(api_code(&err), Some(422), "{name}: {err}");
        assert!(err.to_string().contains(why), "{name}: {err}");
    }
    // What passes: one transport, including one given as an explicit null
    // beside the other (CEL's has() counts a null as absent), and unknown
    // fields, which are pruned (the fake keeps them).
    for (name, spec) in [
        ("iscsi", json!({"iscsi": iscsi.clone()})),
        ("fc", json!({"fibreChannel": fc})),
        (
            "fc-null",
            json!({"iscsi": iscsi.clone(), "fibreChannel": null}),
        ),
        ("unknown-field", json!({"iscsi": iscsi, "bogus": 1})),
    ] {
        let created = targets
            .create(
                &PostParams::default(),
                &object::<SCSITarget>(name, json!({ "spec": spec })),
            )
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(created.data["spec"].get("bogus").is_none(), "{created:?}");
    }
    // The proxy reads the null transport as absent.
    let inv = real_kube::inventory(real_kube::admin().await).await;
    let names: Vec<_> = inv
        .targets()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["fc", "fc-null", "iscsi", "unknown-field"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_is_dropped_on_create_and_kept_by_a_spec_replace() {
    let _only = real_kube::exclusive().await;
    let admin = real_kube::admin().await;
    let devices: Api<DynamicObject> = Api::all_with(admin, &erased::<SCSIDevice>());
    let spec = json!({"wwid": wwid(1), "target": "t1", "lun": 1, "sizeBytes": GIB});
    let status = |phase: &str| json!({"phase": phase, "nodes": [{"node": "node-a", "target": "t1", "paths": ["p"]}], "nodeNames": ["node-a"]});
    let created = devices
        .create(
            &PostParams::default(),
            &object::<SCSIDevice>(
                wwid(1).as_str(),
                json!({"spec": spec, "status": status("Available")}),
            ),
        )
        .await
        .unwrap();
    assert!(created.data.get("status").is_none(), "{created:?}");
    // The inventory reads an object without status as Lost (the fake's
    // `device()` helper relies on a create keeping it).
    let inv = real_kube::inventory(real_kube::admin().await).await;
    assert_eq!(
        inv.device(&wwid(1)).await.unwrap().unwrap().phase,
        Phase::Lost
    );

    let mut with_status = created.clone();
    with_status.data["status"] = status("Available");
    let written = devices
        .replace_status(wwid(1).as_str(), &PostParams::default(), &with_status)
        .await
        .unwrap();
    assert_eq!(written.data["status"]["phase"], "Available");
    // A spec replace carrying another status changes the spec only.
    let mut next = written.clone();
    next.data["spec"]["sizeBytes"] = json!(2 * GIB);
    next.data["status"] = status("Bound");
    let replaced = devices
        .replace(wwid(1).as_str(), &PostParams::default(), &next)
        .await
        .unwrap();
    assert_eq!(replaced.data["spec"]["sizeBytes"], json!(2 * GIB));
    assert_eq!(replaced.data["status"]["phase"], "Available");
    // And a status write with a stale resourceVersion is refused.
    let err = devices
        .replace_status(wwid(1).as_str(), &PostParams::default(), &with_status)
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(409), "{err}");
}

// === optimistic concurrency ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxies_binding_from_one_pool_never_bind_a_device_twice() {
    const DEVICES: u32 = 40;
    let _only = real_kube::exclusive().await;
    let a = Arc::new(real_kube::inventory(real_kube::admin().await).await);
    let luns: Vec<_> = (0..DEVICES).map(|i| lun(i, GIB)).collect();
    a.apply_discovery(round("t1", &[("node-a", luns)], &[]))
        .await
        .unwrap();
    // A second proxy: its own client, connections and watch caches.
    let b = Arc::new(real_kube::inventory(real_kube::admin().await).await);
    let tasks: Vec<_> = (0..2 * DEVICES)
        .map(|i| {
            let inv = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
                loop {
                    match inv.bind(bind_req(&format!("pv-{i}"), &[], "")).await {
                        Err(InventoryError::Conflict(_)) => tokio::task::yield_now().await,
                        other => return other,
                    }
                }
            })
        })
        .collect();
    let mut bound = BTreeMap::new();
    for r in futures::future::join_all(tasks).await {
        match r.unwrap() {
            Ok(d) => {
                let b = d.binding.unwrap();
                assert!(
                    bound
                        .insert(d.wwid.clone(), (b.volume_name, b.uid))
                        .is_none(),
                    "{} bound twice",
                    d.wwid
                );
            }
            Err(InventoryError::NoFit(_)) => {}
            Err(e) => panic!("a bind failed otherwise: {e}"),
        }
    }
    assert_eq!(bound.len(), DEVICES as usize);
    // The server's objects, not a cache: each device holds exactly the
    // binding its winner was told about, and no volume holds two.
    let stored = Api::<SCSIDevice>::all(real_kube::admin().await)
        .list(&ListParams::default())
        .await
        .unwrap();
    let mut in_server = BTreeMap::new();
    for o in &stored.items {
        let b = o.status.as_ref().and_then(|s| s.binding.as_ref()).unwrap();
        in_server.insert(
            Wwid::parse(&o.spec.wwid).unwrap(),
            (b.volume_name.clone(), b.uid.clone()),
        );
    }
    assert_eq!(in_server, bound);
    let volumes: BTreeSet<_> = in_server.values().map(|(v, _)| v).collect();
    assert_eq!(
        volumes.len(),
        DEVICES as usize,
        "a volume holds two devices"
    );
}

// === a watch whose resourceVersion is gone ===

/// etcd's current revision, through its HTTP gateway.
fn etcd_revision(etcd: &str) -> i64 {
    let out = etcd_post(etcd, "range", &json!({"key": "AAA="}));
    out["header"]["revision"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no revision in {out}"))
}

fn etcd_post(etcd: &str, call: &str, body: &Value) -> Value {
    let out = std::process::Command::new("curl")
        .args(["-sS", "-X", "POST", &format!("{etcd}/v3/kv/{call}"), "-d"])
        .arg(body.to_string())
        .output()
        .expect("curl");
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).expect("etcd answered JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_whose_resource_version_is_gone_relists_and_reads_stay_right() {
    let _only = real_kube::exclusive().await;
    let plane = real_kube::plane().await;
    let admin = real_kube::admin().await;
    let store = real_kube::store(admin.clone(), None).await;
    let inv = Inventory::new(Arc::new(store.clone()));
    let luns: Vec<_> = (1..=3).map(|i| lun(i, GIB)).collect();
    inv.apply_discovery(round("t1", &[("node-a", luns)], &[]))
        .await
        .unwrap();
    let bound = inv.bind(bind_req("pv-1", &[], "")).await.unwrap();
    let devices: Api<SCSIDevice> = Api::all(admin.clone());
    let before = devices
        .list_metadata(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let changed = store.targets_changed();
    while tokio::time::timeout(Duration::from_millis(300), changed.notified())
        .await
        .is_ok()
    {}

    // etcd forgets every revision before now...
    let revision = etcd_revision(&plane.etcd_url);
    etcd_post(
        &plane.etcd_url,
        "compaction",
        &json!({"revision": revision.to_string(), "physical": true}),
    );
    let old = etcd_post(
        &plane.etcd_url,
        "range",
        &json!({"key": "AAA=", "revision": (revision - 1).to_string()}),
    );
    assert!(old.to_string().contains("compacted"), "{old}");
    // ...but the API server serves watches from its watch cache, which
    // still holds them: compaction alone sends no 410. A CRD update (an
    // upgrade) rebuilds that cache at the current revision and closes the
    // open watches, so resuming from an older version is answered 410.
    for crd in ["scsidevices", "scsitargets"] {
        let patch = format!(
            r#"[{{"op":"add","path":"/spec/names/shortNames/-","value":"{crd}-relisted"}}]"#
        );
        plane
            .admin
            .run(&[
                "patch",
                "crd",
                &format!("{crd}.csi-scsi.io"),
                "--type=json",
                "-p",
                &patch,
            ])
            .unwrap();
    }
    // Another writer deletes a device while the watch is down.
    devices
        .delete(wwid(3).as_str(), &DeleteParams::default())
        .await
        .unwrap();
    until("the old resourceVersion to be refused with 410", 30, || {
        let devices = devices.clone();
        let before = before.clone();
        async move {
            let Ok(stream) = devices.watch(&WatchParams::default(), &before).await else {
                return false;
            };
            futures::pin_mut!(stream);
            matches!(stream.next().await, Some(Ok(WatchEvent::Error(e))) if e.code == 410)
        }
    })
    .await;
    // The targets' reflector saw no target change, so a notification now
    // is its InitDone: it re-listed.
    tokio::time::timeout(Duration::from_secs(30), changed.notified())
        .await
        .expect("the SCSITarget reflector re-listed");
    // The devices' watch may meet errors while the API server rebuilds the
    // CRD's storage; the reflector retries with backoff growing to 30 s
    // per try (a CI run once took longer than 30 s in all).
    let reader = &inv;
    until(
        "the deletion, seen through the re-list",
        120,
        move || async move { reader.device(&wwid(3)).await.unwrap().is_none() },
    )
    .await;
    // Reads are right, and writes carry versions the server accepts.
    assert_eq!(get(&inv, 1).await.binding, bound.binding);
    assert_eq!(get(&inv, 2).await.phase, Phase::Available);
    let next = inv.bind(bind_req("pv-2", &[], "")).await.unwrap();
    assert_eq!(next.wwid, wwid(2));
    inv.apply_discovery(round(
        "t1",
        &[("node-a", vec![lun(1, GIB), lun(2, GIB), lun(4, GIB)])],
        &[],
    ))
    .await
    .unwrap();
    let all: Vec<_> = inv
        .devices(None, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|d| (d.wwid, d.phase))
        .collect();
    assert_eq!(
        all,
        [
            (wwid(1), Phase::Bound),
            (wwid(2), Phase::Bound),
            (wwid(4), Phase::Available)
        ]
    );
    plane
        .admin
        .run(&["apply", "-k", &real_kube::deploy("crds").to_string_lossy()])
        .unwrap();
}

async fn get(inv: &Inventory, i: u32) -> csi_scsi_proxy::device::Device {
    inv.device(&wwid(i)).await.unwrap().expect("device")
}

// === what an operator sets, and what `kubectl get` shows ===

/// The server's Table for SCSIDevice `name` (what `kubectl get` prints),
/// as column name to cell, every column (priority 1 included).
async fn table_row(admin: &kube::Client, name: &str) -> BTreeMap<String, Value> {
    let request = hyper::Request::get(format!("/apis/csi-scsi.io/v1alpha1/scsidevices/{name}"))
        .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .body(Vec::new())
        .unwrap();
    let table: Value = admin.request(request).await.unwrap();
    let names = table["columnDefinitions"].as_array().unwrap();
    let cells = table["rows"][0]["cells"].as_array().unwrap();
    names
        .iter()
        .zip(cells)
        .map(|(c, v)| (c["name"].as_str().unwrap().to_owned(), v.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_retired_by_a_merge_patch_stays_retired_through_the_proxy_s_writes_and_kubectl_get_shows_it()
 {
    let _only = real_kube::exclusive().await;
    let admin = real_kube::admin().await;
    let inv = real_kube::inventory(admin.clone()).await;
    inv.apply_discovery(round(
        "t1",
        &[("node-a", vec![lun(1, GIB), lun(2, 3 * GIB / 2)])],
        &[],
    ))
    .await
    .unwrap();
    // What `kubectl patch scsidevice <name> --type merge -p
    // '{"spec":{"retired":true}}'` sends, from another client.
    let devices: Api<SCSIDevice> = Api::all(admin.clone());
    devices
        .patch(
            wwid(1).as_str(),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"retired": true}})),
        )
        .await
        .unwrap();
    // The proxy writes the device at once, perhaps from a cache the patch
    // has not reached: its compare-and-swap reads again, never undoes it.
    inv.apply_discovery(round(
        "t1",
        &[
            ("node-a", vec![lun(1, GIB), lun(2, 3 * GIB / 2)]),
            ("node-b", vec![lun(1, GIB)]),
        ],
        &[],
    ))
    .await
    .unwrap();
    let stored = devices.get(wwid(1).as_str()).await.unwrap();
    assert!(stored.spec.retired, "{stored:?}");
    let seen: Vec<&str> = stored
        .status
        .as_ref()
        .unwrap()
        .node_names
        .iter()
        .map(|n| n.as_str())
        .collect();
    assert_eq!(seen, ["node-a", "node-b"], "the proxy's write went through");
    // The bind passes it over; LUN 2 is bound and published.
    let bound = inv.bind(bind_req("pv-1", &[], "")).await.unwrap();
    assert_eq!(bound.wwid, wwid(2));
    inv.modify(&wwid(2), |d| {
        policy::publish(
            d,
            &bound.binding.as_ref().unwrap().uid,
            crate::devices::publication("node-a"),
        )
        .is_ok()
    })
    .await
    .unwrap();
    let none = inv.bind(bind_req("pv-2", &[], "")).await.unwrap_err();
    assert!(
        matches!(none, InventoryError::NoFit(_)),
        "the retired LUN is never bound: {none}"
    );

    let row = table_row(&admin, wwid(2).as_str()).await;
    assert_eq!(row["LUN"], json!(2));
    assert_eq!(row["Serial"], json!("sn2"));
    assert_eq!(row["Phase"], json!("Bound"));
    assert_eq!(row["Size"], json!("1.5Gi"));
    assert_eq!(row["PV"], json!("pv-1"));
    assert!(
        row["Published"].as_str().unwrap().contains("node-a"),
        "{row:?}"
    );
    assert!(row["Retired"].is_null(), "{row:?}");
    assert!(!row.contains_key("Nodes"), "{row:?}");
    let row = table_row(&admin, wwid(1).as_str()).await;
    assert_eq!(row["Retired"], json!(true), "{row:?}");
    assert_eq!(row["Size"], json!("1Gi"));
    assert!(row["Published"].is_null(), "{row:?}");
}

// === paging ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_inventory_lists_more_than_one_page_of_devices() {
    const DEVICES: u32 = 620;
    let _only = real_kube::exclusive().await;
    let writer = real_kube::inventory(real_kube::admin().await).await;
    let luns: Vec<_> = (0..DEVICES).map(|i| lun(i, GIB)).collect();
    writer
        .apply_discovery(round("t1", &[("node-a", luns)], &[]))
        .await
        .unwrap();
    let (client, log) = admin_logging().await;
    let reader = real_kube::inventory(client).await;
    let all = reader.devices(None, 1000).await.unwrap();
    assert_eq!(all.len(), DEVICES as usize);
    assert_eq!(
        reader.phase_counts().await.unwrap(),
        [(Phase::Available, u64::from(DEVICES))]
    );
    let lists: Vec<String> = log
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.contains("/scsidevices?") && !r.contains("watch=true"))
        .cloned()
        .collect();
    assert_eq!(lists.len(), 2, "two pages of at most 500: {lists:?}");
    assert!(lists[0].contains("limit=500"), "{lists:?}");
    assert!(lists[1].contains("continue="), "{lists:?}");
}

// === the Lease ===

fn lease_config(namespace: &str, identity: &str) -> LeaseConfig {
    LeaseConfig {
        lease_duration: Duration::from_secs(4),
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_millis(250),
        ..LeaseConfig::new(namespace, "csi-scsi-proxy", identity)
    }
}

/// Samples both handles until `stop`; true if both ever led at once.
fn watch_overlap(
    a: LeaderHandle,
    b: LeaderHandle,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<bool> {
    tokio::spawn(async move {
        let mut both = false;
        while !stop.load(Ordering::SeqCst) {
            both |= a.is_leader() && b.is_leader();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        both
    })
}

async fn wait_leads(h: &LeaderHandle, want: bool, secs: u64) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while h.is_leader() != want {
        assert!(Instant::now() < deadline, "leading never became {want}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Instant::now()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_passes_between_two_replicas_and_never_to_both() {
    let ns = "leader-test";
    let plane = real_kube::plane().await;
    let k = &plane.admin;
    k.run(&["create", "namespace", ns]).unwrap();
    k.run(&["create", "serviceaccount", "proxy-b", "-n", ns])
        .unwrap();
    k.run(&[
        "create",
        "role",
        "lease-holder",
        "-n",
        ns,
        "--verb=get,create,update",
        "--resource=leases.coordination.k8s.io",
    ])
    .unwrap();
    let bind = [
        "create",
        "rolebinding",
        "proxy-b",
        "-n",
        ns,
        "--role=lease-holder",
        "--serviceaccount=leader-test:proxy-b",
    ];
    k.run(&bind).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let b_config = plane
        .service_account_kubeconfig(ns, "proxy-b", &dir.path().join("b.kubeconfig"))
        .unwrap();
    let b = LeaderElection::spawn(
        real_kube::client_for(&b_config).await,
        lease_config(ns, "proxy-b"),
    )
    .unwrap();
    let hb = b.handle();
    wait_leads(&hb, true, 15).await;
    // The first holder of a new Lease leads in the first epoch of that
    // Lease: its creation time above, a count of 0 below.
    let first = hb.epoch().expect("leads").0;
    assert_eq!(first & 0xF_FFFF, 0, "{first:#x}");
    assert!(
        first >> 20 > 1_700_000_000,
        "the Lease's creation time: {first:#x}"
    );
    let a = LeaderElection::spawn(real_kube::admin().await, lease_config(ns, "proxy-a")).unwrap();
    let ha = a.handle();
    let stop = Arc::new(AtomicBool::new(false));
    let overlap = watch_overlap(ha.clone(), hb.clone(), stop.clone());
    let leases: Api<Lease> = Api::namespaced(real_kube::admin().await, ns);
    let leases = &leases;
    let holder = move || async move { leases.get("csi-scsi-proxy").await.unwrap().spec.unwrap() };

    // A live Lease is not taken.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(hb.is_leader() && !ha.is_leader());
    assert_eq!(holder().await.holder_identity.as_deref(), Some("proxy-b"));

    // proxy-b loses the right to renew (403 from now on): it stops leading
    // within its renew deadline, and proxy-a takes over only once the Lease
    // has gone unrenewed for a lease duration.
    let cut = Instant::now();
    k.run(&["delete", "rolebinding", "proxy-b", "-n", ns])
        .unwrap();
    let b_stopped = wait_leads(&hb, false, 10).await;
    let a_leads = wait_leads(&ha, true, 15).await;
    assert!(b_stopped <= a_leads);
    assert!(
        b_stopped - cut < Duration::from_secs(4),
        "proxy-b led on for {:?} without renewing",
        b_stopped - cut
    );
    let took = a_leads - cut;
    assert!(
        took >= Duration::from_secs(3) && took <= Duration::from_secs(6),
        "proxy-a took over after {took:?}"
    );
    let spec = holder().await;
    assert_eq!(spec.holder_identity.as_deref(), Some("proxy-a"));
    assert_eq!(spec.lease_transitions, Some(1));
    // Each term is a new leader epoch, which the replica that lost the
    // Lease no longer has.
    assert_eq!(ha.epoch(), Some(LeaderEpoch(first + 1)));
    assert_eq!(hb.epoch(), None);

    // proxy-b may write again; proxy-a steps down and releases the Lease:
    // proxy-b, still campaigning, takes it well within a lease duration.
    k.run(&bind).unwrap();
    let released = Instant::now();
    a.step_down().await;
    assert!(!ha.is_leader());
    let b_leads = wait_leads(&hb, true, 10).await;
    assert!(
        b_leads - released < Duration::from_secs(2),
        "{:?}",
        b_leads - released
    );
    assert_eq!(holder().await.holder_identity.as_deref(), Some("proxy-b"));
    // A Lease taken after a release is a new term too: proxy-b leads in
    // epoch 2, above proxy-a's 1, so an agent refuses proxy-a's calls.
    assert_eq!(hb.epoch(), Some(LeaderEpoch(first + 2)));
    assert_eq!(holder().await.lease_transitions, Some(2));
    stop.store(true, Ordering::SeqCst);
    assert!(!overlap.await.unwrap(), "both replicas led at once");
    b.step_down().await;
}

// === RBAC ===

/// The shipped RBAC, applied in the driver's namespace.
pub(crate) fn apply_rbac(plane: &csi_scsi_testbed::kube::ControlPlane) {
    let rbac = real_kube::deploy("rbac/controller.yaml");
    plane
        .admin
        .run(&["apply", "-n", NAMESPACE, "-f", &rbac.to_string_lossy()])
        .unwrap();
}

async fn as_service_account(account: &str, dir: &Path) -> kube::Client {
    let plane = real_kube::plane().await;
    let config = plane
        .service_account_kubeconfig(
            NAMESPACE,
            account,
            &dir.join(format!("{account}.kubeconfig")),
        )
        .unwrap();
    real_kube::client_for(&config).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_rbac_lets_the_proxy_do_its_work() {
    let _only = real_kube::exclusive().await;
    let plane = real_kube::plane().await;
    apply_rbac(plane);
    let dir = tempfile::tempdir().unwrap();
    let client = as_service_account("csi-scsi-proxy", dir.path()).await;
    // The Lease in the driver's namespace.
    let election =
        LeaderElection::spawn(client.clone(), lease_config(NAMESPACE, "proxy-0")).unwrap();
    wait_leads(&election.handle(), true, 15).await;
    // Targets are the administrator's; the proxy reads them.
    let admin = real_kube::admin().await;
    Api::<DynamicObject>::all_with(admin.clone(), &erased::<SCSITarget>())
        .create(
            &PostParams::default(),
            &object::<SCSITarget>(
                "t1",
                json!({"spec": {"iscsi": {"portals": ["198.18.0.1:3260"], "iqn": "iqn.2026-01.io.csi-scsi:a"}}}),
            ),
        )
        .await
        .unwrap();
    let store = real_kube::store(client.clone(), Some(election.handle())).await;
    let inv = Inventory::new(Arc::new(store));
    let reader = &inv;
    until("the target in the cache", 10, move || async move {
        reader.targets().await.unwrap().len() == 1
    })
    .await;
    // Discovery: device creates, spec and status writes; the target status.
    let out = inv
        .apply_discovery(round(
            "t1",
            &[("node-a", vec![lun(1, GIB), lun(2, GIB)])],
            &[],
        ))
        .await
        .unwrap();
    assert_eq!(out.added, [wwid(1), wwid(2)]);
    // A LUN that grew: a spec write.
    inv.apply_discovery(round(
        "t1",
        &[("node-a", vec![lun(1, GIB), lun(2, 2 * GIB)])],
        &[],
    ))
    .await
    .unwrap();
    assert_eq!(get(&inv, 2).await.size_bytes, 2 * GIB);
    let bound = inv.bind(bind_req("pv-1", &[], "")).await.unwrap();
    // The finalizers of a bound device and of its target: `update` on both.
    let devices = Api::<SCSIDevice>::all(admin.clone());
    assert_eq!(
        finalizers(&devices, bound.wwid.as_str()).await,
        Some(vec![DEVICE_FINALIZER.to_owned()])
    );
    let target = Api::<SCSITarget>::all(admin.clone())
        .get("t1")
        .await
        .unwrap();
    assert_eq!(
        target.metadata.finalizers,
        Some(vec![TARGET_FINALIZER.to_owned()]),
        "the target-in-use finalizer was not written: is `update` on scsitargets granted?"
    );
    let mut failed = inv.device(&bound.wwid).await.unwrap().unwrap();
    failed.wipe_failures = 1;
    inv.update(failed).await.unwrap();
    let target = Api::<SCSITarget>::all(admin.clone())
        .get("t1")
        .await
        .unwrap();
    assert_eq!(
        target.status.and_then(|s| s.phase).as_deref(),
        Some("Ready"),
        "the SCSITarget status was not written: is `update` on scsitargets/status granted?"
    );
    // A resize request beside the claim (none here: the driver's
    // namespace), its spec and status updated.
    let mut request = ResizeRequest {
        name: "resize-pv-1".into(),
        volume_id: bound.volume_id().unwrap(),
        wwid: bound.wwid.clone().to_string(),
        requested_bytes: 2 * GIB,
        current_bytes: GIB,
        created: 0,
        done: false,
    };
    inv.put_resize(request.clone()).await.unwrap();
    request.requested_bytes = 3 * GIB;
    inv.put_resize(request.clone()).await.unwrap();
    request.done = true;
    inv.put_resize(request).await.unwrap();
    // Done: deleted (`delete` on pendingresizerequests).
    assert!(
        Api::<PendingResizeRequest>::namespaced(admin.clone(), NAMESPACE)
            .get_opt("resize-pv-1")
            .await
            .unwrap()
            .is_none()
    );
    // Released: both finalizers come off again.
    inv.modify(&bound.wwid, policy::start_release)
        .await
        .unwrap();
    inv.modify(&bound.wwid, |d| {
        policy::released(d);
        true
    })
    .await
    .unwrap();
    assert_eq!(finalizers(&devices, bound.wwid.as_str()).await, None);
    assert_eq!(
        Api::<SCSITarget>::all(admin.clone())
            .get("t1")
            .await
            .unwrap()
            .metadata
            .finalizers,
        None
    );
    // A phantom (never bound, no node has reported it for longer than
    // the forget time, every node answered): `delete` on scsidevices.
    let mut old = inv.device(&wwid(2)).await.unwrap().unwrap();
    old.last_seen -= 3 * policy::LAST_SEEN_RESOLUTION;
    inv.update(old).await.unwrap();
    let out = inv
        .apply_discovery_pruning(
            round("t1", &[("node-a", vec![lun(1, GIB)])], &[]),
            &|_| false,
            Some(policy::LAST_SEEN_RESOLUTION),
        )
        .await
        .unwrap();
    assert_eq!(out.forgotten, [wwid(2)], "{out:?}");
    assert!(out.failed.is_empty(), "{out:?}");
    assert!(devices.get_opt(wwid(2).as_str()).await.unwrap().is_none());
    // And it is the service account at work: what the role does not
    // grant is refused.
    let err = Api::<SCSITarget>::all(client)
        .delete("t1", &DeleteParams::default())
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(403), "{err}");
    // Through the store, that 403 keeps its source and is no retryable
    // outage: the caller gets INTERNAL, not UNAVAILABLE.
    let err = inv.remove_target("t1").await.unwrap_err();
    assert!(matches!(err, InventoryError::ApiRefused(_)), "{err:?}");
    let source = std::error::Error::source(&err).and_then(|s| s.downcast_ref::<kube::Error>());
    assert_eq!(source.and_then(api_code), Some(403), "{err:?}");
    let status = tonic::Status::from(csi_scsi_proxy::error::ProxyError::from(err));
    assert_eq!(status.code(), tonic::Code::Internal, "{status}");
    election.step_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_device_status_rule_discovery_fails_with_403() {
    let _only = real_kube::exclusive().await;
    let plane = real_kube::plane().await;
    apply_rbac(plane);
    // The shipped role less its scsidevices/status rule, for another account.
    let mut role = plane
        .admin
        .get_json(&["clusterrole", "csi-scsi-proxy"])
        .unwrap();
    let rules = role["rules"].as_array_mut().unwrap();
    let before = rules.len();
    rules.retain(|r| r["resources"] != json!(["scsidevices/status"]));
    assert_eq!(rules.len(), before - 1, "the rule is in the shipped role");
    role["metadata"] = json!({"name": "csi-scsi-proxy-trimmed"});
    plane.admin.apply(&role.to_string()).unwrap();
    let _ = plane.admin.run(&[
        "create",
        "serviceaccount",
        "csi-scsi-trimmed",
        "-n",
        NAMESPACE,
    ]);
    let _ = plane.admin.run(&[
        "create",
        "clusterrolebinding",
        "csi-scsi-trimmed",
        "--clusterrole=csi-scsi-proxy-trimmed",
        "--serviceaccount=csi-scsi:csi-scsi-trimmed",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let client = as_service_account("csi-scsi-trimmed", dir.path()).await;
    let inv = real_kube::inventory(client).await;
    // The device's failure is its own: in the outcome, the round merged.
    let out = inv
        .apply_discovery(round("t1", &[("node-a", vec![lun(1, GIB)])], &[]))
        .await
        .unwrap();
    assert!(out.added.is_empty(), "{out:?}");
    let [(failed, why)] = out.failed.as_slice() else {
        panic!("one device failed: {out:?}");
    };
    assert_eq!(*failed, wwid(1));
    assert!(why.contains("403") || why.contains("forbidden"), "{why}");
    // The create went through; the status never did: the device is Lost
    // and no bind can take it.
    let stored = Api::<SCSIDevice>::all(real_kube::admin().await)
        .get(wwid(1).as_str())
        .await
        .unwrap();
    assert!(stored.status.is_none());
    let err = inv.bind(bind_req("pv-1", &[], "")).await.unwrap_err();
    assert!(matches!(err, InventoryError::NoFit(_)), "{err}");
}

/// The proxy's own SCSITarget status writes must not wake discovery (each
/// pass writes them, so discovery would run back to back, as the
/// Kubernetes lab once showed); a change of the target's spec must.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_status_write_does_not_wake_discovery_but_a_spec_change_does() {
    let _only = real_kube::exclusive().await;
    let plane = real_kube::plane().await;
    let admin = real_kube::admin().await;
    plane
        .admin
        .apply(
            r#"{"apiVersion":"csi-scsi.io/v1alpha1","kind":"SCSITarget","metadata":{"name":"t1"},
                "spec":{"iscsi":{"portals":["127.0.0.1:3260"],"iqn":"iqn.2026-11.io.example:t1"},
                "deviceLabels":{"tier":"fast"}}}"#,
        )
        .unwrap();
    let store = real_kube::store(admin.clone(), None).await;
    let inv = Inventory::new(Arc::new(store.clone()));
    let reader = &inv;
    until("the target in the cache", 10, move || async move {
        reader
            .targets()
            .await
            .unwrap()
            .iter()
            .any(|t| t.name == "t1")
    })
    .await;
    let changed = store.targets_changed();
    while tokio::time::timeout(Duration::from_millis(500), changed.notified())
        .await
        .is_ok()
    {}

    // A discovery round writes the target's status (its nodes)...
    inv.apply_discovery(round("t1", &[("node-a", vec![lun(1, GIB)])], &[]))
        .await
        .unwrap();
    let kubectl = &plane.admin;
    until("the target's status written", 10, move || async move {
        let t = kubectl.get_json(&["scsitarget", "t1"]).unwrap();
        t["status"]["nodes"]
            .as_array()
            .is_some_and(|n| !n.is_empty())
    })
    .await;
    // ...and wakes no one.
    assert!(
        tokio::time::timeout(Duration::from_secs(2), changed.notified())
            .await
            .is_err(),
        "a status write woke discovery"
    );

    // An administrator's change of the spec does.
    plane
        .admin
        .run(&[
            "patch",
            "scsitarget",
            "t1",
            "--type=merge",
            "-p",
            r#"{"spec":{"deviceLabels":{"tier":"slow"}}}"#,
        ])
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), changed.notified())
        .await
        .expect("a spec change wakes discovery");
}
