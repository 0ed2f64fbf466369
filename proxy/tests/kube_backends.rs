//! The Kubernetes backends against a real kube-apiserver and etcd, started
//! once for this binary (`support/real_kube.rs`): what each backend does
//! with Pods, Nodes, Leases and the csi-scsi.io kinds, how it behaves on
//! 409s, deleted Pods and expiring Leases, and ControllerUnpublish over
//! them. What every inventory store does is not here: `inventory.rs` runs
//! that contract over this store. `real_api` is what only a real server
//! shows (schema and CEL, the status subresource, 410 and re-list, paging,
//! two writers, the Lease between two replicas, RBAC). A local fake server
//! (`kube_backends/fake_api.rs`) stays for request bodies, writes the watch
//! never delivers, and injected faults; its module doc lists its tests.
//! One test binary, submodules below, to link kube once.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![warn(clippy::assertions_on_result_states)]

#[path = "kube_backends/crds.rs"]
mod crds;
#[path = "support/devices.rs"]
mod devices;
#[path = "kube_backends/directory.rs"]
mod directory;
#[path = "kube_backends/enrolment.rs"]
mod enrolment;
#[path = "kube_backends/fake_api.rs"]
mod fake_api;
#[path = "kube_backends/finalizers.rs"]
mod finalizers;
#[path = "kube_backends/inventory.rs"]
mod inventory;
#[path = "kube_backends/leader.rs"]
mod leader;
#[path = "support/lifecycle.rs"]
mod lifecycle_support;
#[path = "kube_backends/node_labels.rs"]
mod node_labels;
#[path = "kube_backends/real_api.rs"]
mod real_api;
#[path = "support/real_kube.rs"]
mod real_kube;
#[path = "kube_backends/target_refusal.rs"]
mod target_refusal;
#[path = "kube_backends/unpublish.rs"]
mod unpublish;

use std::time::Duration;

/// How long a test waits for something to become true before it fails.
pub fn patience() -> Duration {
    let secs = std::env::var("KUBE_TEST_PATIENCE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    Duration::from_secs(secs)
}

/// Polls `check` until it holds or patience runs out.
pub async fn eventually<F: FnMut() -> bool>(what: &str, mut check: F) {
    let deadline = tokio::time::Instant::now() + patience();
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
