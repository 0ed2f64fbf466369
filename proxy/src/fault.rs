//! Deliberate defects for proving the reliability suites can fail. Only
//! debug builds with the `fault-injection` feature (which only the test
//! crate enables) read `CSI_SCSI_FAULT` (a comma-separated list); every
//! other build compiles each check to `false`, so no shipped binary can be
//! told to misbehave.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

/// A defect the suites must catch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// CreateVolume picks a free LUN and binds it in two steps without the
    /// compare-and-swap, so concurrent binds can claim one LUN twice.
    SkipCas,
    /// A release DeleteVolume asked for in this process holds its Wipe
    /// call back for [`STALE_WIPE_HOLD`] after reading the device, in a
    /// task the loss of leadership does not abort, as if the call were in
    /// flight: the window in which the Kubernetes lab freezes the leader
    /// (it waits for the log line). A release the scan found (the next
    /// leader's) is not held back.
    StaleWipe,
    /// A replica whose term lapsed still sends destructive calls, with its
    /// last term's epoch: only the agent's epoch fence is left to refuse.
    SkipLeaderCheck,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Self::SkipCas => "skip-cas",
            Self::StaleWipe => "stale-wipe",
            Self::SkipLeaderCheck => "skip-leader-check",
        }
    }
}

/// How long [`Fault::StaleWipe`] holds a Wipe call back.
pub(crate) const STALE_WIPE_HOLD: Duration = Duration::from_secs(20);

/// Whether `fault` was asked for (test builds only).
pub(crate) fn injected(fault: Fault) -> bool {
    #[cfg(all(debug_assertions, feature = "fault-injection"))]
    {
        static ASKED: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
        let asked = ASKED.get_or_init(|| {
            let v: Vec<String> = std::env::var("CSI_SCSI_FAULT")
                .unwrap_or_default()
                .split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect();
            if !v.is_empty() {
                tracing::warn!(faults = ?v, "DELIBERATE DEFECTS INJECTED (CSI_SCSI_FAULT): test use only");
            }
            v
        });
        asked.iter().any(|a| a == fault.name())
    }
    #[cfg(not(all(debug_assertions, feature = "fault-injection")))]
    {
        let _ = fault.name();
        false
    }
}

/// The LUNs whose next Wipe [`Fault::StaleWipe`] holds back.
static HELD_WIPES: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// DeleteVolume asked for the release of `wwid`: with
/// [`Fault::StaleWipe`], its next Wipe call is held back.
pub(crate) fn hold_next_wipe(wwid: &str) {
    if injected(Fault::StaleWipe) {
        held_wipes().insert(wwid.to_owned());
    }
}

/// Whether this Wipe of `wwid` is to be held back (once per
/// [`hold_next_wipe`]).
pub(crate) fn take_held_wipe(wwid: &str) -> bool {
    injected(Fault::StaleWipe) && held_wipes().remove(wwid)
}

fn held_wipes() -> std::sync::MutexGuard<'static, BTreeSet<String>> {
    HELD_WIPES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Binds inside [`Fault::SkipCas`]'s window between read and write.
static BINDS_IN_WINDOW: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// Wakes a bind waiting in that window when another one enters it.
static BIND_ENTERED: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// [`Fault::SkipCas`]: holds a bind between its read and its write until
/// another bind has read too (up to two seconds), so concurrent creates
/// claim one LUN twice on every run instead of by luck of timing.
pub(crate) async fn meet_another_bind() {
    use std::sync::atomic::Ordering;
    let entered = BIND_ENTERED.notified();
    let before = BINDS_IN_WINDOW.fetch_add(1, Ordering::SeqCst);
    if before == 0 {
        let _ = tokio::time::timeout(Duration::from_secs(2), entered).await;
    } else {
        BIND_ENTERED.notify_waiters();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    BINDS_IN_WINDOW.fetch_sub(1, Ordering::SeqCst);
}
