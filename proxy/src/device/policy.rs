//! Every device transition, as pure functions over the model: no I/O, no
//! clock, no store. The inventory reads a device, applies one of these,
//! and writes the result with compare-and-swap; both stores share them, so
//! a change to how a LUN moves between phases is made here, once.
//!
//! ```text
//!   discovery (new WWID), or found holding no volume: the target's newLuns
//!      probe |              wipe |                    trust |
//!            v                   v                          |
//!       Unverified ------> Releasing (no binding)           |
//!        |    |   newLuns:     ^                            |
//!  probe |    | probe   wipe   |                            |
//!  blank |    v data           |                            v
//!        |  HoldsData ---------+         bind         Available
//!        |    | probe blank        Available ------> Bound --------> Releasing
//!        +----+-----------------------> ^    delete: start_release   |  ^  |
//!                                       |                            |  |  | wipe_failed
//!                              released +----------------------------+  |  v
//!                                                      (retried) ----- Failed
//!
//!   Available, Unverified, HoldsData, Bound --(no node sees it)--> Lost
//!   Lost --found--> Bound (with its binding) or as a new LUN (without)
//! ```
//!
//! Releasing and Failed are both [`releasing`]: the volume is deleted (or
//! the LUN is new and its target says wipe) and a release worker
//! (`crate::reconcile::release`) still has to wipe it, unless an operator
//! retired the LUN ([`wipe_due`]). Unverified and HoldsData
//! [`await_proof`]: a qualification worker (`crate::reconcile::qualify`)
//! reads them.
//!
//! `retired` is the operator's, in any phase: no transition here sets or
//! clears it. A retired LUN is never [`free_for`] a new volume, never
//! wiped by a release worker and never [`forgettable`]; a volume living on
//! it keeps working, and nothing is detached or wiped because of it.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use csi_scsi_contract::{NodeName, Wwid};

use super::access::Capability;
use super::model::{
    BindRequest, Binding, Device, DiscoveryRound, LunReport, NewLuns, NodeView, Phase, Publication,
    TargetConflict,
};
use crate::selector::Selector;
use csi_scsi_contract::FsType;

/// How stale `last_seen` may get when nothing else about a device changed:
/// 50,000 devices must not mean 50,000 writes per discovery pass.
pub const LAST_SEEN_RESOLUTION: i64 = 600;

/// What a discovery round did to one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Seen for the first time: a new device, in the phase its target's
    /// policy gives new LUNs ([`new_lun_phase`]).
    Added,
    /// No node reports it any more.
    Lost,
    /// It was Lost and a node reports it again.
    Found,
    /// Something else changed (paths, size, labels, last seen).
    Updated,
    /// A target of another array reported its WWID: recorded, not merged.
    Conflict,
}

/// The result of merging a round into one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Merged {
    /// The device to write.
    pub device: Device,
    /// What changed.
    pub change: Change,
}

/// One node's report of one LUN.
pub type Report<'a> = (&'a NodeName, &'a LunReport);

/// A round's reports grouped by WWID.
pub fn reports_by_wwid(round: &DiscoveryRound) -> BTreeMap<&Wwid, Vec<Report<'_>>> {
    let mut by: BTreeMap<&Wwid, Vec<Report<'_>>> = BTreeMap::new();
    for (node, luns) in &round.answered {
        for lun in luns {
            by.entry(&lun.wwid).or_default().push((node, lun));
        }
    }
    by
}

/// The size to record for `before` when its nodes report `reported` at
/// most. A LUN that may hold a tenant's data (any phase but Available)
/// never gets smaller: a smaller report is a rescan that did not take (a
/// stale map after the array grew it) or a path in transition (0), and
/// recording it would have the release wipe only that much and offer the
/// rest as it was. A free LUN was wiped or read blank whole before it was
/// offered; it takes what its nodes report. A LUN not yet proven blank
/// may hold somebody's data: its probe or wipe must cover the most it
/// ever reported.
fn recorded_size(before: &Device, reported: u64) -> u64 {
    match before.phase {
        Phase::Available => reported,
        Phase::Unverified
        | Phase::HoldsData
        | Phase::Bound
        | Phase::Releasing
        | Phase::Failed
        | Phase::Lost => before.size_bytes.max(reported),
    }
}

/// The phase of a LUN its target shows for the first time (or again,
/// after it was Lost holding no volume): what the target's policy says.
/// Releasing without a binding is the target's wipe, done by a release
/// worker as for a deleted volume.
pub fn new_lun_phase(policy: NewLuns) -> Phase {
    match policy {
        NewLuns::Probe => Phase::Unverified,
        NewLuns::Wipe => Phase::Releasing,
        NewLuns::Trust => Phase::Available,
    }
}

/// Whether `dev` waits for a probe to prove it blank: Unverified or
/// HoldsData, holding no volume.
pub fn await_proof(dev: &Device) -> bool {
    matches!(dev.phase, Phase::Unverified | Phase::HoldsData) && dev.binding.is_none()
}

/// A probe read `dev` back as zeroes over `probed_size` bytes: offered.
/// `false` (nothing changed) when it no longer awaits proof, or its
/// recorded size changed since the probe read it (the probe did not cover
/// what it records now: probed again).
pub fn proven_blank(dev: &mut Device, probed_size: u64) -> bool {
    if !await_proof(dev) || dev.size_bytes != probed_size {
        return false;
    }
    dev.phase = Phase::Available;
    dev.reason.clear();
    true
}

/// A probe found data on `dev`: held, with `reason`. `false` (nothing
/// changed) when it no longer awaits proof or is held for that reason
/// already.
pub fn found_data(dev: &mut Device, reason: String) -> bool {
    if !await_proof(dev) || (dev.phase == Phase::HoldsData && dev.reason == reason) {
        return false;
    }
    dev.phase = Phase::HoldsData;
    dev.reason = reason;
    true
}

/// Merges what `round` saw of `wwid` (`reports`) into the stored device.
/// `None`: nothing to write. Nodes that did not answer keep their earlier
/// view, unless they are `departed` (gone from the cluster: their views go,
/// of every target, so they leave topology and fan-outs); another target's
/// views are kept; a label the device already has is never overwritten
/// (the conflict goes into `conflicts`).
///
/// A device is known through its first target and the targets of its
/// views. A report through a target that is none of those and names no
/// array with one of them ([`known_through`]) is a conflict: recorded in
/// the device's `conflicts` and nothing else of it merged, so a LUN never
/// moves to another array on a node's word.
pub fn merge(
    existing: Option<&Device>,
    wwid: &Wwid,
    reports: &[Report<'_>],
    round: &DiscoveryRound,
    departed: &BTreeSet<NodeName>,
    now: i64,
    conflicts: &mut Vec<String>,
) -> Option<Merged> {
    let t = &round.target;
    let fresh = reports.iter().map(|(node, lun)| NodeView {
        node: (*node).clone(),
        target: t.clone(),
        paths: lun.paths.clone(),
    });
    let Some(before) = existing else {
        let (_, first) = reports.first()?;
        return Some(Merged {
            device: Device {
                wwid: wwid.clone(),
                target: t.clone(),
                lun: first.lun,
                size_bytes: first.size_bytes,
                vendor: first.vendor.clone(),
                model: first.model.clone(),
                serial: first.serial.clone(),
                labels: round.device_labels.clone(),
                phase: new_lun_phase(round.new_luns),
                binding: None,
                nodes: fresh.collect(),
                published: Vec::new(),
                last_seen: now,
                reason: String::new(),
                wipe_failures: 0,
                conflicts: Vec::new(),
                retired: false,
                retry_wipe: String::new(),
                generation: 0,
            },
            change: Change::Added,
        });
    };
    let mut dev = before.clone();
    let accepted = known_through(before, round);
    dev.nodes.retain(|v| {
        // This round's answer replaces the node's view of this target.
        let answered_again = v.target == *t && round.answered.contains_key(&v.node);
        !answered_again && !departed.contains(&v.node)
    });
    let mut change = Change::Updated;
    if accepted {
        dev.conflicts.retain(|c| c.target != *t);
        dev.nodes.extend(fresh);
        dev.nodes
            .sort_by(|a, b| (&a.node, &a.target).cmp(&(&b.node, &b.target)));
        if let Some((_, lun)) = reports.iter().max_by_key(|(_, l)| l.size_bytes) {
            dev.size_bytes = recorded_size(before, lun.size_bytes);
            if now - dev.last_seen >= LAST_SEEN_RESOLUTION {
                dev.last_seen = now;
            }
        }
        for (k, v) in &round.device_labels {
            match dev.labels.get(k) {
                None => {
                    dev.labels.insert(k.clone(), v.clone());
                }
                Some(have) if have != v => {
                    conflicts.push(format!(
                        "{wwid}: {k}={have} (kept), this target says {k}={v}"
                    ));
                }
                Some(_) => {}
            }
        }
    } else if target_conflict(&mut dev, reports, round, departed, now) {
        change = Change::Conflict;
    }
    let visible = matches!(
        dev.phase,
        Phase::Available | Phase::Unverified | Phase::HoldsData | Phase::Bound
    );
    if dev.nodes.is_empty() && visible {
        lost(&mut dev, &format!("no node reports it (target {t})"));
        change = Change::Lost;
    } else if !dev.nodes.is_empty() && dev.phase == Phase::Lost {
        found(&mut dev, round.new_luns);
        change = Change::Found;
    } else if round.new_luns == NewLuns::Wipe && await_proof(&dev) && dev.target == *t {
        // The operator set the LUN's own target to wipe: the way to
        // release a LUN held for its data (see docs/operations.md).
        dev.phase = Phase::Releasing;
        dev.reason.clear();
    }
    (dev != *before).then_some(Merged {
        device: dev,
        change,
    })
}

/// Whether `round`'s target may report `dev`: it is the device's first
/// target or the target of one of its views, or names the same array as
/// one of those.
pub fn known_through(dev: &Device, round: &DiscoveryRound) -> bool {
    let ours = |target: &String| *target == round.target || round.same_array.contains(target);
    ours(&dev.target) || dev.nodes.iter().any(|v| ours(&v.target))
}

/// Records the round's target as a conflict of `dev` (the nodes that
/// report it now, and those that did before and are silent now), or
/// drops the record once its nodes answer without it. `true`: a conflict
/// that was not recorded before.
fn target_conflict(
    dev: &mut Device,
    reports: &[Report<'_>],
    round: &DiscoveryRound,
    departed: &BTreeSet<NodeName>,
    now: i64,
) -> bool {
    let t = &round.target;
    let earlier = dev.conflicts.iter().position(|c| c.target == *t);
    let mut nodes: BTreeSet<NodeName> = earlier
        .map(|i| dev.conflicts[i].nodes.iter().cloned().collect())
        .unwrap_or_default();
    nodes.retain(|n| !round.answered.contains_key(n) && !departed.contains(n));
    nodes.extend(reports.iter().map(|(n, _)| (*n).clone()));
    match (earlier, nodes.is_empty()) {
        (Some(i), true) => {
            dev.conflicts.remove(i);
            false
        }
        (Some(i), false) => {
            dev.conflicts[i].nodes = nodes.into_iter().collect();
            false
        }
        (None, true) => false,
        (None, false) => {
            dev.conflicts.push(TargetConflict {
                target: t.clone(),
                nodes: nodes.into_iter().collect(),
                since: now,
            });
            dev.conflicts.sort_by(|a, b| a.target.cmp(&b.target));
            true
        }
    }
}

/// Whether discovery removes `dev` after merging `round` into it: a
/// phantom. It holds no volume and was never published, is Available or
/// Lost and not retired, no node has a view of it and no other array
/// claims it, at least one node answered the round and every node asked
/// did (a node that did not answer is doubt, never "not reported"), this
/// round did not report it, and it was last seen more than `forget_after`
/// seconds ago. As
/// `last_seen` moves only every [`LAST_SEEN_RESOLUTION`], that much is
/// added: a device that is still reported is never removed.
pub fn forgettable(
    dev: &Device,
    round: &DiscoveryRound,
    reported: bool,
    now: i64,
    forget_after: i64,
) -> bool {
    !reported
        // Forgotten, it would come back as a new LUN an operator never
        // retired.
        && !dev.retired
        && !round.answered.is_empty()
        && round.unanswered.is_empty()
        && dev.binding.is_none()
        && dev.published.is_empty()
        && matches!(dev.phase, Phase::Available | Phase::Lost)
        && dev.nodes.is_empty()
        && dev.conflicts.is_empty()
        && now.saturating_sub(dev.last_seen) >= forget_after.saturating_add(LAST_SEEN_RESOLUTION)
}

/// No node reports the device: it goes Lost and keeps any binding.
pub fn lost(dev: &mut Device, reason: &str) {
    dev.phase = Phase::Lost;
    dev.reason = reason.to_owned();
}

/// A Lost device is reported again: back to Bound if it has a binding;
/// otherwise a new LUN as its target's `policy` says, as something may
/// have written to it while no node here saw it.
pub fn found(dev: &mut Device, policy: NewLuns) {
    dev.phase = if dev.binding.is_some() {
        Phase::Bound
    } else {
        new_lun_phase(policy)
    };
    dev.reason.clear();
}

/// The filesystem whose minimum size binds a volume of `capabilities`
/// (the largest minimum among them; `None`: raw block only, no floor).
pub fn size_floor(capabilities: &[Capability]) -> Option<FsType> {
    capabilities
        .iter()
        .filter_map(|c| c.fs_type())
        .max_by_key(|fs| fs.min_bytes())
}

/// The smallest LUN a volume of `capabilities` can live on.
pub fn floor_bytes(capabilities: &[Capability]) -> u64 {
    size_floor(capabilities).map_or(0, FsType::min_bytes)
}

/// The smallest LUN that may back `req`: its required bytes, and never
/// less than its filesystem's minimum (a LUN `mkfs` refuses could never
/// be staged).
pub fn smallest(req: &BindRequest) -> u64 {
    req.min_bytes.max(floor_bytes(&req.binding.capabilities))
}

/// The filesystem whose minimum `limit_bytes` (0: none) is below, if any:
/// no LUN in the request's range could be formatted.
pub fn limit_below_floor(capabilities: &[Capability], limit_bytes: u64) -> Option<FsType> {
    size_floor(capabilities).filter(|fs| limit_bytes != 0 && limit_bytes < fs.min_bytes())
}

/// Whether `dev` is free for a new volume of a class selecting
/// `selector`, seen from `node` (`None`: from anywhere): Available, not
/// retired, in no target conflict, labels matching. What a bind may take,
/// whatever the size, and so what GetCapacity counts.
pub fn free_for(dev: &Device, selector: &Selector, node: Option<&NodeName>) -> bool {
    dev.phase == Phase::Available
        // Taken out of service by an operator.
        && !dev.retired
        // Another array's target reports its WWID too: which LUN a node
        // would write through is in doubt until an operator settles it.
        && dev.conflicts.is_empty()
        && selector.matches(&dev.labels)
        && node.is_none_or(|n| dev.nodes.iter().any(|v| &v.node == n))
}

/// Whether `dev` may back `req`: [`free_for`] its selector from `node`,
/// and of a fitting size (no smaller than [`smallest`]).
pub fn fits(dev: &Device, req: &BindRequest, node: Option<&NodeName>) -> bool {
    free_for(dev, &req.selector, node) && (smallest(req)..=req.max_bytes).contains(&dev.size_bytes)
}

/// The order in which a bind considers fitting devices: the smallest
/// first, so large LUNs stay for large requests; then the one whose wipes
/// failed least often, as a LUN that failed a wipe before is the likelier
/// to fail the next volume; then the WWID, so the choice is stable. The
/// stores hand candidates out in this order (the embedded store's indexes
/// are on these columns), so a bind reads only until the first fit.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PreferenceKey {
    /// Size in bytes.
    pub size_bytes: u64,
    /// Past wipe failures.
    pub wipe_failures: u32,
    /// The WWID.
    pub wwid: Wwid,
}

/// `dev`'s place in the bind order.
pub fn preference_key(dev: &Device) -> PreferenceKey {
    PreferenceKey {
        size_bytes: dev.size_bytes,
        wipe_failures: dev.wipe_failures,
        wwid: dev.wwid.clone(),
    }
}

/// Which of two devices a bind takes first (`Less`: `a`): the order of
/// their [`preference_key`]s.
pub fn preference(a: &Device, b: &Device) -> Ordering {
    preference_key(a).cmp(&preference_key(b))
}

/// The first of `candidates` that fits `req` from `node` (anywhere:
/// `None`), when they come in preference order.
pub fn choose<'a>(
    candidates: impl IntoIterator<Item = &'a Device>,
    req: &BindRequest,
    node: Option<&NodeName>,
) -> Option<&'a Device> {
    candidates.into_iter().find(|d| fits(d, req, node))
}

/// Binds `dev` to a new volume.
pub fn bind(dev: &mut Device, binding: Binding) {
    dev.phase = Phase::Bound;
    dev.binding = Some(binding);
    dev.reason.clear();
}

/// Why no device fits `req` (naming the filesystem's minimum when it
/// raised the size asked for).
pub fn no_fit(req: &BindRequest) -> String {
    let floor = match size_floor(&req.binding.capabilities) {
        Some(fs) if fs.min_bytes() > req.min_bytes => {
            format!(" ({fs} needs at least {})", fs.min_size_text())
        }
        _ => String::new(),
    };
    format!(
        "{} bytes or more{floor}{}",
        smallest(req),
        if req.placement.is_anywhere() {
            ""
        } else {
            " on the requested nodes"
        }
    )
}

/// Whether volume `uid` lives on `dev` and may be used (published,
/// expanded): bound to that very binding, Bound or Lost. A deleted
/// volume's LUN (Releasing, Failed) or one bound again is not it.
pub fn serves(dev: &Device, uid: &str) -> bool {
    holds_binding(dev, uid) && matches!(dev.phase, Phase::Bound | Phase::Lost)
}

/// Whether `dev`'s binding is `uid`'s, whatever its phase.
pub fn holds_binding(dev: &Device, uid: &str) -> bool {
    dev.binding.as_ref().is_some_and(|b| b.uid == uid)
}

/// What [`publish`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Publish {
    /// The node was added to the record: there is something to write.
    Recorded,
    /// The node was recorded already, the same way: nothing to write.
    AlreadyRecorded,
}

/// Why [`publish`] refused, judged on the very state it would write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PublishRefusal {
    /// The device no longer serves the volume ([`serves`]): its binding
    /// is gone or another volume's, or the volume is being deleted.
    NotServed,
    /// Published to that node already with another capability or
    /// readonly flag (this publication).
    Incompatible(Publication),
    /// Published to other nodes (these), and the access mode allows one
    /// node only.
    Elsewhere(Vec<NodeName>),
}

/// Records a ControllerPublish of volume `uid` on `publication.node`,
/// checking on `dev` as it is (in a compare-and-swap, on every attempt):
/// the device still serves the volume, a publication on that node asked
/// for the same, and a single-node access mode finds no other node.
/// Nothing is changed when it refuses.
pub fn publish(
    dev: &mut Device,
    uid: &str,
    publication: Publication,
) -> Result<Publish, PublishRefusal> {
    if !serves(dev, uid) {
        return Err(PublishRefusal::NotServed);
    }
    if let Some(p) = dev.publication(&publication.node) {
        // Spec: published to this node "but is incompatible with the
        // specified volume_capability or readonly flag".
        let same = p.readonly == publication.readonly
            && p.access.is_none_or(|a| Some(a) == publication.access);
        return if same {
            Ok(Publish::AlreadyRecorded)
        } else {
            Err(PublishRefusal::Incompatible(p.clone()))
        };
    }
    let single_node = publication.access.is_some_and(|a| a.mode().single_node());
    if single_node && !dev.published.is_empty() {
        return Err(PublishRefusal::Elsewhere(dev.published_nodes()));
    }
    dev.published.push(publication);
    Ok(Publish::Recorded)
}

/// Forgets the ControllerPublish of volume `uid` on `node`; `false` (and
/// nothing changed) when there is none or the device is not `uid`'s any
/// more (another volume's record is never touched).
pub fn unpublish(dev: &mut Device, uid: &str, node: &NodeName) -> bool {
    if !holds_binding(dev, uid) || dev.publication(node).is_none() {
        return false;
    }
    dev.published.retain(|p| &p.node != node);
    true
}

/// Its volume was deleted: it goes Releasing until wiped. `false` when it
/// is Releasing or Failed already (a retried delete changes nothing).
pub fn start_release(dev: &mut Device) -> bool {
    if matches!(dev.phase, Phase::Releasing | Phase::Failed) {
        return false;
    }
    dev.phase = Phase::Releasing;
    dev.reason.clear();
    true
}

/// Whether `dev`'s volume is deleted and its wipe is still to be done
/// (Releasing, or Failed by an earlier wipe): no CreateVolume, publication
/// or volume of its name may use it, and a release worker retries it.
pub fn releasing(dev: &Device) -> bool {
    matches!(dev.phase, Phase::Releasing | Phase::Failed)
}

/// Whether a release worker wipes `dev` now: its release is still to be
/// done ([`releasing`]) and an operator has not retired it. A retired
/// LUN keeps what is on it and is never offered.
pub fn wipe_due(dev: &Device) -> bool {
    releasing(dev) && !dev.retired
}

/// Whether a volume lives on `dev` (bound, or deleted but not yet wiped,
/// or Lost with its binding): its record must not be dropped or re-created
/// free. Only a release clears the binding.
pub fn holds_volume(dev: &Device) -> bool {
    dev.binding.is_some()
}

/// The wipe failed: never offered again until a retried wipe succeeds.
pub fn wipe_failed(dev: &mut Device, reason: String) {
    dev.phase = Phase::Failed;
    dev.reason = reason;
    dev.wipe_failures = dev.wipe_failures.saturating_add(1);
}

/// Wiped (or nothing to wipe): offered again, or Lost when no node sees it.
pub fn released(dev: &mut Device) {
    dev.phase = if dev.nodes.is_empty() {
        Phase::Lost
    } else {
        Phase::Available
    };
    dev.binding = None;
    dev.published.clear();
    dev.reason.clear();
}

#[cfg(test)]
mod tests;
