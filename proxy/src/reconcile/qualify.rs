//! The qualification workers: probe the LUNs that await proof of being
//! blank (`policy::await_proof`) and offer those that read zeroes. Woken
//! when discovery writes such a LUN and by a periodic scan; a LUN held for
//! its data is probed again every `reprobe`, so one erased on the array
//! is offered without anybody's help. Leader-only, like discovery.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use csi_scsi_contract::Wwid;
use futures::StreamExt;
use tokio::time::Instant;

use crate::agents::Backoff;
use crate::lifecycle::{Lifecycle, Probed};

/// How the qualification workers run.
#[derive(Clone, Debug)]
pub struct QualifyConfig {
    /// Probes running at once.
    pub workers: usize,
    /// How often the inventory is scanned for LUNs to probe.
    pub scan_interval: Duration,
    /// How long a LUN found holding data waits before it is probed again.
    pub reprobe: Duration,
    /// The wait before a probe that could not be done is tried again (no
    /// node answering, a node reading it smaller than recorded).
    pub retry: Backoff,
}

/// When a LUN is probed next, and how many probes of it failed in a row.
#[derive(Clone, Copy, Debug)]
struct Next {
    at: Instant,
    failures: u32,
}

/// Runs the qualification workers until the task is dropped.
pub async fn run(life: Arc<Lifecycle>, config: QualifyConfig) {
    let mut work = life.inventory().lun_work();
    let mut next: BTreeMap<Wwid, Next> = BTreeMap::new();
    loop {
        let scanned_at = Instant::now();
        match life.inventory().awaiting_proof().await {
            Ok(wwids) => {
                let waiting: BTreeSet<Wwid> = wwids.into_iter().collect();
                next.retain(|w, _| waiting.contains(w));
                let due: Vec<Wwid> = waiting
                    .into_iter()
                    .filter(|w| next.get(w).is_none_or(|n| n.at <= scanned_at))
                    .collect();
                let results: Vec<_> = futures::stream::iter(due)
                    .map(|wwid| {
                        let life = life.clone();
                        async move {
                            let request_id = format!("probe-{}", uuid::Uuid::new_v4());
                            let probed = life.qualify(&wwid, &request_id).await;
                            (wwid, request_id, probed)
                        }
                    })
                    .buffer_unordered(config.workers.max(1))
                    .collect()
                    .await;
                for (wwid, request_id, probed) in results {
                    let now = Instant::now();
                    match probed {
                        Ok(Probed::Blank | Probed::NotAwaiting) => {
                            next.remove(&wwid);
                        }
                        Ok(Probed::Changed) => {
                            next.insert(
                                wwid,
                                Next {
                                    at: now,
                                    failures: 0,
                                },
                            );
                        }
                        Ok(Probed::Data(_)) => {
                            next.insert(
                                wwid,
                                Next {
                                    at: now + config.reprobe,
                                    failures: 0,
                                },
                            );
                        }
                        Err(e) => {
                            let failures = next.get(&wwid).map_or(0, |n| n.failures) + 1;
                            let wait = config.retry.delay(failures);
                            tracing::warn!(%wwid, %request_id, error = %e, failures, retry_in = ?wait, "new LUN not probed");
                            next.insert(
                                wwid,
                                Next {
                                    at: now + wait,
                                    failures,
                                },
                            );
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "scan for LUNs to probe failed"),
        }
        let wake_at = next
            .values()
            .map(|n| n.at)
            .min()
            .map_or(scanned_at + config.scan_interval, |at| {
                at.min(scanned_at + config.scan_interval)
            });
        tokio::select! {
            changed = work.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = tokio::time::sleep_until(wake_at) => {}
        }
    }
}
