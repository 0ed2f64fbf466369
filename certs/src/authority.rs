//! The cluster CA: create one, or load it from its PEM files.

use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    PKCS_ECDSA_P256_SHA256, SanType,
};

use crate::identity::identities_in;
use crate::issue::{Validity, random_serial};
use crate::pem_files::read_to_string;
use crate::{CertError, TrustDomain};

/// The cluster CA: its certificate, its key and the trust domain it serves.
pub struct CertificateAuthority {
    pub(crate) cert_pem: String,
    pub(crate) key_pem: String,
    pub(crate) domain: TrustDomain,
    pub(crate) issuer: Issuer<'static, KeyPair>,
}

// === impl CertificateAuthority ===

impl CertificateAuthority {
    /// Creates a new self-signed CA for `domain`. The CA certificate carries
    /// the URI SAN `spiffe://<domain>` so later issuing needs no flag.
    pub fn create(domain: &TrustDomain, validity: Validity) -> Result<Self, CertError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        let serial = random_serial();
        // A unique name per CA: verifiers find issuers by name, so two CAs
        // with one name would make a foreign certificate look like a bad
        // signature instead of an unknown issuer.
        let tag: String = serial
            .as_ref()
            .iter()
            .take(4)
            .map(|b| format!("{b:02x}"))
            .collect();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("csi-scsi CA {domain} {tag}"));
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.subject_alt_names = vec![SanType::URI(
            format!("spiffe://{domain}")
                .try_into()
                .map_err(|_| bad_domain(domain))?,
        )];
        params.serial_number = Some(serial);
        validity.apply(&mut params);
        let cert = params.self_signed(&key)?;
        let cert_pem = cert.pem();
        let key_pem = key.serialize_pem();
        Ok(Self {
            issuer: Issuer::new(params, key),
            cert_pem,
            key_pem,
            domain: domain.clone(),
        })
    }

    /// Loads a CA written by [`CertificateAuthority::create`].
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Self, CertError> {
        let cert_pem = read_to_string(cert_path)?;
        let key_pem = read_to_string(key_path)?;
        let key = KeyPair::from_pem(&key_pem).map_err(|e| CertError::BadPem {
            path: key_path.to_owned(),
            reason: format!("not a usable private key: {e}"),
        })?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, key).map_err(|e| CertError::BadPem {
            path: cert_path.to_owned(),
            reason: format!("not a usable CA certificate: {e}"),
        })?;
        let domain = ca_trust_domain(&cert_pem).ok_or_else(|| CertError::BadPem {
            path: cert_path.to_owned(),
            reason: "the CA certificate carries no spiffe://<trust-domain> URI SAN".into(),
        })?;
        Ok(Self {
            cert_pem,
            key_pem,
            domain,
            issuer,
        })
    }

    /// The trust domain this CA serves.
    pub fn trust_domain(&self) -> &TrustDomain {
        &self.domain
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA private key, PEM. Handle as a secret.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }
}

impl std::fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("domain", &self.domain)
            .field("key", &"<redacted>")
            .finish()
    }
}

fn bad_domain(domain: &TrustDomain) -> CertError {
    CertError::InvalidName {
        what: "trust domain",
        value: domain.to_string(),
        reason: "cannot appear in a URI",
    }
}

/// Finds the `spiffe://<domain>` URI SAN of a CA certificate.
fn ca_trust_domain(cert_pem: &str) -> Option<TrustDomain> {
    let der = rustls_pki_types::CertificateDer::from_pem_slice(cert_pem.as_bytes()).ok()?;
    // Any domain parses the raw URI list; we only need the raw strings here.
    let probe = TrustDomain::new("x").ok()?;
    let (_, raw) = identities_in(&der, &probe);
    raw.iter()
        .find_map(|uri| uri.strip_prefix("spiffe://"))
        .filter(|rest| !rest.contains('/'))
        .and_then(|d| TrustDomain::new(d).ok())
}

use rustls_pki_types::pem::PemObject;
