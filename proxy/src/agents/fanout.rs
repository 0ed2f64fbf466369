//! Bounded concurrent fan-out of one call to many agents.

use csi_scsi_contract::NodeName;
use futures::StreamExt;

use super::call::Rpc;
use super::error::AgentError;
use super::pool::AgentPool;

/// Calls `request` on every node in `nodes`, at most `limit` at once; each
/// node's result comes back with its name, in completion order. The cost is
/// close to the slowest agent, not the sum.
pub async fn fan_out<R: Rpc>(
    pool: &AgentPool,
    nodes: Vec<NodeName>,
    request: R,
    request_id: &str,
    limit: usize,
) -> Vec<(NodeName, Result<R::Reply, AgentError>)> {
    futures::stream::iter(nodes)
        .map(|node| {
            let request = request.clone();
            async move {
                let r = pool.call(&node, request, request_id).await;
                (node, r)
            }
        })
        .buffer_unordered(limit.max(1))
        .collect()
        .await
}
