//! The TCP under a channel to an agent, made so that a request is never
//! delivered after the proxy gave up on it.
//!
//! A request sent while a node's link is down waits in the kernel's send
//! queue, and TCP retransmits it once the link is back: seconds or minutes
//! after the caller's deadline. The agent would then run an Attach or a
//! Detach behind the publish record's back (a stale Detach removes a LUN
//! the record says is attached; a stale Attach makes a single-writer
//! volume visible on a second node). So:
//! - when the proxy gives up on a call, it [`Severance::sever`]s the
//!   channel: every connection fails at once and is closed with a reset
//!   (`SO_LINGER` 0), which discards what it still had to send;
//! - the kernel aborts a connection whose data stays unacknowledged for
//!   [`UNACKED_LIMIT`] (`TCP_USER_TIMEOUT`), however long the caller is
//!   prepared to wait.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Longest time data may sit in the kernel unacknowledged by an agent
/// before its connection is aborted (`TCP_USER_TIMEOUT`).
pub const UNACKED_LIMIT: Duration = Duration::from_secs(15);

/// Cuts every connection of one channel at once (see the module docs).
#[derive(Clone, Default)]
pub struct Severance(Arc<Shared>);

#[derive(Default)]
struct Shared {
    severed: AtomicBool,
    /// The tasks polling each live connection, woken to see the cut.
    wakers: Mutex<Vec<Weak<AtomicWaker>>>,
}

/// Dials TCP for one channel, each connection under its [`Severance`].
#[derive(Clone)]
pub(crate) struct AgentTcp {
    pub(crate) inner: tonic_tls::TcpTransport,
    pub(crate) severance: Severance,
}

/// One connection: TCP that fails its next read or write once severed.
pub struct SeverableStream {
    stream: TcpStream,
    severance: Severance,
    waker: Arc<AtomicWaker>,
}

// === impl Severance ===

impl Severance {
    /// Fails every connection made so far or from now on; each is closed
    /// with a reset, discarding what it still had to send.
    pub fn sever(&self) {
        self.0.severed.store(true, Ordering::SeqCst);
        let wakers = std::mem::take(&mut *self.0.wakers.lock().unwrap_or_else(|p| p.into_inner()));
        for w in wakers.iter().filter_map(Weak::upgrade) {
            w.wake();
        }
    }

    /// Whether [`Self::sever`] was called.
    pub fn is_severed(&self) -> bool {
        self.0.severed.load(Ordering::SeqCst)
    }

    fn track(&self, waker: &Arc<AtomicWaker>) {
        let mut wakers = self.0.wakers.lock().unwrap_or_else(|p| p.into_inner());
        wakers.retain(|w| w.strong_count() > 0);
        wakers.push(Arc::downgrade(waker));
    }
}

// === impl AgentTcp ===

impl tonic_tls::Transport for AgentTcp {
    type Io = SeverableStream;
    type Error = io::Error;

    async fn connect(&self, uri: &http::Uri) -> Result<SeverableStream, io::Error> {
        if self.severance.is_severed() {
            return Err(severed());
        }
        let stream = self.inner.connect(uri).await?;
        let socket = socket2::SockRef::from(&stream);
        socket.set_linger(Some(Duration::ZERO))?;
        socket.set_tcp_user_timeout(Some(UNACKED_LIMIT))?;
        let waker = Arc::new(AtomicWaker::new());
        self.severance.track(&waker);
        Ok(SeverableStream {
            stream,
            severance: self.severance.clone(),
            waker,
        })
    }
}

// === impl SeverableStream ===

impl SeverableStream {
    /// `Some(error)` once severed; otherwise the task is registered to be
    /// woken by a cut.
    fn cut(&self, cx: &Context<'_>) -> Option<io::Error> {
        self.waker.register(cx.waker());
        self.severance.is_severed().then(severed)
    }
}

fn severed() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "connection cut: the proxy gave up on a call over it",
    )
}

impl AsyncRead for SeverableStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if let Some(e) = me.cut(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut me.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for SeverableStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        if let Some(e) = me.cut(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut me.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        if let Some(e) = me.cut(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut me.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if let Some(e) = me.cut(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut me.stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        // A cut connection sends nothing more, not even a FIN: the reset
        // at close is all the agent sees.
        if me.severance.is_severed() {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut me.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A severed connection fails a read already waiting, and the peer
    /// sees a reset, not the bytes that were still queued.
    #[tokio::test]
    async fn severing_fails_a_pending_read_and_the_peer_sees_a_reset() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let endpoint =
            tonic::transport::Endpoint::from_shared(format!("http://{addr}")).expect("endpoint");
        let severance = Severance::default();
        let tcp = AgentTcp {
            inner: tonic_tls::TcpTransport::from_endpoint(&endpoint),
            severance: severance.clone(),
        };
        let uri: http::Uri = format!("http://{addr}").parse().expect("uri");
        let (client, accepted) =
            tokio::join!(tonic_tls::Transport::connect(&tcp, &uri), listener.accept());
        let mut client = client.expect("connect");
        let (mut server, _) = accepted.expect("accept");
        client.write_all(b"before").await.expect("write");
        let mut got = [0u8; 6];
        server.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"before");

        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 1];
            let r = client.read(&mut buf).await;
            (client, r)
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        severance.sever();
        let (client, r) = tokio::time::timeout(Duration::from_secs(5), reader)
            .await
            .expect("the pending read wakes up")
            .expect("join");
        assert_eq!(
            r.expect_err("severed").kind(),
            io::ErrorKind::ConnectionAborted
        );
        drop(client);
        let mut rest = Vec::new();
        let end = server.read_to_end(&mut rest).await;
        assert_eq!(
            end.expect_err("an abortive close").kind(),
            io::ErrorKind::ConnectionReset,
            "read {rest:?}"
        );

        // A channel once severed dials no more.
        let again = tonic_tls::Transport::connect(&tcp, &uri).await;
        assert!(again.is_err(), "a severed channel must not reconnect");
    }
}
