//! Seeded garbage: random IDs and strings, and the rounds that send them
//! in every ID field of every RPC.

use std::collections::HashMap;

use csi_scsi_proto::agent::{self as api, agent_client::AgentClient};
use csi_scsi_proto::csi::CreateVolumeRequest;
use tonic::transport::Channel;

use super::codes::*;
use super::fixture::Fixture;
use super::requests::*;
use super::{NODE, Sweep, clip};
use crate::lab::scenario::Clients;

/// `n` random hex digits.
pub(super) fn hex(rng: &mut fastrand::Rng, n: usize) -> String {
    (0..n)
        .map(|_| char::from_digit(rng.u32(..16), 16).unwrap_or('0'))
        .collect()
}

/// A random version-4 UUID.
pub(super) fn uuid(rng: &mut fastrand::Rng) -> String {
    format!(
        "{}-{}-4{}-a{}-{}",
        hex(rng, 8),
        hex(rng, 4),
        hex(rng, 3),
        hex(rng, 3),
        hex(rng, 12)
    )
}

/// A volume ID of the right shape that names no volume.
pub(super) fn unknown_volume(rng: &mut fastrand::Rng) -> String {
    format!("naa.6{}:{}", hex(rng, 31), uuid(rng))
}

/// A WWID of the right shape that names no LUN.
pub(super) fn unknown_wwid(rng: &mut fastrand::Rng) -> String {
    format!("naa.6{}", hex(rng, 31))
}

/// A random string no service could take for an ID: printable noise,
/// arbitrary Unicode with control characters, an almost-volume-ID, a path,
/// escapes, or a long run.
pub(super) fn garbage(rng: &mut fastrand::Rng) -> String {
    match rng.u8(..7) {
        0 => (0..rng.usize(1..200))
            .map(|_| rng.char(' '..='~'))
            .collect(),
        1 => (0..rng.usize(1..100)).map(|_| rng.char(..)).collect(),
        // An invalid binding UID ('/' is never in one).
        2 => format!("naa.6{}:{}/{}", hex(rng, 31), hex(rng, 8), hex(rng, 4)),
        3 => format!("{}etc/passwd", "../".repeat(rng.usize(1..20))),
        4 => format!("vol\0{}\n%00{}", hex(rng, 8), rng.char(..)),
        5 => rng
            .char('\u{80}'..='\u{10ffff}')
            .to_string()
            .repeat(rng.usize(200..2000)),
        _ => format!(
            "{}:{}",
            (0..rng.usize(1..40))
                .map(|_| rng.char(' '..='~'))
                .collect::<String>(),
            uuid(rng)
        ),
    }
}

/// One round of seeded garbage: random IDs in every ID field of every RPC.
pub(super) async fn round(
    sw: &mut Sweep,
    cl: &mut Clients,
    fx: &Fixture,
    mut a: AgentClient<Channel>,
    rng: &mut fastrand::Rng,
) {
    let c = &mut cl.controller;
    let g = garbage(rng);
    let case = &format!("garbage {:?}", clip(&g));
    let fs_id = &fx.fs_id();
    let rq = Requests::new(sw, fx).bare();
    let staging = &fx.fs_staging.display().to_string();
    let target = &fx.fs_target.display().to_string();

    let create = CreateVolumeRequest {
        name: garbage(rng),
        capacity_range: None,
        volume_capabilities: vec![fs_cap()],
        parameters: HashMap::from([(g.clone(), garbage(rng))]),
        secrets: rq.secrets(),
        volume_content_source: None,
        accessibility_requirements: None,
        mutable_parameters: HashMap::new(),
    };
    let named = format!("a parameter named {case}");
    if let Some(v) = sw
        .send(c, &named, create, INVALID)
        .await
        .and_then(|r| r.volume)
    {
        sw.created.push(v.volume_id);
    }
    // A volume that cannot exist does not exist: "MUST reply 0 OK".
    sw.send(c, case, rq.delete_volume(&g), DELETE_OVERSIZED)
        .await;
    let req = rq.controller_publish(&g, NODE, Some(fs_cap()));
    sw.send(c, case, req, INVALID_OR_NOT_FOUND).await;
    let req = rq.controller_publish(fs_id, &g, Some(fs_cap()));
    sw.send(c, &format!("node {case}"), req, INVALID_OR_NOT_FOUND)
        .await;
    let req = rq.controller_unpublish(&g, NODE);
    sw.send(c, case, req, UNPUBLISH_GARBAGE).await;
    let req = rq.validate(&g, vec![fs_cap()], &[]);
    sw.send(c, case, req, INVALID_OR_NOT_FOUND).await;
    let req = list_volumes(0, &g);
    sw.send(c, &format!("token {case}"), req, BAD_TOKEN).await;
    let req = rq.controller_expand(&g, Some((1 << 20, 0)), None);
    sw.send(c, case, req, INVALID_OR_NOT_FOUND).await;
    sw.send(c, case, get_volume(&g), INVALID_OR_NOT_FOUND).await;

    // Node: a garbage volume ID at the fixture's real paths.
    let n = &mut cl.node(NODE);
    let req = rq.node_stage(&g, staging, Some(fs_cap()));
    sw.send(n, case, req, INVALID_OR_NOT_FOUND).await;
    let req = node_unstage(&g, staging);
    sw.send(n, case, req, INVALID_OR_NOT_FOUND).await;
    let req = rq.node_publish(&g, staging, target, Some(fs_cap()), false);
    sw.send(n, case, req, INVALID_OR_NOT_FOUND).await;
    let req = node_unpublish(&g, target);
    sw.send(n, case, req, INVALID_OR_NOT_FOUND).await;
    let req = node_stats(&g, target);
    sw.send(n, case, req, INVALID_OR_NOT_FOUND).await;
    let req = rq.node_expand(&g, target, None, None);
    sw.send(n, case, req, INVALID_OR_NOT_FOUND).await;
    // A garbage path with the fixture's volume.
    let p = garbage(rng);
    let pcase = &format!("path {:?}", clip(&p));
    sw.send(n, pcase, node_unpublish(fs_id, &p), INVALID).await;
    sw.send(n, pcase, node_unstage(fs_id, &p), INVALID).await;

    // Agent API: a garbage WWID everywhere.
    let w = garbage(rng);
    let wcase = &format!("WWID {:?}", clip(&w));
    let a = &mut a;
    let req = attach(&w, vec![fx.array_a.clone()], 1);
    sw.send(a, wcase, req, INVALID).await;
    sw.send(a, wcase, detach(&w, vec![]), INVALID).await;
    let req = wipe(&w, api::WipeMode::Zero as i32);
    sw.send(a, wcase, req, INVALID).await;
    sw.send(a, wcase, rescan(&w), INVALID).await;
    let target = iscsi(&garbage(rng), &[&garbage(rng)], &garbage(rng), None);
    let req = api::DiscoverRequest {
        target: Some(target),
    };
    sw.send(a, "a garbage portal and IQN", req, INVALID).await;
}
