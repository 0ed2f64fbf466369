//! The Node service's tables, on node-a, and its control calls on every
//! node.

use csi_scsi_proto::csi::node_client::NodeClient;
use csi_scsi_proto::csi::volume_capability::access_mode::Mode;
use csi_scsi_proto::csi::{NodeGetCapabilitiesRequest, NodeGetInfoRequest};
use fastrand::Rng;
use tonic::transport::Channel;

use super::codes::*;
use super::fixture::Fixture;
use super::garbage::unknown_volume;
use super::inputs::bad_capabilities;
use super::requests::{
    Requests, block_cap, fs_cap, mount_cap, node_stats, node_unpublish, node_unstage,
};
use super::{Cases, HUGE, NODE, Sweep};
use crate::lab::Lab;
use crate::lab::scenario::{Clients, capability};

type Client = NodeClient<Channel>;

/// What every table of the service needs.
struct Ctx<'a> {
    fx: &'a Fixture,
    rq: Requests,
    fs_id: String,
    /// The fs fixture's staging and target paths.
    staging: String,
    target: String,
    /// A volume ID of the right shape that names no volume.
    unknown: String,
}

/// Sends every Node RPC its table.
pub(super) async fn sweep(
    sw: &mut Sweep,
    lab: &Lab,
    cl: &mut Clients,
    fx: &Fixture,
    rng: &mut Rng,
) {
    let mut n = cl.node(NODE);
    let cx = Ctx {
        fx,
        rq: Requests::new(sw, fx),
        fs_id: fx.fs_id(),
        staging: fx.fs_staging.display().to_string(),
        target: fx.fs_target.display().to_string(),
        unknown: unknown_volume(rng),
    };
    stage(sw, &mut n, &cx).await;
    unstage(sw, &mut n, &cx).await;
    publish(sw, &mut n, &cx).await;
    unpublish(sw, &mut n, &cx).await;
    stats(sw, &mut n, &cx).await;
    expand(sw, &mut n, &cx).await;
    for ln in &lab.nodes {
        let mut n = cl.node(&ln.name);
        let control = format!("{}: control", ln.name);
        sw.send(&mut n, &control, NodeGetCapabilitiesRequest {}, OK)
            .await;
        if let Some(i) = sw.send(&mut n, &control, NodeGetInfoRequest {}, OK).await {
            sw.holds(i.node_id == ln.name, || {
                format!("{} says it is {:?}", ln.name, i.node_id)
            });
        }
    }
}

/// NodeStageVolume: the fixture is staged; a request that passed its
/// checks would meet the device in use (or succeed, at the real path), so
/// INVALID_ARGUMENT can only come from the check under test.
async fn stage(sw: &mut Sweep, n: &mut Client, cx: &Ctx<'_>) {
    let stage = |id: &str, path: &str, cap| cx.rq.node_stage(id, path, cap);
    let (fs_id, staging) = (&cx.fs_id, &cx.staging);
    let mkfs = |options: String| {
        let mut r = stage(fs_id, staging, Some(fs_cap()));
        r.volume_context.insert("mkfsOptions".into(), options);
        r
    };
    let mut cases = Cases::new();
    cases
        .add(
            "an empty volume_id",
            stage("", staging, Some(fs_cap())),
            INVALID,
        )
        .add(
            "a 1 MiB volume_id",
            stage(&"v".repeat(HUGE), staging, Some(fs_cap())),
            INVALID_OR_NOT_FOUND,
        )
        .add(
            "a volume that does not exist",
            stage(&cx.unknown, &cx.fx.fresh_staging("unknown"), Some(fs_cap())),
            NOT_FOUND,
        )
        .add(
            "an empty staging_target_path",
            stage(fs_id, "", Some(fs_cap())),
            INVALID,
        )
        .add("no capability", stage(fs_id, staging, None), INVALID)
        .add(
            "mount flags that remount",
            stage(fs_id, staging, Some(mount_cap("xfs", &["remount"], ""))),
            INVALID,
        )
        .add(
            "a 1 MiB mount flag",
            stage(
                fs_id,
                staging,
                Some(mount_cap("xfs", &[&"o".repeat(HUGE)], "")),
            ),
            INVALID,
        )
        .add(
            "a mount flag with a newline",
            stage(fs_id, staging, Some(mount_cap("xfs", &["ro\nexec"], ""))),
            INVALID,
        )
        .add(
            "a volume_mount_group",
            stage(fs_id, staging, Some(mount_cap("xfs", &[], "1000"))),
            INVALID,
        )
        .add(
            "a filesystem for MULTI_NODE_MULTI_WRITER",
            stage(
                fs_id,
                staging,
                Some(capability(false, "xfs", Mode::MultiNodeMultiWriter)),
            ),
            EXCEEDS,
        )
        // "Volume published but is incompatible" (6).
        .add(
            "ext4 where it is staged as xfs",
            stage(
                fs_id,
                staging,
                Some(capability(false, "ext4", Mode::SingleNodeWriter)),
            ),
            ALREADY_EXISTS,
        )
        .add(
            "mkfsOptions with a shell command",
            mkfs("-f; rm -rf / #".into()),
            INVALID,
        )
        .add(
            "1 MiB of mkfsOptions",
            mkfs("-K ".repeat(HUGE / 3)),
            INVALID,
        )
        .each("", bad_capabilities(), INVALID, |cap| {
            stage(fs_id, staging, Some(cap))
        })
        .each("a staging path: ", cx.fx.bad_paths(), INVALID, |path| {
            stage(fs_id, &path, Some(fs_cap()))
        })
        .add(
            "control: the fixture where it is staged",
            stage(fs_id, staging, Some(fs_cap())),
            OK,
        );
    sw.table(n, cases).await;
}

/// NodeUnstageVolume: only what cannot unstage the fixture.
async fn unstage(sw: &mut Sweep, n: &mut Client, cx: &Ctx<'_>) {
    let (fs_id, staging) = (&cx.fs_id, &cx.staging);
    let mut cases = Cases::new();
    cases
        .add("an empty volume_id", node_unstage("", staging), INVALID)
        .add(
            "an empty staging_target_path",
            node_unstage(fs_id, ""),
            INVALID,
        )
        .add(
            "a 1 MiB volume_id",
            node_unstage(&"v".repeat(HUGE), staging),
            INVALID_OR_NOT_FOUND,
        )
        .add(
            "a volume that does not exist",
            node_unstage(&cx.unknown, &cx.fx.fresh_staging("unknown")),
            NODE_UNDO_UNKNOWN,
        )
        // "If the volume ... is not staged to the staging_target_path, the
        // Plugin MUST reply 0 OK."
        .add(
            "control: a path it is not staged at",
            node_unstage(fs_id, &cx.fx.fresh_staging("none")),
            OK,
        )
        .each("a staging path: ", cx.fx.bad_paths(), INVALID, |path| {
            node_unstage(fs_id, &path)
        });
    sw.table(n, cases).await;
}

async fn publish(sw: &mut Sweep, n: &mut Client, cx: &Ctx<'_>) {
    let publish = |id: &str, staging: &str, target: &str, cap, ro| {
        cx.rq.node_publish(id, staging, target, cap, ro)
    };
    let (fs_id, staging, target) = (&cx.fs_id, &cx.staging, &cx.target);
    let fresh = &cx.fx.fresh_target("publish");
    let mut cases = Cases::new();
    cases
        .add(
            "an empty volume_id",
            publish("", staging, target, Some(fs_cap()), false),
            INVALID,
        )
        .add(
            "a 1 MiB volume_id",
            publish(&"v".repeat(HUGE), staging, target, Some(fs_cap()), false),
            INVALID_OR_NOT_FOUND,
        )
        .add(
            "a volume that does not exist",
            publish(&cx.unknown, staging, fresh, Some(fs_cap()), false),
            NOT_FOUND,
        )
        .add(
            "an empty target_path",
            publish(fs_id, staging, "", Some(fs_cap()), false),
            INVALID,
        )
        // "Staging target path not set" (9).
        .add(
            "an empty staging_target_path",
            publish(fs_id, "", fresh, Some(fs_cap()), false),
            PRECONDITION,
        )
        .add(
            "no capability",
            publish(fs_id, staging, fresh, None, false),
            INVALID,
        )
        .add(
            "the staging path as target",
            publish(fs_id, staging, staging, Some(fs_cap()), false),
            INVALID,
        )
        // "Volume published but is incompatible" (6): published rw.
        .add(
            "readonly where it is published read-write",
            publish(fs_id, staging, target, Some(fs_cap()), true),
            ALREADY_EXISTS,
        )
        // The second-publish table: SINGLE_NODE_WRITER at a second target
        // path with SINGLE_NODE_MULTI_WRITER support is FAILED_PRECONDITION.
        .add(
            "a second target for SINGLE_NODE_WRITER",
            publish(fs_id, staging, fresh, Some(fs_cap()), false),
            PRECONDITION,
        )
        .each("", bad_capabilities(), INVALID, |cap| {
            publish(fs_id, staging, fresh, Some(cap), false)
        });
    for (case, path) in cx.fx.bad_paths() {
        cases.add(
            format!("a target path: {case}"),
            publish(fs_id, staging, &path, Some(fs_cap()), false),
            INVALID,
        );
        // An empty staging path is another case (FAILED_PRECONDITION).
        if !path.is_empty() {
            cases.add(
                format!("a staging path: {case}"),
                publish(fs_id, &path, fresh, Some(fs_cap()), false),
                INVALID,
            );
        }
    }
    cases.add(
        "control: the fixture where it is published",
        publish(fs_id, staging, target, Some(fs_cap()), false),
        OK,
    );
    sw.table(n, cases).await;
}

/// NodeUnpublishVolume: only what cannot unpublish the fixture.
async fn unpublish(sw: &mut Sweep, n: &mut Client, cx: &Ctx<'_>) {
    let (fs_id, target) = (&cx.fs_id, &cx.target);
    let mut cases = Cases::new();
    cases
        .add("an empty volume_id", node_unpublish("", target), INVALID)
        .add("an empty target_path", node_unpublish(fs_id, ""), INVALID)
        .add(
            "a 1 MiB volume_id",
            node_unpublish(&"v".repeat(HUGE), target),
            INVALID_OR_NOT_FOUND,
        )
        .add(
            "a volume that does not exist",
            node_unpublish(&cx.unknown, &cx.fx.fresh_target("unknown")),
            NODE_UNDO_UNKNOWN,
        )
        .add(
            "control: a path it is not published at",
            node_unpublish(fs_id, &cx.fx.fresh_target("none")),
            OK,
        )
        .each("a target path: ", cx.fx.bad_paths(), INVALID, |path| {
            node_unpublish(fs_id, &path)
        });
    sw.table(n, cases).await;
}

async fn stats(sw: &mut Sweep, n: &mut Client, cx: &Ctx<'_>) {
    let (fs_id, target) = (&cx.fs_id, &cx.target);
    let mut cases = Cases::new();
    cases
        .add("an empty volume_id", node_stats("", target), INVALID)
        .add("an empty volume_path", node_stats(fs_id, ""), INVALID)
        .add(
            "a 1 MiB volume_id",
            node_stats(&"v".repeat(HUGE), target),
            INVALID_OR_NOT_FOUND,
        )
        // "Volume does not exist" on the specified volume_path (5).
        .add(
            "a volume that is not at the path",
            node_stats(&cx.unknown, target),
            NOT_FOUND,
        )
        .add(
            "a path that does not exist",
            node_stats(fs_id, &cx.fx.fresh_target("none")),
            NOT_FOUND,
        )
        // A path outside the kubelet directory is invalid, and the volume
        // is not there either.
        .each(
            "a volume path: ",
            cx.fx.bad_paths(),
            INVALID_OR_NOT_FOUND,
            |path| node_stats(fs_id, &path),
        );
    sw.table(n, cases).await;
    let control = node_stats(fs_id, target);
    if let Some(s) = sw.send(n, "control: the fixture", control, OK).await {
        let abnormal = s.volume_condition.as_ref().is_some_and(|c| c.abnormal);
        sw.holds(!s.usage.is_empty() && !abnormal, || {
            format!("NodeGetVolumeStats of the fixture: {s:?}")
        });
    }
}

async fn expand(sw: &mut Sweep, n: &mut Client, cx: &Ctx<'_>) {
    let expand = |id: &str, path: &str, range, cap| cx.rq.node_expand(id, path, range, cap);
    let (fs_id, target) = (&cx.fs_id, &cx.target);
    let mut cases = Cases::new();
    cases
        .add(
            "an empty volume_id",
            expand("", target, None, Some(fs_cap())),
            INVALID,
        )
        .add(
            "an empty volume_path",
            expand(fs_id, "", None, Some(fs_cap())),
            INVALID,
        )
        .add(
            "a 1 MiB volume_id",
            expand(&"v".repeat(HUGE), target, None, Some(fs_cap())),
            INVALID_OR_NOT_FOUND,
        )
        .add(
            "a volume that is not at the path",
            expand(&cx.unknown, target, None, Some(fs_cap())),
            NOT_FOUND,
        )
        .add(
            "a negative required_bytes",
            expand(fs_id, target, Some((-1, 0)), Some(fs_cap())),
            INVALID,
        )
        .add(
            "limit_bytes below required_bytes",
            expand(fs_id, target, Some((2 << 20, 1 << 20)), Some(fs_cap())),
            BAD_RANGE,
        )
        // "Unsupported capacity_range" (11): more than the LUN has.
        .add(
            "1 PiB required",
            expand(fs_id, target, Some((1 << 50, 0)), Some(fs_cap())),
            OUT_OF_RANGE,
        )
        // "Exceeds capabilities" (3).
        .add(
            "raw block for the filesystem fixture",
            expand(fs_id, target, None, Some(block_cap())),
            INVALID,
        )
        .each("", bad_capabilities(), INVALID, |cap| {
            expand(fs_id, target, None, Some(cap))
        })
        // As for NodeGetVolumeStats: invalid, and no volume is there.
        .each(
            "a volume path: ",
            cx.fx.bad_paths(),
            INVALID_OR_NOT_FOUND,
            |path| expand(fs_id, &path, None, Some(fs_cap())),
        )
        .add(
            "control: to the size it has",
            expand(fs_id, target, None, Some(fs_cap())),
            OK,
        );
    sw.table(n, cases).await;
}
