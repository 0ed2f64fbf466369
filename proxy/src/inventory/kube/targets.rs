//! SCSITarget objects: their spec (what an administrator or the targets
//! file says) and the status each discovery round writes back.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::DeleteParams;
use kube::runtime::reflector;

use super::{KubeInventory, api_error, retry_on_conflict};
use crate::device::{DiscoveryRound, Target, TargetRefused};
use crate::inventory::InventoryError;
use crate::kube_wiring::post_params;
use crate::resources::{SCSITarget, SCSITargetSpec, SCSITargetStatus, TargetNodeStatus};

/// What an SCSITarget's `status.phase` says (a string on the wire, so an
/// object another version wrote still reads).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TargetPhase {
    /// Every node that should see the target answered.
    Ready,
    /// Some answered, some did not.
    Degraded,
    /// No node answered.
    Unreachable,
    /// Left out of discovery: its node selector was refused.
    Refused,
}

impl TargetPhase {
    /// The phase a discovery round leaves the target in.
    fn of(round: &DiscoveryRound) -> Self {
        match (round.answered.is_empty(), round.unanswered.is_empty()) {
            (false, true) => Self::Ready,
            (false, false) => Self::Degraded,
            (true, _) => Self::Unreachable,
        }
    }

    /// The text written into the status.
    fn as_str(self) -> &'static str {
        match self {
            Self::Ready => "Ready",
            Self::Degraded => "Degraded",
            Self::Unreachable => "Unreachable",
            Self::Refused => "Refused",
        }
    }
}

impl KubeInventory {
    pub(super) async fn apply_target(&self, target: Target) -> Result<(), InventoryError> {
        self.fence()?;
        self.wait_until_ready().await?;
        let spec = &SCSITargetSpec::from_target(&target);
        let name = target.name.as_str();
        // A conflict means a stale cache: wait for the watch and try again.
        let outcome = retry_on_conflict(Duration::from_millis(200), move |_| async move {
            let current = self
                .inner
                .target_cache
                .get(&reflector::ObjectRef::new(name));
            match current {
                Some(obj) if obj.spec == *spec => Ok(()),
                Some(obj) => {
                    let mut next = (*obj).clone();
                    next.spec = spec.clone();
                    self.inner
                        .targets
                        .replace(name, &post_params(), &next)
                        .await
                        .map(drop)
                }
                None => {
                    let obj = SCSITarget::new(name, spec.clone());
                    self.inner
                        .targets
                        .create(&post_params(), &obj)
                        .await
                        .map(drop)
                }
            }
        })
        .await;
        match outcome {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(api_error(e)),
            None => Err(InventoryError::TargetConflict(target.name.clone())),
        }
    }

    pub(super) async fn delete_target(&self, name: &str) -> Result<(), InventoryError> {
        self.fence()?;
        match self
            .inner
            .targets
            .delete(name, &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(api_error(e)),
        }
    }

    pub(super) async fn list_targets(&self) -> Result<Vec<Target>, InventoryError> {
        self.wait_until_ready().await?;
        let mut all: Vec<Target> = self
            .inner
            .target_cache
            .state()
            .iter()
            .filter_map(|t| {
                t.to_target()
                    .inspect_err(|e| tracing::warn!(error = %e, "SCSITarget skipped"))
                    .ok()
            })
            .collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }

    /// Writes what the round saw into the target's status (best effort).
    pub(super) async fn write_target_status(
        &self,
        round: &DiscoveryRound,
        mut conflicts: Vec<String>,
    ) {
        let mut nodes: Vec<TargetNodeStatus> = round
            .answered
            .iter()
            .map(|(node, luns)| TargetNodeStatus {
                node: node.clone(),
                answered: true,
                luns: u32::try_from(luns.len()).unwrap_or(u32::MAX),
            })
            .chain(round.unanswered.iter().map(|node| TargetNodeStatus {
                node: node.clone(),
                answered: false,
                luns: 0,
            }))
            .collect();
        nodes.sort_by(|a, b| a.node.cmp(&b.node));
        conflicts.sort();
        conflicts.dedup();
        let answered = u32::try_from(round.answered.len()).unwrap_or(u32::MAX);
        let phase = TargetPhase::of(round);
        let now = Timestamp::now();
        let previous = self
            .inner
            .target_cache
            .get(&reflector::ObjectRef::new(&round.target))
            .and_then(|t| t.status.clone());
        let discovered = answered > 0;
        let status = SCSITargetStatus {
            phase: Some(phase.as_str().into()),
            reachable_nodes: answered,
            nodes,
            label_conflicts: conflicts,
            last_discovery: Some(Time(now)),
            conditions: vec![condition(
                previous
                    .as_ref()
                    .map(|s| s.conditions.as_slice())
                    .unwrap_or_default(),
                "Discovered",
                discovered,
                if discovered {
                    "AgentsAnswered"
                } else {
                    "NoAgentAnswered"
                },
                format!(
                    "{answered} of {} nodes answered",
                    round.answered.len() + round.unanswered.len()
                ),
                now,
            )],
        };
        self.replace_target_status(&round.target, status).await;
    }

    /// Says in the target's status that it was refused: phase `Refused`,
    /// condition `Discovered` False with the reason. What the last pass saw
    /// (nodes, LUN counts) stays as it was.
    pub(super) async fn write_target_refused(&self, refused: &TargetRefused) {
        let now = Timestamp::now();
        let mut status = self
            .inner
            .target_cache
            .get(&reflector::ObjectRef::new(refused.target()))
            .and_then(|t| t.status.clone())
            .unwrap_or_default();
        let discovered = condition(
            &status.conditions,
            "Discovered",
            false,
            refused.reason(),
            refused.to_string(),
            now,
        );
        status.phase = Some(TargetPhase::Refused.as_str().into());
        status.conditions.retain(|c| c.type_ != "Discovered");
        status.conditions.push(discovered);
        self.replace_target_status(refused.target(), status).await;
    }

    /// Replaces target `name`'s status with `status` (best effort).
    async fn replace_target_status(&self, name: &str, status: SCSITargetStatus) {
        // The whole status replaces the stored one: the empty fields it
        // skips (no conflicts left, no nodes) must clear, and a JSON merge
        // patch would leave them as they were.
        let status = &status;
        let outcome = retry_on_conflict(Duration::ZERO, move |n| async move {
            let object = match self.target_for_try(name, n).await {
                Ok(Some(o)) => o,
                // Removed meanwhile: nothing to report on.
                Ok(None) => return Ok(()),
                Err(e) => {
                    tracing::warn!(target = %name, error = %e, "could not read the SCSITarget to write its status");
                    return Ok(());
                }
            };
            let mut next = (*object).clone();
            next.status = Some(status.clone());
            self.inner
                .targets
                .replace_status(name, &post_params(), &next)
                .await
                .map(drop)
        })
        .await;
        match outcome {
            Some(Ok(())) => {}
            Some(Err(kube::Error::Api(s))) if s.code == 404 => {}
            Some(Err(e)) => {
                tracing::warn!(target = %name, error = %e, "could not write the SCSITarget status")
            }
            None => {
                tracing::warn!(target = %name, "SCSITarget status not written: it kept changing")
            }
        }
    }

    /// Target `name` for try `n` of a write: from the cache on the first,
    /// from the API server after (a 409 said the cache was behind); `None`
    /// when it is gone.
    pub(super) async fn target_for_try(
        &self,
        name: &str,
        n: usize,
    ) -> Result<Option<Arc<SCSITarget>>, kube::Error> {
        if n == 0
            && let Some(cached) = self
                .inner
                .target_cache
                .get(&reflector::ObjectRef::new(name))
        {
            return Ok(Some(cached));
        }
        Ok(self.inner.targets.get_opt(name).await?.map(Arc::new))
    }
}

/// A condition that keeps its transition time while its status holds.
fn condition(
    previous: &[Condition],
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    now: Timestamp,
) -> Condition {
    let status = if ok { "True" } else { "False" };
    let transition = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time: transition,
        observed_generation: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_sets_the_phase_from_who_answered() {
        let round = |answered: &[&str], unanswered: &[&str]| DiscoveryRound {
            target: "t".into(),
            device_labels: Default::default(),
            answered: answered
                .iter()
                .map(|n| (crate::node(n), Vec::new()))
                .collect(),
            unanswered: unanswered.iter().map(|n| crate::node(n)).collect(),
            same_array: Default::default(),
            new_luns: Default::default(),
        };
        for (answered, unanswered, want) in [
            (&["a"][..], &[][..], TargetPhase::Ready),
            (&["a"], &["b"], TargetPhase::Degraded),
            (&[], &["b"], TargetPhase::Unreachable),
            // No node should see it: nobody answered.
            (&[], &[], TargetPhase::Unreachable),
        ] {
            let got = TargetPhase::of(&round(answered, unanswered));
            assert_eq!(got, want, "{answered:?} {unanswered:?}");
        }
        assert_eq!(TargetPhase::Refused.as_str(), "Refused");
    }
}
