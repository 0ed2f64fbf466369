//! Per-key locks: operations on one key (a volume, a request name, a LUN,
//! a target) run one at a time; different keys run in parallel. Callers
//! either wait (bounded or not) or, with [`KeyedLocks::try_lock`], give up
//! at once: the CSI spec lets a plugin answer ABORTED to a second call for
//! a volume that already has one in flight ("Operation pending for
//! volume", Error Scheme). Owned by the services that share it (cloning
//! shares the set), never global, so every test gets a fresh set.
//!
//! An entry lives only while a guard or a waiter needs it: the last one to
//! let go removes it, so the map holds the keys in use, not every key ever
//! seen, and no call scans the whole map.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

type Map<K> = HashMap<K, Slot>;

/// A set of per-key locks, created on demand and removed when unused.
pub struct KeyedLocks<K: Eq + Hash> {
    map: Arc<Mutex<Map<K>>>,
}

/// Holds one key until dropped, whatever way the operation ends.
#[must_use = "the key is released as soon as the guard is dropped"]
pub struct KeyGuard<K: Eq + Hash> {
    // Declared before `user`, so the lock is released before the key can
    // leave the map: a newcomer never gets a fresh lock for a key that is
    // still held.
    _held: OwnedMutexGuard<()>,
    user: User<K>,
}

/// No guard within the wait given to [`KeyedLocks::lock_timeout`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("another operation held the key for {0:?}")]
pub struct TimedOut(pub Duration);

/// One key's lock and how many holders and waiters it has.
struct Slot {
    lock: Arc<AsyncMutex<()>>,
    // Counted under the map's lock rather than read off the `Arc`'s strong
    // count, which changes outside it (a waiting future dropped after its
    // `User`, a guard mid-drop) and would leave unused entries behind.
    users: usize,
}

/// One holder's or waiter's registration on a key: the last one to drop
/// removes the key from the map.
struct User<K: Eq + Hash> {
    map: Arc<Mutex<Map<K>>>,
    key: K,
}

// === impl KeyedLocks ===

impl<K: Eq + Hash + Clone> KeyedLocks<K> {
    /// An empty set.
    pub fn new() -> Self {
        Self {
            map: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Waits for `key` as long as it takes.
    pub async fn lock(&self, key: K) -> KeyGuard<K> {
        let (user, lock) = self.join(key);
        let held = lock.lock_owned().await;
        KeyGuard { _held: held, user }
    }

    /// Waits up to `wait` for `key`; [`TimedOut`] when another operation
    /// held it all that time.
    pub async fn lock_timeout(&self, key: K, wait: Duration) -> Result<KeyGuard<K>, TimedOut> {
        let (user, lock) = self.join(key);
        let held = tokio::time::timeout(wait, lock.lock_owned())
            .await
            .map_err(|_| TimedOut(wait))?;
        Ok(KeyGuard { _held: held, user })
    }

    /// Waits for every key of `keys`, taken in key order without
    /// duplicates so two callers with overlapping sets never wait on each
    /// other crosswise.
    pub async fn lock_many(&self, keys: impl IntoIterator<Item = K>) -> Vec<KeyGuard<K>>
    where
        K: Ord,
    {
        let mut keys: Vec<K> = keys.into_iter().collect();
        keys.sort_unstable();
        keys.dedup();
        let mut guards = Vec::with_capacity(keys.len());
        for key in keys {
            guards.push(self.lock(key).await);
        }
        guards
    }

    /// Takes `key` if no one holds it, or `None` at once when someone does.
    pub fn try_lock(&self, key: K) -> Option<KeyGuard<K>> {
        let (user, lock) = self.join(key);
        // On failure `user` drops here and removes the key if it added it.
        let held = lock.try_lock_owned().ok()?;
        Some(KeyGuard { _held: held, user })
    }

    /// How many keys are held or waited for.
    pub fn len(&self) -> usize {
        lock_map(&self.map).len()
    }

    /// Whether no key is held or waited for.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Registers one more user of `key`, creating its lock if needed.
    fn join(&self, key: K) -> (User<K>, Arc<AsyncMutex<()>>) {
        let mut map = lock_map(&self.map);
        let slot = map.entry(key.clone()).or_insert_with(|| Slot {
            lock: Arc::default(),
            users: 0,
        });
        slot.users += 1;
        let lock = Arc::clone(&slot.lock);
        let user = User {
            map: Arc::clone(&self.map),
            key,
        };
        (user, lock)
    }
}

impl<K: Eq + Hash + Clone> Default for KeyedLocks<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Eq + Hash> Clone for KeyedLocks<K> {
    fn clone(&self) -> Self {
        Self {
            map: Arc::clone(&self.map),
        }
    }
}

impl<K: Eq + Hash> fmt::Debug for KeyedLocks<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = lock_map(&self.map).len();
        f.debug_struct("KeyedLocks").field("in_use", &n).finish()
    }
}

// === impl KeyGuard ===

impl<K: Eq + Hash> KeyGuard<K> {
    /// The key this guard holds.
    pub fn key(&self) -> &K {
        &self.user.key
    }
}

impl<K: Eq + Hash + fmt::Debug> fmt::Debug for KeyGuard<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyGuard")
            .field("key", &self.user.key)
            .finish()
    }
}

// === impl User ===

impl<K: Eq + Hash> Drop for User<K> {
    fn drop(&mut self) {
        let mut map = lock_map(&self.map);
        if let Some(slot) = map.get_mut(&self.key) {
            slot.users -= 1;
            if slot.users == 0 {
                map.remove(&self.key);
            }
        }
    }
}

/// The map, even after a panic elsewhere: no code panics while holding it
/// with an update half-done, so a poisoned lock is safe to use.
fn lock_map<K>(map: &Mutex<Map<K>>) -> MutexGuard<'_, Map<K>> {
    map.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
