//! The one place the tower layers for agent calls are composed.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tonic::Status;
use tower::util::BoxCloneService;
use tower::{BoxError, ServiceBuilder};

use super::call::{AgentCall, AgentReply, Caller};
use super::retry::RetryPolicy;

/// A composed agent service.
pub type AgentService = BoxCloneService<AgentCall, AgentReply, Status>;

/// Outermost first:
/// 1. map errors back to `Status` (a timeout becomes DEADLINE_EXCEEDED);
/// 2. the overall deadline of the operation, retries included;
/// 3. retry on UNAVAILABLE with jittered backoff;
/// 4. the process-wide concurrency bound, held per attempt (not while a
///    retry sleeps), which bounds every fan-out.
pub fn compose(
    caller: Caller,
    overall: Duration,
    retry: RetryPolicy,
    limit: Arc<Semaphore>,
) -> AgentService {
    let svc = ServiceBuilder::new()
        .map_err(into_status)
        .timeout(overall)
        .retry(retry)
        .layer(tower::limit::GlobalConcurrencyLimitLayer::with_semaphore(
            limit,
        ))
        .service(caller);
    BoxCloneService::new(svc)
}

fn into_status(e: BoxError) -> Status {
    match e.downcast::<Status>() {
        Ok(status) => *status,
        Err(e) if e.is::<tower::timeout::error::Elapsed>() => {
            Status::deadline_exceeded("agent call exceeded its deadline")
        }
        Err(e) => Status::internal(format!("agent call failed: {e}")),
    }
}
