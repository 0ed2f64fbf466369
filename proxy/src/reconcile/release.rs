//! The release workers: wipe the LUNs of deleted volumes (Releasing, or
//! Failed by an earlier wipe) off the CSI call path. At most `workers` at
//! once, each LUN by one worker at a time. Woken by DeleteVolume and by a
//! periodic scan of the inventory, which picks up every release a restart
//! or a leader change interrupted. Leader-only, like discovery.
//!
//! A LUN whose attempt did not finish waits out a backoff (in memory: a
//! restart ends it). An operator who fixed the cause asks for the wipe
//! again by giving the device's `retry_wipe` a new value: the next scan
//! that sees it ends the backoff, and the attempt is an ordinary one
//! (`Lifecycle::release`, with every check a wipe makes). A retired LUN
//! is not scanned for at all (`policy::wipe_due`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_scsi_contract::Wwid;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::agents::Backoff;
use crate::lifecycle::{Lifecycle, Released};

/// How the release workers run.
#[derive(Clone, Debug)]
pub struct ReleaseConfig {
    /// Releases (wipes) running at once.
    pub workers: usize,
    /// How often the inventory is scanned for releases to do.
    pub scan_interval: Duration,
    /// The wait before a LUN whose release did not finish is tried again
    /// (a failed wipe, no agent answering, the agent still busy).
    pub retry: Backoff,
}

/// A LUN whose last release attempt did not finish.
#[derive(Clone, Debug)]
struct Retry {
    at: Instant,
    attempts: u32,
    /// The device's `retry_wipe` when that attempt began.
    request: String,
}

/// Ends the backoff of every LUN the scan found (`scanned`: WWID and its
/// `retry_wipe`) whose retry request changed since its last attempt
/// began: an operator asked for the wipe again. Returns those LUNs.
fn honour_retry_requests(
    retries: &mut BTreeMap<Wwid, Retry>,
    scanned: &BTreeMap<Wwid, String>,
) -> Vec<Wwid> {
    let asked: Vec<Wwid> = retries
        .iter()
        .filter(|(wwid, r)| scanned.get(*wwid).is_some_and(|now| *now != r.request))
        .map(|(wwid, _)| wwid.clone())
        .collect();
    for wwid in &asked {
        retries.remove(wwid);
    }
    asked
}

/// Runs the release workers until the task is dropped (which aborts every
/// wipe call in flight; the next leader's scan resumes them).
pub async fn run(life: Arc<Lifecycle>, config: ReleaseConfig) {
    let permits = Arc::new(Semaphore::new(config.workers.max(1)));
    let retries: Arc<Mutex<BTreeMap<Wwid, Retry>>> = Arc::default();
    let mut workers = JoinSet::new();
    let mut next_scan = Instant::now();
    let mut lun_work = life.inventory().lun_work();
    loop {
        let mut candidates: BTreeSet<Wwid> = life.releases().take_wanted();
        let now = Instant::now();
        if now >= next_scan {
            match life.inventory().releasing().await {
                Ok(scanned) => {
                    let asked = honour_retry_requests(&mut lock(&retries), &scanned);
                    for wwid in asked {
                        tracing::info!(%wwid, "wipe retry requested by an operator: backoff ended");
                    }
                    candidates.extend(scanned.into_keys());
                }
                Err(e) => tracing::warn!(error = %e, "scan for releases failed"),
            }
            next_scan = now + config.scan_interval;
        }
        candidates.extend(
            lock(&retries)
                .iter()
                .filter(|(_, r)| r.at <= now)
                .map(|(w, _)| w.clone()),
        );
        for wwid in candidates {
            if lock(&retries).get(&wwid).is_some_and(|r| r.at > now) {
                continue;
            }
            // Waits while every worker is busy: what DeleteVolume asks for
            // meanwhile stays in the wanted set.
            let Ok(permit) = permits.clone().acquire_owned().await else {
                return;
            };
            if !life.releases().start(&wwid) {
                continue;
            }
            let (life, retries, backoff) = (life.clone(), retries.clone(), config.retry.clone());
            workers.spawn(async move {
                let _permit = permit;
                let _running = Running(&life, &wwid);
                let request_id = format!("release-{}", uuid::Uuid::new_v4());
                // Read before the attempt: a request made while it runs
                // ends the backoff its failure would start.
                // A failed read keeps the request the last attempt saw: an
                // empty one would make a standing request look new.
                let request = match life.inventory().device(&wwid).await {
                    Ok(Some(d)) => d.retry_wipe,
                    Err(_) | Ok(None) => lock(&retries)
                        .get(&wwid)
                        .map(|r| r.request.clone())
                        .unwrap_or_default(),
                };
                match life.release(&wwid, &request_id).await {
                    Ok(done) => {
                        if done == Released::Done {
                            tracing::info!(%wwid, %request_id, "released: LUN offered again");
                        }
                        lock(&retries).remove(&wwid);
                    }
                    Err(e) => {
                        let mut retries = lock(&retries);
                        let attempts = retries.get(&wwid).map_or(0, |r| r.attempts) + 1;
                        let wait = backoff.delay(attempts);
                        tracing::warn!(%wwid, %request_id, error = %e, attempts, retry_in = ?wait, "release not finished");
                        retries.insert(
                            wwid.clone(),
                            Retry {
                                at: Instant::now() + wait,
                                attempts,
                                request,
                            },
                        );
                    }
                }
            });
        }
        while workers.try_join_next().is_some() {}
        let wake_at = lock(&retries)
            .values()
            .map(|r| r.at)
            .min()
            .map_or(next_scan, |r| r.min(next_scan));
        tokio::select! {
            () = life.releases().woken() => {}
            () = tokio::time::sleep_until(wake_at) => {}
            // Discovery wrote a new LUN its target wants wiped: scan now.
            Ok(()) = lun_work.changed() => next_scan = Instant::now(),
            // A finished attempt may have set a retry earlier than `wake_at`.
            Some(_) = workers.join_next() => {}
        }
    }
}

/// Marks a LUN as being released for as long as it lives, so an aborted
/// worker (leadership lost) frees it too.
struct Running<'a>(&'a Lifecycle, &'a Wwid);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.releases().end(self.1);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wwid(i: u32) -> Wwid {
        Wwid::parse(&format!("naa.6001405{i:025x}")).expect("a canonical WWID")
    }

    fn waiting(request: &str) -> Retry {
        Retry {
            at: Instant::now() + Duration::from_secs(1800),
            attempts: 9,
            request: request.into(),
        }
    }

    #[test]
    fn only_a_changed_retry_request_ends_a_backoff() {
        let mut retries = BTreeMap::from([
            (wwid(1), waiting("")),
            (wwid(2), waiting("")),
            (wwid(3), waiting("monday")),
            (wwid(4), waiting("monday")),
            (wwid(5), waiting("")),
        ]);
        let scanned = BTreeMap::from([
            // Asked for now, first time.
            (wwid(1), "2026-05-01".to_owned()),
            // Never asked.
            (wwid(2), String::new()),
            // Asked again, with a new value.
            (wwid(3), "tuesday".to_owned()),
            // The request its last attempt already answered.
            (wwid(4), "monday".to_owned()),
            // wwid(5): not in the scan (released meanwhile, or retired).
        ]);
        let ended = honour_retry_requests(&mut retries, &scanned);
        assert_eq!(ended, [wwid(1), wwid(3)]);
        let left: Vec<&Wwid> = retries.keys().collect();
        assert_eq!(left, [&wwid(2), &wwid(4), &wwid(5)]);
        assert!(
            retries.values().all(|r| r.attempts == 9),
            "the others keep their backoff"
        );
        // The same scan again ends nothing more.
        assert!(honour_retry_requests(&mut retries, &scanned).is_empty());
    }
}
