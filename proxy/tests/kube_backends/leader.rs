//! Leader election through a Lease: acquired, renewed, lost to another
//! replica after it expired, released on step-down.

use std::time::Duration;

use csi_scsi_proxy::leader::{LeaderElection, LeaderGate, LeaseConfig};
use tonic::service::Interceptor;

use crate::eventually;
use crate::fake_api::FakeApi;

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/csi-scsi/leases";

fn config(identity: &str) -> LeaseConfig {
    LeaseConfig {
        lease_duration: Duration::from_millis(1500),
        renew_deadline: Duration::from_millis(1000),
        retry_period: Duration::from_millis(100),
        ..LeaseConfig::new("csi-scsi", "csi-scsi-proxy", identity)
    }
}

fn holder(api: &FakeApi) -> Option<String> {
    api.get("leases", "csi-scsi", "csi-scsi-proxy")?["spec"]["holderIdentity"]
        .as_str()
        .map(str::to_owned)
}

#[tokio::test]
async fn the_lease_is_acquired_renewed_and_lost_to_a_replica_after_it_expired() {
    let api = FakeApi::start().await;
    let a = LeaderElection::spawn(api.client(), config("proxy-a")).unwrap();
    let leader_a = a.handle();
    eventually("proxy-a leads", || leader_a.is_leader()).await;
    let create = api.writes().into_iter().next().unwrap();
    assert_eq!(
        (create.method.as_str(), create.path.as_str()),
        ("POST", LEASES)
    );
    assert_eq!(create.body["spec"]["holderIdentity"], "proxy-a");
    assert_eq!(create.body["spec"]["leaseDurationSeconds"], 1);

    // Renewals: guarded replaces that move renewTime forward.
    eventually("two renewals", || {
        api.writes().iter().filter(|w| w.method == "PUT").count() >= 2
    })
    .await;
    let puts: Vec<_> = api
        .writes()
        .into_iter()
        .filter(|w| w.method == "PUT")
        .collect();
    assert!(
        puts.iter()
            .all(|p| p.path == format!("{LEASES}/csi-scsi-proxy"))
    );
    assert!(
        puts.iter()
            .all(|p| p.body["metadata"]["resourceVersion"].is_string()),
        "renewals carry the resourceVersion"
    );
    assert!(
        puts[1].body["spec"]["renewTime"].as_str() >= puts[0].body["spec"]["renewTime"].as_str()
    );
    assert_eq!(puts[1].body["spec"]["holderIdentity"], "proxy-a");

    // A second replica waits while proxy-a renews.
    let b = LeaderElection::spawn(api.client(), config("proxy-b")).unwrap();
    let leader_b = b.handle();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(
        leader_a.is_leader() && !leader_b.is_leader(),
        "proxy-b took a live Lease"
    );
    assert_eq!(holder(&api).as_deref(), Some("proxy-a"));

    // proxy-a can no longer renew (cut off from the API server): it steps
    // down within its renew deadline, and proxy-b takes over once the
    // Lease has gone unrenewed for a lease duration.
    api.rule(Box::new(|r| {
        (r.method == "PUT" && r.body["spec"]["holderIdentity"] == "proxy-a").then_some(503)
    }));
    eventually("proxy-a steps down", || !leader_a.is_leader()).await;
    eventually("proxy-b leads", || leader_b.is_leader()).await;
    let lease = api.get("leases", "csi-scsi", "csi-scsi-proxy").unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "proxy-b");
    assert_eq!(lease["spec"]["leaseTransitions"], 1);
    drop(a);

    // Stepping down releases the Lease at once.
    b.step_down().await;
    assert_eq!(holder(&api), None);
}

#[tokio::test]
async fn a_non_leader_answers_controller_calls_with_unavailable() {
    let api = FakeApi::start().await;
    // Someone else holds a fresh Lease.
    api.put(
        "leases",
        serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "csi-scsi-proxy", "namespace": "csi-scsi"},
            "spec": {"holderIdentity": "proxy-z", "leaseDurationSeconds": 3600, "renewTime": "2026-01-01T00:00:00.000000Z"},
        }),
    );
    let a = LeaderElection::spawn(api.client(), config("proxy-a")).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut gate = LeaderGate(a.handle());
    let status = gate.call(tonic::Request::new(())).unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(api.writes().is_empty(), "a candidate wrote a live Lease");
}

#[tokio::test]
async fn bad_timings_are_refused() {
    let api = FakeApi::start().await;
    let bad = LeaseConfig {
        renew_deadline: Duration::from_secs(20),
        ..LeaseConfig::new("csi-scsi", "csi-scsi-proxy", "proxy-a")
    };
    let err = LeaderElection::spawn(api.client(), bad).unwrap_err();
    assert!(err.to_string().contains("renew deadline"), "{err}");
}
