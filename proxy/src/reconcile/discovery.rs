//! Discovery: fan `Discover` out to the agents whose nodes match each
//! target, and merge the reports by WWID into the inventory. Releases are
//! not its business (`super::release`): a wipe of hours must not hold up
//! new LUNs or Lost detection.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use csi_scsi_contract::NodeName;
use csi_scsi_proto::agent::{DiscoverRequest, Lun};
use tokio::sync::Notify;

use crate::agents::fan_out;
use crate::device::{DiscoveryRound, LunReport, Target, TargetRefused, canonical_wwid};
use crate::directory::{LabelSource, NodeAgent};
use crate::error::ProxyError;
use crate::lifecycle::Lifecycle;

/// What one node's report of one target may hold. A report beyond any of
/// these is refused whole, never cut: a cut report would read as LUNs gone.
pub mod bounds {
    /// LUNs in one node's report of one target.
    pub const MAX_LUNS_PER_REPORT: usize = 4096;
    /// Paths of one LUN on one node (16 portals, or HBAs times target ports).
    pub const MAX_PATHS_PER_LUN: usize = 64;
    /// Bytes of the vendor, model and serial (INQUIRY gives 8, 16 and at
    /// most 252).
    pub const MAX_FIELD_BYTES: usize = 256;
    /// Bytes of one path name (a by-path name holds an IQN of up to 223).
    pub const MAX_PATH_BYTES: usize = 512;
}

/// Why a node's report of a target was refused (its earlier views stand).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReportRefused {
    /// More LUNs than [`bounds::MAX_LUNS_PER_REPORT`].
    #[error("{0} LUNs, more than {max}", max = bounds::MAX_LUNS_PER_REPORT)]
    TooManyLuns(usize),
    /// A LUN with more paths than [`bounds::MAX_PATHS_PER_LUN`].
    #[error("LUN {wwid}: {count} paths, more than {max}", max = bounds::MAX_PATHS_PER_LUN)]
    TooManyPaths {
        /// The LUN.
        wwid: String,
        /// Paths reported.
        count: usize,
    },
    /// A text field longer than its bound.
    #[error("LUN {wwid}: {field} of {bytes} bytes, more than {max}")]
    FieldTooLong {
        /// The LUN.
        wwid: String,
        /// Which field.
        field: &'static str,
        /// Its length.
        bytes: usize,
        /// Its bound.
        max: usize,
    },
    /// The same WWID twice (the agent groups paths by WWID).
    #[error("LUN {0} reported twice")]
    Duplicate(String),
    /// A WWID that is not canonical, or no WWID at all.
    #[error("{0}")]
    Wwid(String),
}

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PassSummary {
    /// Targets discovered.
    pub targets: usize,
    /// Devices seen for the first time.
    pub added: usize,
    /// Devices that went Lost.
    pub lost: usize,
    /// Node/target pairs that did not answer.
    pub unanswered: usize,
    /// Node/target pairs whose report was refused (out of bounds, malformed).
    pub refused: usize,
    /// Devices another array's target newly reported (not merged).
    pub conflicts: usize,
    /// Phantom devices removed.
    pub forgotten: usize,
    /// Devices that could not be read or written.
    pub failed: usize,
    /// Targets whose round could not be merged at all.
    pub failed_targets: usize,
    /// Targets left out: their nodeSelector uses keys a kubelet can set.
    pub refused_targets: usize,
}

/// How passes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassSettings {
    /// Agents asked at once.
    pub concurrency: usize,
    /// Devices no node reported for this long, never bound, are removed
    /// (`policy::forgettable`); `None`: never.
    pub forget_after: Option<Duration>,
}

/// The other targets of `targets` that name `target`'s array.
pub fn same_array(target: &Target, targets: &[Target]) -> BTreeSet<String> {
    let Some(array) = &target.array else {
        return BTreeSet::new();
    };
    targets
        .iter()
        .filter(|t| t.name != target.name && t.array.as_ref() == Some(array))
        .map(|t| t.name.clone())
        .collect()
}

/// Takes `node`'s answer into `round`: its LUNs, or, when the report is
/// refused, the node among those that did not answer (its earlier views
/// stand, nothing of the report is merged). `false`: refused.
pub fn take_report(round: &mut DiscoveryRound, node: NodeName, luns: Vec<Lun>) -> bool {
    match node_report(luns) {
        Ok(luns) => {
            round.answered.insert(node, luns);
            true
        }
        Err(e) => {
            tracing::warn!(%node, target = %round.target, error = %e, "discovery report refused; the node's earlier report stands");
            round.unanswered.push(node);
            false
        }
    }
}

/// A node's report of one target, checked whole against [`bounds`].
pub fn node_report(luns: Vec<Lun>) -> Result<Vec<LunReport>, ReportRefused> {
    if luns.len() > bounds::MAX_LUNS_PER_REPORT {
        return Err(ReportRefused::TooManyLuns(luns.len()));
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(luns.len());
    for l in luns {
        let lun = lun_report(l)?;
        if !seen.insert(lun.wwid.clone()) {
            return Err(ReportRefused::Duplicate(lun.wwid.to_string()));
        }
        out.push(lun);
    }
    Ok(out)
}

/// One discovery pass over every target. One target's failure is logged
/// and counted; the others are discovered all the same.
pub async fn reconcile_once(
    life: &Lifecycle,
    settings: &PassSettings,
) -> Result<PassSummary, ProxyError> {
    let request_id = format!("discovery-{}", uuid::Uuid::new_v4());
    let directory = life.agents().directory().clone();
    // An unlisted directory would look like a cluster where no node
    // answers: nothing to learn from a pass, and target statuses to spoil.
    if !directory.is_synced() {
        return Err(ProxyError::DirectoryNotSynced {
            consequence: "no discovery pass yet".into(),
        });
    }
    let agents = directory.snapshot();
    // Only the directory decides a node is gone (its Node object deleted);
    // one merely unreachable keeps its views.
    let gone = move |node: &NodeName| directory.locate(node) == NodeAgent::Gone;
    let forget_after = settings
        .forget_after
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let mut summary = PassSummary::default();
    let targets = life.inventory().targets().await?;
    let keys = life.selector_keys();
    let labels_from_nodes = life.agents().directory().label_source() == LabelSource::NodeObjects;
    for target in &targets {
        // A selector any node could satisfy by labelling itself selects no
        // node: no Discover (no CHAP) goes out for it, and its devices'
        // records stay as they are (no view dropped, nothing Lost).
        // Nor does one whose IQN, portals or WWPNs do not parse: every
        // agent would refuse it on every Discover; it is refused here, once.
        let checked = target
            .check_selector(keys)
            .map_err(TargetRefused::from)
            .and_then(|()| target.check_transport().map_err(TargetRefused::from));
        if let Err(refused) = checked {
            tracing::warn!(target = %target.name, error = %refused, "target not discovered");
            life.inventory().target_refused(&refused).await;
            summary.refused_targets += 1;
            continue;
        }
        let settable = target.kubelet_settable_keys();
        if labels_from_nodes && !settable.is_empty() {
            tracing::warn!(target = %target.name, keys = ?settable, "the target's nodeSelector uses keys a node's kubelet can set on its own Node, allowed by --allow-kubelet-settable-selectors: any node that labels itself gets its CHAP credentials and LUNs");
        }
        let nodes: Vec<NodeName> = agents
            .iter()
            .filter(|(n, e)| target.selects(n, &e.labels, keys))
            .map(|(n, _)| n.clone())
            .collect();
        // A target whose CHAP Secret is missing or misplaced is skipped,
        // not the whole pass.
        let agent_target = match life.agent_target(target).await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(target = %target.name, error = %e, "target not discovered");
                continue;
            }
        };
        let discover = DiscoverRequest {
            target: Some(agent_target),
        };
        let mut round = DiscoveryRound {
            target: target.name.clone(),
            device_labels: target.device_labels.clone(),
            answered: BTreeMap::new(),
            unanswered: Vec::new(),
            same_array: same_array(target, &targets),
            new_luns: target.new_luns,
        };
        for (node, result) in fan_out(
            life.agents(),
            nodes,
            discover,
            &request_id,
            settings.concurrency,
        )
        .await
        {
            match result {
                Ok(r) => {
                    for p in r.portals.iter().filter(|p| !p.reachable) {
                        tracing::warn!(%node, target = %target.name, portal = %p.portal, error = %p.error, "portal unreachable");
                    }
                    if !take_report(&mut round, node, r.luns) {
                        summary.refused += 1;
                    }
                }
                Err(e) => {
                    tracing::warn!(%node, target = %target.name, error = %e, "discover failed");
                    round.unanswered.push(node);
                }
            }
        }
        summary.targets += 1;
        summary.unanswered += round.unanswered.len();
        let out = match life
            .inventory()
            .apply_discovery_pruning(round, &gone, forget_after)
            .await
        {
            Ok(out) => out,
            Err(e) => {
                tracing::warn!(target = %target.name, error = %e, "target's round not merged; the other targets go on");
                summary.failed_targets += 1;
                continue;
            }
        };
        summary.added += out.added.len();
        summary.lost += out.lost.len();
        summary.conflicts += out.conflicts.len();
        summary.forgotten += out.forgotten.len();
        summary.failed += out.failed.len();
        for wwid in &out.lost {
            tracing::warn!(%wwid, target = %target.name, "device no longer reported by any node: Lost");
        }
        for wwid in &out.conflicts {
            tracing::warn!(%wwid, target = %target.name, "WWID reported through a target of another array than the one it is known through: not merged (TargetConflict)");
        }
        for wwid in &out.forgotten {
            tracing::info!(%wwid, target = %target.name, "device not reported by any node for the forget time and never bound: removed");
        }
    }
    Ok(summary)
}

/// Runs passes every `interval` and whenever `trigger` is notified, until
/// the task is dropped.
pub async fn run(
    life: Arc<Lifecycle>,
    interval: Duration,
    trigger: Arc<Notify>,
    settings: PassSettings,
) {
    // The first pass waits for the directory's first list (start-up).
    let directory = life.agents().directory().clone();
    while !directory.is_synced() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    loop {
        match reconcile_once(&life, &settings).await {
            Ok(s) => tracing::info!(
                targets = s.targets,
                added = s.added,
                lost = s.lost,
                unanswered = s.unanswered,
                refused = s.refused,
                conflicts = s.conflicts,
                forgotten = s.forgotten,
                failed = s.failed,
                failed_targets = s.failed_targets,
                "discovery pass"
            ),
            Err(e) => tracing::warn!(error = %e, "discovery pass failed"),
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = trigger.notified() => {}
        }
    }
}

/// A LUN an agent reported, as the inventory keeps it. Its WWID must be in
/// canonical form already: the inventory is keyed by it and volume IDs are
/// built from it, and the agents only ever report canonical WWIDs, so
/// anything else is refused rather than stored under a spelling no volume
/// ID could name.
fn lun_report(l: Lun) -> Result<LunReport, ReportRefused> {
    let wwid = canonical_wwid(&l.wwid).map_err(ReportRefused::Wwid)?;
    if l.paths.len() > bounds::MAX_PATHS_PER_LUN {
        return Err(ReportRefused::TooManyPaths {
            wwid: l.wwid,
            count: l.paths.len(),
        });
    }
    let paths: Vec<String> = l
        .paths
        .iter()
        .map(|p| {
            if p.by_path.is_empty() {
                p.by_id.clone()
            } else {
                p.by_path.clone()
            }
        })
        .collect();
    let fields = [
        ("vendor", l.vendor.len(), bounds::MAX_FIELD_BYTES),
        ("model", l.model.len(), bounds::MAX_FIELD_BYTES),
        ("serial", l.serial.len(), bounds::MAX_FIELD_BYTES),
    ]
    .into_iter()
    .chain(
        paths
            .iter()
            .map(|p| ("path", p.len(), bounds::MAX_PATH_BYTES)),
    );
    for (field, bytes, max) in fields {
        if bytes > max {
            return Err(ReportRefused::FieldTooLong {
                wwid: l.wwid,
                field,
                bytes,
                max,
            });
        }
    }
    Ok(LunReport {
        paths,
        wwid,
        lun: l.lun,
        size_bytes: l.size_bytes,
        vendor: l.vendor,
        model: l.model,
        serial: l.serial,
    })
}

#[cfg(test)]
mod lun_report_tests {
    use super::*;
    use crate::device::Phase;

    #[test]
    fn only_a_canonical_wwid_is_taken_into_the_inventory() {
        let lun = |wwid: &str| Lun {
            wwid: wwid.into(),
            ..Lun::default()
        };
        let canonical = "naa.60014050000100000000000000000001";
        assert_eq!(
            lun_report(lun(canonical)).expect("canonical").wwid.as_str(),
            canonical
        );
        for other in [
            "NAA.60014050000100000000000000000001",
            "360014050000100000000000000000001",
            "naa.1",
            "",
            "../etc",
        ] {
            assert!(lun_report(lun(other)).is_err(), "{other:?} taken");
        }
    }

    fn wwid(i: usize) -> String {
        format!("naa.6001405{i:025x}")
    }

    /// The inventory's key of LUN `i`.
    fn key(i: usize) -> csi_scsi_contract::Wwid {
        csi_scsi_contract::Wwid::parse(&wwid(i)).expect("a canonical WWID")
    }

    fn agent_lun(i: usize) -> Lun {
        Lun {
            wwid: wwid(i),
            size_bytes: 1 << 30,
            vendor: "LIO-ORG".into(),
            model: "disk".into(),
            serial: format!("sn{i}"),
            lun: u32::try_from(i).unwrap_or(u32::MAX),
            paths: vec![csi_scsi_proto::agent::DevicePath {
                by_path: format!("ip-198.18.0.1:3260-iscsi-iqn.2026-01.io.csi-scsi:a-lun-{i}"),
                ..Default::default()
            }],
            ..Lun::default()
        }
    }

    #[test]
    fn a_report_beyond_any_bound_is_refused_whole_never_cut() {
        let at_bounds = |i: usize| {
            let mut l = agent_lun(i);
            l.serial = "s".repeat(bounds::MAX_FIELD_BYTES);
            l.paths = vec![
                csi_scsi_proto::agent::DevicePath {
                    by_path: "p".repeat(bounds::MAX_PATH_BYTES),
                    ..Default::default()
                };
                bounds::MAX_PATHS_PER_LUN
            ];
            l
        };
        // As many LUNs as allowed, one of them at every bound of its own.
        let mut full: Vec<Lun> = (0..bounds::MAX_LUNS_PER_REPORT).map(agent_lun).collect();
        full[0] = at_bounds(0);
        assert_eq!(
            node_report(full.clone()).expect("at the bounds").len(),
            bounds::MAX_LUNS_PER_REPORT
        );
        let mut too_many = full;
        too_many.push(agent_lun(bounds::MAX_LUNS_PER_REPORT));
        assert_eq!(
            node_report(too_many),
            Err(ReportRefused::TooManyLuns(bounds::MAX_LUNS_PER_REPORT + 1))
        );
        // One field of one LUN past its bound refuses the whole report.
        type Spoil = fn(&mut Lun);
        let spoilers: [(&str, Spoil); 6] = [
            ("vendor", |l| {
                l.vendor = "v".repeat(bounds::MAX_FIELD_BYTES + 1)
            }),
            ("model", |l| {
                l.model = "m".repeat(bounds::MAX_FIELD_BYTES + 1)
            }),
            ("serial", |l| {
                l.serial = "s".repeat(bounds::MAX_FIELD_BYTES + 1)
            }),
            ("path", |l| {
                l.paths[0].by_path = "p".repeat(bounds::MAX_PATH_BYTES + 1)
            }),
            ("paths", |l| {
                l.paths = vec![l.paths[0].clone(); bounds::MAX_PATHS_PER_LUN + 1]
            }),
            ("duplicate", |l| l.wwid = wwid(0)),
        ];
        for (what, spoil) in spoilers {
            let mut luns: Vec<Lun> = (0..3).map(agent_lun).collect();
            spoil(&mut luns[1]);
            let refused = node_report(luns).expect_err(what);
            let text = refused.to_string();
            assert!(
                text.contains(what.trim_end_matches('s')) || text.contains("twice"),
                "{what}: {text}"
            );
        }
        // A malformed WWID too: the node's word is doubted whole, not
        // taken less that LUN (which would read as the LUN gone).
        let mut luns: Vec<Lun> = (0..3).map(agent_lun).collect();
        luns[2].wwid = "NAA.6001405".into();
        assert!(matches!(node_report(luns), Err(ReportRefused::Wwid(_))));
    }

    #[tokio::test]
    async fn a_refused_report_stands_as_the_node_s_earlier_one_while_the_others_merge() {
        use crate::inventory::{EmbeddedInventory, Inventory};
        let dir = tempfile::tempdir().expect("tempdir");
        let inv = Inventory::new(Arc::new(
            EmbeddedInventory::open(&dir.path().join("inventory.db")).expect("open"),
        ));
        let fresh = || DiscoveryRound {
            target: "t1".into(),
            ..DiscoveryRound::default()
        };
        // Before: node-a sees LUN 1.
        let mut before = fresh();
        assert!(take_report(
            &mut before,
            crate::node("node-a"),
            vec![agent_lun(1)]
        ));
        inv.apply_discovery(before).await.expect("first round");
        // Now node-a reports LUN 2 with a serial of 1 MiB; node-b, LUN 3.
        let mut huge = agent_lun(2);
        huge.serial = "x".repeat(1 << 20);
        let mut round = fresh();
        assert!(!take_report(&mut round, crate::node("node-a"), vec![huge]));
        assert!(take_report(
            &mut round,
            crate::node("node-b"),
            vec![agent_lun(3)]
        ));
        assert_eq!(round.unanswered, ["node-a"]);
        let out = inv.apply_discovery(round).await.expect("second round");
        assert_eq!(out.added, [key(3)], "{out:?}");
        assert!(out.lost.is_empty(), "{out:?}");
        // node-a's earlier view stands; nothing of its refused report is in.
        let one = inv.device(&key(1)).await.expect("read").expect("kept");
        assert_eq!(
            (one.phase, one.node_names()),
            (Phase::Unverified, vec![crate::node("node-a")])
        );
        assert!(inv.device(&key(2)).await.expect("read").is_none());
    }
}
