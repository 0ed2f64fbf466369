//! The release workers: wipe the LUNs of deleted volumes (Releasing, or
//! Failed by an earlier wipe) off the CSI call path. At most `workers` at
//! once, each LUN by one worker at a time. Woken by DeleteVolume and by a
//! periodic scan of the inventory, which picks up every release a restart
//! or a leader change interrupted. Leader-only, like discovery.

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
#[derive(Clone, Copy, Debug)]
struct Retry {
    at: Instant,
    attempts: u32,
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
                Ok(wwids) => candidates.extend(wwids),
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
