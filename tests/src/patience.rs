//! Poll instead of sleeping: wait until a condition holds, up to a limit.

use std::future::Future;
use std::time::Duration;

/// How long tests wait for something to happen (`CSI_SCSI_TEST_PATIENCE`
/// seconds, default 20).
pub fn patience() -> Duration {
    std::env::var("CSI_SCSI_TEST_PATIENCE")
        .ok()
        .and_then(|s| s.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(20))
}

/// Calls `probe` every 50 ms until it returns `Some`, or fails after
/// [`patience`] with `what` in the message.
pub async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + patience();
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {:?} waiting for {what}",
            patience()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
