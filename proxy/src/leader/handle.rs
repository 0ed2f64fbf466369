//! What the rest of the proxy sees of the election: whether this replica
//! leads and in which epoch, the Probe check that follows it, and the
//! helpers that start and stop work with it.

use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio::time::Instant;

use csi_scsi_contract::LeaderEpoch;

/// Whether this replica leads, now and as it changes.
#[derive(Clone, Debug)]
pub struct LeaderHandle {
    rx: watch::Receiver<bool>,
    /// For an elected leader: its term (see [`Term`]); `None` while it
    /// does not lead. A process frozen past the term's end (a paused
    /// container, a stalled VM) has lost the Lease to another replica by
    /// the time it wakes, and must refuse before its elector runs again to
    /// notice.
    term: Option<Arc<Mutex<Option<Term>>>>,
    /// Keeps the channel open for a handle with no election behind it.
    _fixed: Option<std::sync::Arc<watch::Sender<bool>>>,
}

/// What an elected leader's last renewal lets it do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Term {
    /// Until when it may act (the renewal attempt's start plus the renew
    /// deadline).
    pub(super) until: Instant,
    /// The Lease's `leaseTransitions` since this replica acquired it: the
    /// leader epoch its agent calls carry.
    pub(super) epoch: LeaderEpoch,
}

// === impl LeaderHandle ===

impl LeaderHandle {
    /// A handle that always leads (embedded mode: one proxy, no election).
    pub fn always() -> Self {
        let (tx, rx) = watch::channel(true);
        Self {
            rx,
            term: None,
            _fixed: Some(Arc::new(tx)),
        }
    }

    /// The handle of an election: leads while `rx` says so and `term` has
    /// not lapsed.
    pub(super) fn elected(rx: watch::Receiver<bool>, term: Arc<Mutex<Option<Term>>>) -> Self {
        Self {
            rx,
            term: Some(term),
            _fixed: None,
        }
    }

    /// A handle that follows `rx` (another election, tests).
    pub fn from_receiver(rx: watch::Receiver<bool>) -> Self {
        Self {
            rx,
            term: None,
            _fixed: None,
        }
    }

    /// Whether this replica leads now. A stopped election never leads.
    pub fn is_leader(&self) -> bool {
        self.epoch().is_some()
    }

    /// The leader epoch this replica acts in, `None` unless it leads now
    /// (renew deadline included). A handle with no election behind it
    /// ([`Self::always`], [`Self::from_receiver`]) leads in epoch 0: one
    /// proxy, no predecessor to fence off.
    pub fn epoch(&self) -> Option<LeaderEpoch> {
        if self.rx.has_changed().is_err() || !*self.rx.borrow() {
            return None;
        }
        match &self.term {
            None => Some(LeaderEpoch(0)),
            Some(term) => match *term.lock().unwrap_or_else(|p| p.into_inner()) {
                Some(t) if Instant::now() < t.until => Some(t.epoch),
                _ => None,
            },
        }
    }

    /// The epoch of this replica's last term even when it has lapsed,
    /// until its elector notices the loss; `None` without one. Only for
    /// `crate::fault::Fault::SkipLeaderCheck`: a lapsed term acts in no
    /// epoch.
    pub fn lapsed_epoch(&self) -> Option<LeaderEpoch> {
        let term = self.term.as_ref()?;
        term.lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|t| t.epoch)
    }

    /// A receiver that sees every change.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.rx.clone()
    }
}

/// CSI `Probe` is ready only on the leading replica. Each sidecar probes
/// until ready before it campaigns for its own Lease (csi-lib-utils'
/// `ProbeForever`), so the sidecars of a replica that does not lead wait
/// instead of winning their elections and meeting UNAVAILABLE on every
/// write. Not part of `/readyz`: a standby replica is healthy.
#[derive(Clone, Debug)]
pub struct LeaderCheck(pub LeaderHandle);

impl csi_scsi_daemon::Check for LeaderCheck {
    fn name(&self) -> &str {
        "leader"
    }

    fn check(&self) -> Result<(), String> {
        match self.0.is_leader() {
            true => Ok(()),
            false => Err(
                "this replica does not hold the proxy's Lease: its sidecars wait for the Probe while the leader's work"
                    .into(),
            ),
        }
    }
}

/// Waits until this replica, having led, loses the Lease (or the election
/// stops): the caller then shuts the process down. The CSI socket closes,
/// the sidecars beside it exit on the lost connection (csi-lib-utils'
/// `ExitOnConnectionLoss`) and, restarted, wait at the Probe: no sidecar
/// keeps leading beside a proxy that does not.
pub async fn exit_when_leadership_lost(handle: LeaderHandle) {
    let mut rx = handle.subscribe();
    if rx.wait_for(|leads| *leads).await.is_err() {
        return;
    }
    let _ = rx.wait_for(|leads| !*leads).await;
}

/// Runs `work()` while this replica leads: starts it on gaining leadership,
/// aborts it on losing it, and starts it again on the next gain. Returns
/// when the election stops.
pub async fn run_while_leader<F, Fut>(handle: LeaderHandle, mut work: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut rx = handle.subscribe();
    loop {
        // A stopped election may leave `true` behind: it does not lead.
        if rx.wait_for(|leads| *leads).await.is_err() || rx.has_changed().is_err() {
            return;
        }
        tracing::info!("leading: starting leader-only work");
        let task = tokio::spawn(work());
        let lost = rx.wait_for(|leads| !*leads).await.is_ok();
        task.abort();
        if !lost {
            return;
        }
        tracing::warn!("leadership lost: leader-only work stopped");
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use csi_scsi_daemon::Check;

    #[tokio::test]
    async fn a_leader_frozen_past_its_renew_deadline_refuses_before_its_elector_runs_again() {
        let (tx, rx) = watch::channel(true);
        let term = |until| Term {
            until,
            epoch: LeaderEpoch(4),
        };
        let held = Arc::new(Mutex::new(Some(term(
            Instant::now() + Duration::from_secs(3600),
        ))));
        let handle = LeaderHandle {
            rx,
            term: Some(held.clone()),
            _fixed: Some(Arc::new(tx)),
        };
        assert!(handle.is_leader(), "renewed a moment ago");
        assert_eq!(handle.epoch(), Some(LeaderEpoch(4)));
        // The process slept through its renew deadline: the watch still
        // says leading (nothing ran to change it), the fence does not.
        *held.lock().expect("lock") = Instant::now()
            .checked_sub(Duration::from_millis(1))
            .map(term);
        assert!(*handle.subscribe().borrow(), "the elector has not run");
        assert!(!handle.is_leader(), "acted on a lapsed renewal");
        assert_eq!(handle.epoch(), None, "a lapsed term has no epoch");
        assert!(LeaderCheck(handle.clone()).check().is_err());
        // The next renewal lets it act again.
        *held.lock().expect("lock") = Some(term(Instant::now() + Duration::from_secs(3600)));
        assert!(handle.is_leader());
    }

    #[test]
    fn a_handle_without_an_election_leads_in_epoch_zero_while_told_it_leads() {
        assert_eq!(LeaderHandle::always().epoch(), Some(LeaderEpoch(0)));
        let (tx, rx) = watch::channel(false);
        let handle = LeaderHandle::from_receiver(rx);
        assert_eq!(handle.epoch(), None);
        tx.send_replace(true);
        assert_eq!(handle.epoch(), Some(LeaderEpoch(0)));
        drop(tx);
        assert_eq!(handle.epoch(), None, "a stopped election never leads");
    }

    #[tokio::test]
    async fn the_probe_waits_for_leadership_and_losing_it_ends_the_process() {
        let (tx, rx) = watch::channel(false);
        let handle = LeaderHandle::from_receiver(rx);
        let check = LeaderCheck(handle.clone());
        assert!(check.check().is_err(), "a standby answered the Probe ready");
        // A standby never lost anything: it waits on.
        let exit = tokio::spawn(exit_when_leadership_lost(handle));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!exit.is_finished(), "a standby was told to exit");
        tx.send(true).expect("the handle listens");
        assert!(check.check().is_ok(), "the leader's Probe is not ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!exit.is_finished(), "the leader was told to exit");
        tx.send(false).expect("the handle listens");
        tokio::time::timeout(Duration::from_secs(5), exit)
            .await
            .expect("losing the Lease ends the process")
            .expect("the waiter ran");
        assert!(check.check().is_err());
    }
}
