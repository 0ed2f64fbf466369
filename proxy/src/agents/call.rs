//! Typed agent calls as a tower `Service`, so generic layers (timeout,
//! retry, concurrency limit) can wrap them. Each request message names its
//! RPC and its reply type ([`Rpc`]), so a caller gets the reply of the call
//! it made, never a message to match on. Requests are plain prost
//! messages, cheap to clone for a retry.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use csi_scsi_contract::{LEADER_EPOCH_HEADER, LeaderEpoch};
use csi_scsi_proto::agent::agent_client::AgentClient;
use csi_scsi_proto::agent::{
    AttachRequest, AttachResponse, DetachRequest, DetachResponse, DiscoverRequest,
    DiscoverResponse, RescanRequest, RescanResponse, StatusRequest, StatusResponse, VerifyRequest,
    VerifyResponse, WipeProgress, WipeRequest,
};
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Request, Status};

use crate::fault::Fault;
use crate::leader::LeaderHandle;

/// gRPC metadata key carrying the request ID from proxy to agent.
pub const REQUEST_ID_HEADER: &str = csi_scsi_daemon::request_id::HEADER;

/// The future an [`Rpc`] sends.
pub(crate) type Sent<T> = Pin<Box<dyn Future<Output = Result<T, Status>> + Send>>;

/// One RPC of the agent API, implemented by its request message.
pub trait Rpc: Clone + std::fmt::Debug + Send + Sync + 'static {
    /// What the agent answers.
    type Reply: Send + 'static;
    /// The RPC name, for logs and metrics.
    const NAME: &'static str;
    /// Whether it runs long (a wipe), so it gets the long deadline.
    const LONG: bool = false;
    /// Whether it changes what a node does with a LUN (Attach, Detach,
    /// Wipe): only the leader sends it, and the agent refuses it from an
    /// older leader epoch than one it has seen. No default: each RPC says.
    const DESTRUCTIVE: bool;
    /// Sends it over `client`.
    fn send(request: Request<Self>, client: AgentClient<Channel>) -> Sent<Self::Reply>;
}

/// One call to one agent.
#[derive(Clone, Debug)]
pub struct AgentCall<R> {
    /// The request.
    pub request: R,
    /// Sent as `x-request-id` so one grep follows an operation across nodes.
    pub request_id: String,
    /// When the proxy stops waiting. Each attempt sends the time left as
    /// `grpc-timeout`, so the agent stops when the proxy does.
    pub deadline: Instant,
}

/// The innermost service: sends one call over one agent's channel, with
/// this replica's leader epoch.
#[derive(Clone, Debug)]
pub struct Caller {
    client: AgentClient<Channel>,
    leader: LeaderHandle,
}

/// A destructive call this replica may not send: it does not lead (or its
/// term lapsed) right now.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{method} not sent: this proxy replica does not lead (a stale leader must not act)")]
pub struct NotLeading {
    /// The RPC.
    pub method: &'static str,
}

/// The epoch a call of `R` goes out with, `None` when this replica does
/// not lead (calls that change nothing still go, without an epoch, which
/// the agent reads as 0). A destructive call is never sent by a replica
/// that does not lead: the one rule, checked when a call starts and again
/// before each attempt.
pub(crate) fn sending_epoch<R: Rpc>(
    leader: &LeaderHandle,
) -> Result<Option<LeaderEpoch>, NotLeading> {
    match leader.epoch() {
        // A deliberate defect for the lab: the lapsed term's epoch goes
        // out, and only the agent's fence is left.
        None if R::DESTRUCTIVE && crate::fault::injected(Fault::SkipLeaderCheck) => leader
            .lapsed_epoch()
            .map(Some)
            .ok_or(NotLeading { method: R::NAME }),
        None if R::DESTRUCTIVE => Err(NotLeading { method: R::NAME }),
        epoch => Ok(epoch),
    }
}

impl Rpc for DiscoverRequest {
    type Reply = DiscoverResponse;
    const NAME: &'static str = "Discover";
    const DESTRUCTIVE: bool = false;
    fn send(request: Request<Self>, mut client: AgentClient<Channel>) -> Sent<Self::Reply> {
        Box::pin(async move { Ok(client.discover(request).await?.into_inner()) })
    }
}

impl Rpc for AttachRequest {
    type Reply = AttachResponse;
    const NAME: &'static str = "Attach";
    const DESTRUCTIVE: bool = true;
    fn send(request: Request<Self>, mut client: AgentClient<Channel>) -> Sent<Self::Reply> {
        Box::pin(async move { Ok(client.attach(request).await?.into_inner()) })
    }
}

impl Rpc for DetachRequest {
    type Reply = DetachResponse;
    const NAME: &'static str = "Detach";
    const DESTRUCTIVE: bool = true;
    fn send(request: Request<Self>, mut client: AgentClient<Channel>) -> Sent<Self::Reply> {
        Box::pin(async move { Ok(client.detach(request).await?.into_inner()) })
    }
}

impl Rpc for RescanRequest {
    type Reply = RescanResponse;
    const NAME: &'static str = "Rescan";
    const DESTRUCTIVE: bool = false;
    fn send(request: Request<Self>, mut client: AgentClient<Channel>) -> Sent<Self::Reply> {
        Box::pin(async move { Ok(client.rescan(request).await?.into_inner()) })
    }
}

impl Rpc for VerifyRequest {
    type Reply = VerifyResponse;
    const NAME: &'static str = "Verify";
    const DESTRUCTIVE: bool = false;
    fn send(request: Request<Self>, mut client: AgentClient<Channel>) -> Sent<Self::Reply> {
        Box::pin(async move { Ok(client.verify(request).await?.into_inner()) })
    }
}

impl Rpc for StatusRequest {
    type Reply = StatusResponse;
    const NAME: &'static str = "Status";
    const DESTRUCTIVE: bool = false;
    fn send(request: Request<Self>, mut client: AgentClient<Channel>) -> Sent<Self::Reply> {
        Box::pin(async move { Ok(client.status(request).await?.into_inner()) })
    }
}

/// The stream is drained; the reply is the last progress message, which
/// must say done.
impl Rpc for WipeRequest {
    type Reply = WipeProgress;
    const NAME: &'static str = "Wipe";
    const DESTRUCTIVE: bool = true;
    const LONG: bool = true;
    fn send(request: Request<Self>, mut client: AgentClient<Channel>) -> Sent<Self::Reply> {
        Box::pin(async move {
            let mut stream = client.wipe(request).await?.into_inner();
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
                Some(p) if p.done => Ok(p),
                _ => Err(Status::unavailable("wipe stream ended before completion")),
            }
        })
    }
}

impl Caller {
    /// A caller on `channel`, acting for `leader`.
    pub fn new(channel: Channel, leader: LeaderHandle) -> Self {
        Self {
            client: AgentClient::new(channel),
            leader,
        }
    }
}

impl<R: Rpc> tower::Service<AgentCall<R>> for Caller {
    type Response = R::Reply;
    type Error = Status;
    type Future = Sent<R::Reply>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        // The channel queues and reconnects by itself.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: AgentCall<R>) -> Self::Future {
        // A retry may come after the term lapsed: it is not sent. The
        // first attempt's earlier tries leave doubt, so UNAVAILABLE.
        let epoch = match sending_epoch::<R>(&self.leader) {
            Ok(epoch) => epoch,
            Err(e) => return Box::pin(std::future::ready(Err(Status::unavailable(e.to_string())))),
        };
        let mut request = Request::new(call.request);
        if let Some(epoch) = epoch
            && let Ok(v) = epoch.to_string().parse()
        {
            request.metadata_mut().insert(LEADER_EPOCH_HEADER, v);
        }
        request.set_timeout(call.deadline.saturating_duration_since(Instant::now()));
        if let Ok(v) = call.request_id.parse() {
            request.metadata_mut().insert(REQUEST_ID_HEADER, v);
        }
        let sent = R::send(request, self.client.clone());
        Box::pin(async move { sent.await.map_err(transport_is_unavailable) })
    }
}

/// Why the connection under `status` failed (a TLS refusal, a reset), the
/// whole chain of causes; `None` when the agent answered.
pub(crate) fn transport_failure(status: &Status) -> Option<String> {
    std::error::Error::source(status).map(|e| {
        let mut why = e.to_string();
        let mut next = e.source();
        while let Some(inner) = next {
            why = format!("{why}: {inner}");
            next = inner.source();
        }
        why
    })
}

/// A call the transport lost (the agent died, the connection reset, a
/// stream cut mid-body) is UNAVAILABLE, which the retry layer retries, not the UNKNOWN tonic gives
/// it: the agent never answered, and every agent call is idempotent.
fn transport_is_unavailable(status: Status) -> Status {
    // An answer from the agent carries no source; only a failure of the
    // connection (tonic's transport error, hyper's body error) does.
    match transport_failure(&status) {
        Some(why) if status.code() == tonic::Code::Unknown => {
            Status::unavailable(format!("connection to the agent lost: {why}"))
        }
        _ => status,
    }
}
