//! rustls verifiers that demand the expected peer identity on top of the
//! usual chain checks, reading the current CA from the [`MaterialStore`] so
//! rotated roots apply to the next handshake.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, OtherError, SignatureScheme,
};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use crate::identity::{identities_from, identities_in, uris_in};
use crate::{Identity, MaterialStore};

/// Why a peer with a valid chain was still refused.
#[derive(thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdentityRejected {
    /// The agent API accepts only the proxy; this client is someone else.
    #[error(
        "client identity {presented} is not the proxy ({expected}): only the proxy may call the agent API"
    )]
    NotProxy {
        /// The identity required.
        expected: String,
        /// What the client presented.
        presented: String,
    },
    /// The certificate names the node dialled, but a Node object of that
    /// name that has since been deleted.
    #[error(
        "the certificate of {node} was issued to Node UID {presented}, but node {node} is now UID {expected}: the Node was deleted and created again; its agent must enrol afresh"
    )]
    StaleNode {
        /// The node name.
        node: String,
        /// The Node's UID now.
        expected: String,
        /// The UID the certificate names.
        presented: String,
    },
    /// The proxy dialled one node and another answered.
    #[error("dialled {expected} but the peer's certificate names {presented}")]
    WrongNode {
        /// The identity required.
        expected: String,
        /// What the server presented.
        presented: String,
    },
}

// rustls prints the error inside `CertificateError::Other` with `Debug`;
// make that the sentence an operator should read.
impl std::fmt::Debug for IdentityRejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// Checks a client's certificate chain (leaf first) as the agent API's
/// handshake does, against the trust material current *now*: from the CA,
/// unexpired, naming exactly the proxy. The agent runs it on every request,
/// so a proxy certificate rotated out (or expired) stops working on a
/// connection opened before, not only on the next handshake. The chain
/// last accepted against the current material is remembered
/// ([`AcceptedChain`]), so the requests of one connection pay for one
/// signature check, not one each.
pub fn verify_proxy_chain(
    store: &Arc<MaterialStore>,
    chain: &[CertificateDer<'_>],
) -> Result<(), rustls::Error> {
    let (leaf, intermediates) = chain
        .split_first()
        .ok_or(rustls::Error::NoCertificatesPresented)?;
    let material = store.current();
    let now = UnixTime::now();
    if material
        .accepted_proxy
        .load()
        .as_ref()
        .is_some_and(|accepted| accepted.covers(chain, now))
    {
        return Ok(());
    }
    verify_proxy(&material, store.trust_domain(), leaf, intermediates, now)?;
    if intermediates.is_empty()
        && let Some(accepted) = AcceptedChain::of(leaf)
    {
        material.accepted_proxy.store(Some(Arc::new(accepted)));
    }
    Ok(())
}

/// A client chain [`verify_proxy_chain`] accepted against one
/// [`crate::Material`]: the leaf, alone (a chain with intermediates is
/// never remembered), and its validity window. Against the same material
/// (a rotation loads a new one, which remembers nothing), a byte-identical
/// leaf inside that window gets the answer the full check gave: nothing
/// else goes into it.
#[derive(Debug)]
pub(crate) struct AcceptedChain {
    leaf: Vec<u8>,
    /// notBefore and notAfter, seconds since the epoch, both valid (as
    /// webpki checks them).
    valid: std::ops::RangeInclusive<u64>,
}

impl AcceptedChain {
    /// `leaf` and its validity, or `None` when it does not parse.
    fn of(leaf: &CertificateDer<'_>) -> Option<Self> {
        let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref()).ok()?;
        let validity = cert.validity();
        let not_before = u64::try_from(validity.not_before.timestamp()).ok()?;
        let not_after = u64::try_from(validity.not_after.timestamp()).ok()?;
        Some(Self {
            leaf: leaf.as_ref().to_vec(),
            valid: not_before..=not_after,
        })
    }

    /// Whether `chain` is this very leaf alone, at a time it is valid.
    fn covers(&self, chain: &[CertificateDer<'_>], now: UnixTime) -> bool {
        matches!(chain, [leaf] if leaf.as_ref() == self.leaf.as_slice())
            && self.valid.contains(&now.as_secs())
    }
}

/// The proxy's client certificate checked against `material`: the chain
/// to its CA, and exactly the proxy's identity in `domain`.
fn verify_proxy(
    material: &crate::Material,
    domain: &crate::TrustDomain,
    end_entity: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
    now: UnixTime,
) -> Result<ClientCertVerified, rustls::Error> {
    let (ids, raw) = identities_in(end_entity, domain);
    let presented = describe(&raw);
    let rejected = || {
        other(IdentityRejected::NotProxy {
            expected: domain.uri(&Identity::Proxy),
            presented: presented.clone(),
        })
    };
    match material
        .client_verifier
        .verify_client_cert(end_entity, intermediates, now)
    {
        // Exactly the proxy: a certificate naming more than one
        // identity is no one's.
        Ok(verified) if raw.len() == 1 && ids == [Identity::Proxy] => Ok(verified),
        Ok(_) => Err(rejected()),
        // An agent certificate lacks the client-auth usage; say who it is.
        Err(rustls::Error::InvalidCertificate(
            CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. },
        )) if !ids.contains(&Identity::Proxy) => Err(rejected()),
        Err(e) => Err(e),
    }
}

/// Server side of the agent API: a client certificate from the CA that
/// names the proxy, nothing else.
#[derive(Debug)]
pub(crate) struct ProxyClientVerifier {
    pub(crate) store: Arc<MaterialStore>,
}

/// Client side (the proxy) dialling one node: a server certificate from the
/// CA that names exactly that node.
#[derive(Debug)]
pub(crate) struct NodeServerVerifier {
    pub(crate) store: Arc<MaterialStore>,
    pub(crate) node: String,
    /// The Node object's UID now, when known.
    pub(crate) uid: Option<String>,
}

// === impl ProxyClientVerifier ===

impl ClientCertVerifier for ProxyClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // Hints are optional; the roots can change under us, so send none.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        verify_proxy(
            &self.store.current(),
            self.store.trust_domain(),
            end_entity,
            intermediates,
            now,
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.store
            .current()
            .client_verifier
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.store
            .current()
            .client_verifier
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.store
            .current()
            .client_verifier
            .supported_verify_schemes()
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }
}

// === impl NodeServerVerifier ===

impl ServerCertVerifier for NodeServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let material = self.store.current();
        let domain = self.store.trust_domain();
        let expected = Identity::Node(self.node.clone());
        // One parse for both names looked for (a cold fan-out to a
        // thousand agents is a thousand of these).
        let uris = uris_in(end_entity);
        let (ids, raw) = identities_from(&uris, domain);
        let wrong_node = || {
            other(IdentityRejected::WrongNode {
                expected: domain.uri(&expected),
                presented: describe(&raw),
            })
        };
        // Check against the node we meant to reach, whatever name the
        // connector put in SNI.
        let name = ServerName::try_from(self.node.clone()).map_err(|_| wrong_node())?;
        match material.server_verifier.verify_server_cert(
            end_entity,
            intermediates,
            &name,
            ocsp_response,
            now,
        ) {
            // Exactly the node dialled: a certificate naming several nodes
            // would let one node answer for another.
            Ok(verified) if raw.len() == 1 && ids == [expected.clone()] => {
                // A certificate without a UID (issued by hand) names no
                // Node object in particular; one with a UID, exactly one.
                match (&self.uid, crate::enrol::node_uid_from(&uris)) {
                    (Some(now), Some(issued)) if *now != issued => {
                        Err(other(IdentityRejected::StaleNode {
                            node: self.node.clone(),
                            expected: now.clone(),
                            presented: issued,
                        }))
                    }
                    _ => Ok(verified),
                }
            }
            Ok(_) => Err(wrong_node()),
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Err(wrong_node()),
            Err(e) => Err(e),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.store
            .current()
            .server_verifier
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.store
            .current()
            .server_verifier
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.store
            .current()
            .server_verifier
            .supported_verify_schemes()
    }
}

fn other(e: IdentityRejected) -> rustls::Error {
    rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(e))))
}

fn describe(raw: &[String]) -> String {
    if raw.is_empty() {
        "no spiffe:// identity".into()
    } else {
        raw.join(", ")
    }
}
