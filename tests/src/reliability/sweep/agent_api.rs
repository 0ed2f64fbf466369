//! The agent API of node-a, over mTLS: malformed Discover, Attach, Detach,
//! Wipe and Rescan requests.

use std::time::Duration;

use anyhow::Context;
use csi_scsi_proto::agent::{self as api, agent_client::AgentClient};
use fastrand::Rng;
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::codes::*;
use super::fixture::{ARRAY_A, Fixture, lun_through};
use super::garbage::unknown_wwid;
use super::inputs::{bad_targets, bad_wwids};
use super::requests::{attach, bounded, detach, iscsi, rescan, wipe};
use super::rpc::Rpc;
use super::{AGENT_API, Cases, Sweep};
use crate::lab::scenario::lun_file;
use crate::lab::{CHAP_USER, Lab};

type Client = AgentClient<Channel>;

/// What every table of the API needs.
struct Ctx<'a> {
    lab: &'a Lab,
    fx: &'a Fixture,
    /// The secret the bad targets carry as CHAP secret.
    token: String,
    /// A LUN of array-a no fixture uses, as node-a sees it.
    spare: Spare,
}

/// A LUN of array-a, as node-a sees it.
struct Spare {
    /// Its name in the lab.
    name: &'static str,
    wwid: String,
    /// Its LUN number through array-a.
    lun: u32,
}

/// Sends every agent API RPC its table.
pub(super) async fn sweep(
    sw: &mut Sweep,
    lab: &Lab,
    mut a: Client,
    fx: &Fixture,
    rng: &mut Rng,
) -> anyhow::Result<()> {
    let status = api::StatusRequest {}.send(&mut a).await;
    sw.check(AGENT_API, "Status", "control", &status, OK);
    let status = status.context("agent status")?;
    let cx = Ctx {
        lab,
        fx,
        token: sw.secrets[1].clone(),
        spare: spare(lab, fx, &status)?,
    };
    discover_table(sw, &mut a, &cx).await;
    attach_table(sw, &mut a, &cx, rng).await;
    detach_table(sw, &mut a, &cx, rng).await;
    wipe_table(sw, &mut a, &cx, rng).await;
    rescan_table(sw, &mut a, rng).await;
    Ok(())
}

/// A LUN of array-a no fixture uses.
fn spare(lab: &Lab, fx: &Fixture, status: &api::StatusResponse) -> anyhow::Result<Spare> {
    let name = ["a1", "a2", "mp"]
        .into_iter()
        .find(|n| *n != fx.fs_lun && *n != fx.raw_lun)
        .context("a spare LUN")?;
    let file = &lab.luns[name];
    let wwid = status
        .devices
        .iter()
        .map(|d| d.wwid.clone())
        .find(|w| lun_file(lab, w).is_some_and(|(_, f)| f == *file))
        .with_context(|| format!("node-a does not see LUN {name}"))?;
    let lun = lun_through(status, &wwid, ARRAY_A)
        .with_context(|| format!("node-a sees LUN {name} through no path of array-a"))?;
    Ok(Spare { name, wwid, lun })
}

async fn discover_table(sw: &mut Sweep, a: &mut Client, cx: &Ctx<'_>) {
    let discover = |target| api::DiscoverRequest { target };
    let closed = iscsi(
        "sweep-closed",
        &[&format!("{}:3261", cx.lab.net.host_ip())],
        ARRAY_A,
        Some((CHAP_USER, &cx.token)),
    );
    let mut cases = Cases::new();
    cases
        .add("no target", discover(None), INVALID)
        .each("", bad_targets(cx.lab, &cx.token), INVALID, |t| {
            discover(Some(t))
        })
        // agent.proto: UNAVAILABLE when no portal answered.
        .add(
            "a portal nobody listens on",
            discover(Some(closed)),
            UNAVAILABLE,
        );
    sw.table(a, cases).await;
    let control = discover(Some(cx.fx.array_a.clone()));
    if let Some(d) = sw.send(a, "control: array-a", control, OK).await {
        let wwid = &cx.spare.wwid;
        sw.holds(d.luns.iter().any(|l| l.wwid == *wwid), || {
            format!("Discover of array-a does not report {wwid}")
        });
    }
}

async fn attach_table(sw: &mut Sweep, a: &mut Client, cx: &Ctx<'_>, rng: &mut Rng) {
    let (array_a, spare) = (&cx.fx.array_a, &cx.spare);
    let mut cases = Cases::new();
    cases
        .each("", bad_wwids(rng), INVALID, |w| {
            attach(&w, vec![array_a.clone()], spare.lun)
        })
        .add("no targets", attach(&unknown_wwid(rng), vec![], 1), INVALID)
        .each("", bad_targets(cx.lab, &cx.token), INVALID, |t| {
            attach(&spare.wwid, vec![t], spare.lun)
        });
    sw.table(a, cases).await;
    // Control first: what follows may take the spare LUN's path away for
    // a moment.
    // The lab's kernel stand-in rewrites a disk's sysfs `size` in place on
    // every discovery scan, so a read racing it can miss the disk for a
    // moment (the kernel's sysfs never does): a control asks again briefly.
    let mut r = Err(Status::unknown("not sent"));
    for _ in 0..10 {
        r = rescan(&spare.wwid).send(a).await;
        if !matches!(&r, Err(s) if s.code() == Code::NotFound) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if sw.check(AGENT_API, "Rescan", "control: the spare LUN", &r, OK)
        && let Ok(s) = &r
    {
        let size = std::fs::metadata(&cx.lab.luns[spare.name]).map_or(0, |m| m.len());
        sw.holds(s.size_bytes == size, || {
            format!(
                "Rescan of {} says {} bytes, its file has {size}",
                spare.name, s.size_bytes
            )
        });
    }
    // A WWID that never appears, and one at the address of a real LUN
    // (which is left in place): bounded by a short deadline.
    for (case, lun) in [
        ("a WWID no LUN has", 77),
        ("a wrong WWID at a spare LUN's address", spare.lun),
    ] {
        let req = attach(&unknown_wwid(rng), vec![array_a.clone()], lun);
        sw.send(a, case, bounded(req, Duration::from_secs(3)), ATTACH_NEVER)
            .await;
    }
}

async fn detach_table(sw: &mut Sweep, a: &mut Client, cx: &Ctx<'_>, rng: &mut Rng) {
    let mut cases = Cases::new();
    cases
        .each("", bad_wwids(rng), INVALID, |w| detach(&w, vec![]))
        .each("", bad_targets(cx.lab, &cx.token), INVALID, |t| {
            detach(&cx.spare.wwid, vec![t])
        });
    sw.table(a, cases).await;
    // agent.proto: "A device that is already gone is success."
    let absent = detach(&unknown_wwid(rng), vec![cx.fx.array_a.clone()]);
    if let Some(d) = sw
        .send(a, "control: a WWID that is not here", absent, OK)
        .await
    {
        sw.holds(!d.removed, || {
            "Detach of an absent WWID removed something".into()
        });
    }
}

/// Wipe: nothing here may erase; the spare LUN's head is compared later.
async fn wipe_table(sw: &mut Sweep, a: &mut Client, cx: &Ctx<'_>, rng: &mut Rng) {
    let (spare, zero) = (&cx.spare.wwid, api::WipeMode::Zero as i32);
    let mut cases = Cases::new();
    cases
        .each("", bad_wwids(rng), INVALID, |w| wipe(&w, zero))
        .add(
            "mode UNSPECIFIED",
            wipe(spare, api::WipeMode::Unspecified as i32),
            INVALID,
        )
        .add("mode 99", wipe(spare, 99), INVALID)
        .add("mode -1", wipe(spare, -1), INVALID)
        .add(
            "a WWID that is not here",
            wipe(&unknown_wwid(rng), zero),
            NOT_FOUND,
        );
    sw.table(a, cases).await;
}

async fn rescan_table(sw: &mut Sweep, a: &mut Client, rng: &mut Rng) {
    let mut cases = Cases::new();
    cases.each("", bad_wwids(rng), INVALID, |w| rescan(&w)).add(
        "a WWID that is not here",
        rescan(&unknown_wwid(rng)),
        NOT_FOUND,
    );
    sw.table(a, cases).await;
}
