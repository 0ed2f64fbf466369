//! The transitions, table-driven, with no store behind them.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::device::{AccessMode, Capability, Cleanup, FsType, Placement};
use crate::node;
use crate::selector::Selector;

fn wwid(i: u32) -> Wwid {
    Wwid::parse(&format!("naa.6001405{i:025x}")).expect("a canonical WWID")
}

fn lun(i: u32, size: u64) -> LunReport {
    LunReport {
        wwid: wwid(i),
        lun: i,
        size_bytes: size,
        vendor: "LIO-ORG".into(),
        model: "disk".into(),
        serial: format!("sn{i}"),
        paths: vec![format!("path-{i}")],
    }
}

fn round(answered: &[(&str, Vec<LunReport>)], unanswered: &[&str]) -> DiscoveryRound {
    DiscoveryRound {
        target: "t1".into(),
        device_labels: BTreeMap::from([("tier".into(), "fast".into())]),
        answered: answered.iter().map(|(n, l)| (node(n), l.clone())).collect(),
        unanswered: unanswered.iter().map(|s| node(s)).collect(),
        same_array: BTreeSet::new(),
        new_luns: NewLuns::default(),
    }
}

fn binding(name: &str) -> Binding {
    Binding {
        uid: format!("uid-{name}"),
        volume_name: name.into(),
        required_bytes: 1,
        limit_bytes: 0,
        capabilities: vec![Capability::Mount(
            FsType::Ext4,
            AccessMode::SingleNodeWriter,
        )],
        parameters: BTreeMap::new(),
        cleanup: Cleanup::Zero,
    }
}

fn device(i: u32, size: u64, nodes: &[&str], phase: Phase) -> Device {
    let r = round(&[], &[]);
    let report = lun(i, size);
    let mut d = merge(
        None,
        &wwid(i),
        &[(&node("n"), &report)],
        &r,
        &BTreeSet::new(),
        1_000,
        &mut Vec::new(),
    )
    .expect("new")
    .device;
    d.nodes = nodes
        .iter()
        .map(|n| NodeView {
            node: node(n),
            target: "t1".into(),
            paths: vec!["p".into()],
        })
        .collect();
    d.phase = phase;
    if matches!(phase, Phase::Bound | Phase::Releasing | Phase::Failed) {
        d.binding = Some(binding("v"));
    }
    d
}

/// A raw block volume's request (no filesystem minimum: sizes as given).
fn request(min: u64, max: u64, selector: &str, nodes: &[&str]) -> BindRequest {
    request_for(
        &[Capability::Block(AccessMode::SingleNodeWriter)],
        min,
        max,
        selector,
        nodes,
    )
}

fn request_for(
    capabilities: &[Capability],
    min: u64,
    max: u64,
    selector: &str,
    nodes: &[&str],
) -> BindRequest {
    BindRequest {
        binding: Binding {
            capabilities: capabilities.to_vec(),
            ..binding("new")
        },
        placement: Placement::new(&[], &nodes.iter().map(|n| node(n)).collect::<Vec<_>>())
            .expect("placement"),
        selector: Selector::parse(selector).expect("selector"),
        min_bytes: min,
        max_bytes: max,
    }
}

fn merged(existing: &Device, answered: &[(&str, Vec<LunReport>)], now: i64) -> Option<Merged> {
    merged_departed(existing, answered, &[], now)
}

fn merged_departed(
    existing: &Device,
    answered: &[(&str, Vec<LunReport>)],
    departed: &[&str],
    now: i64,
) -> Option<Merged> {
    let r = round(answered, &[]);
    let by = reports_by_wwid(&r);
    let reports = by.get(&existing.wwid).cloned().unwrap_or_default();
    let departed: BTreeSet<NodeName> = departed.iter().map(|n| node(n)).collect();
    merge(
        Some(existing),
        &existing.wwid,
        &reports,
        &r,
        &departed,
        now,
        &mut Vec::new(),
    )
}

#[test]
fn the_views_of_departed_nodes_go_and_silent_ones_stay() {
    // (views before as (node, target), answered with the LUN, departed,
    // views after, phase after)
    type Views = &'static [(&'static str, &'static str)];
    type Nodes = &'static [&'static str];
    let cases: [(Views, Nodes, Nodes, Views, Phase); 6] = [
        // Silent (unreachable) nodes keep their views: doubt keeps.
        (
            &[("a", "t1"), ("b", "t1")],
            &["a"],
            &[],
            &[("a", "t1"), ("b", "t1")],
            Phase::Available,
        ),
        // A departed node's view goes.
        (
            &[("a", "t1"), ("b", "t1")],
            &["a"],
            &["b"],
            &[("a", "t1")],
            Phase::Available,
        ),
        // ... of every target: the node is gone, not its path to one target.
        (
            &[("a", "t1"), ("b", "t1"), ("b", "t2")],
            &["a"],
            &["b"],
            &[("a", "t1")],
            Phase::Available,
        ),
        // Another target's view of a node that stays is kept.
        (
            &[("a", "t1"), ("c", "t2")],
            &["a"],
            &["b"],
            &[("a", "t1"), ("c", "t2")],
            Phase::Available,
        ),
        // The last node that saw it departed and nobody reports it: Lost.
        (&[("b", "t1")], &[], &["b"], &[], Phase::Lost),
        // Departed nodes that saw nothing of it change nothing.
        (
            &[("a", "t1")],
            &["a"],
            &["z"],
            &[("a", "t1")],
            Phase::Available,
        ),
    ];
    for (before, answered, departed, after, phase) in cases {
        let mut dev = device(1, 100, &[], Phase::Available);
        dev.nodes = before
            .iter()
            .map(|(n, t)| NodeView {
                node: node(n),
                target: t.to_string(),
                paths: vec!["path-1".into()],
            })
            .collect();
        let answered: Vec<(&str, Vec<LunReport>)> =
            answered.iter().map(|n| (*n, vec![lun(1, 100)])).collect();
        let out =
            merged_departed(&dev, &answered, departed, 1_000).map_or(dev.clone(), |m| m.device);
        let views: Vec<(&str, &str)> = out
            .nodes
            .iter()
            .map(|v| (v.node.as_str(), v.target.as_str()))
            .collect();
        assert_eq!(views, after, "{before:?} departed {departed:?}");
        assert_eq!(out.phase, phase, "{before:?} departed {departed:?}");
    }
}

#[test]
fn discovery_moves_devices_between_phases_as_the_table_says() {
    // (phase before, nodes before, reported by a node now, phase after, change)
    let cases = [
        (
            Phase::Available,
            &["a"][..],
            false,
            Phase::Lost,
            Some(Change::Lost),
        ),
        (
            Phase::Bound,
            &["a"][..],
            false,
            Phase::Lost,
            Some(Change::Lost),
        ),
        // Back without a volume: something may have written to it while no
        // node saw it, so it is a new LUN again (its target probes).
        (
            Phase::Lost,
            &[][..],
            true,
            Phase::Unverified,
            Some(Change::Found),
        ),
        (Phase::Available, &["a"][..], true, Phase::Available, None),
        // Not yet proven blank: still a LUN a node sees, and it can be lost.
        (Phase::Unverified, &["a"][..], true, Phase::Unverified, None),
        (
            Phase::Unverified,
            &["a"][..],
            false,
            Phase::Lost,
            Some(Change::Lost),
        ),
        (
            Phase::HoldsData,
            &["a"][..],
            false,
            Phase::Lost,
            Some(Change::Lost),
        ),
        // A wipe in progress or failed is never touched by discovery's phases.
        (
            Phase::Releasing,
            &["a"][..],
            false,
            Phase::Releasing,
            Some(Change::Updated),
        ),
        (
            Phase::Failed,
            &["a"][..],
            false,
            Phase::Failed,
            Some(Change::Updated),
        ),
    ];
    for (before, nodes, reported, after, change) in cases {
        let dev = device(1, 100, nodes, before);
        let mut now_seen = dev.clone();
        now_seen
            .nodes
            .iter_mut()
            .for_each(|v| v.paths = vec!["path-1".into()]);
        let answered = if reported {
            vec![("a", vec![lun(1, 100)])]
        } else {
            vec![("a", vec![])]
        };
        let out = merged(&now_seen, &answered, 1_000);
        assert_eq!(
            out.as_ref().map(|m| m.change),
            change,
            "{before:?} reported={reported}"
        );
        let phase = out.as_ref().map_or(now_seen.phase, |m| m.device.phase);
        assert_eq!(phase, after, "{before:?} reported={reported}");
    }
}

#[test]
fn a_lost_bound_device_keeps_its_binding_and_comes_back_bound() {
    let dev = device(1, 100, &["a"], Phase::Bound);
    let gone = merged(&dev, &[("a", vec![])], 1_000).expect("lost").device;
    assert_eq!(gone.phase, Phase::Lost);
    assert!(gone.binding.is_some());
    assert!(gone.reason.contains("no node reports it"));
    let back = merged(&gone, &[("b", vec![lun(1, 100)])], 1_000)
        .expect("found")
        .device;
    assert_eq!(back.phase, Phase::Bound);
    assert!(back.reason.is_empty());
}

#[test]
fn a_silent_node_keeps_its_view_and_last_seen_moves_only_past_the_resolution() {
    let dev = device(1, 100, &["a", "b"], Phase::Available);
    // Only b answers: a's view stands, b's paths are replaced.
    let out = merged(&dev, &[("b", vec![lun(1, 100)])], 1_000 + 10)
        .expect("paths changed")
        .device;
    assert_eq!(out.node_names(), ["a", "b"]);
    assert_eq!(out.last_seen, 1_000, "within the resolution");
    let later = merged(
        &out,
        &[("b", vec![lun(1, 100)])],
        1_000 + LAST_SEEN_RESOLUTION,
    )
    .expect("seen again")
    .device;
    assert_eq!(later.last_seen, 1_000 + LAST_SEEN_RESOLUTION);
    assert!(
        merged(
            &later,
            &[("b", vec![lun(1, 100)])],
            1_000 + LAST_SEEN_RESOLUTION + 1
        )
        .is_none()
    );
}

#[test]
fn a_label_the_device_has_is_kept_and_the_conflict_reported() {
    let mut dev = device(1, 100, &["a"], Phase::Available);
    dev.labels.insert("tier".into(), "slow".into());
    let r = round(&[("a", vec![lun(1, 100)])], &[]);
    let by = reports_by_wwid(&r);
    let mut conflicts = Vec::new();
    let out = merge(
        Some(&dev),
        &dev.wwid,
        &by[&dev.wwid],
        &r,
        &BTreeSet::new(),
        1_000,
        &mut conflicts,
    );
    assert_eq!(
        out.map_or(dev.labels.clone(), |m| m.device.labels)["tier"],
        "slow"
    );
    assert_eq!(conflicts.len(), 1);
    assert!(conflicts[0].contains("tier=slow (kept)"));
}

#[test]
fn bind_order_is_the_smallest_then_the_fewest_wipe_failures_then_the_wwid() {
    let mut small_failed = device(1, 100, &["a"], Phase::Available);
    small_failed.wipe_failures = 2;
    let small_clean = device(2, 100, &["a"], Phase::Available);
    let mut small_once = device(3, 100, &["a"], Phase::Available);
    small_once.wipe_failures = 1;
    let big = device(4, 1_000, &["a"], Phase::Available);
    let mut twin = small_clean.clone();
    twin.wwid = wwid(0);
    let mut all = vec![
        big.clone(),
        small_failed.clone(),
        small_clean.clone(),
        small_once.clone(),
        twin.clone(),
    ];
    all.sort_by(preference);
    let order: Vec<&str> = all.iter().map(|d| d.wwid.as_str()).collect();
    assert_eq!(
        order,
        [&twin, &small_clean, &small_once, &small_failed, &big].map(|d| d.wwid.as_str())
    );
    // The key the stores order by agrees with the comparison.
    let mut by_key = all.clone();
    by_key.sort_by_key(preference_key);
    assert_eq!(by_key, all);
    // The first fit in that order wins.
    assert_eq!(
        choose(&all, &request(50, u64::MAX, "", &[]), None),
        Some(&twin)
    );
    assert_eq!(
        choose(&all, &request(101, u64::MAX, "", &[]), None),
        Some(&big)
    );
}

/// `dev` as another array's target reports it too (a target conflict).
fn disputed(dev: &Device) -> Device {
    let mut d = dev.clone();
    d.conflicts.push(TargetConflict {
        target: "other-array".into(),
        nodes: vec![node("a")],
        since: 1,
    });
    d
}

#[test]
fn fits_checks_phase_size_labels_and_visibility() {
    let dev = device(1, 100, &["a"], Phase::Available);
    // (request, node, fits)
    let cases = [
        (request(100, 100, "", &[]), None, true),
        (request(101, u64::MAX, "", &[]), None, false),
        (request(1, 99, "", &[]), None, false),
        (request(1, u64::MAX, "tier=fast", &[]), None, true),
        (request(1, u64::MAX, "tier=slow", &[]), None, false),
        (request(1, u64::MAX, "", &["a"]), Some("a"), true),
        (request(1, u64::MAX, "", &["b"]), Some("b"), false),
    ];
    for (req, at, want) in cases {
        assert_eq!(
            fits(&dev, &req, at.map(node).as_ref()),
            want,
            "{req:?} from {at:?}"
        );
    }
    assert!(
        !fits(&disputed(&dev), &request(1, u64::MAX, "", &[]), None),
        "a LUN another array's target reports too is never bound"
    );
    for phase in [Phase::Bound, Phase::Releasing, Phase::Failed, Phase::Lost] {
        let taken = device(1, 100, &["a"], phase);
        assert!(
            !fits(&taken, &request(1, u64::MAX, "", &[]), None),
            "{phase:?}"
        );
    }
}

#[test]
fn free_for_is_fits_without_the_size() {
    let dev = device(1, 100, &["a"], Phase::Available);
    let fast = Selector::parse("tier=fast").expect("selector");
    let slow = Selector::parse("tier=slow").expect("selector");
    // (selector, node, free)
    let cases = [
        (&fast, None, true),
        (&fast, Some("a"), true),
        (&fast, Some("b"), false),
        (&slow, None, false),
    ];
    for (selector, at, want) in cases {
        assert_eq!(
            free_for(&dev, selector, at.map(node).as_ref()),
            want,
            "{selector:?} from {at:?}"
        );
    }
    assert!(
        !free_for(&disputed(&dev), &fast, None),
        "in a target conflict"
    );
    for phase in [
        Phase::Bound,
        Phase::Releasing,
        Phase::Unverified,
        Phase::Lost,
    ] {
        let taken = device(1, 100, &["a"], phase);
        assert!(!free_for(&taken, &fast, None), "{phase:?}");
    }
}

#[test]
fn release_fail_and_release_again_count_the_failures() {
    let mut dev = device(1, 100, &["a"], Phase::Bound);
    assert!(!releasing(&dev));
    assert!(start_release(&mut dev));
    assert_eq!(dev.phase, Phase::Releasing);
    assert!(releasing(&dev), "a worker wipes it");
    wipe_failed(&mut dev, "EIO".into());
    assert_eq!((dev.phase, dev.wipe_failures), (Phase::Failed, 1));
    assert!(releasing(&dev), "a worker retries it");
    // A retried delete changes nothing: no new Releasing write.
    assert!(!start_release(&mut dev));
    released(&mut dev);
    assert!(!releasing(&dev));
    assert_eq!(dev.phase, Phase::Available);
    assert!(dev.binding.is_none() && dev.published.is_empty() && dev.reason.is_empty());
    assert_eq!(dev.wipe_failures, 1, "the count outlives the binding");
    let mut unseen = device(2, 100, &[], Phase::Releasing);
    released(&mut unseen);
    assert_eq!(unseen.phase, Phase::Lost);
}

const MIB: u64 = 1024 * 1024;

#[test]
fn a_lun_below_the_filesystems_minimum_never_fits_and_no_fit_names_the_minimum() {
    let xfs = Capability::Mount(FsType::Xfs, AccessMode::SingleNodeWriter);
    let ext4 = Capability::Mount(FsType::Ext4, AccessMode::SingleNodeWriter);
    let block = Capability::Block(AccessMode::SingleNodeWriter);
    assert_eq!(FsType::Xfs.min_bytes(), 300 * MIB);
    assert_eq!(FsType::Ext4.min_bytes(), MIB);
    // (capabilities, required bytes, LUN size, fits, smallest)
    let cases: [(&[Capability], u64, u64, bool, u64); 9] = [
        (&[xfs], 0, 64 * MIB, false, 300 * MIB),
        (&[xfs], MIB, 300 * MIB - 1, false, 300 * MIB),
        (&[xfs], MIB, 300 * MIB, true, 300 * MIB),
        (&[xfs], 400 * MIB, 300 * MIB, false, 400 * MIB),
        (&[ext4], 0, 64 * MIB, true, MIB),
        (&[ext4], 0, MIB - 1, false, MIB),
        (&[block], 0, 1, true, 0),
        // A volume used both ways needs what its filesystem needs.
        (&[block, xfs], 0, 64 * MIB, false, 300 * MIB),
        (&[ext4, xfs], 0, 64 * MIB, false, 300 * MIB),
    ];
    for (caps, required, size, want, least) in cases {
        let req = request_for(caps, required, u64::MAX, "", &[]);
        let dev = device(1, size, &["a"], Phase::Available);
        assert_eq!(
            fits(&dev, &req, None),
            want,
            "{caps:?} {required} on {size}"
        );
        assert_eq!(smallest(&req), least, "{caps:?} {required}");
    }
    let why = no_fit(&request_for(&[xfs], MIB, u64::MAX, "", &[]));
    assert!(why.contains("xfs needs at least 300 MiB"), "{why}");
    assert!(why.contains(&(300 * MIB).to_string()), "{why}");
    // Required bytes above the minimum: the minimum played no part.
    let why = no_fit(&request_for(&[xfs], 400 * MIB, u64::MAX, "", &[]));
    assert!(!why.contains("needs at least"), "{why}");
    // limit_bytes under the minimum: nothing could ever fit.
    assert_eq!(limit_below_floor(&[xfs], 100 * MIB), Some(FsType::Xfs));
    assert_eq!(limit_below_floor(&[xfs], 300 * MIB), None);
    assert_eq!(limit_below_floor(&[xfs], 0), None, "no limit");
    assert_eq!(limit_below_floor(&[block], 1), None);
    assert_eq!(floor_bytes(&[]), 0);
}

#[test]
fn publish_judges_the_state_it_writes_and_unpublish_touches_only_its_binding() {
    let snw = Capability::Mount(FsType::Ext4, AccessMode::SingleNodeWriter);
    let mnmw = Capability::Block(AccessMode::MultiNodeMultiWriter);
    let on = |name: &str, access: Capability, readonly: bool| Publication {
        node: node(name),
        access: Some(access),
        readonly,
    };
    let bound = |published: &[Publication]| {
        let mut d = device(1, 100, &["a", "b"], Phase::Bound);
        d.published = published.to_vec();
        d
    };
    let released = {
        let mut d = bound(&[]);
        released(&mut d);
        d
    };
    let rebound = {
        let mut d = released.clone();
        bind(&mut d, binding("other"));
        d
    };
    let deleted = {
        let mut d = bound(&[]);
        start_release(&mut d);
        d
    };
    let lost = {
        let mut d = bound(&[]);
        lost(&mut d, "gone");
        d
    };
    let old_record = Publication {
        node: node("b"),
        access: None,
        readonly: false,
    };
    // (device, publication asked for, outcome)
    let cases: Vec<(Device, Publication, Result<Publish, PublishRefusal>)> = vec![
        (bound(&[]), on("b", snw, false), Ok(Publish::Recorded)),
        (lost, on("b", snw, false), Ok(Publish::Recorded)),
        (
            bound(&[on("b", snw, false)]),
            on("b", snw, false),
            Ok(Publish::AlreadyRecorded),
        ),
        (
            bound(std::slice::from_ref(&old_record)),
            on("b", snw, false),
            Ok(Publish::AlreadyRecorded),
        ),
        (
            bound(std::slice::from_ref(&old_record)),
            on("b", snw, true),
            Err(PublishRefusal::Incompatible(old_record)),
        ),
        (
            bound(&[on("b", snw, true)]),
            on("b", snw, false),
            Err(PublishRefusal::Incompatible(on("b", snw, true))),
        ),
        (
            bound(&[on("b", mnmw, false)]),
            on("b", snw, false),
            Err(PublishRefusal::Incompatible(on("b", mnmw, false))),
        ),
        (
            bound(&[on("a", snw, false)]),
            on("b", snw, false),
            Err(PublishRefusal::Elsewhere(vec![node("a")])),
        ),
        (
            bound(&[on("a", mnmw, false)]),
            on("b", mnmw, false),
            Ok(Publish::Recorded),
        ),
        (
            released,
            on("b", snw, false),
            Err(PublishRefusal::NotServed),
        ),
        (rebound, on("b", snw, false), Err(PublishRefusal::NotServed)),
        (deleted, on("b", snw, false), Err(PublishRefusal::NotServed)),
    ];
    for (before, asked, want) in cases {
        let mut dev = before.clone();
        let got = publish(&mut dev, "uid-v", asked.clone());
        assert_eq!(got, want, "{asked:?} on {:?}", before.published);
        let mut expected = before.clone();
        if got == Ok(Publish::Recorded) {
            expected.published.push(asked);
        }
        assert_eq!(dev, expected, "changed only by a recording");
    }

    let mut dev = bound(&[on("a", mnmw, false), on("b", mnmw, false)]);
    assert!(
        !unpublish(&mut dev, "uid-other", &node("a")),
        "another binding's"
    );
    assert!(
        !unpublish(&mut dev, "uid-v", &node("c")),
        "not published there"
    );
    assert_eq!(dev.published_nodes(), ["a", "b"]);
    assert!(unpublish(&mut dev, "uid-v", &node("a")));
    assert_eq!(dev.published_nodes(), ["b"]);
}

fn round_of(
    target: &str,
    answered: &[(&str, Vec<LunReport>)],
    same_array: &[&str],
) -> DiscoveryRound {
    DiscoveryRound {
        target: target.into(),
        same_array: same_array.iter().map(|s| s.to_string()).collect(),
        ..round(answered, &[])
    }
}

fn merge_round(dev: &Device, r: &DiscoveryRound, now: i64) -> Option<Merged> {
    let by = reports_by_wwid(r);
    let reports = by.get(&dev.wwid).cloned().unwrap_or_default();
    merge(
        Some(dev),
        &dev.wwid,
        &reports,
        r,
        &BTreeSet::new(),
        now,
        &mut Vec::new(),
    )
}

#[test]
fn a_target_of_another_array_reporting_a_known_wwid_is_a_conflict_never_a_merge() {
    // Known through t1 from node a, bound.
    let dev = device(1, 100, &["a"], Phase::Bound);
    let mut bigger = lun(1, 500);
    bigger.paths = vec!["elsewhere".into()];
    // t2 (no array in common) reports the WWID from node c.
    let r = DiscoveryRound {
        device_labels: BTreeMap::from([("zone".into(), "b".into())]),
        ..round_of("t2", &[("c", vec![bigger.clone()])], &[])
    };
    let m = merge_round(&dev, &r, 2_000).expect("flagged");
    assert_eq!(m.change, Change::Conflict);
    let mut want = dev.clone();
    want.conflicts = vec![TargetConflict {
        target: "t2".into(),
        nodes: vec![node("c")],
        since: 2_000,
    }];
    // Nothing else of the report: no view, size, label or last seen.
    assert_eq!(m.device, want);
    // Seen again: nothing new to write.
    assert!(merge_round(&m.device, &r, 2_100).is_none());
    // node c silent: the conflict stands (doubt keeps it).
    let silent = DiscoveryRound {
        unanswered: vec![node("c")],
        ..round_of("t2", &[], &[])
    };
    assert!(merge_round(&m.device, &silent, 2_200).is_none());
    // node c answers without it: cleared, the device as it was.
    let cleared = merge_round(&m.device, &round_of("t2", &[("c", vec![])], &[]), 2_300)
        .expect("cleared")
        .device;
    assert_eq!(cleared, dev);
    // t1's nodes answer without it: Lost; t2's claim does not keep it.
    let lost = merge_round(&m.device, &round_of("t1", &[("a", vec![])], &[]), 2_400)
        .expect("lost")
        .device;
    assert_eq!(lost.phase, Phase::Lost);
    assert_eq!(lost.conflicts, want.conflicts);
    assert!(lost.nodes.is_empty());
}

#[test]
fn a_target_of_the_same_array_or_one_the_device_is_seen_through_is_merged() {
    let dev = device(1, 100, &["a"], Phase::Available);
    // (target, same array as it, merged)
    let cases = [
        ("t1", &[][..], true),
        ("t2", &["t1"][..], true),
        ("t2", &["t3"][..], false),
        ("t2", &[][..], false),
    ];
    for (target, same, merged) in cases {
        let r = round_of(target, &[("c", vec![lun(1, 100)])], same);
        let out = merge_round(&dev, &r, 1_000).expect("changed").device;
        assert_eq!(
            out.nodes.iter().any(|v| v.node == "c"),
            merged,
            "{target} {same:?}"
        );
        assert_eq!(out.conflicts.is_empty(), merged, "{target} {same:?}");
        assert_eq!(out.target, "t1");
    }
    // A device already seen through t2 (a record from before arrays) is
    // known through it; merging clears a conflict of that target.
    let mut seen = dev.clone();
    seen.nodes.push(NodeView {
        node: node("c"),
        target: "t2".into(),
        paths: vec!["old".into()],
    });
    seen.conflicts = vec![TargetConflict {
        target: "t2".into(),
        nodes: vec![node("d")],
        since: 1,
    }];
    let out = merge_round(
        &seen,
        &round_of("t2", &[("c", vec![lun(1, 100)])], &[]),
        1_000,
    )
    .expect("merged")
    .device;
    assert!(out.conflicts.is_empty());
    assert!(
        out.nodes
            .iter()
            .any(|v| v.node == "c" && v.paths == ["path-1"])
    );
}

#[test]
fn only_a_phantom_never_bound_unseen_past_the_forget_time_after_a_clean_round_is_forgotten() {
    let forget = 3_600;
    let old = 10_000;
    let now = old + forget + LAST_SEEN_RESOLUTION;
    let mut phantom = device(1, 100, &[], Phase::Lost);
    phantom.last_seen = old;
    let clean = round(&[("a", vec![])], &[]);
    assert!(forgettable(&phantom, &clean, false, now, forget));
    let mut bound = phantom.clone();
    bound.binding = Some(binding("v"));
    let mut published = phantom.clone();
    published.published = vec![Publication {
        node: node("a"),
        access: None,
        readonly: false,
    }];
    let mut viewed = phantom.clone();
    viewed.phase = Phase::Available;
    viewed.nodes = vec![NodeView {
        node: node("b"),
        target: "t1".into(),
        paths: vec![],
    }];
    let mut claimed = phantom.clone();
    claimed.conflicts = vec![TargetConflict {
        target: "t2".into(),
        nodes: vec![node("c")],
        since: old,
    }];
    let mut releasing = phantom.clone();
    releasing.phase = Phase::Failed;
    let mut recent = phantom.clone();
    // Refreshed at most every LAST_SEEN_RESOLUTION: the forget time alone
    // past it is not enough.
    recent.last_seen = now - forget;
    let silent = round(&[("a", vec![])], &["b"]);
    let nobody = round(&[], &[]);
    // (device, round, reported now)
    let kept = [
        (&bound, &clean, false),
        (&published, &clean, false),
        (&viewed, &clean, false),
        (&claimed, &clean, false),
        (&releasing, &clean, false),
        (&recent, &clean, false),
        (&phantom, &silent, false),
        (&phantom, &nobody, false),
        (&phantom, &clean, true),
    ];
    for (i, (dev, r, reported)) in kept.into_iter().enumerate() {
        assert!(!forgettable(dev, r, reported, now, forget), "case {i}");
    }
}

#[test]
fn a_smaller_report_never_lowers_the_size_of_a_lun_that_may_hold_data() {
    // (phase, recorded, reported, recorded after the round): a LUN that may
    // hold a tenant's data keeps the largest size it had, so its release
    // wipes all of it; a free one takes what its nodes report.
    let cases = [
        (Phase::Available, 80, 64, 64),
        (Phase::Available, 64, 80, 80),
        (Phase::Available, 64, 0, 0),
        (Phase::Bound, 80, 64, 80),
        (Phase::Bound, 64, 80, 80),
        (Phase::Releasing, 80, 64, 80),
        (Phase::Releasing, 64, 0, 64),
        (Phase::Failed, 80, 64, 80),
        (Phase::Lost, 80, 64, 80),
        // Not yet proven blank: its probe or wipe must cover all it had.
        (Phase::Unverified, 80, 64, 80),
        (Phase::HoldsData, 80, 0, 80),
    ];
    for (phase, recorded, reported, want) in cases {
        let dev = device(1, recorded, &["a"], phase);
        let m = merged(&dev, &[("a", vec![lun(1, reported)])], 2_000).expect("merged");
        assert_eq!(
            m.device.size_bytes, want,
            "{phase:?}: recorded {recorded}, reported {reported}"
        );
    }
}

#[test]
fn a_new_lun_takes_the_phase_its_target_s_policy_gives_and_so_does_one_found_without_a_volume() {
    // (policy, phase of a new LUN = of a Lost one found again holding no volume)
    let cases = [
        (NewLuns::Probe, Phase::Unverified),
        (NewLuns::Wipe, Phase::Releasing),
        (NewLuns::Trust, Phase::Available),
    ];
    for (policy, phase) in cases {
        let r = DiscoveryRound {
            new_luns: policy,
            ..round(&[("a", vec![lun(1, 100)])], &[])
        };
        let new = merge(
            None,
            &wwid(1),
            &[(&node("a"), &lun(1, 100))],
            &r,
            &BTreeSet::new(),
            1_000,
            &mut Vec::new(),
        )
        .expect("a new device");
        assert_eq!(
            (new.change, new.device.phase),
            (Change::Added, phase),
            "{policy:?}"
        );
        assert_eq!(new.device.binding, None);
        let mut lost = device(1, 100, &[], Phase::Lost);
        lost.nodes.clear();
        let back = merge_round(&lost, &r, 1_000).expect("found");
        assert_eq!(
            (back.change, back.device.phase),
            (Change::Found, phase),
            "{policy:?}"
        );
        // With its volume, it comes back to it whatever the policy.
        let mut bound_lost = lost.clone();
        bound_lost.binding = Some(binding("v"));
        let back = merge_round(&bound_lost, &r, 1_000).expect("found");
        assert_eq!(back.device.phase, Phase::Bound, "{policy:?}");
    }
}

#[test]
fn only_a_lun_s_own_target_set_to_wipe_sends_a_held_or_unproven_lun_to_its_wipe() {
    // (phase before, binding, the round's target, its policy, phase after)
    let cases = [
        (
            Phase::HoldsData,
            false,
            "t1",
            NewLuns::Wipe,
            Phase::Releasing,
        ),
        (
            Phase::Unverified,
            false,
            "t1",
            NewLuns::Wipe,
            Phase::Releasing,
        ),
        // Another target (of the same array) cannot order its wipe.
        (
            Phase::HoldsData,
            false,
            "t2",
            NewLuns::Wipe,
            Phase::HoldsData,
        ),
        // Probe and trust leave found data where it is: trust is about new
        // LUNs, never about data a probe has seen.
        (
            Phase::HoldsData,
            false,
            "t1",
            NewLuns::Probe,
            Phase::HoldsData,
        ),
        (
            Phase::HoldsData,
            false,
            "t1",
            NewLuns::Trust,
            Phase::HoldsData,
        ),
        // Nothing that is offered or holds a volume is touched.
        (
            Phase::Available,
            false,
            "t1",
            NewLuns::Wipe,
            Phase::Available,
        ),
        (Phase::Bound, true, "t1", NewLuns::Wipe, Phase::Bound),
    ];
    for (before, bound, target, policy, after) in cases {
        let mut dev = device(1, 100, &["a"], before);
        dev.nodes
            .iter_mut()
            .for_each(|v| v.paths = vec!["path-1".into()]);
        if bound {
            dev.binding = Some(binding("v"));
        }
        let r = DiscoveryRound {
            new_luns: policy,
            ..round_of(target, &[("a", vec![lun(1, 100)])], &["t1", "t2"])
        };
        let out = merge_round(&dev, &r, 1_000).map_or(dev.clone(), |m| m.device);
        assert_eq!(
            out.phase, after,
            "{before:?} through {target} set to {policy:?}"
        );
    }
}

#[test]
fn a_probe_offers_a_lun_only_at_the_size_it_read_and_holds_one_with_data_once() {
    let mut dev = device(1, 100, &["a"], Phase::Unverified);
    // The recorded size moved while the probe read 90 bytes: not proven.
    assert!(!proven_blank(&mut dev, 90));
    assert_eq!(dev.phase, Phase::Unverified);
    assert!(found_data(&mut dev, "data at byte 0".into()));
    assert_eq!(
        (dev.phase, dev.reason.as_str()),
        (Phase::HoldsData, "data at byte 0")
    );
    // The same finding again writes nothing.
    assert!(!found_data(&mut dev, "data at byte 0".into()));
    assert!(proven_blank(&mut dev, 100));
    assert_eq!((dev.phase, dev.reason.as_str()), (Phase::Available, ""));
    // Only a LUN awaiting proof: neither an offered nor a bound one.
    assert!(!found_data(&mut dev, "data".into()));
    let mut bound = device(2, 100, &["a"], Phase::Bound);
    bound.binding = Some(binding("v"));
    assert!(!proven_blank(&mut bound, 100) && !found_data(&mut bound, "x".into()));
    assert_eq!(bound.phase, Phase::Bound);
    // And an awaiting LUN is never bound.
    let unproven = device(3, 100, &["a"], Phase::Unverified);
    let req = BindRequest {
        binding: binding("w"),
        placement: Placement::anywhere(),
        selector: Selector::default(),
        min_bytes: 1,
        max_bytes: u64::MAX,
    };
    assert!(!fits(&unproven, &req, None));
    let held = device(4, 100, &["a"], Phase::HoldsData);
    assert!(!fits(&held, &req, None));
}

#[test]
fn a_retired_lun_is_never_bound_counted_wiped_or_forgotten_and_no_transition_clears_it() {
    let retire = |mut d: Device| {
        d.retired = true;
        d
    };
    let any = Selector::default();
    let req = request(1, u64::MAX, "", &[]);
    let free = device(1, 100, &["a"], Phase::Available);
    assert!(fits(&free, &req, None) && free_for(&free, &any, None));
    let retired = retire(free.clone());
    assert!(!fits(&retired, &req, None), "never bound");
    assert!(!free_for(&retired, &any, None), "never counted as capacity");
    assert!(!free_for(&retired, &any, Some(&node("a"))));
    assert_eq!(choose([&free, &retired], &req, None), Some(&free));
    assert_eq!(choose([&retired], &req, None), None);

    // Its wipe is not due, in either phase a release worker wipes in; its
    // release is still pending (no volume or bind may use it).
    for phase in [Phase::Releasing, Phase::Failed] {
        let pending = device(2, 100, &["a"], phase);
        assert!(wipe_due(&pending), "{phase:?}");
        let held = retire(pending);
        assert!(!wipe_due(&held) && releasing(&held), "{phase:?}");
    }
    for phase in [
        Phase::Available,
        Phase::Bound,
        Phase::Lost,
        Phase::Unverified,
    ] {
        assert!(!wipe_due(&device(3, 100, &["a"], phase)), "{phase:?}");
    }

    // A phantom otherwise forgotten stays while retired: forgotten, it
    // would come back as a LUN nobody retired.
    let forget = 3_600;
    let now = 10_000 + forget + LAST_SEEN_RESOLUTION;
    let mut phantom = device(4, 100, &[], Phase::Lost);
    phantom.last_seen = 10_000;
    let clean = round(&[("a", vec![])], &[]);
    assert!(forgettable(&phantom, &clean, false, now, forget));
    assert!(!forgettable(&retire(phantom), &clean, false, now, forget));

    // Every transition keeps the operator's flag and request.
    let mut dev = retire(device(5, 100, &["a"], Phase::Available));
    dev.retry_wipe = "asked".into();
    bind(&mut dev, binding("v"));
    let published = publish(
        &mut dev,
        "uid-v",
        Publication {
            node: node("a"),
            access: None,
            readonly: false,
        },
    );
    assert_eq!(published, Ok(Publish::Recorded));
    assert!(unpublish(&mut dev, "uid-v", &node("a")));
    assert!(start_release(&mut dev));
    wipe_failed(&mut dev, "EIO".into());
    released(&mut dev);
    lost(&mut dev, "gone");
    found(&mut dev, NewLuns::Probe);
    let seen = merged(&dev, &[("a", vec![lun(5, 100)])], 5_000).map_or(dev.clone(), |m| m.device);
    for d in [&dev, &seen] {
        assert!(d.retired, "{:?}", d.phase);
        assert_eq!(d.retry_wipe, "asked");
    }
    // A LUN seen for the first time is nobody's to retire.
    let new = device(6, 100, &["a"], Phase::Available);
    assert!(!new.retired && new.retry_wipe.is_empty());
}
