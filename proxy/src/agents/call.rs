//! Typed agent calls as a tower `Service`, so generic layers (timeout,
//! retry, concurrency limit) can wrap them. Requests are plain prost
//! messages, cheap to clone for a retry.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use csi_scsi_proto::agent::agent_client::AgentClient;
use csi_scsi_proto::agent::{
    AttachRequest, AttachResponse, DetachRequest, DetachResponse, DiscoverRequest,
    DiscoverResponse, RescanRequest, RescanResponse, StatusRequest, StatusResponse, WipeProgress,
    WipeRequest,
};
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Request, Status};

/// gRPC metadata key carrying the request ID from proxy to agent.
pub const REQUEST_ID_HEADER: &str = csi_scsi_daemon::request_id::HEADER;

/// One call to one agent.
#[derive(Clone, Debug)]
pub struct AgentCall {
    /// The operation.
    pub op: AgentOp,
    /// Sent as `x-request-id` so one grep follows an operation across nodes.
    pub request_id: String,
    /// When the proxy stops waiting. Each attempt sends the time left as
    /// `grpc-timeout`, so the agent stops when the proxy does.
    pub deadline: Instant,
}

/// The agent API's operations.
#[derive(Clone, Debug)]
pub enum AgentOp {
    /// `Discover`.
    Discover(DiscoverRequest),
    /// `Attach`.
    Attach(AttachRequest),
    /// `Detach`.
    Detach(DetachRequest),
    /// `Wipe` (the stream is drained; the last progress message is returned).
    Wipe(WipeRequest),
    /// `Rescan`.
    Rescan(RescanRequest),
    /// `Status`.
    Status(StatusRequest),
}

/// The answer to an [`AgentCall`].
#[derive(Clone, Debug)]
pub enum AgentReply {
    /// From `Discover`.
    Discover(DiscoverResponse),
    /// From `Attach`.
    Attach(AttachResponse),
    /// From `Detach`.
    Detach(DetachResponse),
    /// The final `Wipe` progress (done = true).
    Wipe(WipeProgress),
    /// From `Rescan`.
    Rescan(RescanResponse),
    /// From `Status`.
    Status(StatusResponse),
}

/// The innermost service: sends one call over one agent's channel.
#[derive(Clone, Debug)]
pub struct Caller {
    client: AgentClient<Channel>,
}

impl AgentOp {
    /// The RPC name, for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Discover(_) => "Discover",
            Self::Attach(_) => "Attach",
            Self::Detach(_) => "Detach",
            Self::Wipe(_) => "Wipe",
            Self::Rescan(_) => "Rescan",
            Self::Status(_) => "Status",
        }
    }
}

impl Caller {
    /// A caller on `channel`.
    pub fn new(channel: Channel) -> Self {
        Self {
            client: AgentClient::new(channel),
        }
    }
}

impl tower::Service<AgentCall> for Caller {
    type Response = AgentReply;
    type Error = Status;
    type Future = Pin<Box<dyn Future<Output = Result<AgentReply, Status>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        // The channel queues and reconnects by itself.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: AgentCall) -> Self::Future {
        let mut client = self.client.clone();
        let answer = async move {
            fn req<T>(msg: T, call: &AgentCall) -> Request<T> {
                let mut r = Request::new(msg);
                r.set_timeout(call.deadline.saturating_duration_since(Instant::now()));
                if let Ok(v) = call.request_id.parse() {
                    r.metadata_mut().insert(REQUEST_ID_HEADER, v);
                }
                r
            }
            Ok(match call.op.clone() {
                AgentOp::Discover(m) => {
                    AgentReply::Discover(client.discover(req(m, &call)).await?.into_inner())
                }
                AgentOp::Attach(m) => {
                    AgentReply::Attach(client.attach(req(m, &call)).await?.into_inner())
                }
                AgentOp::Detach(m) => {
                    AgentReply::Detach(client.detach(req(m, &call)).await?.into_inner())
                }
                AgentOp::Rescan(m) => {
                    AgentReply::Rescan(client.rescan(req(m, &call)).await?.into_inner())
                }
                AgentOp::Status(m) => {
                    AgentReply::Status(client.status(req(m, &call)).await?.into_inner())
                }
                AgentOp::Wipe(m) => {
                    let mut stream = client.wipe(req(m, &call)).await?.into_inner();
                    let mut last = None;
                    while let Some(p) = stream.message().await? {
                        tracing::debug!(
                            done = p.bytes_done,
                            total = p.bytes_total,
                            pass = p.pass,
                            "wipe progress"
                        );
                        last = Some(p);
                    }
                    match last {
                        Some(p) if p.done => AgentReply::Wipe(p),
                        _ => {
                            return Err(Status::unavailable("wipe stream ended before completion"));
                        }
                    }
                }
            })
        };
        Box::pin(async move { answer.await.map_err(transport_is_unavailable) })
    }
}

/// A call the transport lost (the agent died, the connection reset, a
/// stream cut mid-body) is UNAVAILABLE, which the retry layer retries, not the UNKNOWN tonic gives
/// it: the agent never answered, and every agent call is idempotent.
fn transport_is_unavailable(status: Status) -> Status {
    // An answer from the agent carries no source; only a failure of the
    // connection (tonic's transport error, hyper's body error) does.
    let lost = std::error::Error::source(&status).map(|e| {
        let mut why = e.to_string();
        let mut next = e.source();
        while let Some(inner) = next {
            why = format!("{why}: {inner}");
            next = inner.source();
        }
        why
    });
    match lost {
        Some(why) if status.code() == tonic::Code::Unknown => {
            Status::unavailable(format!("connection to the agent lost: {why}"))
        }
        _ => status,
    }
}
