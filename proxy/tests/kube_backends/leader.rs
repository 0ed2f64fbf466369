//! Leader election through a Lease: acquired, renewed, lost to another
//! replica after it expired, released on step-down; the Controller service
//! of a replica that does not lead, on the real kube-apiserver.

use std::sync::Arc;
use std::time::Duration;

use csi_scsi_proto::csi::controller_client::ControllerClient;
use csi_scsi_proto::csi::controller_server::ControllerServer;
use csi_scsi_proto::csi::controller_service_capability::rpc::Type as Rpc;
use csi_scsi_proto::csi::*;
use csi_scsi_proxy::csi::ControllerService;
use csi_scsi_proxy::leader::{LeaderElection, LeaderGate, LeaderHandle, LeaseConfig};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use tonic::Code;
use tower::Layer;

use crate::directory::Agents;
use crate::eventually;
use crate::fake_api::FakeApi;
use crate::real_api::{admin_logging, writes};
use crate::real_kube;

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/csi-scsi/leases";

fn config(namespace: &str, identity: &str) -> LeaseConfig {
    LeaseConfig {
        lease_duration: Duration::from_millis(1500),
        renew_deadline: Duration::from_millis(1000),
        retry_period: Duration::from_millis(100),
        ..LeaseConfig::new(namespace, "csi-scsi-proxy", identity)
    }
}

fn holder(api: &FakeApi) -> Option<String> {
    api.get("leases", "csi-scsi", "csi-scsi-proxy")?["spec"]["holderIdentity"]
        .as_str()
        .map(str::to_owned)
}

// On the fake: it asserts the bodies of the Lease writes and cuts one
// replica off with injected 503s (`real_api.rs` passes a Lease for real).
#[tokio::test]
async fn the_lease_is_acquired_renewed_and_lost_to_a_replica_after_it_expired() {
    let api = FakeApi::start().await;
    let a = LeaderElection::spawn(api.client(), config("csi-scsi", "proxy-a")).unwrap();
    let leader_a = a.handle();
    eventually("proxy-a leads", || leader_a.is_leader()).await;
    let create = api.writes().into_iter().next().unwrap();
    assert_eq!(
        (create.method.as_str(), create.path.as_str()),
        ("POST", LEASES)
    );
    assert_eq!(create.body["spec"]["holderIdentity"], "proxy-a");
    assert_eq!(create.body["spec"]["leaseDurationSeconds"], 1);
    assert_eq!(
        create.query.get("fieldManager").map(String::as_str),
        Some("csi-scsi-proxy")
    );

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
        puts.iter()
            .all(|p| p.query.get("fieldManager").map(String::as_str) == Some("csi-scsi-proxy"))
    );
    assert!(
        puts[1].body["spec"]["renewTime"].as_str() >= puts[0].body["spec"]["renewTime"].as_str()
    );
    assert_eq!(puts[1].body["spec"]["holderIdentity"], "proxy-a");

    // A second replica waits while proxy-a renews.
    let b = LeaderElection::spawn(api.client(), config("csi-scsi", "proxy-b")).unwrap();
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

/// The Controller service behind the leader gate, served over TCP as
/// `serve.rs` serves it on the socket, over the real server; a client to it.
async fn controller(
    agents: &Agents,
    leader: LeaderHandle,
    scratch: &std::path::Path,
) -> ControllerClient<tonic::transport::Channel> {
    let admin = real_kube::admin().await;
    let inventory = Arc::new(real_kube::inventory(admin.clone()).await);
    let directory = agents.ready_directory(admin).await;
    let life = crate::lifecycle_support::lifecycle(inventory, directory, scratch);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(
                LeaderGate(leader).layer(ControllerServer::new(ControllerService::new(Arc::new(
                    life,
                )))),
            )
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    ControllerClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_leader_serves_reads_and_answers_writes_with_unavailable() {
    // No device may exist: volume 1 must be unknown.
    let _only = real_kube::exclusive().await;
    // The Lease in the test's own namespace: `real_api.rs` campaigns for
    // the one in the driver's.
    let agents = Agents::new("leader-reads").await;
    let ns = agents.namespace.as_str();
    // Someone else holds a fresh Lease.
    let lease: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "csi-scsi-proxy", "namespace": ns},
        "spec": {"holderIdentity": "proxy-z", "leaseDurationSeconds": 3600, "renewTime": "2026-01-01T00:00:00.000000Z"},
    }))
    .unwrap();
    Api::<Lease>::namespaced(real_kube::admin().await, ns)
        .create(&PostParams::default(), &lease)
        .await
        .unwrap();
    let (client, log) = admin_logging().await;
    let a = LeaderElection::spawn(client, config(ns, "proxy-a")).unwrap();
    let lease_writes = || writes(&log);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!a.handle().is_leader());
    assert!(lease_writes().is_empty(), "a candidate wrote a live Lease");
    let scratch = tempfile::tempdir().unwrap();
    let mut client = controller(&agents, a.handle(), scratch.path()).await;

    // Every sidecar calls this once at start-up, before its own election,
    // and exits if it fails.
    let caps = client
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(!caps.capabilities.is_empty());
    // The reads come from this replica's watch caches.
    client
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap();
    client
        .get_capacity(GetCapacityRequest::default())
        .await
        .unwrap();
    let id = format!("{}:uid-pv-1", crate::devices::wwid(1));
    let id = id.as_str();
    let missing = client
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: id.into(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound, "{missing:?}");
    let missing = client
        .validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
            volume_id: id.into(),
            volume_capabilities: vec![VolumeCapability::default()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound, "{missing:?}");

    // What changes state waits for the leader.
    let refusals = [
        client
            .create_volume(CreateVolumeRequest {
                name: "pv-1".into(),
                ..Default::default()
            })
            .await
            .map(drop),
        client
            .delete_volume(DeleteVolumeRequest {
                volume_id: id.into(),
                ..Default::default()
            })
            .await
            .map(drop),
        client
            .controller_publish_volume(ControllerPublishVolumeRequest {
                volume_id: id.into(),
                node_id: "node-a".into(),
                ..Default::default()
            })
            .await
            .map(drop),
        client
            .controller_unpublish_volume(ControllerUnpublishVolumeRequest {
                volume_id: id.into(),
                node_id: "node-a".into(),
                ..Default::default()
            })
            .await
            .map(drop),
        client
            .controller_expand_volume(ControllerExpandVolumeRequest {
                volume_id: id.into(),
                ..Default::default()
            })
            .await
            .map(drop),
    ];
    for refused in refusals {
        let status = refused.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert!(status.message().contains("not the leader"), "{status:?}");
    }
    assert!(
        lease_writes().is_empty(),
        "a candidate wrote a live Lease: {:?}",
        lease_writes()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_publication_is_refused_as_the_capability_is_not_advertised() {
    let agents = Agents::new("leader-read-only").await;
    let scratch = tempfile::tempdir().unwrap();
    let mut client = controller(&agents, LeaderHandle::always(), scratch.path()).await;
    let caps = client
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let advertised: Vec<Rpc> = caps
        .capabilities
        .iter()
        .filter_map(|c| {
            let controller_service_capability::Type::Rpc(r) = c.r#type.as_ref()?;
            Some(r.r#type())
        })
        .collect();
    assert!(advertised.contains(&Rpc::PublishUnpublishVolume));
    assert!(
        !advertised.contains(&Rpc::PublishReadonly),
        "{advertised:?}"
    );
    let refused = client
        .controller_publish_volume(ControllerPublishVolumeRequest {
            volume_id: format!("{}:uid-pv-1", crate::devices::wwid(1)),
            node_id: "node-a".into(),
            volume_capability: Some(VolumeCapability {
                access_type: Some(volume_capability::AccessType::Mount(
                    volume_capability::MountVolume::default(),
                )),
                access_mode: Some(volume_capability::AccessMode {
                    mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
                }),
            }),
            readonly: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("readonly"), "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_timings_are_refused() {
    let bad = LeaseConfig {
        renew_deadline: Duration::from_secs(20),
        ..LeaseConfig::new("csi-scsi", "csi-scsi-proxy", "proxy-a")
    };
    let err = LeaderElection::spawn(real_kube::admin().await, bad).unwrap_err();
    assert!(err.to_string().contains("renew deadline"), "{err}");
}
