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
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(IssuedCertificate {
            identity: identity.clone(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            ca_pem: self.cert_pem.clone(),
        })
    }
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
