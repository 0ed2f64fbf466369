//! Finalizers, ownerReferences and CHAP Secrets through the API, on the
//! real kube-apiserver (the fake deletes at once and ignores finalizers).
//! There is no kube-controller-manager in the test plane: garbage
//! collection never runs, so the ownerReference itself is asserted.

use std::sync::{Arc, Mutex};

use csi_scsi_contract::Wwid;
use csi_scsi_proxy::device::{Device, Phase, ResizeRequest, SecretRef, policy};
use csi_scsi_proxy::error::ProxyError;
use csi_scsi_proxy::inventory::{Inventory, InventoryError};
use csi_scsi_proxy::resources::{
    DEVICE_FINALIZER, PendingResizeRequest, SCSIDevice, SCSITarget, TARGET_FINALIZER,
};
use csi_scsi_proxy::secrets::{KubeSecrets, SecretError, SecretSource};
use csi_scsi_proxy::selector::Selector;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tonic::Code;

use crate::devices::{bind_req, lun, round, wwid};
use crate::real_api::{api_code, apply_rbac, claimed_volume, erased, object, until};
use crate::real_kube::{self, NAMESPACE};

const GIB: u64 = 1 << 30;

fn everything() -> Selector {
    Selector::parse("").unwrap()
}

fn finalizers<K: Resource>(o: &K) -> Vec<String> {
    o.meta().finalizers.clone().unwrap_or_default()
}

/// Creates SCSITarget `name` (iSCSI) as the administrator would.
async fn create_target(admin: &kube::Client, name: &str) {
    Api::<DynamicObject>::all_with(admin.clone(), &erased::<SCSITarget>())
        .create(
            &PostParams::default(),
            &object::<SCSITarget>(
                name,
                json!({"spec": {"iscsi": {"portals": ["198.18.0.1:3260"], "iqn": "iqn.2026-01.io.csi-scsi:a"}}}),
            ),
        )
        .await
        .unwrap();
}

/// The volume on `wwid` deleted and its LUN wiped: free again.
async fn release(inv: &Inventory, wwid: &Wwid) -> Device {
    inv.modify(wwid, policy::start_release).await.unwrap();
    inv.modify(wwid, |d| {
        policy::released(d);
        true
    })
    .await
    .unwrap()
    .unwrap()
}

/// Waits until the inventory's cache shows `wwid` marked for deletion.
async fn until_cached_deleting(inv: &Inventory, devices: &Api<SCSIDevice>, wwid: &Wwid) {
    // The cache has no deletionTimestamp accessor through the inventory;
    // the server has it, and a later read of the cache sees at least that
    // version once the watch delivered it.
    let rv = devices
        .get(wwid.as_str())
        .await
        .unwrap()
        .resource_version()
        .unwrap();
    let rv: i64 = rv.parse().unwrap();
    until("the deletion in the cache", 10, || async move {
        inv.device(wwid)
            .await
            .unwrap()
            .is_some_and(|d| d.generation >= rv)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_device_deleted_stays_bound_until_released_then_is_rediscovered() {
    let _only = real_kube::exclusive().await;
    let admin = real_kube::admin().await;
    let devices = Api::<SCSIDevice>::all(admin.clone());
    let inv = real_kube::inventory(admin.clone()).await;
    let seen = || round("t1", &[("node-a", vec![lun(1, GIB)])], &[]);
    inv.apply_discovery(seen()).await.unwrap();
    assert!(finalizers(&devices.get(wwid(1).as_str()).await.unwrap()).is_empty());
    let bound = inv.bind(bind_req("pv-1", &[], "")).await.unwrap();
    let before = devices.get(wwid(1).as_str()).await.unwrap();
    assert_eq!(finalizers(&before), [DEVICE_FINALIZER]);

    // `kubectl delete scsidevice`: only marked.
    devices
        .delete(wwid(1).as_str(), &DeleteParams::default())
        .await
        .unwrap();
    let marked = devices.get(wwid(1).as_str()).await.unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    until_cached_deleting(&inv, &devices, &wwid(1)).await;
    // Discovery still sees the LUN: it stays the same bound object, never
    // a new Available one.
    let out = inv.apply_discovery(seen()).await.unwrap();
    assert!(out.added.is_empty(), "{out:?}");
    let still = inv.device(&wwid(1)).await.unwrap().unwrap();
    assert_eq!(still.phase, Phase::Bound);
    assert_eq!(still.binding, bound.binding);
    assert_eq!(
        devices.get(wwid(1).as_str()).await.unwrap().uid(),
        before.uid()
    );
    let err = inv.bind(bind_req("pv-2", &[], "")).await.unwrap_err();
    assert!(matches!(err, InventoryError::NoFit(_)), "{err}");

    // Released: the finalizer comes off and the deletion completes.
    let freed = release(&inv, &wwid(1)).await;
    assert_eq!(freed.phase, Phase::Available);
    let server = &devices;
    until("the device deleted", 10, || async move {
        server.get_opt(wwid(1).as_str()).await.unwrap().is_none()
    })
    .await;
    let reader = &inv;
    until("the deletion in the cache", 10, || async move {
        reader.device(&wwid(1)).await.unwrap().is_none()
    })
    .await;
    // The next round re-creates it, Available, as a new object.
    let out = inv.apply_discovery(seen()).await.unwrap();
    assert_eq!(out.added, [wwid(1)]);
    let again = devices.get(wwid(1).as_str()).await.unwrap();
    assert_ne!(again.uid(), before.uid());
    assert!(finalizers(&again).is_empty());
    assert_eq!(again.status.unwrap().phase, Phase::Available);
    assert_eq!(
        inv.bind(bind_req("pv-3", &[], "")).await.unwrap().wwid,
        wwid(1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_marked_for_deletion_is_never_bound() {
    let _only = real_kube::exclusive().await;
    let admin = real_kube::admin().await;
    let devices = Api::<SCSIDevice>::all(admin.clone());
    let inv = real_kube::inventory(admin.clone()).await;
    inv.apply_discovery(round(
        "t1",
        &[("node-a", vec![lun(1, GIB), lun(2, GIB)])],
        &[],
    ))
    .await
    .unwrap();
    // Another party's finalizer keeps the Available device 1 in place,
    // marked for deletion.
    let hold = json!({"metadata": {"finalizers": ["example.com/hold"]}});
    devices
        .patch(
            wwid(1).as_str(),
            &PatchParams::default(),
            &Patch::Merge(&hold),
        )
        .await
        .unwrap();
    devices
        .delete(wwid(1).as_str(), &DeleteParams::default())
        .await
        .unwrap();
    until_cached_deleting(&inv, &devices, &wwid(1)).await;
    assert_eq!(
        inv.device(&wwid(1)).await.unwrap().unwrap().phase,
        Phase::Available
    );
    let first = inv.bind(bind_req("pv-1", &[], "")).await.unwrap();
    assert_eq!(first.wwid, wwid(2));
    let err = inv.bind(bind_req("pv-2", &[], "")).await.unwrap_err();
    assert!(matches!(err, InventoryError::NoFit(_)), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_in_use_stays_until_its_last_volume_is_released() {
    let _only = real_kube::exclusive().await;
    let admin = real_kube::admin().await;
    let targets = Api::<SCSITarget>::all(admin.clone());
    create_target(&admin, "t1").await;
    let inv = real_kube::inventory(admin.clone()).await;
    let reader = &inv;
    until("the target in the cache", 10, || async move {
        reader.targets().await.unwrap().len() == 1
    })
    .await;
    inv.apply_discovery(round(
        "t1",
        &[("node-a", vec![lun(1, GIB), lun(2, GIB)])],
        &[],
    ))
    .await
    .unwrap();
    assert!(finalizers(&targets.get("t1").await.unwrap()).is_empty());
    let bound = inv.bind(bind_req("pv-1", &[], "")).await.unwrap();
    assert_eq!(
        finalizers(&targets.get("t1").await.unwrap()),
        [TARGET_FINALIZER]
    );

    targets
        .delete("t1", &DeleteParams::default())
        .await
        .unwrap();
    let marked = targets.get("t1").await.unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    // Once the cache has the deletion, the leaving target offers nothing.
    until("the target's deletion in the cache", 10, || async move {
        reader.capacity(&[], &everything(), 0).await.unwrap() == (0, 0)
    })
    .await;
    // Still listed for attach and detach of the bound volume...
    assert_eq!(inv.targets().await.unwrap()[0].name, "t1");
    // ...but no device reached only through it takes a new volume.
    let err = inv.bind(bind_req("pv-2", &[], "")).await.unwrap_err();
    assert!(matches!(err, InventoryError::NoFit(_)), "{err}");
    // A discovery round of the leaving target keeps the finalizer.
    inv.apply_discovery(round(
        "t1",
        &[("node-a", vec![lun(1, GIB), lun(2, GIB)])],
        &[],
    ))
    .await
    .unwrap();
    assert_eq!(
        finalizers(&targets.get("t1").await.unwrap()),
        [TARGET_FINALIZER]
    );

    release(&inv, &bound.wwid).await;
    let server = &targets;
    until("the target deleted", 10, || async move {
        server.get_opt("t1").await.unwrap().is_none()
    })
    .await;
}

// === PendingResizeRequest and its claim ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resize_request_is_owned_by_its_claim_and_deleted_once_done() {
    let _only = real_kube::exclusive().await;
    let admin = real_kube::admin().await;
    let ns = "apps-resize";
    let (claim_uid, _) = claimed_volume(&admin, ns, "pv-resize").await;

    let inv = real_kube::inventory(admin.clone()).await;
    inv.apply_discovery(round("t1", &[("node-a", vec![lun(1, GIB)])], &[]))
        .await
        .unwrap();
    let bound = inv.bind(bind_req("pv-resize", &[], "")).await.unwrap();
    let mut request = ResizeRequest {
        name: "resize-pv-resize".into(),
        volume_id: bound.volume_id().unwrap(),
        wwid: bound.wwid.clone().to_string(),
        requested_bytes: 2 * GIB,
        current_bytes: GIB,
        created: 0,
        done: false,
    };
    inv.put_resize(request.clone()).await.unwrap();
    let requests = Api::<PendingResizeRequest>::namespaced(admin.clone(), ns);
    let stored = requests.get("resize-pv-resize").await.unwrap();
    let owners = stored.owner_references();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(owners[0].kind, "PersistentVolumeClaim");
    assert_eq!(owners[0].api_version, "v1");
    assert_eq!(owners[0].name, "data");
    assert_eq!(owners[0].uid, claim_uid);

    request.done = true;
    request.current_bytes = 2 * GIB;
    inv.put_resize(request).await.unwrap();
    assert!(
        requests
            .get_opt("resize-pv-resize")
            .await
            .unwrap()
            .is_none()
    );

    Api::<PersistentVolume>::all(admin.clone())
        .delete("pv-resize", &DeleteParams::default())
        .await
        .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(admin.clone(), ns)
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
}

// === CHAP Secrets through the API ===

fn chap_secret(name: &str, keys: &[(&str, &str)]) -> Secret {
    let data: serde_json::Map<String, serde_json::Value> = keys
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    serde_json::from_value(json!({"metadata": {"name": name}, "stringData": data})).unwrap()
}

fn code(e: SecretError) -> (Code, String) {
    let s = tonic::Status::from(ProxyError::from(e));
    (s.code(), s.message().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chap_secrets_are_read_from_the_driver_namespace_only() {
    let plane = real_kube::plane().await;
    apply_rbac(plane);
    let admin = real_kube::admin().await;
    let secrets = Api::<Secret>::namespaced(admin.clone(), NAMESPACE);
    for (name, keys) in [
        (
            "chap-array-a",
            &[("username", "initiator-a"), ("password", "s3cret-value-a")][..],
        ),
        ("chap-half", &[("username", "initiator-h")][..]),
    ] {
        let _ = secrets.delete(name, &DeleteParams::default()).await;
        secrets
            .create(&PostParams::default(), &chap_secret(name, keys))
            .await
            .unwrap();
    }
    let _ = Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "tenant"}})).unwrap(),
        )
        .await;
    let _ = Api::<Secret>::namespaced(admin.clone(), "tenant")
        .create(
            &PostParams::default(),
            &chap_secret("chap-array-a", &[("username", "u"), ("password", "p")]),
        )
        .await;

    // The proxy's identity, every request it sends logged.
    let dir = tempfile::tempdir().unwrap();
    let config = plane
        .service_account_kubeconfig(
            NAMESPACE,
            "csi-scsi-proxy",
            &dir.path().join("proxy.kubeconfig"),
        )
        .unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let client = real_kube::client_logging(&config, Some(log.clone())).await;
    let source = KubeSecrets::new(client.clone(), NAMESPACE);
    let reference = |name: &str, namespace: &str| SecretRef {
        name: name.into(),
        namespace: namespace.into(),
    };

    // In the driver's namespace, named or by default.
    for ns in ["", NAMESPACE] {
        let creds = source.chap(&reference("chap-array-a", ns)).await.unwrap();
        assert_eq!(creds.username, "initiator-a");
        assert_eq!(creds.password, "s3cret-value-a");
        assert_eq!(creds.mutual_username, "");
    }

    // Another namespace: refused before any request.
    log.lock().unwrap().clear();
    let err = source
        .chap(&reference("chap-array-a", "tenant"))
        .await
        .unwrap_err();
    assert!(matches!(err, SecretError::ForeignNamespace { .. }), "{err}");
    assert!(log.lock().unwrap().is_empty(), "{:?}", log.lock().unwrap());
    let (c, message) = code(err);
    assert_eq!(c, Code::FailedPrecondition);
    assert!(message.contains("tenant/chap-array-a"), "{message}");
    assert!(message.contains(NAMESPACE), "{message}");

    // Missing Secret, missing key: retryable, named, never a value.
    let err = source
        .chap(&reference("chap-absent", ""))
        .await
        .unwrap_err();
    assert!(matches!(err, SecretError::NotFound(_)), "{err}");
    let (c, message) = code(err);
    assert_eq!(c, Code::Unavailable);
    assert!(message.contains("csi-scsi/chap-absent"), "{message}");
    let err = source.chap(&reference("chap-half", "")).await.unwrap_err();
    let (c, message) = code(err);
    assert_eq!(c, Code::Unavailable);
    assert!(
        message.contains("chap-half") && message.contains("password"),
        "{message}"
    );
    assert!(!message.contains("initiator-h"), "{message}");

    // The Role reaches no further than the driver's namespace.
    let err = Api::<Secret>::namespaced(client, "tenant")
        .get("chap-array-a")
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(403), "{err}");

    // The sidecars' identity (what code running in a sidecar holds): no
    // Secret anywhere, neither the CHAP Secret the proxy just read nor
    // one like the CA's, and no list.
    let _ = secrets
        .create(
            &PostParams::default(),
            &chap_secret("csi-scsi-ca", &[("ca.key", "not-a-real-key")]),
        )
        .await;
    let config = plane
        .service_account_kubeconfig(
            NAMESPACE,
            "csi-scsi-sidecars",
            &dir.path().join("sidecars.kubeconfig"),
        )
        .unwrap();
    let sidecars = real_kube::client_for(&config).await;
    for (ns, name) in [
        (NAMESPACE, "chap-array-a"),
        (NAMESPACE, "csi-scsi-ca"),
        ("tenant", "chap-array-a"),
    ] {
        let err = Api::<Secret>::namespaced(sidecars.clone(), ns)
            .get(name)
            .await
            .unwrap_err();
        assert_eq!(api_code(&err), Some(403), "{ns}/{name}: {err}");
    }
    let err = Api::<Secret>::all(sidecars.clone())
        .list(&Default::default())
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(403), "{err}");
    // The same identity does the sidecars' own work: the refusals are
    // RBAC's, not a broken token.
    Api::<PersistentVolume>::all(sidecars)
        .list(&Default::default())
        .await
        .unwrap();
}
