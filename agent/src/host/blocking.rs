//! Syscalls that may block on a device (mount, umount, fsync of a block
//! device) run here: on tokio's blocking pool, never on an async worker,
//! and with a deadline, so a device whose I/O hangs (every path gone,
//! queueing) costs one blocked thread and a retryable error, not the
//! agent's runtime.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::AgentError;

/// How long a mount or unmount may take.
pub(crate) const MOUNT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a flush of a block device may take.
pub(crate) const FLUSH_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `call` off the async workers; [`AgentError::Stuck`] when it has not
/// returned within `within` (it keeps running on its thread, and whatever
/// it does when it returns is found by the retry).
pub(crate) async fn within<T, F>(
    op: &'static str,
    path: &Path,
    within: Duration,
    call: F,
) -> Result<T, AgentError>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    start(op, path, within, call).finish().await
}

/// A call handed to the blocking pool, running from the moment it was
/// started; [`Started::finish`] waits for it until its limit, counted from
/// the start. Dropped unfinished, its result is discarded (the call itself
/// runs to its end on its thread).
#[derive(Debug)]
pub(crate) struct Started<T> {
    op: &'static str,
    path: PathBuf,
    limit: Duration,
    deadline: tokio::time::Instant,
    handle: tokio::task::JoinHandle<T>,
}

/// Starts `call` on the blocking pool now, without waiting: a worker can
/// go on with other checks while a thread wakes for it (on a VM, waking an
/// idle thread costs more than the work it then does).
pub(crate) fn start<T, F>(op: &'static str, path: &Path, limit: Duration, call: F) -> Started<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    Started {
        op,
        path: path.to_owned(),
        limit,
        deadline: tokio::time::Instant::now() + limit,
        handle: tokio::task::spawn_blocking(call),
    }
}

impl<T> Started<T> {
    /// The call's result; [`AgentError::Stuck`] when it has not returned
    /// within its limit from its start.
    pub(crate) async fn finish(self) -> Result<T, AgentError> {
        match tokio::time::timeout_at(self.deadline, self.handle).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(_)) => Err(AgentError::Unreachable(
                "a blocking syscall task panicked or was cancelled",
            )),
            Err(_) => Err(AgentError::Stuck {
                op: self.op,
                path: self.path,
                after: self.limit,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn a_call_that_hangs_is_stuck_and_the_runtime_goes_on() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let started = std::time::Instant::now();
        // The only worker thread stays free while the call hangs.
        let ticker = tokio::spawn(async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            "ticked"
        });
        let err = within(
            "flush",
            Path::new("/dev/sdz"),
            Duration::from_millis(100),
            move || {
                let _ = rx.recv_timeout(Duration::from_secs(5));
            },
        )
        .await
        .expect_err("hangs");
        assert!(
            matches!(err, AgentError::Stuck { op: "flush", .. }),
            "{err}"
        );
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(ticker.await.expect("ticker"), "ticked");
        drop(tx);
        assert_eq!(
            within("mount", Path::new("/x"), Duration::from_secs(5), || 7)
                .await
                .expect("returns"),
            7
        );
    }
}
