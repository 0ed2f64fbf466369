//! The cluster CA: create one, or load it from its PEM files.

use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    PKCS_ECDSA_P256_SHA256, PublicKeyData, SanType,
};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

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

    /// Loads a CA written by [`CertificateAuthority::create`]. `ca.crt` may
    /// hold several certificates (a CA rotation): the first is the one that
    /// signs and must match the key; all of them are the trust bundle
    /// handed to agents.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Self, CertError> {
        let cert_pem = read_to_string(cert_path)?;
        let key_pem = read_to_string(key_path)?;
        let key = KeyPair::from_pem(&key_pem).map_err(|e| CertError::BadPem {
            path: key_path.to_owned(),
            reason: format!("not a usable private key: {e}"),
        })?;
        let bad_cert = |reason: String| CertError::BadPem {
            path: cert_path.to_owned(),
            reason,
        };
        // Every certificate of the bundle must parse (agents get all of
        // them as their trust); the first signs.
        let bundle = crate::material::parse_certs(cert_path, cert_pem.as_bytes())?;
        let signer = &bundle[0];
        let (_, parsed) = x509_parser::parse_x509_certificate(signer)
            .map_err(|e| bad_cert(format!("not a usable CA certificate: {e}")))?;
        // Signing with a key that is not the first certificate's would hand
        // out certificates nobody can verify.
        if parsed.tbs_certificate.subject_pki.raw != key.subject_public_key_info().as_slice() {
            return Err(CertError::KeyMismatch {
                cert: cert_path.to_owned(),
                key: key_path.to_owned(),
            });
        }
        let issuer = Issuer::from_ca_cert_der(signer, key)
            .map_err(|e| bad_cert(format!("not a usable CA certificate: {e}")))?;
        let domain = ca_trust_domain(&cert_pem).ok_or_else(|| {
            bad_cert("the CA certificate carries no spiffe://<trust-domain> URI SAN".into())
        })?;
        Ok(Self {
            cert_pem,
            key_pem,
            domain,
            issuer,
        })
    }

    /// Adds the CA certificates in `pem` (read from `path`) to the trust
    /// bundle, after the signing CA's: steps 1 and 2 of a CA rotation.
    pub fn also_trusting(mut self, pem: &str, path: &Path) -> Result<Self, CertError> {
        let certs = crate::material::parse_certs(path, pem.as_bytes())?;
        let held: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
                .filter_map(Result::ok)
                .collect();
        if certs.iter().all(|c| held.contains(c)) {
            return Ok(self);
        }
        if !self.cert_pem.ends_with('\n') {
            self.cert_pem.push('\n');
        }
        self.cert_pem.push_str(pem.trim());
        self.cert_pem.push('\n');
        Ok(self)
    }

    /// The digest of the trust bundle ([`crate::trust_digest`]): what an
    /// agent enrolled by this CA reports while it trusts exactly this.
    pub fn trust_digest(&self) -> String {
        crate::trust_digest(self.cert_pem.as_bytes()).unwrap_or_default()
    }

    /// When the signing CA's certificate expires.
    pub fn not_after(&self) -> std::time::SystemTime {
        CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .next()
            .and_then(Result::ok)
            .and_then(|c| crate::material::serial_and_expiry(&c).map(|(_, t)| t))
            .unwrap_or(std::time::SystemTime::UNIX_EPOCH)
    }

    /// The trust domain this CA serves.
    pub fn trust_domain(&self) -> &TrustDomain {
        &self.domain
    }

    /// The trust bundle, PEM: the signing CA's certificate first, then any
    /// other CA trusted during a rotation.
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
