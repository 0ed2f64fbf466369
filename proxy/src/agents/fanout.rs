//! Bounded concurrent fan-out of one call to many agents.

use futures::StreamExt;

use super::call::{AgentOp, AgentReply};
use super::pool::{AgentPool, PoolError};

/// Calls `op` on every node in `nodes`, at most `limit` at once; each
/// node's result comes back with its name, in completion order. The cost is
/// close to the slowest agent, not the sum.
pub async fn fan_out(
    pool: &AgentPool,
    nodes: Vec<String>,
    op: AgentOp,
    request_id: &str,
    limit: usize,
) -> Vec<(String, Result<Result<AgentReply, tonic::Status>, PoolError>)> {
    futures::stream::iter(nodes)
        .map(|node| {
            let op = op.clone();
            async move {
                let r = pool.call(&node, op, request_id).await;
                (node, r)
            }
        })
        .buffer_unordered(limit.max(1))
        .collect()
        .await
}
