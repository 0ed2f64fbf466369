//! The TLS handshake already refuses anyone but the proxy; each request
//! (through [`ProxyOnly`], the interceptor both agent API services are
//! built behind, so a new RPC cannot forget it) checks the peer's chain again against the trust material current now,
//! so a misconfigured listener never serves the API to someone else, and a
//! proxy certificate rotated out (or expired) stops working on connections
//! opened before the rotation too, not only on new ones.

use std::sync::Arc;

use csi_scsi_certs::{Identity, MaterialStore, identity_of, verify_proxy_chain};
use tonic::Status;
use tonic::transport::server::TcpConnectInfo;
use tonic_tls::rustls::SslConnectInfo;

/// Admits only calls from the proxy over mutual TLS.
#[derive(Clone)]
pub(crate) struct ProxyOnly {
    /// The trust material each request's client chain is checked against.
    trust: Arc<MaterialStore>,
}

impl ProxyOnly {
    /// Checks callers against `trust` (the agent's current TLS material).
    pub(crate) fn new(trust: Arc<MaterialStore>) -> Self {
        Self { trust }
    }
}

impl tonic::service::Interceptor for ProxyOnly {
    fn call(&mut self, req: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        require_proxy(&req, &self.trust)?;
        Ok(req)
    }
}

/// Requires the request to come from the proxy over TLS.
fn require_proxy<T>(req: &tonic::Request<T>, trust: &Arc<MaterialStore>) -> Result<(), Status> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use csi_scsi_certs::{
        CertificateAuthority, MaterialPaths, Role, TrustDomain, Validity, write_issued,
    };
    use tonic::service::Interceptor;

    #[test]
    fn a_call_without_a_tls_peer_is_refused_unauthenticated() {
        csi_scsi_certs::install_crypto_provider();
        let dir = tempfile::tempdir().expect("tempdir");
        let domain = TrustDomain::new("csi-scsi.local").expect("domain");
        let ca = CertificateAuthority::create(&domain, Validity::days(1)).expect("CA");
        let agent = ca
            .issue(&Identity::Node("n1".to_owned()), Validity::days(1))
            .expect("issue");
        write_issued(dir.path(), &agent).expect("write");
        let store = MaterialStore::load(
            MaterialPaths::in_dir(dir.path()),
            Role::Agent {
                node: "n1".to_owned(),
            },
            domain,
        )
        .expect("material");
        let err = ProxyOnly::new(store)
            .call(tonic::Request::new(()))
            .expect_err("no TLS peer");
        assert_eq!(err.code(), tonic::Code::Unauthenticated);
        assert!(
            err.message().contains("mutual TLS only"),
            "{}",
            err.message()
        );
    }
}
