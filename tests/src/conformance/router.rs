//! A thin CSI router for conformance runs: one Unix socket that forwards
//! Identity and Controller calls to the proxy and Node calls to one agent.
//!
//! Why it exists: csi-sanity assumes one driver behind its node endpoint.
//! Before it calls ControllerPublishVolume it asks the *node* endpoint's
//! Identity whether the plugin provides the Controller service, and the
//! agent rightly says it does not (it is the node plugin only). In a
//! cluster the two halves are one driver by name (`csi-scsi.io`); the
//! router makes them one endpoint the same way, by forwarding whole HTTP/2
//! requests by service name, bodies and trailers untouched, so every code
//! and message csi-sanity sees is the proxy's or the agent's own.

use std::convert::Infallible;
use std::marker::PhantomData;
use std::path::Path;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::transport::{Channel, Server};
use tower::{Service, ServiceExt};

use crate::csi_client::csi_channel;

/// A gRPC service name that the router serves by forwarding.
pub trait Served: Send + Sync + 'static {
    /// The fully qualified service name (`csi.v1.Node`).
    const NAME: &'static str;
}

/// `csi.v1.Identity`.
pub struct Identity;
/// `csi.v1.Controller`.
pub struct Controller;
/// `csi.v1.Node`.
pub struct Node;

impl Served for Identity {
    const NAME: &'static str = "csi.v1.Identity";
}
impl Served for Controller {
    const NAME: &'static str = "csi.v1.Controller";
}
impl Served for Node {
    const NAME: &'static str = "csi.v1.Node";
}

/// Forwards every call of service `S` to `channel`, as it came.
pub struct Forward<S> {
    channel: Channel,
    service: PhantomData<fn() -> S>,
}

impl<S> Clone for Forward<S> {
    fn clone(&self) -> Self {
        Self {
            channel: self.channel.clone(),
            service: PhantomData,
        }
    }
}

impl<S: Served> Forward<S> {
    fn to(channel: Channel) -> Self {
        Self {
            channel,
            service: PhantomData,
        }
    }
}

impl<S: Served> NamedService for Forward<S> {
    const NAME: &'static str = S::NAME;
}

impl<S: Served> Service<http::Request<Body>> for Forward<S> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let channel = self.channel.clone();
        Box::pin(async move {
            // `oneshot`: the channel is a buffer that must be polled ready
            // before each call.
            match channel.oneshot(request).await {
                Ok(response) => Ok(response),
                // The plugin behind did not answer at all: say so in the
                // status a CO would see for a plugin that went away.
                Err(e) => Ok(tonic::Status::unavailable(format!(
                    "csi router: {} did not answer: {e}",
                    S::NAME
                ))
                .into_http()),
            }
        })
    }
}

/// Serves the router on `socket` until the task is dropped: Identity and
/// Controller to the proxy's CSI socket, Node to the agent's.
pub async fn serve(socket: &Path, proxy: &Path, agent: &Path) -> anyhow::Result<()> {
    let proxy = csi_channel(proxy).await?;
    let agent = csi_channel(agent).await?;
    let _ = std::fs::remove_file(socket);
    let incoming = UnixListenerStream::new(UnixListener::bind(socket)?);
    Server::builder()
        .add_service(Forward::<Identity>::to(proxy.clone()))
        .add_service(Forward::<Controller>::to(proxy))
        .add_service(Forward::<Node>::to(agent))
        .serve_with_incoming(incoming)
        .await?;
    Ok(())
}
