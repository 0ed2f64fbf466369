//! The proxy's Controller service through its real socket, over a real
//! embedded store pre-filled the way discovery fills it (no agents are
//! needed to bind): concurrency, crash safety and the spec's error codes.

use std::collections::HashMap;
use std::path::Path;

use csi_scsi_proto::csi::controller_client::ControllerClient;
use csi_scsi_proto::csi::volume_capability::access_mode::Mode;
use csi_scsi_proto::csi::*;
use csi_scsi_proxy::inventory::{EmbeddedInventory, Inventory};
use csi_scsi_tests::csi_client::csi_channel;
use csi_scsi_tests::daemon::Daemon;
use csi_scsi_tests::lab::scenario::{capability, prefer};
use tonic::Code;
use tonic::transport::Channel;

use crate::support::Env;

async fn proxy(
    env: &Env,
    devices: u32,
) -> (csi_scsi_tests::daemon::Daemon, ControllerClient<Channel>) {
    csi_scsi_tests::bench::inventory::fill(&env.path("proxy/inventory.db"), devices)
        .await
        .expect("fill");
    std::fs::write(env.path("agents.txt"), "node-a 127.0.0.1:1\n").expect("agents");
    let p = env.start_proxy().await;
    let c = ControllerClient::new(csi_channel(&p.csi).await.expect("connect"));
    (p.daemon, c)
}

fn create_req(name: &str, bytes: i64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability(false, "ext4", Mode::SingleNodeWriter)],
        parameters: HashMap::from([("deviceSelector".into(), "tier=fast".into())]),
        secrets: HashMap::new(),
        volume_content_source: None,
        accessibility_requirements: Some(prefer("node-a")),
        mutable_parameters: HashMap::new(),
    }
}

/// (wwid, volume name) of every bound device, read with the sqlite3 tool.
fn bindings(store: &Path) -> Vec<(String, String)> {
    let out = std::process::Command::new("sqlite3")
        .arg(store)
        .arg("select wwid, volume_name from devices where volume_name is not null")
        .output()
        .expect("sqlite3");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('|').map(|(a, b)| (a.to_owned(), b.to_owned())))
        .collect()
}

#[tokio::test]
async fn two_hundred_concurrent_creates_over_one_hundred_devices_bind_each_at_most_once() {
    let env = Env::new();
    let (_p, c) = proxy(&env, 100).await;
    let calls = (0..200).map(|i| {
        let mut c = c.clone();
        async move {
            c.create_volume(create_req(&format!("pv-{i}"), 1 << 20))
                .await
        }
    });
    let results = futures::future::join_all(calls).await;
    let ok: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    let exhausted = results
        .iter()
        .filter(|r| matches!(r, Err(s) if s.code() == Code::ResourceExhausted))
        .count();
    assert_eq!(ok.len(), 100);
    assert_eq!(exhausted, 100);
    let b = bindings(&env.path("proxy/inventory.db"));
    let wwids: std::collections::BTreeSet<_> = b.iter().map(|(w, _)| w).collect();
    let names: std::collections::BTreeSet<_> = b.iter().map(|(_, n)| n).collect();
    assert_eq!(
        (b.len(), wwids.len(), names.len()),
        (100, 100, 100),
        "each device bound once, each name once"
    );
}

#[tokio::test]
async fn a_retry_storm_on_one_name_returns_one_volume() {
    let env = Env::new();
    let (_p, c) = proxy(&env, 10).await;
    let calls = (0..50).map(|_| {
        let mut c = c.clone();
        async move { c.create_volume(create_req("pv-storm", 1 << 20)).await }
    });
    let ids: std::collections::BTreeSet<String> = futures::future::join_all(calls)
        .await
        .into_iter()
        .map(|r| {
            r.expect("create")
                .into_inner()
                .volume
                .expect("volume")
                .volume_id
        })
        .collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(bindings(&env.path("proxy/inventory.db")).len(), 1);
}

#[tokio::test]
async fn kill_9_during_concurrent_binds_leaves_a_sound_store_without_double_binding() {
    let env = Env::new();
    let (mut p, c) = proxy(&env, 100).await;
    let calls: Vec<_> = (0..150)
        .map(|i| {
            let mut c = c.clone();
            tokio::spawn(async move {
                c.create_volume(create_req(&format!("pv-{i}"), 1 << 20))
                    .await
            })
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(40)).await;
    std::process::Command::new("kill")
        .args(["-KILL", &p.pid().to_string()])
        .status()
        .expect("kill");
    let _ = p.terminate().await;
    let _ = futures::future::join_all(calls).await;
    let db = env.path("proxy/inventory.db");
    let check = std::process::Command::new("sqlite3")
        .arg(&db)
        .arg("PRAGMA integrity_check")
        .output()
        .expect("sqlite3");
    assert_eq!(String::from_utf8_lossy(&check.stdout).trim(), "ok");
    let b = bindings(&db);
    let wwids: std::collections::BTreeSet<_> = b.iter().map(|(w, _)| w).collect();
    let names: std::collections::BTreeSet<_> = b.iter().map(|(_, n)| n).collect();
    assert_eq!(wwids.len(), b.len(), "no device bound twice");
    assert_eq!(names.len(), b.len(), "no name bound twice");
    // The store still serves a restarted proxy.
    let inv = Inventory::new(std::sync::Arc::new(
        EmbeddedInventory::open(&db).expect("reopen"),
    ));
    assert_eq!(inv.devices(None, 1000).await.expect("devices").len(), 100);
    let _: Option<Daemon> = None;
}

fn code<T>(r: Result<T, tonic::Status>) -> Code {
    r.err().map(|s| s.code()).unwrap_or(Code::Ok)
}

#[tokio::test]
async fn every_bad_input_gets_the_code_the_spec_names() {
    let env = Env::new();
    let (_p, mut c) = proxy(&env, 3).await;
    let vol = c
        .create_volume(create_req("pv-ok", 1 << 20))
        .await
        .expect("create")
        .into_inner()
        .volume
        .expect("vol");
    let mut r = create_req("", 1);
    assert_eq!(
        code(c.create_volume(r.clone()).await),
        Code::InvalidArgument,
        "missing name"
    );
    r.name = "x".into();
    r.volume_capabilities.clear();
    assert_eq!(
        code(c.create_volume(r).await),
        Code::InvalidArgument,
        "no capabilities"
    );
    let mut r = create_req("x", 1);
    r.parameters.insert("replicas".into(), "3".into());
    assert_eq!(
        code(c.create_volume(r).await),
        Code::InvalidArgument,
        "unknown parameter"
    );
    let mut r = create_req("x", 1);
    r.volume_capabilities = vec![capability(false, "ext4", Mode::MultiNodeMultiWriter)];
    assert_eq!(
        code(c.create_volume(r).await),
        Code::InvalidArgument,
        "multi-writer filesystem"
    );
    let mut r = create_req("x", 1);
    r.volume_capabilities = vec![capability(false, "btrfs", Mode::SingleNodeWriter)];
    assert_eq!(
        code(c.create_volume(r).await),
        Code::InvalidArgument,
        "unknown fsType"
    );
    let mut r = create_req("x", 1);
    r.volume_content_source = Some(VolumeContentSource { r#type: None });
    assert_eq!(
        code(c.create_volume(r).await),
        Code::InvalidArgument,
        "content source"
    );
    assert_eq!(
        code(c.create_volume(create_req("x", 2 << 30)).await),
        Code::OutOfRange,
        "bigger than any LUN"
    );
    let mut r = create_req("x", 2 << 20);
    r.capacity_range = Some(CapacityRange {
        required_bytes: 2 << 20,
        limit_bytes: 1 << 20,
    });
    assert_eq!(
        code(c.create_volume(r).await),
        Code::OutOfRange,
        "limit below required"
    );
    let mut r = create_req("pv-ok", 1 << 20);
    r.parameters.insert("cleanup".into(), "none".into());
    assert_eq!(
        code(c.create_volume(r).await),
        Code::AlreadyExists,
        "same name, other parameters"
    );
    let mut r = create_req("x", 1);
    r.accessibility_requirements = Some(prefer("node-z"));
    assert_eq!(
        code(c.create_volume(r).await),
        Code::ResourceExhausted,
        "no device on that node"
    );

    let del = |id: &str| DeleteVolumeRequest {
        volume_id: id.into(),
        secrets: HashMap::new(),
    };
    assert_eq!(code(c.delete_volume(del("")).await), Code::InvalidArgument);
    assert_eq!(
        code(
            c.delete_volume(del("naa.6001405ffffffffffffffffffffffff0:gone"))
                .await
        ),
        Code::Ok,
        "unknown volume"
    );
    assert_eq!(
        code(c.delete_volume(del("not-ours")).await),
        Code::Ok,
        "malformed is unknown"
    );

    let publish =
        |id: &str, node: &str, cap: Option<VolumeCapability>| ControllerPublishVolumeRequest {
            volume_id: id.into(),
            node_id: node.into(),
            volume_capability: cap,
            readonly: false,
            secrets: HashMap::new(),
            volume_context: HashMap::new(),
        };
    let cap = Some(capability(false, "ext4", Mode::SingleNodeWriter));
    assert_eq!(
        code(
            c.controller_publish_volume(publish("", "node-a", cap.clone()))
                .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            c.controller_publish_volume(publish(&vol.volume_id, "", cap.clone()))
                .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            c.controller_publish_volume(publish(&vol.volume_id, "node-a", None))
                .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            c.controller_publish_volume(publish(
                "naa.6001405ffffffffffffffffffffffff0:x",
                "node-a",
                cap.clone()
            ))
            .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(
            c.controller_publish_volume(publish(&vol.volume_id, "node-z", cap.clone()))
                .await
        ),
        Code::NotFound
    );
    let unpublish = |id: &str| ControllerUnpublishVolumeRequest {
        volume_id: id.into(),
        node_id: "node-a".into(),
        secrets: HashMap::new(),
    };
    assert_eq!(
        code(c.controller_unpublish_volume(unpublish("")).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            c.controller_unpublish_volume(unpublish("naa.6001405ffffffffffffffffffffffff0:x"))
                .await
        ),
        Code::Ok
    );

    let validate = |id: &str, caps: Vec<VolumeCapability>| ValidateVolumeCapabilitiesRequest {
        volume_id: id.into(),
        volume_context: HashMap::new(),
        volume_capabilities: caps,
        parameters: HashMap::new(),
        secrets: HashMap::new(),
        mutable_parameters: HashMap::new(),
    };
    let ok = c
        .validate_volume_capabilities(validate(
            &vol.volume_id,
            vec![capability(false, "ext4", Mode::SingleNodeWriter)],
        ))
        .await
        .expect("validate");
    assert!(ok.into_inner().confirmed.is_some());
    let no = c
        .validate_volume_capabilities(validate(
            &vol.volume_id,
            vec![capability(true, "", Mode::MultiNodeMultiWriter)],
        ))
        .await
        .expect("validate");
    assert!(no.into_inner().confirmed.is_none());
    assert_eq!(
        code(
            c.validate_volume_capabilities(validate(&vol.volume_id, vec![]))
                .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            c.validate_volume_capabilities(validate(
                "naa.6001405ffffffffffffffffffffffff0:x",
                vec![capability(false, "ext4", Mode::SingleNodeWriter)]
            ))
            .await
        ),
        Code::NotFound
    );

    let list = |token: &str, max: i32| ListVolumesRequest {
        max_entries: max,
        starting_token: token.into(),
    };
    assert_eq!(
        code(c.list_volumes(list("bogus-token", 1)).await),
        Code::Aborted
    );
    assert_eq!(
        code(c.list_volumes(list("", -1)).await),
        Code::InvalidArgument
    );
    let page = c
        .list_volumes(list("", 10))
        .await
        .expect("list")
        .into_inner();
    assert_eq!(page.entries.len(), 1);

    let expand = |id: &str| ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 1 << 20,
            limit_bytes: 0,
        }),
        secrets: HashMap::new(),
        volume_capability: None,
    };
    assert_eq!(
        code(c.controller_expand_volume(expand("")).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            c.controller_expand_volume(expand("naa.6001405ffffffffffffffffffffffff0:x"))
                .await
        ),
        Code::NotFound
    );
    let grown = c
        .controller_expand_volume(expand(&vol.volume_id))
        .await
        .expect("already large enough")
        .into_inner();
    assert!(grown.node_expansion_required);
    assert_eq!(
        code(
            c.controller_get_volume(ControllerGetVolumeRequest {
                volume_id: "naa.6001405ffffffffffffffffffffffff0:x".into()
            })
            .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(
            c.create_snapshot(CreateSnapshotRequest {
                source_volume_id: vol.volume_id.clone(),
                name: "s".into(),
                secrets: HashMap::new(),
                parameters: HashMap::new()
            })
            .await
        ),
        Code::Unimplemented
    );
}

/// Fills the store at `path` with one 1 GiB-or-smaller LUN per target,
/// labelled tier=fast: `(target, wwid index, MiB, nodes that see it)`.
async fn luns_seen_by(path: &Path, luns: &[(&str, u32, u64, &[&str])]) {
    use csi_scsi_contract::{NodeName, Wwid};
    use csi_scsi_proxy::device::{DiscoveryRound, LunReport, NewLuns};
    let inv = Inventory::new(std::sync::Arc::new(
        EmbeddedInventory::open(path).expect("store"),
    ));
    for &(target, i, mib, nodes) in luns {
        let report = LunReport {
            wwid: Wwid::parse(&format!("naa.6001405{i:025x}")).expect("wwid"),
            lun: 0,
            size_bytes: mib << 20,
            vendor: "LIO-ORG".into(),
            model: "disk".into(),
            serial: format!("sn{i}"),
            paths: vec![format!(
                "ip-198.18.0.1:3260-iscsi-iqn.2026-11.io.csi-scsi.e2e:{target}-lun-0"
            )],
        };
        inv.apply_discovery(DiscoveryRound {
            target: target.into(),
            device_labels: std::collections::BTreeMap::from([("tier".into(), "fast".into())]),
            answered: nodes
                .iter()
                .map(|n| (NodeName::parse(n).expect("node"), vec![report.clone()]))
                .collect(),
            unanswered: Vec::new(),
            same_array: Default::default(),
            new_luns: NewLuns::Trust,
        })
        .await
        .expect("discovery");
    }
}

/// Node names as a table writes them.
type Names = &'static [&'static str];

/// Requirements naming `preferred` and `requisite` nodes, in order.
fn requirements(preferred: &[&str], requisite: &[&str]) -> TopologyRequirement {
    let topologies = |nodes: &[&str]| -> Vec<Topology> {
        nodes
            .iter()
            .map(|n| Topology {
                segments: HashMap::from([(
                    csi_scsi_tests::lab::scenario::NODE_KEY.to_owned(),
                    (*n).to_owned(),
                )]),
            })
            .collect()
    };
    TopologyRequirement {
        requisite: topologies(requisite),
        preferred: topologies(preferred),
    }
}

/// CreateVolume of `name` (`mib` MiB or more) under `req`: the LUN's
/// WWID index and the nodes the volume is accessible from, sorted.
async fn create_under(
    c: &mut ControllerClient<Channel>,
    name: &str,
    mib: i64,
    req: TopologyRequirement,
) -> Result<(String, Vec<String>), tonic::Status> {
    let mut r = create_req(name, mib << 20);
    r.accessibility_requirements = Some(req);
    let v = c
        .create_volume(r)
        .await?
        .into_inner()
        .volume
        .expect("volume");
    let mut nodes: Vec<String> = v
        .accessible_topology
        .iter()
        .map(|t| t.segments[csi_scsi_tests::lab::scenario::NODE_KEY].clone())
        .collect();
    nodes.sort();
    Ok((v.volume_id, nodes))
}

#[tokio::test]
async fn create_volume_honours_requisite_and_tries_preferred_nodes_first() {
    let env = Env::new();
    let wwid = |i: u32| format!("naa.6001405{i:025x}");
    luns_seen_by(
        &env.path("proxy/inventory.db"),
        &[
            ("t-abc", 1, 1024, &["node-a", "node-b", "node-c"]),
            // The smallest: a bind that ignored the preferred order would
            // take it first.
            ("t-ab", 2, 512, &["node-a", "node-b"]),
            ("t-c", 3, 1024, &["node-c"]),
        ],
    )
    .await;
    let p = env.start_proxy().await;
    let mut c = ControllerClient::new(csi_channel(&p.csi).await.expect("connect"));
    let abc: Names = &["node-a", "node-b", "node-c"];
    // In order, on one store: (why, name, MiB, preferred, requisite, the
    // LUN bound and the nodes it is accessible from, or the refusal).
    // The LUN's WWID index and the nodes sorted, or the refusal.
    type Outcome = Result<(u32, Names), Code>;
    let steps: [(&str, &str, i64, Names, Names, Outcome); 5] = [
        (
            "immediate binding under allowedTopologies {a, b} (preferred: \
             requisite rotated): node-c sees the LUN but is not allowed",
            "pv-allowed",
            600,
            &["node-b", "node-a"],
            &["node-a", "node-b"],
            Ok((1, &["node-a", "node-b"])),
        ),
        (
            "a repeated call answers the same",
            "pv-allowed",
            600,
            &["node-b", "node-a"],
            &["node-a", "node-b"],
            Ok((1, &["node-a", "node-b"])),
        ),
        (
            "preferred node-c first: the LUN node-c sees, not the smaller \
             one only node-a and node-b see",
            "pv-prefer-c",
            1,
            &["node-c"],
            abc,
            Ok((3, &["node-c"])),
        ),
        (
            "delayed binding, node-b selected, every node requisite: not \
             pinned to node-b, its Pod may move to node-a",
            "pv-selected-b",
            1,
            &["node-b"],
            abc,
            Ok((2, &["node-a", "node-b"])),
        ),
        (
            "a preferred node outside requisite breaks the spec's rule",
            "pv-stray",
            1,
            &["node-c"],
            &["node-a", "node-b"],
            Err(Code::InvalidArgument),
        ),
    ];
    let mut ids: HashMap<&str, String> = HashMap::new();
    for (why, name, mib, preferred, requisite, want) in steps {
        let got = create_under(&mut c, name, mib, requirements(preferred, requisite)).await;
        match (got, want) {
            (Ok((id, nodes)), Ok((lun, accessible))) => {
                assert!(id.starts_with(&wwid(lun)), "{why}: {id}");
                assert_eq!(nodes, accessible, "{why}");
                let first = ids.entry(name).or_insert_with(|| id.clone());
                assert_eq!(*first, id, "{why}: the same volume");
            }
            (Err(status), Err(code)) => assert_eq!(status.code(), code, "{why}: {status:?}"),
            (got, want) => panic!("{why}: {got:?}, not {want:?}"),
        }
    }
}
