//! The agent's half of enrolment: a fresh key pair and its certificate
//! signing request, and the checks on the certificate that comes back.
//! The signer's half is [`crate::CertificateAuthority::sign_agent_csr`].

use rcgen::{CertificateParams, DnType, KeyPair, PKCS_ECDSA_P256_SHA256};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use crate::issue::NODE_UID_URI_PREFIX;
use crate::{CertError, Identity, IssuedCertificate};

/// An agent's new key pair, waiting for its certificate. The private key
/// stays in memory until [`PendingKey::accept`] pairs it with its
/// certificate.
pub struct PendingKey {
    node: String,
    key: KeyPair,
    csr_pem: String,
}

impl PendingKey {
    /// A new ECDSA P-256 key and a CSR for it naming `node` (the signer
    /// uses only the public key; the names are its own).
    pub fn generate(node: &str) -> Result<Self, CertError> {
        crate::validate_node_name(node)?;
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::new(vec![node.to_owned()])?;
        params.distinguished_name.push(
            DnType::CommonName,
            Identity::Node(node.to_owned()).to_string(),
        );
        let csr_pem = params.serialize_request(&key)?.pem()?;
        Ok(Self {
            node: node.to_owned(),
            key,
            csr_pem,
        })
    }

    /// The certificate signing request, PEM.
    pub fn csr_pem(&self) -> &str {
        &self.csr_pem
    }

    /// Pairs the key with `cert_pem` if the certificate is for this very
    /// key; the chain, validity and identity are checked when it is
    /// installed ([`crate::MaterialStore::install`]).
    pub fn accept(&self, cert_pem: &str, ca_pem: &str) -> Result<IssuedCertificate, CertError> {
        let bad = |reason: String| CertError::BadPem {
            path: "<enrolment>".into(),
            reason,
        };
        let der = CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| bad(format!("the signed certificate is not PEM: {e}")))?;
        let (_, cert) = x509_parser::parse_x509_certificate(&der)
            .map_err(|e| bad(format!("the signed certificate does not parse: {e}")))?;
        if cert.public_key().subject_public_key.data.as_ref() != self.key.public_key_raw() {
            return Err(bad(
                "the signed certificate is for another key than the pending one".into(),
            ));
        }
        Ok(IssuedCertificate {
            identity: Identity::Node(self.node.clone()),
            cert_pem: cert_pem.to_owned(),
            key_pem: self.key.serialize_pem(),
            ca_pem: ca_pem.to_owned(),
        })
    }
}

impl std::fmt::Debug for PendingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingKey")
            .field("node", &self.node)
            .field("key", &"<redacted>")
            .finish()
    }
}

/// The Node UID a DER certificate names (`urn:csi-scsi:node-uid:<uid>`),
/// if it names exactly one.
pub fn node_uid_of(der: &[u8]) -> Option<String> {
    node_uid_from(&crate::identity::uris_in(der))
}

/// [`node_uid_of`] over URIs already read.
pub(crate) fn node_uid_from(uris: &[String]) -> Option<String> {
    let mut uids = uris
        .iter()
        .filter_map(|uri| uri.strip_prefix(NODE_UID_URI_PREFIX));
    let first = uids.next()?;
    uids.next().is_none().then(|| first.to_owned())
}
