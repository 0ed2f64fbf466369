//! The agent API's transport: gRPC over mutual TLS on TCP, never plaintext.
//! The server side logs every refused handshake with its cause; the client
//! side opens one lazily connected HTTP/2 channel to one node's agent.

use std::sync::Arc;
use std::time::Duration;

use csi_scsi_certs::{
    CertError, MaterialStore, client_config_for_node_uid, enrolment_client_config,
};
use futures::Stream;
use rustls::ServerConfig;
use rustls::pki_types::ServerName;
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::{Channel, Endpoint};
use tonic_tls::rustls::TlsStream;

use crate::agent_tcp::{AgentTcp, Severance};

/// How long a peer may take to complete its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a channel to an agent could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The agent address is not `host:port`.
    #[error("invalid agent address {addr:?}: {source}")]
    BadAddress {
        /// The rejected address.
        addr: String,
        /// The cause.
        #[source]
        source: tonic::transport::Error,
    },
    /// The node name cannot be a TLS server name.
    #[error("node name {0:?} is not a valid TLS server name")]
    BadNodeName(String),
    /// The TLS config could not be built.
    #[error(transparent)]
    Tls(#[from] CertError),
}

/// Whether the connection under `failure` (a failed call's error, its
/// causes walked) was refused over a certificate: the agent's did not
/// verify here, or the agent refused the proxy's. A timeout, a reset or a
/// refused connection is not: it says nothing about either certificate
/// (a starved node answers late), so it must not be taken for one.
pub fn certificate_refused(failure: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(failure);
    while let Some(e) = next {
        let tls = e.downcast_ref::<rustls::Error>().or_else(|| {
            e.downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::get_ref)
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(tls) = tls {
            return refuses_a_certificate(tls);
        }
        next = e.source();
    }
    false
}

/// The TLS failures that are about a certificate, either side's.
fn refuses_a_certificate(e: &rustls::Error) -> bool {
    use rustls::AlertDescription as A;
    match e {
        rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented => true,
        rustls::Error::AlertReceived(alert) => matches!(
            alert,
            A::BadCertificate
                | A::UnsupportedCertificate
                | A::CertificateRevoked
                | A::CertificateExpired
                | A::CertificateUnknown
                | A::UnknownCA
                | A::AccessDenied
                | A::CertificateRequired
        ),
        _ => false,
    }
}

/// Bounds the TLS handshakes in progress on one listener: a peer that
/// opens connections and never finishes its handshake holds a slot for at
/// most the handshake timeout, and once every slot is held a new
/// connection is closed at once (counted in `refused`) instead of costing
/// a task and a handshake's memory each. Established connections hold no
/// slot.
#[derive(Clone, Debug)]
pub struct HandshakeLimit {
    slots: Arc<tokio::sync::Semaphore>,
    refused: prometheus_client::metrics::counter::Counter,
}

impl HandshakeLimit {
    /// Handshakes in progress at once by default: far more than the few
    /// proxy replicas and probes that dial one agent ever need.
    pub const DEFAULT: usize = 128;

    /// At most `max` handshakes at once.
    pub fn new(max: usize) -> Self {
        Self {
            slots: Arc::new(tokio::sync::Semaphore::new(max.max(1))),
            refused: Default::default(),
        }
    }

    /// Connections closed because every slot was held (register it as a
    /// metric to export it).
    pub fn refused(&self) -> &prometheus_client::metrics::counter::Counter {
        &self.refused
    }
}

/// Accepts TLS connections on `listener` with `config`, at most
/// [`HandshakeLimit::DEFAULT`] handshakes at once; a failed handshake is
/// logged with the peer and the reason, then dropped.
pub fn tls_incoming(
    listener: TcpListener,
    config: Arc<ServerConfig>,
) -> impl Stream<Item = Result<TlsStream<TcpStream>, tonic_tls::Error>> + Send + 'static {
    tls_incoming_bounded(
        listener,
        config,
        HandshakeLimit::new(HandshakeLimit::DEFAULT),
    )
}

/// [`tls_incoming`] under `limit`.
pub fn tls_incoming_bounded(
    listener: TcpListener,
    config: Arc<ServerConfig>,
    limit: HandshakeLimit,
) -> impl Stream<Item = Result<TlsStream<TcpStream>, tonic_tls::Error>> + Send + 'static {
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic_tls::incoming_inner(
        incoming,
        LoggingAcceptor(
            tokio_rustls::TlsAcceptor::from(config),
            Arc::new(WarningBudget::default()),
            limit,
        ),
    )
}

/// A lazily connected channel to the agent of `node` at `addr` (`host:port`),
/// which must present a certificate naming `node`.
pub fn agent_channel(
    addr: &str,
    node: &str,
    store: Arc<MaterialStore>,
    connect_timeout: Duration,
) -> Result<Channel, TransportError> {
    severable_agent_channel(addr, node, None, store, connect_timeout).map(|(channel, _)| channel)
}

/// A lazily connected channel for the Enrolment service of the agent at
/// `addr`: the proxy's certificate is presented, the agent's is not
/// checked (see [`csi_scsi_certs::enrolment_client_config`]). Never use it
/// for anything but enrolment.
pub fn enrolment_channel(
    addr: &str,
    node: &str,
    store: Arc<MaterialStore>,
    connect_timeout: Duration,
) -> Result<Channel, TransportError> {
    let config = enrolment_client_config(store)?;
    connect(addr, node, config, connect_timeout).map(|(channel, _)| channel)
}

/// [`agent_channel`], with the [`Severance`] that cuts its connections: a
/// caller that gives up on a call severs the channel, so nothing it sent is
/// delivered later (see [`crate::agent_tcp`]). With `node_uid`, a
/// certificate issued to another Node object of that name is refused.
pub fn severable_agent_channel(
    addr: &str,
    node: &str,
    node_uid: Option<&str>,
    store: Arc<MaterialStore>,
    connect_timeout: Duration,
) -> Result<(Channel, Severance), TransportError> {
    let config = client_config_for_node_uid(store, node, node_uid)?;
    connect(addr, node, config, connect_timeout)
}

fn connect(
    addr: &str,
    node: &str,
    config: Arc<rustls::ClientConfig>,
    connect_timeout: Duration,
) -> Result<(Channel, Severance), TransportError> {
    let endpoint = Endpoint::from_shared(format!("https://{addr}"))
        .map_err(|source| TransportError::BadAddress {
            addr: addr.to_owned(),
            source,
        })?
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_while_idle(true);
    let server_name = ServerName::try_from(node.to_owned())
        .map_err(|_| TransportError::BadNodeName(node.to_owned()))?;
    let severance = Severance::default();
    let transport = AgentTcp {
        inner: tonic_tls::TcpTransport::from_endpoint(&endpoint),
        severance: severance.clone(),
    };
    let connector = tonic_tls::rustls::TlsConnector::new(transport, config, server_name);
    Ok((endpoint.connect_with_connector_lazy(connector), severance))
}

/// A TLS acceptor that says why a handshake failed, within its limit.
#[derive(Clone)]
struct LoggingAcceptor(
    tokio_rustls::TlsAcceptor,
    Arc<WarningBudget>,
    HandshakeLimit,
);

/// Most refused-handshake warnings logged a minute: a port scan or a
/// misconfigured client retrying in a loop must not flood the log. The
/// rest go to debug, and the next warning logged says how many there were.
const MAX_WARNINGS_PER_MINUTE: u32 = 20;

/// The budget of refused-handshake warnings (see
/// [`MAX_WARNINGS_PER_MINUTE`]).
#[derive(Default)]
struct WarningBudget(std::sync::Mutex<Option<(std::time::Instant, u32, u64)>>);

impl WarningBudget {
    /// `Some(n)` when this warning may be logged (`n` were held back since
    /// the last one), `None` when it is over budget.
    fn take(&self) -> Option<u64> {
        let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        let (start, logged, held) = state.get_or_insert((now, 0, 0));
        if now.duration_since(*start) >= Duration::from_secs(60) {
            *start = now;
            *logged = 0;
        }
        if *logged < MAX_WARNINGS_PER_MINUTE {
            *logged += 1;
            Some(std::mem::take(held))
        } else {
            *held += 1;
            None
        }
    }
}

impl tonic_tls::TlsAcceptor<TcpStream> for LoggingAcceptor {
    type TlsStream = TlsStream<TcpStream>;

    async fn accept(&self, stream: TcpStream) -> Result<Self::TlsStream, tonic_tls::Error> {
        let peer = stream
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "unknown".into());
        // Held until the handshake ends; dropping `stream` closes it.
        let Ok(_slot) = self.2.slots.clone().try_acquire_owned() else {
            self.2.refused.inc();
            match self.1.take() {
                Some(held_back) => {
                    tracing::warn!(%peer, held_back, "agent API: every TLS handshake slot is taken; connection closed")
                }
                None => {
                    tracing::debug!(%peer, "agent API: every TLS handshake slot is taken; connection closed")
                }
            }
            return Err("too many TLS handshakes in progress".into());
        };
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, self.0.accept(stream)).await {
            Ok(Ok(tls)) => Ok(TlsStream::new(tls)),
            // A TCP probe (load balancer, kubelet tcpSocket) connects and
            // closes without a word: not worth a warning.
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                tracing::debug!(%peer, "agent API: connection closed before the TLS handshake");
                Err(e.into())
            }
            Ok(Err(e)) => {
                match self.1.take() {
                    Some(held_back) => {
                        tracing::warn!(%peer, error = %e, held_back, "agent API: TLS handshake refused")
                    }
                    None => tracing::debug!(%peer, error = %e, "agent API: TLS handshake refused"),
                }
                Err(e.into())
            }
            Err(_) => {
                match self.1.take() {
                    Some(held_back) => {
                        tracing::warn!(%peer, held_back, "agent API: TLS handshake timed out")
                    }
                    None => tracing::debug!(%peer, "agent API: TLS handshake timed out"),
                }
                Err("TLS handshake timed out".into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_handshake_warnings_are_bounded_and_the_held_back_ones_counted() {
        let budget = WarningBudget::default();
        for _ in 0..MAX_WARNINGS_PER_MINUTE {
            assert_eq!(budget.take(), Some(0));
        }
        assert_eq!(budget.take(), None);
        assert_eq!(budget.take(), None);
        // A minute later the next one is logged and says two were held back.
        if let Some((start, _, _)) = budget.0.lock().expect("lock").as_mut() {
            *start -= Duration::from_secs(61);
        }
        assert_eq!(budget.take(), Some(2));
        assert_eq!(budget.take(), Some(0));
    }
}
