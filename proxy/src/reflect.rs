//! The one watch-and-reflect loop the Kubernetes backends share: a
//! kube-runtime reflector that keeps a store, says when it changed, and
//! counts itself listed once.

use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::reflector::store::Writer;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

/// Runs a reflector over `api` until aborted: each object is passed through
/// `trim` (drop what the proxy never reads, to save memory) before the
/// store keeps it; `changed` (when given) is notified on every applied or
/// deleted object and after each (re)list; `listed` counts up by one after
/// the first list. A failed watch is logged and retried with backoff.
pub fn spawn<K>(
    api: Api<K>,
    config: watcher::Config,
    writer: Writer<K>,
    trim: impl FnMut(&mut K) + Send + 'static,
    changed: Option<Arc<Notify>>,
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
        while let Some(event) = stream.next().await {
            match event {
                Ok(event) => {
                    let done = matches!(event, watcher::Event::InitDone);
                    if done && !counted {
                        counted = true;
                        listed.send_modify(|n| *n += 1);
                    }
                    let change = done
                        || matches!(event, watcher::Event::Apply(_) | watcher::Event::Delete(_));
                    if let (true, Some(n)) = (change, &changed) {
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
