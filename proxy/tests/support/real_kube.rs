//! The real kube-apiserver (and etcd) the Kubernetes backend tests run
//! against: one per test binary (`csi_scsi_testbed::kube::shared_plane`),
//! with the CRDs of `deploy/crds` and the driver's namespace. The
//! csi-scsi.io kinds are cluster-scoped, so tests that need an empty
//! inventory take [`exclusive`], which serialises them and deletes every
//! csi-scsi.io object first.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_scsi_proxy::inventory::{Inventory, KubeInventory, KubeInventoryConfig};
use csi_scsi_proxy::leader::LeaderHandle;
use csi_scsi_proxy::resources::{PendingResizeRequest, SCSIDevice, SCSITarget};
use csi_scsi_testbed::kube::{ControlPlane, shared_plane};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

/// The driver's namespace.
pub const NAMESPACE: &str = "csi-scsi";

/// Serialises the tests that need the csi-scsi.io kinds to themselves.
static EXCLUSIVE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A directory of this repository's `deploy/`.
pub fn deploy(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(sub)
}

/// The binary's control plane, CRDs installed (started on first call).
pub async fn plane() -> &'static ControlPlane {
    tokio::task::spawn_blocking(|| {
        shared_plane(|p| {
            let crds = deploy("crds");
            p.admin.run(&["apply", "-k", &crds.to_string_lossy()])?;
            p.admin.run(&[
                "wait",
                "--for=condition=Established",
                "crd",
                "--all",
                "--timeout=60s",
            ])?;
            p.admin.run(&["create", "namespace", NAMESPACE])?;
            Ok(())
        })
    })
    .await
    .expect("control plane start-up")
}

/// A client with the identity of `kubeconfig`.
pub async fn client_for(kubeconfig: &Path) -> Client {
    client_logging(kubeconfig, None).await
}

/// A client that also appends each request's method and URI to `log`.
pub async fn client_logging(kubeconfig: &Path, log: Option<Arc<Mutex<Vec<String>>>>) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("client config");
    config.read_timeout = Some(Duration::from_secs(60));
    let builder = kube::client::ClientBuilder::try_from(config).expect("client");
    match log {
        None => builder.build(),
        Some(log) => builder
            .with_layer(&tower::util::MapRequestLayer::new(
                move |req: tonic::codegen::http::Request<kube::client::Body>| {
                    log.lock()
                        .expect("log")
                        .push(format!("{} {}", req.method(), req.uri()));
                    req
                },
            ))
            .build(),
    }
}

/// A cluster-admin client.
pub async fn admin() -> Client {
    client_for(plane().await.admin.kubeconfig()).await
}

/// The csi-scsi.io kinds to the holder alone, every object deleted.
pub struct Exclusive {
    _guard: tokio::sync::MutexGuard<'static, ()>,
}

/// Waits for the other exclusive tests, then empties the inventory.
pub async fn exclusive() -> Exclusive {
    let guard = EXCLUSIVE.lock().await;
    let admin = admin().await;
    let all = (DeleteParams::default(), ListParams::default());
    // A bound device or a target in use carries the proxy's finalizer; no
    // proxy is left to take it off.
    drop_finalizers(&Api::<SCSIDevice>::all(admin.clone())).await;
    drop_finalizers(&Api::<SCSITarget>::all(admin.clone())).await;
    Api::<SCSIDevice>::all(admin.clone())
        .delete_collection(&all.0, &all.1)
        .await
        .expect("delete SCSIDevices");
    Api::<SCSITarget>::all(admin.clone())
        .delete_collection(&all.0, &all.1)
        .await
        .expect("delete SCSITargets");
    Api::<PendingResizeRequest>::namespaced(admin, NAMESPACE)
        .delete_collection(&all.0, &all.1)
        .await
        .expect("delete PendingResizeRequests");
    Exclusive { _guard: guard }
}

/// Removes every finalizer of every object of `api`.
async fn drop_finalizers<K>(api: &Api<K>)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let none = serde_json::json!({"metadata": {"finalizers": null}});
    for o in api.list(&ListParams::default()).await.expect("list").items {
        if o.meta().finalizers.as_ref().is_some_and(|f| !f.is_empty()) {
            let name = o.meta().name.clone().unwrap_or_default();
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&none))
                .await
                .expect("drop finalizers");
        }
    }
}

/// The Kubernetes store over `client`, once its caches listed.
pub async fn store(client: Client, leader: Option<LeaderHandle>) -> KubeInventory {
    let store = KubeInventory::start(
        client,
        KubeInventoryConfig {
            namespace: NAMESPACE.into(),
            sync_timeout: Duration::from_secs(30),
            leader,
            events: None,
        },
    );
    store.wait_until_ready().await.expect("caches listed");
    store
}

/// An inventory over the store over `client`.
pub async fn inventory(client: Client) -> Inventory {
    Inventory::new(Arc::new(store(client, None).await))
}
