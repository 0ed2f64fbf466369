//! The one place the tower layers for agent calls are composed.

use std::sync::Arc;

use tokio::sync::Semaphore;
use tonic::Status;
use tower::ServiceBuilder;
use tower::util::BoxCloneService;

use super::call::{AgentCall, Caller, Rpc};
use super::retry::RetryPolicy;

/// A composed agent service for RPC `R`.
pub(crate) type AgentService<R> = BoxCloneService<AgentCall<R>, <R as Rpc>::Reply, Status>;

/// Outermost first:
/// 1. retry on UNAVAILABLE with jittered backoff, while the call's
///    deadline leaves time;
/// 2. the process-wide concurrency bound, held per attempt (not while a
///    retry sleeps), which bounds every fan-out.
///
/// The overall deadline is not a layer: the pool awaits the stack until the
/// call's deadline, so it knows when the agent never answered (and drops
/// that agent's channel, which may sit on a dead connection).
pub(crate) fn compose<R: Rpc>(
    caller: Caller,
    retry: RetryPolicy,
    limit: Arc<Semaphore>,
) -> AgentService<R> {
    let svc = ServiceBuilder::new()
        .retry(retry)
        .layer(tower::limit::GlobalConcurrencyLimitLayer::with_semaphore(
            limit,
        ))
        .service(caller);
    BoxCloneService::new(svc)
}
