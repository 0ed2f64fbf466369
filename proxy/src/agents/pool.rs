//! One channel per agent, opened lazily, dropped when the agent leaves the
//! directory or moves to another address, or when it left a call
//! unanswered until its deadline (the connection may be dead: a fresh one
//! does not wait out TCP's retransmission backoff once the node is back).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_scsi_certs::MaterialStore;
use csi_scsi_contract::NodeName;
use csi_scsi_daemon::Severance;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tonic::transport::Channel;
use tower::ServiceExt;

use super::call::{AgentCall, Caller, NotLeading, Rpc, sending_epoch};
use super::deadline;
use super::error::AgentError;
use super::metrics::AgentCallMetrics;
use super::retry::{Backoff, RetryPolicy};
use super::stack::compose;
use crate::directory::AgentDirectory;
use crate::leader::LeaderHandle;

/// Less time than this left before the deadline: the call is not sent.
const MIN_ATTEMPT: Duration = Duration::from_millis(20);

/// Timeouts, retries and concurrency of agent calls.
#[derive(Clone, Debug)]
pub struct CallConfig {
    /// TCP+TLS connect timeout.
    pub connect_timeout: Duration,
    /// Overall deadline of quick calls (Discover, Attach, Detach, Rescan,
    /// Status); a CSI caller's shorter deadline wins (see `deadline`).
    pub deadline: Duration,
    /// Overall deadline of a Wipe (zeroing a LUN takes a while); a CSI
    /// caller's shorter deadline wins.
    pub wipe_deadline: Duration,
    /// Tries in all for a call that meets UNAVAILABLE.
    pub attempts: u32,
    /// Backoff between tries.
    pub backoff: Backoff,
    /// Agent calls in flight at once, process-wide.
    pub concurrency: usize,
}

/// Why a call could not even be sent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// The node has no agent in the directory.
    #[error("no agent is known for node {0}")]
    UnknownNode(NodeName),
    /// The channel could not be built.
    #[error("cannot open a channel to node {node}: {reason}")]
    Channel {
        /// The node.
        node: NodeName,
        /// Why.
        reason: String,
    },
    /// A destructive call, and this replica does not lead right now.
    #[error("to node {node}: {source}")]
    NotLeading {
        /// The node.
        node: NodeName,
        /// The call.
        source: NotLeading,
    },
}

/// One agent's channel in the pool.
struct Pooled {
    address: String,
    node_uid: Option<String>,
    id: u64,
    channel: Channel,
    /// Cuts the channel's connections when a call over it is given up.
    severance: Severance,
}

/// The agents' channels.
pub struct AgentPool {
    directory: Arc<dyn AgentDirectory>,
    tls: Arc<MaterialStore>,
    config: CallConfig,
    limit: Arc<Semaphore>,
    /// Whether this replica leads, and in which epoch (sent with every call).
    leader: LeaderHandle,
    /// Node -> its channel.
    channels: Mutex<HashMap<NodeName, Pooled>>,
    next_channel: AtomicU64,
    metrics: std::sync::OnceLock<AgentCallMetrics>,
}

impl AgentPool {
    /// A pool over `directory`, dialling with `tls`, calling for `leader`
    /// (its epoch goes with every call; destructive calls only while it
    /// leads). Starts a task that drops channels of agents that left.
    /// Needs a Tokio runtime.
    pub fn new(
        directory: Arc<dyn AgentDirectory>,
        tls: Arc<MaterialStore>,
        config: CallConfig,
        leader: LeaderHandle,
    ) -> Arc<Self> {
        let pool = Arc::new(Self {
            leader,
            limit: Arc::new(Semaphore::new(config.concurrency.max(1))),
            directory,
            tls,
            config,
            channels: Mutex::new(HashMap::new()),
            next_channel: AtomicU64::new(0),
            metrics: std::sync::OnceLock::new(),
        });
        let weak = Arc::downgrade(&pool);
        let mut rx = pool.directory.subscribe();
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let agents = rx.borrow_and_update().clone();
                let Some(pool) = weak.upgrade() else { return };
                let mut channels = pool.channels.lock().unwrap_or_else(|p| p.into_inner());
                channels.retain(|node, p| {
                    let keep = agents
                        .get(node)
                        .is_some_and(|a| a.address == p.address && a.node_uid == p.node_uid);
                    if !keep {
                        tracing::info!(%node, "agent left or moved; dropping its channel");
                    }
                    keep
                });
            }
        });
        // A reloaded certificate (a renewal, a CA rotation step) is used
        // on every agent connection at once: open connections would go on
        // presenting the old one for up to their 10 minutes, and an agent
        // that has dropped the old CA refuses it on every call.
        let weak = Arc::downgrade(&pool);
        let mut reloads = pool.tls.subscribe();
        tokio::spawn(async move {
            while reloads.changed().await.is_ok() {
                let Some(pool) = weak.upgrade() else { return };
                let mut channels = pool.channels.lock().unwrap_or_else(|p| p.into_inner());
                if !channels.is_empty() {
                    tracing::info!(
                        channels = channels.len(),
                        "own TLS material reloaded; agent channels dial afresh with it"
                    );
                }
                // Not severed: calls in flight finish on the old connections.
                channels.clear();
            }
        });
        pool
    }

    /// The directory the pool follows.
    pub fn directory(&self) -> &Arc<dyn AgentDirectory> {
        &self.directory
    }

    /// The call settings.
    pub fn config(&self) -> &CallConfig {
        &self.config
    }

    /// Times every call from now on (registering the agent-call series in
    /// `metrics`), and keeps failed ones for `/status` (a second call is
    /// ignored).
    pub fn set_metrics(&self, metrics: &csi_scsi_daemon::Metrics) {
        self.metrics.get_or_init(|| AgentCallMetrics::new(metrics));
    }

    /// Number of open channels.
    pub fn open_channels(&self) -> usize {
        self.channels.lock().map(|c| c.len()).unwrap_or(0)
    }

    /// The channel to `node` and its ID (for [`Self::forget`]).
    fn channel(&self, node: &NodeName) -> Result<(u64, Channel), PoolError> {
        let agents = self.directory.snapshot();
        let entry = agents
            .get(node)
            .ok_or_else(|| PoolError::UnknownNode(node.clone()))?;
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = channels.get(node)
            && p.address == entry.address
            && p.node_uid == entry.node_uid
        {
            return Ok((p.id, p.channel.clone()));
        }
        let (ch, severance) = csi_scsi_daemon::severable_agent_channel(
            &entry.address,
            node.as_str(),
            entry.node_uid.as_deref(),
            self.tls.clone(),
            self.config.connect_timeout,
        )
        .map_err(|e| PoolError::Channel {
            node: node.clone(),
            reason: e.to_string(),
        })?;
        let id = self.next_channel.fetch_add(1, Ordering::Relaxed);
        channels.insert(
            node.clone(),
            Pooled {
                address: entry.address.clone(),
                node_uid: entry.node_uid.clone(),
                id,
                channel: ch.clone(),
                severance,
            },
        );
        Ok((id, ch))
    }

    /// Drops `node`'s channel if it is still channel `id`, and cuts its
    /// connections at once: what was sent over them and not yet delivered
    /// (the node's link may be down) is discarded, never delivered after
    /// the caller gave up. The next call dials afresh.
    fn forget(&self, node: &NodeName, id: u64) {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if channels.get(node).is_some_and(|p| p.id == id)
            && let Some(p) = channels.remove(node)
        {
            p.severance.sever();
            tracing::info!(%node, "agent left a call unanswered; its connection is cut and its next call dials afresh");
        }
    }

    /// Calls `request` on `node`'s agent through the full stack, until the
    /// configured deadline or the CSI caller's (`deadline::within`),
    /// whichever comes first. No answer by then is `Unreachable`, saying
    /// what went wrong before.
    pub async fn call<R: Rpc>(
        &self,
        node: &NodeName,
        request: R,
        request_id: &str,
    ) -> Result<R::Reply, AgentError> {
        // Checked right before the call, so a replica frozen past its term
        // sends nothing; the agent's epoch check covers a freeze after it.
        sending_epoch::<R>(&self.leader).map_err(|source| PoolError::NotLeading {
            node: node.clone(),
            source,
        })?;
        let (channel_id, channel) = self.channel(node)?;
        let configured = if R::LONG {
            self.config.wipe_deadline
        } else {
            self.config.deadline
        };
        let start = Instant::now();
        let deadline = deadline::effective(configured, start);
        let method = R::NAME;
        let timer = self.metrics.get().map(|m| m.start(method));
        let budget = deadline.saturating_duration_since(start);
        let result = if budget < MIN_ATTEMPT {
            Err(tonic::Status::unavailable(format!(
                "no time left to call {method} on {node}: the caller's deadline has (nearly) passed"
            )))
        } else {
            let retry = RetryPolicy::new(self.config.backoff.clone(), self.config.attempts);
            let history = retry.clone();
            let svc = compose(
                Caller::new(channel, self.leader.clone()),
                retry,
                self.limit.clone(),
            );
            let call = AgentCall {
                request,
                request_id: request_id.to_owned(),
                deadline,
            };
            let answer = tokio::time::timeout_at(deadline, svc.oneshot(call)).await;
            match answer {
                // tonic's own timer (the attempt's grpc-timeout) may beat ours.
                Ok(Err(s)) if s.code() == tonic::Code::Cancelled && Instant::now() >= deadline => {
                    Err(self.unanswered(node, channel_id, method, budget, history.last_error()))
                }
                Ok(r) => r,
                Err(_) => {
                    Err(self.unanswered(node, channel_id, method, budget, history.last_error()))
                }
            }
        };
        if let Some(timer) = timer {
            timer.finish(
                result
                    .as_ref()
                    .map_or_else(|s| s.code(), |_| tonic::Code::Ok),
            );
        }
        // Probes (Status) fail while an agent is down; /status shows that
        // per agent, so they do not crowd the recent errors.
        if let (Err(status), Some(m), false) = (&result, self.metrics.get(), method == "Status") {
            m.note_error(node, method, status.code(), status.message(), request_id);
        }
        result.map_err(|status| AgentError::answer(node, status))
    }

    /// The answer to a call `node` left unanswered for `waited`; forgets
    /// its channel.
    fn unanswered(
        &self,
        node: &NodeName,
        channel_id: u64,
        method: &str,
        waited: Duration,
        last_error: Option<String>,
    ) -> tonic::Status {
        self.forget(node, channel_id);
        tonic::Status::unavailable(format!(
            "node {node} did not answer {method} within {:.1}s{}",
            waited.as_secs_f64(),
            last_error.map_or_else(String::new, |e| format!(" (last error: {e})"))
        ))
    }
}

#[cfg(test)]
mod tests {
    use csi_scsi_certs::{
        CertificateAuthority, Identity, MaterialPaths, Role, TrustDomain, Validity, write_issued,
    };
    use csi_scsi_proto::agent::StatusRequest;

    use super::*;
    use crate::directory::FileDirectory;
    use crate::node;

    /// A pool whose only agent, node-x, accepts connections and never says
    /// a word (a node whose link went down after the TCP handshake).
    async fn pool_with_a_silent_agent(
        dir: &std::path::Path,
        deadline: Duration,
    ) -> (Arc<AgentPool>, tokio::task::JoinHandle<()>) {
        csi_scsi_certs::install_crypto_provider();
        let domain = TrustDomain::new("csi-scsi.local").expect("domain");
        let ca = CertificateAuthority::create(&domain, Validity::days(1)).expect("CA");
        let proxy = ca
            .issue(&Identity::Proxy, Validity::days(1))
            .expect("issue");
        write_issued(&dir.join("proxy"), &proxy).expect("write");
        let tls = MaterialStore::load(
            MaterialPaths::in_dir(&dir.join("proxy")),
            Role::Proxy,
            domain,
        )
        .expect("material");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        std::fs::write(dir.join("agents.txt"), format!("node-x {addr}\n")).expect("agents");
        let directory = FileDirectory::load(&dir.join("agents.txt")).expect("directory");
        let config = CallConfig {
            connect_timeout: Duration::from_secs(20),
            deadline,
            wipe_deadline: deadline,
            attempts: 4,
            backoff: Backoff::try_new(Duration::from_millis(10), Duration::from_millis(50), 0.0)
                .expect("backoff"),
            concurrency: 8,
        };
        (
            AgentPool::new(directory, tls, config, LeaderHandle::always()),
            silent,
        )
    }

    fn status() -> StatusRequest {
        StatusRequest {}
    }

    #[tokio::test]
    async fn a_silent_agent_is_unavailable_by_the_callers_deadline_and_its_channel_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (pool, silent) = pool_with_a_silent_agent(dir.path(), Duration::from_secs(30)).await;
        let start = Instant::now();
        let caller = start + Duration::from_millis(400);
        let result =
            deadline::within(Some(caller), pool.call(&node("node-x"), status(), "t")).await;
        let took = start.elapsed();
        let error = result.expect_err("no answer");
        assert!(
            matches!(&error, AgentError::Unreachable { detail, .. }
                if detail.contains("node node-x did not answer Status within 0.4s")),
            "{error:?}"
        );
        assert!(
            took >= Duration::from_millis(390) && took < Duration::from_millis(1500),
            "answered after {took:?}, not at the caller's deadline"
        );
        assert_eq!(pool.open_channels(), 0, "the channel that hung is dropped");
        silent.abort();
    }

    #[tokio::test]
    async fn without_a_caller_deadline_the_configured_one_applies() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (pool, silent) = pool_with_a_silent_agent(dir.path(), Duration::from_millis(300)).await;
        let start = Instant::now();
        let error = pool
            .call(&node("node-x"), status(), "t")
            .await
            .expect_err("no answer");
        assert!(matches!(error, AgentError::Unreachable { .. }), "{error:?}");
        assert!(start.elapsed() < Duration::from_millis(1500));
        silent.abort();
    }

    #[tokio::test]
    async fn a_call_past_the_callers_deadline_is_not_sent() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (pool, silent) = pool_with_a_silent_agent(dir.path(), Duration::from_secs(30)).await;
        let error = deadline::within(
            Some(Instant::now()),
            pool.call(&node("node-x"), status(), "t"),
        )
        .await
        .expect_err("no time");
        assert!(
            matches!(&error, AgentError::Unreachable { detail, .. } if detail.contains("no time left")),
            "{error:?}"
        );
        silent.abort();
    }
}
