//! SIGTERM/SIGINT handling: stop accepting, let in-flight calls finish
//! within a grace period, then exit.

use std::time::Duration;

use tokio::sync::watch;

/// A shutdown latch set by SIGTERM or SIGINT (or by [`Shutdown::trigger`]).
#[derive(Clone, Debug)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
    tx: std::sync::Arc<watch::Sender<bool>>,
}

// === impl Shutdown ===

impl Shutdown {
    /// Starts listening for SIGTERM and SIGINT. Needs a Tokio runtime.
    pub fn on_signals() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let this = Self::manual();
        let trigger = this.clone();
        tokio::spawn(async move {
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            tracing::info!(
                signal = name,
                "shutting down: no new calls, draining in-flight ones"
            );
            trigger.trigger();
        });
        Ok(this)
    }

    /// A latch only [`Shutdown::trigger`] sets (tests, embedding).
    pub fn manual() -> Self {
        let (tx, rx) = watch::channel(false);
        Self {
            rx,
            tx: std::sync::Arc::new(tx),
        }
    }

    /// Sets the latch.
    pub fn trigger(&self) {
        self.tx.send_replace(true);
    }

    /// Resolves once shutdown has begun.
    pub async fn signaled(&self) {
        let mut rx = self.rx.clone();
        // An error means every sender is gone, which cannot happen while
        // `self` holds one; treat it as shutdown anyway.
        let _ = rx.wait_for(|down| *down).await;
    }

    /// Resolves `grace` after shutdown began: the drain deadline.
    pub async fn grace_elapsed(&self, grace: Duration) {
        self.signaled().await;
        tokio::time::sleep(grace).await;
    }
}
