//! One channel per agent, opened lazily, dropped when the agent leaves the
//! directory or moves to another address.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_scsi_certs::MaterialStore;
use tokio::sync::Semaphore;
use tonic::transport::Channel;
use tower::ServiceExt;

use super::call::{AgentCall, AgentOp, AgentReply, Caller};
use super::retry::{Backoff, RetryPolicy};
use super::stack::compose;
use crate::directory::AgentDirectory;

/// Timeouts, retries and concurrency of agent calls.
#[derive(Clone, Debug)]
pub struct CallConfig {
    /// TCP+TLS connect timeout.
    pub connect_timeout: Duration,
    /// Overall deadline of quick calls (Discover, Attach, Detach, Rescan, Status).
    pub deadline: Duration,
    /// Overall deadline of a Wipe (zeroing a LUN takes a while).
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
    UnknownNode(String),
    /// The channel could not be built.
    #[error("cannot open a channel to node {node}: {reason}")]
    Channel {
        /// The node.
        node: String,
        /// Why.
        reason: String,
    },
}

/// The agents' channels.
pub struct AgentPool {
    directory: Arc<dyn AgentDirectory>,
    tls: Arc<MaterialStore>,
    config: CallConfig,
    limit: Arc<Semaphore>,
    channels: Mutex<HashMap<String, (String, Channel)>>,
    metrics: std::sync::OnceLock<csi_scsi_daemon::Metrics>,
}

impl AgentPool {
    /// A pool over `directory`, dialling with `tls`. Starts a task that
    /// drops channels of agents that left. Needs a Tokio runtime.
    pub fn new(
        directory: Arc<dyn AgentDirectory>,
        tls: Arc<MaterialStore>,
        config: CallConfig,
    ) -> Arc<Self> {
        let pool = Arc::new(Self {
            limit: Arc::new(Semaphore::new(config.concurrency.max(1))),
            directory,
            tls,
            config,
            channels: Mutex::new(HashMap::new()),
            metrics: std::sync::OnceLock::new(),
        });
        let weak = Arc::downgrade(&pool);
        let mut rx = pool.directory.subscribe();
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let agents = rx.borrow_and_update().clone();
                let Some(pool) = weak.upgrade() else { return };
                let mut channels = pool.channels.lock().unwrap_or_else(|p| p.into_inner());
                channels.retain(|node, (addr, _)| {
                    let keep = agents.get(node).is_some_and(|a| &a.address == addr);
                    if !keep {
                        tracing::info!(%node, "agent left or moved; dropping its channel");
                    }
                    keep
                });
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

    /// Times every call from now on, and keeps failed ones for `/status`
    /// (a second call is ignored).
    pub fn set_metrics(&self, metrics: csi_scsi_daemon::Metrics) {
        let _ = self.metrics.set(metrics);
    }

    /// Number of open channels.
    pub fn open_channels(&self) -> usize {
        self.channels.lock().map(|c| c.len()).unwrap_or(0)
    }

    fn channel(&self, node: &str) -> Result<Channel, PoolError> {
        let agents = self.directory.snapshot();
        let entry = agents
            .get(node)
            .ok_or_else(|| PoolError::UnknownNode(node.to_owned()))?;
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((addr, ch)) = channels.get(node)
            && addr == &entry.address
        {
            return Ok(ch.clone());
        }
        let ch = csi_scsi_daemon::agent_channel(
            &entry.address,
            node,
            self.tls.clone(),
            self.config.connect_timeout,
        )
        .map_err(|e| PoolError::Channel {
            node: node.to_owned(),
            reason: e.to_string(),
        })?;
        channels.insert(node.to_owned(), (entry.address.clone(), ch.clone()));
        Ok(ch)
    }

    /// Calls `op` on `node`'s agent through the full stack.
    pub async fn call(
        &self,
        node: &str,
        op: AgentOp,
        request_id: &str,
    ) -> Result<Result<AgentReply, tonic::Status>, PoolError> {
        let channel = self.channel(node)?;
        let overall = match op {
            AgentOp::Wipe(_) => self.config.wipe_deadline,
            _ => self.config.deadline,
        };
        let svc = compose(
            Caller::new(channel),
            overall,
            RetryPolicy::new(self.config.backoff.clone(), self.config.attempts),
            self.limit.clone(),
        );
        let method = op.name();
        let timer = self.metrics.get().map(|m| m.agent_call(method));
        let call = AgentCall {
            op,
            request_id: request_id.to_owned(),
            // Each attempt may use the whole deadline; the stack's overall
            // timeout stops the retries.
            deadline: overall,
        };
        let result = svc.oneshot(call).await;
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
            let source = format!("agent {node}");
            m.note_error(&source, method, status.code(), status.message(), request_id);
        }
        Ok(result)
    }
}
