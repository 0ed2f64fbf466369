//! The Controller service's tables, on the proxy.

use std::collections::HashMap;

use csi_scsi_proto::csi::controller_client::ControllerClient;
use csi_scsi_proto::csi::volume_capability::access_mode::Mode;
use csi_scsi_proto::csi::*;
use fastrand::Rng;
use tonic::transport::Channel;

use super::codes::*;
use super::fixture::Fixture;
use super::garbage::{garbage, hex, unknown_volume, uuid};
use super::inputs::bad_capabilities;
use super::requests::{Requests, block_cap, fs_cap, get_capacity, get_volume, list_volumes};
use super::{Cases, HUGE, NODE, Sweep, clip};
use crate::lab::scenario::{self, Clients, NODE_KEY, capability};

type Client = ControllerClient<Channel>;

/// What every table of the service needs.
struct Ctx<'a> {
    fx: &'a Fixture,
    rq: Requests,
    fs_id: String,
    /// The fs fixture's LUN under a binding that is not (or no longer) its.
    stale: String,
}

/// Sends every Controller RPC its table.
pub(super) async fn sweep(sw: &mut Sweep, cl: &mut Clients, fx: &Fixture, rng: &mut Rng) {
    let c = &mut cl.controller;
    let cx = Ctx {
        fx,
        rq: Requests::new(sw, fx),
        fs_id: fx.fs_id(),
        stale: format!("{}:{}", Fixture::wwid(&fx.fs), uuid(rng)),
    };
    create_volume(sw, c, &cx, rng).await;
    delete_volume(sw, c, &cx, rng).await;
    publish(sw, c, &cx, rng).await;
    unpublish(sw, c, &cx, rng).await;
    validate(sw, c, &cx, rng).await;
    list(sw, c, &cx).await;
    capacity(sw, c).await;
    sw.send(c, "control", ControllerGetCapabilitiesRequest {}, OK)
        .await;
    unimplemented(sw, c, &cx, rng).await;
    expand(sw, c, &cx, rng).await;
    get(sw, c, &cx, rng).await;
}

/// CreateVolume: a base that would succeed, and one fault per case.
async fn create_volume(sw: &mut Sweep, c: &mut Client, cx: &Ctx<'_>, rng: &mut Rng) {
    let base = CreateVolumeRequest {
        name: format!("sweep-create-{}", hex(rng, 8)),
        capacity_range: Some(CapacityRange {
            required_bytes: 16 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![fs_cap()],
        parameters: HashMap::from([("deviceSelector".into(), "array=a".into())]),
        secrets: cx.rq.secrets(),
        volume_content_source: None,
        accessibility_requirements: Some(scenario::prefer(NODE)),
        mutable_parameters: HashMap::new(),
    };
    let with = |f: &dyn Fn(&mut CreateVolumeRequest)| {
        let mut r = base.clone();
        f(&mut r);
        r
    };
    let param = |k: &str, v: &str| {
        with(&|r| {
            r.parameters.insert(k.into(), v.into());
        })
    };
    let key = garbage(rng);
    let mut cases = Cases::new();
    cases
        .add("an empty name", with(&|r| r.name.clear()), INVALID)
        // The spec's general size limit for strings is 128 bytes.
        .add(
            "a 1 MiB name",
            with(&|r| r.name = "n".repeat(HUGE)),
            INVALID,
        )
        .add(
            "no capabilities",
            with(&|r| r.volume_capabilities.clear()),
            INVALID,
        )
        .add(
            "a filesystem for MULTI_NODE_MULTI_WRITER",
            with(&|r| {
                r.volume_capabilities = vec![capability(false, "xfs", Mode::MultiNodeMultiWriter)]
            }),
            INVALID,
        )
        .add("an unknown parameter", param("sweepUnknown", "1"), INVALID)
        .add(
            "deviceSelector (((",
            param("deviceSelector", "((("),
            INVALID,
        )
        .add("cleanup shred", param("cleanup", "shred"), INVALID)
        .add("fsType ntfs", param("fsType", "ntfs"), INVALID)
        .add(
            "a 1 MiB deviceSelector",
            param("deviceSelector", &"a".repeat(HUGE)),
            INVALID,
        )
        .add(
            "a negative required_bytes",
            with(&|r| {
                r.capacity_range = Some(CapacityRange {
                    required_bytes: -1,
                    limit_bytes: 0,
                })
            }),
            INVALID,
        )
        .add(
            "limit_bytes below required_bytes",
            with(&|r| {
                r.capacity_range = Some(CapacityRange {
                    required_bytes: 32 << 20,
                    limit_bytes: 16 << 20,
                })
            }),
            BAD_RANGE,
        )
        .add(
            "a snapshot source",
            with(&|r| {
                r.volume_content_source = Some(VolumeContentSource {
                    r#type: Some(volume_content_source::Type::Snapshot(
                        volume_content_source::SnapshotSource {
                            snapshot_id: "sweep-snap".into(),
                        },
                    )),
                })
            }),
            INVALID,
        )
        .add(
            "mutable parameters",
            with(&|r| {
                r.mutable_parameters.insert("iops".into(), "1000".into());
            }),
            INVALID,
        )
        .add(
            "an unknown topology key",
            with(&|r| {
                r.accessibility_requirements = Some(TopologyRequirement {
                    requisite: vec![Topology {
                        segments: HashMap::from([("sweep/zone".into(), "z".into())]),
                    }],
                    preferred: Vec::new(),
                })
            }),
            INVALID,
        )
        // "Unable to provision in accessible_topology" (8).
        .add(
            "a requisite node that does not exist",
            with(&|r| {
                let t = Topology {
                    segments: HashMap::from([(NODE_KEY.into(), "node-zz".into())]),
                };
                r.accessibility_requirements = Some(TopologyRequirement {
                    requisite: vec![t.clone()],
                    preferred: vec![t],
                })
            }),
            NO_TOPOLOGY,
        )
        // "Volume already exists but is incompatible" (6).
        .add(
            "the fixture's name with another size",
            with(&|r| {
                r.name = "sweep-fs".into();
                r.capacity_range = Some(CapacityRange {
                    required_bytes: 1 << 30,
                    limit_bytes: 0,
                });
            }),
            ALREADY_EXISTS,
        )
        .add(
            format!("a garbage parameter key {:?}", clip(&key)),
            param(&key, "1"),
            INVALID,
        )
        .each("", bad_capabilities(), INVALID, |cap| {
            with(&|r| r.volume_capabilities = vec![cap.clone()])
        });
    for (_, reply) in sw.table(c, cases).await {
        if let Some(v) = reply.and_then(|r| r.volume)
            && v.volume_id != cx.fs_id
        {
            sw.created.push(v.volume_id);
        }
    }
    // Control: the fixture's own request again is the same volume.
    let again = with(&|r| {
        r.name = "sweep-fs".into();
        r.capacity_range = Some(CapacityRange {
            required_bytes: 64 << 20,
            limit_bytes: 0,
        });
        r.parameters.insert("cleanup".into(), "discard".into());
    });
    let case = "control: the fixture's request again";
    if let Some(v) = sw.send(c, case, again, OK).await {
        let id = v.volume.as_ref().map(|v| v.volume_id.as_str());
        sw.holds(id == Some(cx.fs_id.as_str()), || {
            format!(
                "CreateVolume retried by name answered {id:?}, not {}",
                cx.fs_id
            )
        });
    }
}

async fn delete_volume(sw: &mut Sweep, c: &mut Client, cx: &Ctx<'_>, rng: &mut Rng) {
    let del = |id: &str| cx.rq.delete_volume(id);
    let mut cases = Cases::new();
    cases
        .add("an empty volume_id", del(""), INVALID)
        .add(
            "a volume that does not exist",
            del(&unknown_volume(rng)),
            OK,
        )
        // docs/parameters.md: an old binding's ID succeeds and does nothing.
        .add("a stale binding of the fixture's LUN", del(&cx.stale), OK)
        .add(
            "a 1 MiB volume_id",
            del(&"v".repeat(HUGE)),
            DELETE_OVERSIZED,
        )
        // "Volume in use" (9): the fixtures are published.
        .add("the published fs fixture", del(&cx.fs_id), PRECONDITION)
        .add(
            "the published raw fixture",
            del(&cx.fx.raw.volume_id),
            PRECONDITION,
        );
    sw.table(c, cases).await;
}

async fn publish(sw: &mut Sweep, c: &mut Client, cx: &Ctx<'_>, rng: &mut Rng) {
    let publish = |id: &str, node: &str, cap| cx.rq.controller_publish(id, node, cap);
    let fs_id = &cx.fs_id;
    let mut cases = Cases::new();
    cases
        .add(
            "an empty volume_id",
            publish("", NODE, Some(fs_cap())),
            INVALID,
        )
        .add(
            "an empty node_id",
            publish(fs_id, "", Some(fs_cap())),
            INVALID,
        )
        .add("no capability", publish(fs_id, NODE, None), INVALID)
        .add(
            "a volume that does not exist",
            publish(&unknown_volume(rng), NODE, Some(fs_cap())),
            NOT_FOUND,
        )
        .add(
            "a stale binding of the fixture's LUN",
            publish(&cx.stale, NODE, Some(fs_cap())),
            NOT_FOUND,
        )
        .add(
            "a 1 MiB volume_id",
            publish(&"v".repeat(HUGE), NODE, Some(fs_cap())),
            INVALID_OR_NOT_FOUND,
        )
        .add(
            "a node that does not exist",
            publish(fs_id, "node-zz", Some(fs_cap())),
            NOT_FOUND,
        )
        .add(
            "a 1 MiB node_id",
            publish(fs_id, &"n".repeat(HUGE), Some(fs_cap())),
            INVALID_OR_NOT_FOUND,
        )
        // "Volume published to another node" (9).
        .add(
            "a single-node volume to a second node",
            publish(fs_id, "node-b", Some(fs_cap())),
            PRECONDITION,
        )
        .add(
            "raw block for the filesystem fixture",
            publish(fs_id, NODE, Some(block_cap())),
            INCOMPATIBLE,
        )
        .each("", bad_capabilities(), INVALID, |cap| {
            publish(fs_id, NODE, Some(cap))
        })
        .add(
            "control: the fixture again where it is published",
            publish(fs_id, NODE, Some(fs_cap())),
            OK,
        );
    sw.table(c, cases).await;
}

async fn unpublish(sw: &mut Sweep, c: &mut Client, cx: &Ctx<'_>, rng: &mut Rng) {
    let unpublish = |id: &str, node: &str| cx.rq.controller_unpublish(id, node);
    let fs_id = &cx.fs_id;
    let mut cases = Cases::new();
    cases
        .add("an empty volume_id", unpublish("", NODE), INVALID)
        .add(
            "a volume that does not exist",
            unpublish(&unknown_volume(rng), NODE),
            UNPUBLISH_UNKNOWN,
        )
        .add(
            "a stale binding of the fixture's LUN",
            unpublish(&cx.stale, NODE),
            UNPUBLISH_UNKNOWN,
        )
        .add(
            "a 1 MiB volume_id",
            unpublish(&"v".repeat(HUGE), NODE),
            UNPUBLISH_GARBAGE,
        )
        .add(
            "a node that does not exist",
            unpublish(fs_id, "node-zz"),
            UNPUBLISH_UNKNOWN,
        )
        .add(
            "a 1 MiB node_id",
            unpublish(fs_id, &"n".repeat(HUGE)),
            UNPUBLISH_GARBAGE,
        )
        // "If the volume ... is not attached to the node ..., the Plugin
        // MUST reply 0 OK."
        .add(
            "control: a node it is not published to",
            unpublish(fs_id, "node-b"),
            OK,
        );
    sw.table(c, cases).await;
}

async fn validate(sw: &mut Sweep, c: &mut Client, cx: &Ctx<'_>, rng: &mut Rng) {
    let validate = |id: &str, caps, params: &[(&str, &str)]| cx.rq.validate(id, caps, params);
    let fs_id = &cx.fs_id;
    let mut cases = Cases::new();
    cases
        .add(
            "an empty volume_id",
            validate("", vec![fs_cap()], &[]),
            INVALID,
        )
        .add("no capabilities", validate(fs_id, vec![], &[]), INVALID)
        .add(
            "a volume that does not exist",
            validate(&unknown_volume(rng), vec![fs_cap()], &[]),
            NOT_FOUND,
        )
        .add(
            "a 1 MiB volume_id",
            validate(&"v".repeat(HUGE), vec![fs_cap()], &[]),
            INVALID_OR_NOT_FOUND,
        );
    sw.table(c, cases).await;
    let own = validate(fs_id, vec![fs_cap()], &[]);
    if let Some(v) = sw.send(c, "control: its own capability", own, OK).await {
        sw.holds(v.confirmed.is_some(), || {
            format!(
                "ValidateVolumeCapabilities did not confirm the fixture's own capability: {v:?}"
            )
        });
    }
    // Unsupported capabilities or parameters: OK with nothing confirmed
    // ("confirmed ... MUST be empty if the capabilities are not
    // supported"), or the Error Scheme's INVALID_ARGUMENT.
    let mut cases = Cases::new();
    cases
        .add(
            "raw block for the filesystem fixture",
            validate(fs_id, vec![block_cap()], &[]),
            UNSUPPORTED,
        )
        .add(
            "an unknown parameter",
            validate(fs_id, vec![fs_cap()], &[("sweepUnknown", "1")]),
            UNSUPPORTED,
        )
        .each("", bad_capabilities(), UNSUPPORTED, |cap| {
            validate(fs_id, vec![cap], &[])
        });
    for (case, reply) in sw.table(c, cases).await {
        if let Some(v) = reply {
            sw.holds(v.confirmed.is_none() && !v.message.is_empty(), || {
                format!("ValidateVolumeCapabilities with {case} confirmed it: {v:?}")
            });
        }
    }
}

async fn list(sw: &mut Sweep, c: &mut Client, cx: &Ctx<'_>) {
    let mut cases = Cases::new();
    cases
        // "Invalid starting_token" (10).
        .add(
            "a starting_token never issued",
            list_volumes(0, "sweep-token"),
            BAD_TOKEN,
        )
        .add(
            "a 1 MiB starting_token",
            list_volumes(0, &"t".repeat(HUGE)),
            BAD_TOKEN_OVERSIZED,
        )
        .add("a negative max_entries", list_volumes(-1, ""), INVALID);
    sw.table(c, cases).await;
    if let Some(l) = sw.send(c, "control", list_volumes(0, ""), OK).await {
        let ids: Vec<&str> = l
            .entries
            .iter()
            .filter_map(|e| e.volume.as_ref().map(|v| v.volume_id.as_str()))
            .collect();
        sw.holds(
            ids.contains(&cx.fs_id.as_str()) && ids.contains(&cx.fx.raw.volume_id.as_str()),
            || format!("ListVolumes does not list the fixtures: {ids:?}"),
        );
    }
}

async fn capacity(sw: &mut Sweep, c: &mut Client) {
    let mut cases = Cases::new();
    cases
        .add(
            "an unknown parameter",
            get_capacity(vec![], &[("sweepUnknown", "1")], None),
            INVALID,
        )
        .add(
            "deviceSelector (((",
            get_capacity(vec![], &[("deviceSelector", "(((")], None),
            INVALID,
        )
        .add(
            "an unknown topology key",
            get_capacity(vec![], &[], Some(("sweep/zone", "z"))),
            INVALID,
        )
        .each("", bad_capabilities(), INVALID, |cap| {
            get_capacity(vec![cap], &[], None)
        });
    sw.table(c, cases).await;
    let nowhere = get_capacity(vec![], &[], Some((NODE_KEY, "node-zz")));
    if let Some(g) = sw.send(c, "a node that does not exist", nowhere, OK).await {
        sw.holds(g.available_capacity == 0, || {
            format!("GetCapacity on a node that does not exist: {g:?}")
        });
    }
    let control = get_capacity(vec![fs_cap()], &[], None);
    if let Some(g) = sw.send(c, "control", control, OK).await {
        sw.holds(g.available_capacity > 0, || {
            format!("GetCapacity control: {g:?}")
        });
    }
}

/// Snapshots and modification are not offered: "Call not implemented".
async fn unimplemented(sw: &mut Sweep, c: &mut Client, cx: &Ctx<'_>, rng: &mut Rng) {
    let secrets = cx.rq.secrets();
    let req = CreateSnapshotRequest {
        source_volume_id: cx.fs_id.clone(),
        name: String::new(),
        secrets: secrets.clone(),
        parameters: HashMap::new(),
    };
    sw.send(c, "an empty name", req, UNIMPLEMENTED).await;
    let req = DeleteSnapshotRequest {
        snapshot_id: garbage(rng),
        secrets: secrets.clone(),
    };
    sw.send(c, "a garbage snapshot_id", req, UNIMPLEMENTED)
        .await;
    let req = ListSnapshotsRequest {
        max_entries: -1,
        starting_token: garbage(rng),
        source_volume_id: String::new(),
        snapshot_id: String::new(),
        secrets: secrets.clone(),
    };
    sw.send(c, "a garbage token", req, UNIMPLEMENTED).await;
    let req = GetSnapshotRequest {
        snapshot_id: String::new(),
        secrets: secrets.clone(),
    };
    sw.send(c, "an empty snapshot_id", req, UNIMPLEMENTED).await;
    let req = ControllerModifyVolumeRequest {
        volume_id: cx.fs_id.clone(),
        secrets,
        mutable_parameters: HashMap::from([("sweepUnknown".into(), "1".into())]),
    };
    sw.send(c, "an unknown mutable parameter", req, UNIMPLEMENTED)
        .await;
}

async fn expand(sw: &mut Sweep, c: &mut Client, cx: &Ctx<'_>, rng: &mut Rng) {
    let expand = |id: &str, range, cap| cx.rq.controller_expand(id, range, cap);
    let fs_id = &cx.fs_id;
    let size = cx.fx.fs.capacity_bytes;
    let mut cases = Cases::new();
    cases
        .add(
            "an empty volume_id",
            expand("", Some((size, 0)), Some(fs_cap())),
            INVALID,
        )
        .add(
            "no capacity_range",
            expand(fs_id, None, Some(fs_cap())),
            INVALID,
        )
        .add(
            "a negative required_bytes",
            expand(fs_id, Some((-1, 0)), Some(fs_cap())),
            INVALID,
        )
        .add(
            "limit_bytes below required_bytes",
            expand(fs_id, Some((size, size / 2)), Some(fs_cap())),
            BAD_RANGE,
        )
        .add(
            "a volume that does not exist",
            expand(&unknown_volume(rng), Some((size, 0)), Some(fs_cap())),
            NOT_FOUND,
        )
        .add(
            "a stale binding of the fixture's LUN",
            expand(&cx.stale, Some((size, 0)), Some(fs_cap())),
            NOT_FOUND,
        )
        .add(
            "a 1 MiB volume_id",
            expand(&"v".repeat(HUGE), Some((size, 0)), Some(fs_cap())),
            INVALID_OR_NOT_FOUND,
        )
        // "Exceeds capabilities" (3).
        .add(
            "raw block for the filesystem fixture",
            expand(fs_id, Some((size, 0)), Some(block_cap())),
            INVALID,
        )
        .each("", bad_capabilities(), INVALID, |cap| {
            expand(fs_id, Some((size, 0)), Some(cap))
        })
        .add(
            "control: the size it has",
            expand(fs_id, Some((size, 0)), Some(fs_cap())),
            OK,
        );
    sw.table(c, cases).await;
}

async fn get(sw: &mut Sweep, c: &mut Client, cx: &Ctx<'_>, rng: &mut Rng) {
    let mut cases = Cases::new();
    cases
        .add("an empty volume_id", get_volume(""), INVALID)
        .add(
            "a volume that does not exist",
            get_volume(&unknown_volume(rng)),
            NOT_FOUND,
        )
        .add(
            "a stale binding of the fixture's LUN",
            get_volume(&cx.stale),
            NOT_FOUND,
        )
        .add(
            "a 1 MiB volume_id",
            get_volume(&"v".repeat(HUGE)),
            INVALID_OR_NOT_FOUND,
        );
    sw.table(c, cases).await;
}
