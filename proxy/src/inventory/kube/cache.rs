//! The read-your-writes overlay: the reflector cache lags the API server
//! by one watch event, so that a caller reads its own writes (bind, then
//! publish), every object this backend writes or re-reads after a 409 is
//! kept here until the watch delivers that version or a newer one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::runtime::reflector::{self, Store};
use kube::{Resource, ResourceExt};
use tokio::time::Instant;

/// How long an overlay entry may wait for the watch before it is dropped
/// (the object was deleted, or the watch is down and will relist).
const OVERLAY_TTL: Duration = Duration::from_secs(60);

/// A reflector store plus the objects written since the watch last caught up.
pub(super) struct Cache<K: Resource<DynamicType = ()> + Clone + 'static> {
    store: Store<K>,
    recent: Mutex<HashMap<String, (Arc<K>, Instant)>>,
}

impl<K> Cache<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    /// An empty overlay over `store`.
    pub(super) fn new(store: Store<K>) -> Self {
        Self {
            store,
            recent: Mutex::new(HashMap::new()),
        }
    }

    /// The newest version of `name` known to this process.
    pub(super) fn get(&self, name: &str) -> Option<Arc<K>> {
        let cached = self.store.get(&reflector::ObjectRef::new(name));
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        match (cached, recent.get(name)) {
            (cached, Some((mine, at))) => {
                if at.elapsed() > OVERLAY_TTL
                    || cached
                        .as_ref()
                        .is_some_and(|c| version(&**c) >= version(&**mine))
                {
                    recent.remove(name);
                    cached
                } else {
                    Some(mine.clone())
                }
            }
            (cached, None) => cached,
        }
    }

    /// Every object, the overlay's versions where newer.
    pub(super) fn all(&self) -> Vec<Arc<K>> {
        let mut by_name: HashMap<String, Arc<K>> = self
            .store
            .state()
            .into_iter()
            .map(|o| (o.name_any(), o))
            .collect();
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent.retain(|name, (mine, at)| {
            let stale = at.elapsed() > OVERLAY_TTL
                || by_name
                    .get(name)
                    .is_some_and(|c| version(&**c) >= version(&**mine));
            if !stale {
                by_name.insert(name.clone(), mine.clone());
            }
            !stale
        });
        by_name.into_values().collect()
    }

    /// Drops the overlay's version of `name` (the object is being deleted).
    pub(super) fn forget(&self, name: &str) {
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent.remove(name);
    }

    /// Keeps a version this process wrote or re-read.
    pub(super) fn remember(&self, obj: K) -> Arc<K> {
        let obj = Arc::new(obj);
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent.insert(obj.name_any(), (obj.clone(), Instant::now()));
        obj
    }
}

/// The resourceVersion as a number (0 when absent or opaque: never newer).
fn version<K: Resource>(obj: &K) -> u64 {
    obj.meta()
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
