use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::*;

fn error() -> ErrorRecord {
    ErrorRecord {
        time: "2026-11-22T20:21:14.838Z".into(),
        source: "csi.agent.v1.Agent".into(),
        method: "Attach".into(),
        code: "Unauthenticated".into(),
        message: "login refused".into(),
        request_id: "obs-1".into(),
    }
}

fn agent_document() -> Status {
    Status::Agent(agent::Document {
        schema: SCHEMA,
        node: "node-a".into(),
        version: "0.1.0".into(),
        started: "2026-11-22T20:21:13.201Z".into(),
        uptime_seconds: 3512,
        sessions: vec![agent::Session {
            sid: 1,
            target: "iqn.2026-11.io.csi-scsi.lab:array-a".into(),
            portal: "198.18.127.1:3260".into(),
            state: "LOGGED_IN".into(),
            disks: 3,
        }],
        devices: vec![agent::Device {
            wwid: "naa.60014050000100000000000000000001".into(),
            size_bytes: 536870912,
            vendor: "CSISCSI".into(),
            model: "LAB-LUN".into(),
            serial: "sn1".into(),
            multipath: None,
            paths: vec![agent::DevicePath {
                name: "sda".into(),
                hctl: "10:0:0:1".into(),
                state: "running".into(),
                transport: agent::Transport::Iscsi,
                target: "iqn.2026-11.io.csi-scsi.lab:array-a".into(),
                by_path: Some("ip-198.18.127.1:3260-iscsi-x-lun-1".into()),
            }],
            holders: vec![],
        }],
        volumes: agent::Volumes {
            staged: vec![agent::Volume {
                volume: "pv-1".into(),
                path: "/var/lib/kubelet/plugins/kubernetes.io/csi/csi-scsi.io/pv-1/globalmount"
                    .into(),
                wwid: Some("naa.60014050000100000000000000000001".into()),
                device: "7:0".into(),
                fs_type: "xfs".into(),
                read_only: false,
            }],
            published: vec![],
        },
        recent_errors: vec![error()],
        problems: vec![],
        kubelet_registration: None,
        redacted: false,
    })
}

fn proxy_document() -> Status {
    Status::Proxy(proxy::Document {
        schema: SCHEMA,
        version: "0.1.0".into(),
        started: "2026-11-22T20:21:13.201Z".into(),
        uptime_seconds: 60,
        leader: proxy::Leader {
            mode: "single-replica".into(),
            this_replica_leads: true,
        },
        inventory: proxy::Inventory {
            devices_by_phase: BTreeMap::from([("Available".into(), 1), ("Bound".into(), 1)]),
            devices_total: 2,
        },
        devices: vec![
            proxy::Device {
                wwid: "naa.1".into(),
                phase: proxy::Phase::Bound,
                size_bytes: 1 << 30,
                target: "array-a".into(),
                lun: 1,
                vendor: "LIO-ORG".into(),
                model: "disk".into(),
                labels: BTreeMap::from([("array".into(), "a".into())]),
                volume_id: Some("naa.1:uid".into()),
                volume_name: Some("pv-1".into()),
                nodes: vec!["node-a".into(), "node-b".into()],
                published: vec!["node-a".into()],
                reason: String::new(),
            },
            proxy::Device {
                wwid: "naa.2".into(),
                phase: proxy::Phase::Lost,
                size_bytes: 1 << 20,
                target: "array-a".into(),
                lun: 2,
                vendor: "LIO-ORG".into(),
                model: "disk".into(),
                labels: BTreeMap::new(),
                volume_id: None,
                volume_name: None,
                nodes: vec![],
                published: vec![],
                reason: "no node reports it".into(),
            },
        ],
        devices_truncated: false,
        targets: vec![proxy::Target {
            name: "array-a".into(),
            iscsi: Some(proxy::IscsiTarget {
                portals: vec!["198.18.127.1:3260".into()],
                iqn: "iqn.2026-11.io.csi-scsi.lab:array-a".into(),
                chap_secret_ref: Some(proxy::SecretRef {
                    name: "chap-array-a".into(),
                    namespace: String::new(),
                }),
            }),
            fibre_channel: None,
            node_selector: BTreeMap::new(),
            nodes: vec![],
            device_labels: BTreeMap::from([("array".into(), "a".into())]),
        }],
        agents: vec![
            proxy::Agent {
                node: "node-a".into(),
                address: "198.18.127.11:9810".into(),
                reachable: Some(true),
                round_trip_ms: Some(2.9),
                last_probe: Some("2026-11-22T20:21:15.002Z".into()),
                version: Some("0.1.0".into()),
                error: None,
            },
            proxy::Agent {
                node: "node-b".into(),
                address: "198.18.127.12:9810".into(),
                reachable: None,
                round_trip_ms: None,
                last_probe: None,
                version: None,
                error: None,
            },
        ],
        pending_resizes: vec![proxy::Resize {
            name: "resize-pv-1".into(),
            volume_id: "naa.1:uid".into(),
            wwid: "naa.1".into(),
            requested_bytes: 2 << 30,
            current_bytes: 1 << 30,
            created: 1_700_000_000,
            done: false,
        }],
        recent_errors: vec![],
        problems: vec!["resize requests: store busy".into()],
        redacted: false,
    })
}

/// The wire names operators' scripts read (docs/operations.md): pinned.
#[test]
fn documents_keep_their_json_names() {
    let agent = serde_json::to_value(agent_document()).expect("agent");
    assert_eq!(
        agent,
        json!({
            "component": "agent",
            "schema": 1,
            "node": "node-a",
            "version": "0.1.0",
            "started": "2026-11-22T20:21:13.201Z",
            "uptime_seconds": 3512,
            "sessions": [{"sid": 1, "target": "iqn.2026-11.io.csi-scsi.lab:array-a",
                          "portal": "198.18.127.1:3260", "state": "LOGGED_IN", "disks": 3}],
            "devices": [{"wwid": "naa.60014050000100000000000000000001", "size_bytes": 536870912,
                         "vendor": "CSISCSI", "model": "LAB-LUN", "serial": "sn1", "multipath": null,
                         "paths": [{"name": "sda", "hctl": "10:0:0:1", "state": "running",
                                    "transport": "iscsi",
                                    "target": "iqn.2026-11.io.csi-scsi.lab:array-a",
                                    "by_path": "ip-198.18.127.1:3260-iscsi-x-lun-1"}],
                         "holders": []}],
            "volumes": {
                "staged": [{"volume": "pv-1",
                            "path": "/var/lib/kubelet/plugins/kubernetes.io/csi/csi-scsi.io/pv-1/globalmount",
                            "wwid": "naa.60014050000100000000000000000001", "device": "7:0",
                            "fs_type": "xfs", "read_only": false}],
                "published": []
            },
            "recent_errors": [{"time": "2026-11-22T20:21:14.838Z", "source": "csi.agent.v1.Agent",
                               "method": "Attach", "code": "Unauthenticated",
                               "message": "login refused", "request_id": "obs-1"}],
            "problems": []
        })
    );
    let proxy = serde_json::to_value(proxy_document()).expect("proxy");
    assert_eq!(
        proxy,
        json!({
            "component": "proxy",
            "schema": 1,
            "version": "0.1.0",
            "started": "2026-11-22T20:21:13.201Z",
            "uptime_seconds": 60,
            "leader": {"mode": "single-replica", "this_replica_leads": true},
            "inventory": {"devices_by_phase": {"Available": 1, "Bound": 1}, "devices_total": 2},
            "devices": [
                {"wwid": "naa.1", "phase": "Bound", "size_bytes": 1073741824, "target": "array-a",
                 "lun": 1, "vendor": "LIO-ORG", "model": "disk", "labels": {"array": "a"},
                 "volume_id": "naa.1:uid", "volume_name": "pv-1", "nodes": ["node-a", "node-b"],
                 "published": ["node-a"]},
                {"wwid": "naa.2", "phase": "Lost", "size_bytes": 1048576, "target": "array-a",
                 "lun": 2, "vendor": "LIO-ORG", "model": "disk", "labels": {},
                 "volume_id": null, "volume_name": null, "nodes": [], "published": [],
                 "reason": "no node reports it"}
            ],
            "devices_truncated": false,
            "targets": [{"name": "array-a",
                         "iscsi": {"portals": ["198.18.127.1:3260"],
                                   "iqn": "iqn.2026-11.io.csi-scsi.lab:array-a",
                                   "chapSecretRef": {"name": "chap-array-a"}},
                         "deviceLabels": {"array": "a"}}],
            "agents": [
                {"node": "node-a", "address": "198.18.127.11:9810", "reachable": true,
                 "round_trip_ms": 2.9, "last_probe": "2026-11-22T20:21:15.002Z",
                 "version": "0.1.0", "error": null},
                {"node": "node-b", "address": "198.18.127.12:9810", "reachable": null,
                 "round_trip_ms": null, "last_probe": null, "version": null, "error": null}
            ],
            "pending_resizes": [{"name": "resize-pv-1", "volumeId": "naa.1:uid", "wwid": "naa.1",
                                 "requestedBytes": 2147483648u64, "currentBytes": 1073741824,
                                 "created": 1700000000, "done": false}],
            "recent_errors": [],
            "problems": ["resize requests: store busy"]
        })
    );
}

#[test]
fn documents_read_back_as_written() {
    for doc in [agent_document(), proxy_document()] {
        let text = serde_json::to_string(&doc).expect("write");
        let header: Header = serde_json::from_str(&text).expect("header");
        assert_eq!(header.check(), Ok(()));
        let back: Status = serde_json::from_str(&text).expect("read");
        assert_eq!(back, doc);
    }
}

#[test]
fn a_document_from_before_the_schema_field_reads_as_schema_1() {
    let mut old = serde_json::to_value(proxy_document()).expect("write");
    old.as_object_mut().expect("object").remove("schema");
    let header: Header = serde_json::from_value(old.clone()).expect("header");
    assert_eq!(header.schema, UNVERSIONED_SCHEMA);
    assert_eq!(header.check(), Ok(()));
    let back: Status = serde_json::from_value(old).expect("read");
    assert_eq!(back, proxy_document());
}

#[test]
fn other_schemas_and_components_are_refused_by_name() {
    let header = |v: Value| -> Header { serde_json::from_value(v).expect("header") };
    let newer = header(json!({"component": "agent", "schema": SCHEMA + 1, "nodes": {}}))
        .check()
        .expect_err("newer");
    assert_eq!(newer, SchemaError::Unsupported { found: SCHEMA + 1 });
    let text = newer.to_string();
    assert!(
        text.contains(&format!("schema {}", SCHEMA + 1)) && text.contains("newer"),
        "{text}"
    );
    let older = header(json!({"component": "proxy", "schema": 0}))
        .check()
        .expect_err("older");
    assert!(older.to_string().contains("older"), "{older}");
    assert_eq!(
        header(json!({"status": "ok"})).check(),
        Err(SchemaError::NoComponent)
    );
    assert_eq!(
        header(json!({"component": "kubelet"})).check(),
        Err(SchemaError::UnknownComponent("kubelet".into()))
    );
}

#[test]
fn a_chap_secret_is_named_never_carried() {
    let target: proxy::Target = serde_json::from_value(json!({
        "name": "array-a",
        "iscsi": {"portals": [], "iqn": "iqn.x",
                  "chapSecretRef": {"name": "chap", "namespace": "ns", "password": "hunter2"}},
    }))
    .expect("target");
    let text = serde_json::to_string(&target).expect("write");
    assert!(!text.contains("hunter2"), "{text}");
    assert!(text.contains(r#""chapSecretRef":{"name":"chap","namespace":"ns"}"#));
}

/// The registration block's wire names are pinned too; a document without
/// it (registration off, or an older agent) still reads.
#[test]
fn kubelet_registration_keeps_its_json_names_and_is_optional() {
    let Status::Agent(mut doc) = agent_document() else {
        unreachable!("agent_document is an agent's")
    };
    doc.kubelet_registration = Some(agent::KubeletRegistration {
        socket: "/var/lib/kubelet/plugins_registry/csi-scsi.io-reg.sock".into(),
        endpoint: "/var/lib/kubelet/plugins/csi-scsi.io/csi.sock".into(),
        state: agent::RegistrationState::Failed,
        error: Some("node ID mismatch".into()),
        info_requested: Some("2026-11-22T20:21:13.900Z".into()),
        reported: Some("2026-11-22T20:21:14.001Z".into()),
    });
    let with = Status::Agent(doc.clone());
    let value = serde_json::to_value(&with).expect("write");
    assert_eq!(
        value["kubelet_registration"],
        json!({"socket": "/var/lib/kubelet/plugins_registry/csi-scsi.io-reg.sock",
               "endpoint": "/var/lib/kubelet/plugins/csi-scsi.io/csi.sock",
               "state": "failed", "error": "node ID mismatch",
               "info_requested": "2026-11-22T20:21:13.900Z",
               "reported": "2026-11-22T20:21:14.001Z"})
    );
    let back: Status = serde_json::from_value(value).expect("read");
    assert_eq!(back, with);
    let pending = json!({"socket": "/r/csi-scsi.io-reg.sock", "endpoint": "/p/csi.sock",
                         "state": "pending", "info_requested": null, "reported": null});
    let read: agent::KubeletRegistration = serde_json::from_value(pending).expect("pending");
    assert_eq!(read.state, agent::RegistrationState::Pending);
    assert_eq!(read.error, None);
    // Without the block: the schema-1 document of before.
    let mut without = serde_json::to_value(agent_document()).expect("write");
    assert!(without.get("kubelet_registration").is_none());
    without
        .as_object_mut()
        .expect("object")
        .remove("kubelet_registration");
    let back: Status = serde_json::from_value(without).expect("read");
    assert_eq!(back, agent_document());
}

/// Off the machine, no portal, IQN, WWPN, Secret name or error message
/// (which may quote them); counts, states and request IDs stay, and the
/// document says it was cut.
#[test]
fn the_redacted_view_names_no_way_to_the_storage() {
    let mut proxy = proxy_document();
    let Status::Proxy(p) = &mut proxy else {
        unreachable!()
    };
    p.targets.push(proxy::Target {
        name: "fabric-a".into(),
        iscsi: None,
        fibre_channel: Some(proxy::FcTarget {
            wwpns: vec!["0x500a098112345678".into()],
        }),
        node_selector: BTreeMap::new(),
        nodes: vec![],
        device_labels: BTreeMap::new(),
    });
    p.recent_errors = vec![ErrorRecord {
        message: "CHAP Secret default/chap-array-a has no key password".into(),
        ..error()
    }];
    for (full, hidden) in [
        (
            agent_document(),
            &[
                "iqn.2026-11",
                "198.18.127.1",
                "ip-198.18.127.1:3260-iscsi-x-lun-1",
                "login refused",
            ][..],
        ),
        (
            proxy,
            &[
                "iqn.2026-11",
                "198.18.127.1:3260",
                "chap-array-a",
                "chapSecretRef",
                "0x500a098112345678",
            ][..],
        ),
    ] {
        let full_text = serde_json::to_string(&full).expect("write");
        assert!(!full_text.contains("redacted"), "{full_text}");
        for h in hidden {
            assert!(
                full_text.contains(h),
                "the full view shows {h}: {full_text}"
            );
        }
        let cut = full.clone().redacted();
        let text = serde_json::to_string(&cut).expect("write");
        for h in hidden {
            assert!(!text.contains(h), "{h} in {text}");
        }
        assert!(text.contains(r#""redacted":true"#), "{text}");
        let back: Status = serde_json::from_str(&text).expect("the CLI reads it");
        assert_eq!(back, cut);
        // What probes, dashboards and a first look need stays.
        assert_eq!(cut.recent_errors().len(), full.recent_errors().len());
        assert_eq!(cut.recent_errors()[0].request_id, "obs-1");
        match (&full, &cut) {
            (Status::Agent(f), Status::Agent(c)) => {
                assert_eq!(c.sessions[0].state, f.sessions[0].state);
                assert_eq!(c.sessions[0].disks, f.sessions[0].disks);
                assert_eq!(c.devices[0].wwid, f.devices[0].wwid);
                assert_eq!(c.devices[0].paths[0].state, f.devices[0].paths[0].state);
                assert_eq!(c.volumes, f.volumes);
            }
            (Status::Proxy(f), Status::Proxy(c)) => {
                assert_eq!(c.inventory, f.inventory);
                assert_eq!(c.devices, f.devices);
                assert_eq!(c.agents, f.agents);
                assert_eq!(c.targets.len(), f.targets.len());
                assert_eq!(c.targets[0].name, "array-a");
                assert!(c.targets[0].iscsi.is_some() && c.targets[1].fibre_channel.is_some());
            }
            _ => panic!("the component changed"),
        }
    }
}
