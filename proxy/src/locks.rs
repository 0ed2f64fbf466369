//! Per-key serialisation: operations on one volume (or one request name)
//! run one at a time; different keys run in parallel. Waiting is bounded:
//! past the limit the caller answers ABORTED and the sidecar retries.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// A set of named async locks, created on demand and freed when unused.
#[derive(Default)]
pub struct KeyedLocks {
    locks: Mutex<HashMap<String, Arc<AsyncMutex<()>>>>,
}

/// Holds one key until dropped.
pub struct KeyGuard {
    _guard: OwnedMutexGuard<()>,
}

impl KeyedLocks {
    /// Waits up to `wait` for `key`; `None` when another operation held it
    /// all that time.
    pub async fn lock(&self, key: &str, wait: Duration) -> Option<KeyGuard> {
        let lock = {
            let mut map = self.locks.lock().unwrap_or_else(|p| p.into_inner());
            // Drop entries nobody holds or waits for, so the map stays small.
            map.retain(|_, l| Arc::strong_count(l) > 1);
            map.entry(key.to_owned()).or_default().clone()
        };
        tokio::time::timeout(wait, lock.lock_owned())
            .await
            .ok()
            .map(|g| KeyGuard { _guard: g })
    }
}
