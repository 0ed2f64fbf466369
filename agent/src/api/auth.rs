//! The TLS handshake already refuses anyone but the proxy; each request
//! checks the peer's chain again against the trust material current now,
//! so a misconfigured listener never serves the API to someone else, and a
//! proxy certificate rotated out (or expired) stops working on connections
//! opened before the rotation too, not only on new ones.

use std::sync::Arc;

use csi_scsi_certs::{Identity, MaterialStore, identity_of, verify_proxy_chain};
use tonic::Status;
use tonic::transport::server::TcpConnectInfo;
use tonic_tls::rustls::SslConnectInfo;

/// Requires the request to come from the proxy over TLS.
pub fn require_proxy<T>(req: &tonic::Request<T>, trust: &Arc<MaterialStore>) -> Result<(), Status> {
    let domain = trust.trust_domain();
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
        Some(Identity::Proxy) => verify_proxy_chain(trust, &certs).map_err(|e| {
            Status::unauthenticated(format!(
                "the proxy's certificate no longer verifies against this agent's trust material ({e}); reconnect with a current one"
            ))
        }),
        Some(other) => Err(Status::permission_denied(format!(
            "{other} may not call the agent API"
        ))),
        None => Err(Status::permission_denied(
            "the client certificate names no identity of this trust domain",
        )),
    }
}
