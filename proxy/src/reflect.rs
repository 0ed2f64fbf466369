//! The one watch-and-reflect loop the Kubernetes backends share: a
//! kube-runtime reflector that keeps a store, says when it changed, and
//! counts itself listed once.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::reflector::store::Writer;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

/// Whom a reflector wakes, and on what changes.
pub(crate) enum Wake {
    /// No one.
    Nobody,
    /// On any change of an object (status and labels included), its
    /// arrival or departure, and after each (re)list.
    EveryChange(Arc<Notify>),
    /// Only when an object's spec changes (a new `metadata.generation`),
    /// it arrives or goes, and after each (re)list: status writes, the
    /// proxy's own included, do not count, or every status write would
    /// wake discovery again.
    SpecChange(Arc<Notify>),
}

/// Runs a reflector over `api` until aborted: each object is passed through
/// `trim` (drop what the proxy never reads, to save memory) before the
/// store keeps it; `wake` says whom to notify of which changes; `listed`
/// counts up by one after the first list. A failed watch is logged and
/// retried with backoff.
pub(crate) fn spawn<K>(
    api: Api<K>,
    config: watcher::Config,
    writer: Writer<K>,
    trim: impl FnMut(&mut K) + Send + 'static,
    wake: Wake,
    listed: watch::Sender<usize>,
) -> JoinHandle<()>
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    tokio::spawn(async move {
        let stream = watcher(api, config)
            .default_backoff()
            .modify(trim)
            .reflect(writer);
        futures::pin_mut!(stream);
        let mut counted = false;
        let mut generations: HashMap<ObjectRef<K>, Option<i64>> = HashMap::new();
        while let Some(event) = stream.next().await {
            match event {
                Ok(event) => {
                    let change = match &event {
                        watcher::Event::InitDone => {
                            if !counted {
                                counted = true;
                                listed.send_modify(|n| *n += 1);
                            }
                            true
                        }
                        watcher::Event::Init => {
                            generations.clear();
                            false
                        }
                        watcher::Event::InitApply(obj) => {
                            generations.insert(ObjectRef::from_obj(obj), obj.meta().generation);
                            false
                        }
                        watcher::Event::Apply(obj) => {
                            let generation = obj.meta().generation;
                            let new_spec = generations.insert(ObjectRef::from_obj(obj), generation)
                                != Some(generation);
                            new_spec || matches!(wake, Wake::EveryChange(_))
                        }
                        watcher::Event::Delete(obj) => {
                            generations.remove(&ObjectRef::from_obj(obj));
                            true
                        }
                    };
                    if let (true, Wake::EveryChange(n) | Wake::SpecChange(n)) = (change, &wake) {
                        n.notify_one();
                    }
                }
                Err(e) => {
                    tracing::warn!(kind = %K::kind(&()), error = %e, "watch failed; retrying")
                }
            }
        }
    })
}
