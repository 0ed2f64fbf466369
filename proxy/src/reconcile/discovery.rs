//! Discovery: fan `Discover` out to the agents whose nodes match each
//! target, and merge the reports by WWID into the inventory. Releases are
//! not its business (`super::release`): a wipe of hours must not hold up
//! new LUNs or Lost detection.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use csi_scsi_contract::Wwid;
use csi_scsi_proto::agent::{DiscoverRequest, Lun};
use tokio::sync::Notify;

use crate::agents::fan_out;
use crate::device::{DiscoveryRound, LunReport, Target};
use crate::directory::{AgentEntry, NodeAgent};
use crate::error::ProxyError;
use crate::lifecycle::Lifecycle;

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
}

/// Whether `node` (with `entry`) should reach `target`.
pub fn node_matches(target: &Target, node: &str, entry: &AgentEntry) -> bool {
    (target.nodes.is_empty() || target.nodes.iter().any(|n| n == node))
        && target
            .node_selector
            .iter()
            .all(|(k, v)| entry.labels.get(k) == Some(v))
}

/// One discovery pass over every target.
pub async fn reconcile_once(
    life: &Lifecycle,
    concurrency: usize,
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
    let gone = move |node: &str| directory.locate(node) == NodeAgent::Gone;
    let mut summary = PassSummary::default();
    for target in life.inventory().targets().await? {
        let nodes: Vec<String> = agents
            .iter()
            .filter(|(n, e)| node_matches(&target, n, e))
            .map(|(n, _)| n.clone())
            .collect();
        // A target whose CHAP Secret is missing or misplaced is skipped,
        // not the whole pass.
        let agent_target = match life.agent_target(&target).await {
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
        };
        for (node, result) in
            fan_out(life.agents(), nodes, discover, &request_id, concurrency).await
        {
            match result {
                Ok(r) => {
                    for p in r.portals.iter().filter(|p| !p.reachable) {
                        tracing::warn!(%node, target = %target.name, portal = %p.portal, error = %p.error, "portal unreachable");
                    }
                    let luns = r
                        .luns
                        .into_iter()
                        .filter_map(|l| {
                            lun_report(l)
                                .inspect_err(|e| tracing::warn!(%node, target = %target.name, error = %e, "LUN report ignored"))
                                .ok()
                        })
                        .collect();
                    round.answered.insert(node, luns);
                }
                Err(e) => {
                    tracing::warn!(%node, target = %target.name, error = %e, "discover failed");
                    round.unanswered.push(node);
                }
            }
        }
        summary.targets += 1;
        summary.unanswered += round.unanswered.len();
        let out = life
            .inventory()
            .apply_discovery_pruning(round, &gone)
            .await?;
        summary.added += out.added.len();
        summary.lost += out.lost.len();
        for wwid in &out.lost {
            tracing::warn!(%wwid, target = %target.name, "device no longer reported by any node: Lost");
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
    concurrency: usize,
) {
    // The first pass waits for the directory's first list (start-up).
    let directory = life.agents().directory().clone();
    while !directory.is_synced() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    loop {
        match reconcile_once(&life, concurrency).await {
            Ok(s) => tracing::info!(
                targets = s.targets,
                added = s.added,
                lost = s.lost,
                unanswered = s.unanswered,
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
fn lun_report(l: Lun) -> Result<LunReport, String> {
    match Wwid::parse(&l.wwid) {
        Ok(w) if w.as_str() == l.wwid => {}
        Ok(w) => {
            return Err(format!(
                "WWID {:?} is not in canonical form ({})",
                csi_scsi_daemon::text::bounded(&l.wwid, csi_scsi_daemon::text::INPUT_MAX),
                w.as_str()
            ));
        }
        Err(e) => return Err(e.to_string()),
    }
    let paths = l
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
    Ok(LunReport {
        paths,
        wwid: l.wwid,
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

    #[test]
    fn only_a_canonical_wwid_is_taken_into_the_inventory() {
        let lun = |wwid: &str| Lun {
            wwid: wwid.into(),
            ..Lun::default()
        };
        let canonical = "naa.60014050000100000000000000000001";
        assert_eq!(
            lun_report(lun(canonical)).expect("canonical").wwid,
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
}
