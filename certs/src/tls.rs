//! rustls configs for the agent API: mutual TLS only, HTTP/2 ALPN, material
//! read from a [`MaterialStore`] at every handshake.

use std::sync::Arc;

use rustls::client::ResolvesClientCert;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, ServerConfig, SignatureScheme};

use crate::verify::{NodeServerVerifier, ProxyClientVerifier};
use crate::{CertError, MaterialStore};

/// Presents the store's current certificate, on either side.
#[derive(Debug)]
struct CurrentCert(Arc<MaterialStore>);

/// The agent's server config: requires a client certificate from the CA
/// that names the proxy.
pub fn server_config(store: Arc<MaterialStore>) -> Result<Arc<ServerConfig>, CertError> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(Arc::new(ProxyClientVerifier {
            store: store.clone(),
        }))
        .with_cert_resolver(Arc::new(CurrentCert(store)));
    config.alpn_protocols = vec![b"h2".to_vec()];
    // A resumed session skips certificate checks: an expired or no longer
    // trusted client would get back in. Every connection does a full
    // handshake against the current material (connections are long-lived
    // HTTP/2, so this costs little).
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

/// The proxy's client config for dialling `node`: the server must present a
/// certificate from the CA that names exactly that node.
pub fn client_config_for_node(
    store: Arc<MaterialStore>,
    node: &str,
) -> Result<Arc<ClientConfig>, CertError> {
    client_config_for_node_uid(store, node, None)
}

/// [`client_config_for_node`], and when `uid` is given (the Node object's
/// UID now), a certificate that names another Node UID is refused: it was
/// issued to a Node since deleted, whatever its name.
pub fn client_config_for_node_uid(
    store: Arc<MaterialStore>,
    node: &str,
    uid: Option<&str>,
) -> Result<Arc<ClientConfig>, CertError> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(NodeServerVerifier {
            store: store.clone(),
            node: node.to_owned(),
            uid: uid.map(str::to_owned),
        }))
        .with_client_cert_resolver(Arc::new(CurrentCert(store)));
    config.alpn_protocols = vec![b"h2".to_vec()];
    // Same reason as the server: always verify the agent's current certificate.
    config.resumption = rustls::client::Resumption::disabled();
    Ok(Arc::new(config))
}

/// The proxy's client config for the Enrolment service: presents the
/// proxy's certificate (the agent answers no one else) and accepts any
/// server certificate, since an enrolling agent has none from the CA yet.
/// Nothing the agent says over it is trusted: the proxy verifies the
/// credential the agent relays and sends back only public data.
pub fn enrolment_client_config(store: Arc<MaterialStore>) -> Result<Arc<ClientConfig>, CertError> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider())))
        .with_client_cert_resolver(Arc::new(CurrentCert(store)));
    config.alpn_protocols = vec![b"h2".to_vec()];
    config.resumption = rustls::client::Resumption::disabled();
    Ok(Arc::new(config))
}

/// Accepts any server certificate, still checking that the server holds
/// its key (the handshake signature).
#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls_pki_types::CertificateDer<'_>,
        _intermediates: &[rustls_pki_types::CertificateDer<'_>],
        _server_name: &rustls_pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// ring's provider, preferring AES-128-GCM with SHA-256: handshakes hash
/// their transcript with SHA-256, which CPUs accelerate (ring's SHA-384 has
/// no such path), and a cold fan-out to a thousand agents is handshakes.
/// Every TLS 1.3 suite stays allowed.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider
        .cipher_suites
        .sort_by_key(|s| s.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    Arc::new(provider)
}

// === impl CurrentCert ===

impl ResolvesServerCert for CurrentCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current().certified_key.clone())
    }
}

impl ResolvesClientCert for CurrentCert {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current().certified_key.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}
