//! Defence in depth: the TLS handshake already refuses anyone but the
//! proxy; each request checks the verified peer certificate again, so a
//! misconfigured listener can never serve the API to someone else.

use csi_scsi_certs::{Identity, TrustDomain, identity_of};
use tonic::Status;
use tonic::transport::server::TcpConnectInfo;
use tonic_tls::rustls::SslConnectInfo;

/// Requires the request to come from the proxy over TLS.
pub fn require_proxy<T>(req: &tonic::Request<T>, domain: &TrustDomain) -> Result<(), Status> {
    let info = req
        .extensions()
        .get::<SslConnectInfo<TcpConnectInfo>>()
        .ok_or_else(|| Status::unauthenticated("the agent API is served over mutual TLS only"))?;
    let certs = info
        .peer_certs()
        .ok_or_else(|| Status::unauthenticated("no client certificate"))?;
    let leaf = certs
        .first()
        .ok_or_else(|| Status::unauthenticated("no client certificate"))?;
    match identity_of(leaf, domain) {
        Some(Identity::Proxy) => Ok(()),
        Some(other) => Err(Status::permission_denied(format!(
            "{other} may not call the agent API"
        ))),
        None => Err(Status::permission_denied(
            "the client certificate names no identity of this trust domain",
        )),
    }
}
