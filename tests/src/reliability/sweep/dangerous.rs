//! Well-formed requests that would destroy a fixture if a driver got them
//! wrong; sent last, so that a failure does not cascade.

use std::time::Duration;

use csi_scsi_proto::agent::{self as api, agent_client::AgentClient};
use tonic::transport::Channel;

use super::codes::*;
use super::fixture::{ARRAY_A, Fixture, lun_through};
use super::requests::{attach, bounded, detach, node_unpublish, node_unstage, wipe};
use super::rpc::Rpc;
use super::{NODE, Sweep};
use crate::lab::scenario::Clients;

/// Sends the dangerous requests.
pub(super) async fn sweep(
    sw: &mut Sweep,
    cl: &mut Clients,
    fx: &Fixture,
    mut a: AgentClient<Channel>,
) {
    let raw_wwid = Fixture::wwid(&fx.raw);
    let fs_wwid = Fixture::wwid(&fx.fs);
    // agent.proto: Wipe and Detach refuse (FAILED_PRECONDITION) a device
    // mounted or open anywhere on the node; a raw block publication is a
    // bind of the device node, and a filesystem's a mount.
    for (case, wwid) in [
        ("the mounted filesystem fixture's LUN", &fs_wwid),
        ("the published raw block fixture's LUN", &raw_wwid),
    ] {
        let req = wipe(wwid, api::WipeMode::Discard as i32);
        sw.send(&mut a, case, req, PRECONDITION).await;
        sw.send(&mut a, case, detach(wwid, vec![]), PRECONDITION)
            .await;
    }
    // An Attach of another WWID at the address of a LUN in use must leave
    // that LUN alone.
    let status = api::StatusRequest {}.send(&mut a).await;
    let raw_lun = status
        .ok()
        .and_then(|s| lun_through(&s, &raw_wwid, ARRAY_A));
    if sw.holds(raw_lun.is_some(), || {
        "node-a no longer sees the raw fixture's LUN through array-a".into()
    }) {
        let req = attach(
            &format!("naa.6{}", "e".repeat(31)),
            vec![fx.array_a.clone()],
            raw_lun.unwrap_or_default(),
        );
        sw.send(
            &mut a,
            "a wrong WWID at the address of the published raw block fixture",
            bounded(req, Duration::from_secs(3)),
            ATTACH_NEVER,
        )
        .await;
    }
    // CSI Node: a volume that does not exist, at the fixtures' real paths.
    let unknown = format!("naa.6{}:{}", "d".repeat(31), "0123-4567");
    let n = &mut cl.node(NODE);
    let req = node_unpublish(&unknown, &fx.fs_target.display().to_string());
    let case = "a volume that does not exist, at the fixture's target";
    sw.send(n, case, req, NOT_THIS_VOLUME).await;
    let req = node_unstage(&unknown, &fx.fs_staging.display().to_string());
    let case = "a volume that does not exist, at the fixture's staging path";
    sw.send(n, case, req, NOT_THIS_VOLUME).await;
}
