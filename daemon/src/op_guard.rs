//! Per-key in-flight guards: at most one operation per key (a volume, a
//! request name) at a time. The CSI spec lets a plugin answer ABORTED to a
//! second call for a volume that already has one in flight ("Operation
//! pending for volume", Error Scheme), which is what callers do when
//! [`OpGuards::try_begin`] says no. Owned by the services that share it
//! (cloning shares the set), never global, so every test gets a fresh set.

use std::collections::HashSet;
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};

/// The set of keys with an operation in flight.
pub struct OpGuards<K: Eq + Hash> {
    inflight: Arc<Mutex<HashSet<K>>>,
}

/// Proof that the operation on `key` is the only one in flight; the key is
/// released when this is dropped, whatever way the operation ends.
#[must_use = "the key is released as soon as the guard is dropped"]
pub struct OpGuard<K: Eq + Hash> {
    key: Option<K>,
    inflight: Arc<Mutex<HashSet<K>>>,
}

// === impl OpGuards ===

impl<K: Eq + Hash + Clone> OpGuards<K> {
    /// An empty set.
    pub fn new() -> Self {
        Self {
            inflight: Arc::new(Mutex::new(HashSet::new())),
        }
    }

    /// Marks `key` in flight, or `None` when an operation on it already is.
    pub fn try_begin(&self, key: K) -> Option<OpGuard<K>> {
        // A panic while the lock was held cannot leave the set half-updated
        // (insert and remove are single calls), so a poisoned lock is safe.
        let mut set = self.inflight.lock().unwrap_or_else(PoisonError::into_inner);
        if !set.insert(key.clone()) {
            return None;
        }
        Some(OpGuard {
            key: Some(key),
            inflight: Arc::clone(&self.inflight),
        })
    }

    /// How many keys are in flight.
    pub fn len(&self) -> usize {
        self.inflight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether no key is in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<K: Eq + Hash + Clone> Default for OpGuards<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Eq + Hash> Clone for OpGuards<K> {
    fn clone(&self) -> Self {
        Self {
            inflight: Arc::clone(&self.inflight),
        }
    }
}

impl<K: Eq + Hash> fmt::Debug for OpGuards<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self
            .inflight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        f.debug_struct("OpGuards").field("in_flight", &n).finish()
    }
}

// === impl OpGuard ===

impl<K: Eq + Hash> OpGuard<K> {
    /// The key this guard holds.
    pub fn key(&self) -> Option<&K> {
        self.key.as_ref()
    }
}

impl<K: Eq + Hash> Drop for OpGuard<K> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.inflight
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&key);
        }
    }
}

impl<K: Eq + Hash + fmt::Debug> fmt::Debug for OpGuard<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpGuard").field("key", &self.key).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_operation_on_a_key_in_flight_is_refused() {
        let guards = OpGuards::new();
        let first = guards.try_begin("vol-1");
        assert!(first.is_some());
        assert!(guards.try_begin("vol-1").is_none());
        // Other keys are independent.
        assert!(guards.try_begin("vol-2").is_some());
    }

    #[test]
    fn dropping_the_guard_releases_the_key() {
        let guards = OpGuards::new();
        let first = guards.try_begin("vol-1");
        drop(first);
        assert!(guards.is_empty());
        assert!(guards.try_begin("vol-1").is_some());
    }

    #[test]
    fn the_key_is_released_when_the_operation_panics() {
        let guards = OpGuards::new();
        let cloned = guards.clone();
        let result = std::thread::spawn(move || {
            let _guard = cloned.try_begin("vol-1");
            panic!("operation failed");
        })
        .join();
        assert!(result.is_err());
        assert!(guards.try_begin("vol-1").is_some());
    }

    #[test]
    fn only_one_of_many_concurrent_callers_gets_the_key() {
        let guards = OpGuards::new();
        let barrier = Arc::new(std::sync::Barrier::new(8));
        let winners: Vec<_> = (0..8)
            .map(|_| {
                let guards = guards.clone();
                let barrier = Arc::clone(&barrier);
                std::thread::spawn(move || {
                    barrier.wait();
                    let guard = guards.try_begin(7u32);
                    // Hold it until everyone has tried.
                    barrier.wait();
                    guard.is_some()
                })
            })
            .collect();
        let won = winners
            .into_iter()
            .map(|h| h.join().unwrap_or(false))
            .filter(|&w| w)
            .count();
        assert_eq!(won, 1);
    }
}
