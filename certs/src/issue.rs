//! Issue agent and proxy certificates from the cluster CA.

use rcgen::{
    CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair, KeyUsagePurpose,
    PKCS_ECDSA_P256_SHA256, SanType, SerialNumber,
};
use time::{Duration, OffsetDateTime};

use crate::identity::validate_node_name;
use crate::{CertError, CertificateAuthority, Identity};

/// When a certificate is valid.
#[derive(Clone, Copy, Debug)]
pub struct Validity {
    /// First instant of validity.
    pub not_before: OffsetDateTime,
    /// Last instant of validity.
    pub not_after: OffsetDateTime,
}

/// A freshly issued certificate with its key and the CA that signed it.
pub struct IssuedCertificate {
    /// Whose certificate it is.
    pub identity: Identity,
    /// The leaf certificate, PEM.
    pub cert_pem: String,
    /// The leaf's private key, PEM. Handle as a secret.
    pub key_pem: String,
    /// The CA certificate, PEM.
    pub ca_pem: String,
}

// === impl Validity ===

impl Validity {
    /// Valid from five minutes ago (clock skew between nodes) for `days`.
    pub fn days(days: u32) -> Self {
        let now = OffsetDateTime::now_utc();
        Self {
            not_before: now - Duration::minutes(5),
            not_after: now + Duration::days(i64::from(days)),
        }
    }

    /// Valid from five minutes ago for `lifetime` from now: the short-lived
    /// certificates of enrolment.
    pub fn lasting(lifetime: std::time::Duration) -> Self {
        let now = OffsetDateTime::now_utc();
        let lifetime = Duration::try_from(lifetime).unwrap_or(Duration::days(365));
        Self {
            not_before: now - Duration::minutes(5),
            not_after: now + lifetime,
        }
    }

    pub(crate) fn apply(&self, params: &mut CertificateParams) {
        params.not_before = self.not_before;
        params.not_after = self.not_after;
    }
}

// === impl CertificateAuthority (issuing) ===

impl CertificateAuthority {
    /// Issues a certificate for `identity`: an agent's server certificate
    /// (URI and DNS SAN naming the node, server-auth usage) or the proxy's
    /// client certificate (URI SAN, client-auth usage).
    pub fn issue(
        &self,
        identity: &Identity,
        validity: Validity,
    ) -> Result<IssuedCertificate, CertError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let params = self.params_for(identity, validity)?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(IssuedCertificate {
            identity: identity.clone(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            ca_pem: self.cert_pem.clone(),
        })
    }

    /// Signs an agent's certificate for the public key of `csr_pem` (a
    /// PKCS#10 request, PEM), naming `node` and, when given, the Node
    /// object's UID (URI SAN `urn:csi-scsi:node-uid:<uid>`), so that a
    /// Node deleted and created again under the same name does not take
    /// over the old certificate. Nothing else in the request is used: the
    /// names come from what the signer verified.
    pub fn sign_agent_csr(
        &self,
        csr_pem: &str,
        node: &str,
        node_uid: Option<&str>,
        validity: Validity,
    ) -> Result<SignedCertificate, CertError> {
        let csr = rcgen::CertificateSigningRequestParams::from_pem(csr_pem)?;
        let mut params = self.params_for(&Identity::Node(node.to_owned()), validity)?;
        if let Some(uid) = node_uid {
            let uri = node_uid_uri(uid);
            params
                .subject_alt_names
                .push(SanType::URI(uri.as_str().try_into().map_err(|_| {
                    CertError::InvalidName {
                        what: "node UID",
                        value: uid.to_owned(),
                        reason: "cannot appear in a URI",
                    }
                })?));
        }
        let cert = params.signed_by(&csr.public_key, &self.issuer)?;
        let (serial, not_after) =
            crate::material::serial_and_expiry(cert.der()).ok_or_else(|| CertError::BadPem {
                path: "<signed certificate>".into(),
                reason: "does not parse".into(),
            })?;
        Ok(SignedCertificate {
            cert_pem: cert.pem(),
            ca_pem: self.cert_pem.clone(),
            serial,
            not_after,
        })
    }

    fn params_for(
        &self,
        identity: &Identity,
        validity: Validity,
    ) -> Result<CertificateParams, CertError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        let uri = self.domain.uri(identity);
        let invalid = |what, value: &str| CertError::InvalidName {
            what,
            value: value.to_owned(),
            reason: "cannot appear in a certificate",
        };
        params.subject_alt_names = vec![SanType::URI(
            uri.as_str().try_into().map_err(|_| invalid("URI", &uri))?,
        )];
        params
            .distinguished_name
            .push(DnType::CommonName, identity.to_string());
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        match identity {
            Identity::Node(node) => {
                validate_node_name(node)?;
                params.subject_alt_names.push(SanType::DnsName(
                    node.as_str()
                        .try_into()
                        .map_err(|_| invalid("node name", node))?,
                ));
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
            }
            Identity::Proxy => {
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            }
        }
        params.serial_number = Some(random_serial());
        validity.apply(&mut params);
        Ok(params)
    }
}

/// The URI SAN that names a Node object's UID.
pub(crate) fn node_uid_uri(uid: &str) -> String {
    format!("{NODE_UID_URI_PREFIX}{uid}")
}

/// Prefix of the URI SAN naming a Node's UID.
pub(crate) const NODE_UID_URI_PREFIX: &str = "urn:csi-scsi:node-uid:";

/// A certificate signed for a key the signer never saw (an agent's CSR).
#[derive(Clone, Debug)]
pub struct SignedCertificate {
    /// The leaf certificate, PEM.
    pub cert_pem: String,
    /// The CA certificate, PEM.
    pub ca_pem: String,
    /// Its serial number, lower-case hex.
    pub serial: String,
    /// When it expires.
    pub not_after: std::time::SystemTime,
}

impl std::fmt::Debug for IssuedCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedCertificate")
            .field("identity", &self.identity)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// A random positive 128-bit serial number.
pub(crate) fn random_serial() -> SerialNumber {
    let mut bytes = [0u8; 16];
    // The ring provider's system RNG; failure means the OS has no entropy
    // source at all, and then no key could be generated either.
    if rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut bytes)
        .is_err()
    {
        let nanos = OffsetDateTime::now_utc().unix_timestamp_nanos();
        bytes = nanos.to_be_bytes();
    }
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    SerialNumber::from_slice(&bytes)
}
