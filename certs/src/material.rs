//! One consistent set of trust material (own certificate and key, CA
//! roots) loaded from files and checked before use.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

use crate::identity::identities_in;
use crate::pem_files::read_bytes;
use crate::{CA_CERT_FILE, CertError, Identity, TLS_CERT_FILE, TLS_KEY_FILE, TrustDomain};

/// Which side of the agent API a process is on; decides what its own
/// certificate must say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// The agent on `node`: serves the agent API with a server certificate.
    Agent {
        /// The node this agent runs on.
        node: String,
    },
    /// The proxy: calls agents with a client certificate.
    Proxy,
}

/// Where the three PEM files live.
#[derive(Clone, Debug)]
pub struct MaterialPaths {
    /// Own certificate chain, leaf first.
    pub cert: PathBuf,
    /// Own private key.
    pub key: PathBuf,
    /// CA certificate(s) to trust; several during a CA rotation.
    pub ca: PathBuf,
}

/// Why the proxy may not hand agents a CA bundle yet
/// ([`Material::can_hand_out`]).
#[derive(Debug, thiserror::Error)]
pub enum BundleMismatch {
    /// The proxy's own `ca.crt` lacks the signing CA.
    #[error(
        "the proxy does not trust the signing CA yet (its own ca.crt lacks it): it could not verify the certificates it would sign"
    )]
    SignerUntrusted,
    /// The proxy's own certificate does not chain to the bundle.
    #[error(
        "the proxy's own certificate does not chain to the signer's bundle: agents given it would refuse the proxy ({0})"
    )]
    OwnOutside(String),
    /// The bundle does not parse.
    #[error("the signer's bundle is unusable: {0}")]
    Unusable(String),
}

/// Loaded, checked trust material.
pub struct Material {
    pub(crate) certified_key: Arc<CertifiedKey>,
    pub(crate) client_verifier: Arc<dyn ClientCertVerifier>,
    pub(crate) server_verifier: Arc<WebPkiServerVerifier>,
    identity: Identity,
    serial: String,
    not_before: SystemTime,
    not_after: SystemTime,
    /// The Node UID our own certificate names, if any.
    node_uid: Option<String>,
    raw: [Vec<u8>; 3],
    /// False for the stand-in an agent serves with while it enrols.
    enrolled: bool,
    /// The proxy chain the agent API last accepted against this material.
    pub(crate) accepted_proxy: arc_swap::ArcSwapOption<crate::verify::AcceptedChain>,
}

// === impl Role ===

impl Role {
    /// The identity this role's certificate must carry.
    pub fn identity(&self) -> Identity {
        match self {
            Self::Agent { node } => Identity::Node(node.clone()),
            Self::Proxy => Identity::Proxy,
        }
    }
}

// === impl MaterialPaths ===

impl MaterialPaths {
    /// `tls.crt`, `tls.key` and `ca.crt` in `dir` (a mounted Secret).
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            cert: dir.join(TLS_CERT_FILE),
            key: dir.join(TLS_KEY_FILE),
            ca: dir.join(CA_CERT_FILE),
        }
    }

    pub(crate) fn read_raw(&self) -> Result<[Vec<u8>; 3], CertError> {
        Ok([
            read_bytes(&self.cert)?,
            read_bytes(&self.key)?,
            read_bytes(&self.ca)?,
        ])
    }
}

// === impl Material ===

impl Material {
    /// Reads and checks the files: key matches certificate, certificate
    /// chains to the CA and is within its validity, and names `role`.
    pub fn load(
        paths: &MaterialPaths,
        role: &Role,
        domain: &TrustDomain,
    ) -> Result<Self, CertError> {
        Self::from_raw(paths, paths.read_raw()?, role, domain)
    }

    pub(crate) fn from_raw(
        paths: &MaterialPaths,
        raw: [Vec<u8>; 3],
        role: &Role,
        domain: &TrustDomain,
    ) -> Result<Self, CertError> {
        let [cert_pem, key_pem, ca_pem] = &raw;
        let chain = parse_certs(&paths.cert, cert_pem)?;
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| CertError::BadPem {
            path: paths.key.clone(),
            reason: format!("no private key: {e}"),
        })?;
        let (client_verifier, server_verifier) = verifiers(&paths.ca, ca_pem)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mismatch = || CertError::KeyMismatch {
            cert: paths.cert.clone(),
            key: paths.key.clone(),
        };
        let certified_key =
            CertifiedKey::from_der(chain.clone(), key, &provider).map_err(|e| match e {
                rustls::Error::InconsistentKeys(_) => mismatch(),
                other => CertError::Rustls(other),
            })?;
        certified_key.keys_match().map_err(|_| mismatch())?;

        let (leaf, intermediates) = chain.split_first().ok_or_else(|| CertError::BadPem {
            path: paths.cert.clone(),
            reason: "no certificate".into(),
        })?;
        let expected = role.identity();
        let (ids, raw_ids) = identities_in(leaf, domain);
        if !ids.contains(&expected) {
            return Err(CertError::WrongIdentity {
                path: paths.cert.clone(),
                expected: domain.uri(&expected),
                found: if raw_ids.is_empty() {
                    "no spiffe:// identity".into()
                } else {
                    raw_ids.join(", ")
                },
            });
        }
        let now = UnixTime::now();
        let checked = match role {
            Role::Agent { node } => {
                let name =
                    ServerName::try_from(node.clone()).map_err(|_| CertError::InvalidName {
                        what: "node name",
                        value: node.clone(),
                        reason: "not a DNS name",
                    })?;
                server_verifier
                    .verify_server_cert(leaf, intermediates, &name, &[], now)
                    .map(|_| ())
            }
            Role::Proxy => client_verifier
                .verify_client_cert(leaf, intermediates, now)
                .map(|_| ()),
        };
        checked.map_err(|source| CertError::Untrusted {
            path: paths.cert.clone(),
            ca: paths.ca.clone(),
            source,
        })?;
        let (serial, not_after) = serial_and_expiry(leaf).ok_or_else(|| CertError::BadPem {
            path: paths.cert.clone(),
            reason: "certificate does not parse".into(),
        })?;
        let not_before = not_before_of(leaf).unwrap_or(SystemTime::UNIX_EPOCH);
        Ok(Self {
            certified_key: Arc::new(certified_key),
            client_verifier,
            server_verifier,
            identity: expected,
            serial,
            not_before,
            not_after,
            node_uid: crate::node_uid_of(leaf),
            raw,
            enrolled: true,
            accepted_proxy: arc_swap::ArcSwapOption::empty(),
        })
    }

    /// What an agent with no usable certificate serves with while the
    /// proxy enrols it: a throwaway self-signed certificate no one trusts
    /// (the proxy's enrolment client alone accepts it), and the CA in `ca`,
    /// so only the proxy's client certificate is accepted.
    pub fn enrolling(ca: &Path, role: &Role) -> Result<Self, CertError> {
        let ca_pem = read_bytes(ca)?;
        let (client_verifier, server_verifier) = verifiers(ca, &ca_pem)?;
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            format!("csi-scsi {} enrolling", role.identity()),
        );
        let cert = params.self_signed(&key)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certified_key = CertifiedKey::from_der(
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            &provider,
        )?;
        Ok(Self {
            certified_key: Arc::new(certified_key),
            client_verifier,
            server_verifier,
            identity: role.identity(),
            serial: String::new(),
            not_before: SystemTime::UNIX_EPOCH,
            not_after: SystemTime::UNIX_EPOCH,
            node_uid: None,
            raw: [Vec::new(), Vec::new(), ca_pem],
            enrolled: false,
            accepted_proxy: arc_swap::ArcSwapOption::empty(),
        })
    }

    /// Whether this is a real certificate from the CA (not the stand-in of
    /// an agent still enrolling).
    pub fn is_enrolled(&self) -> bool {
        self.enrolled
    }

    /// The identity of our own certificate.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// Serial number of our own certificate, lower-case hex.
    pub fn serial(&self) -> &str {
        &self.serial
    }

    /// When our own certificate became valid.
    pub fn not_before(&self) -> SystemTime {
        self.not_before
    }

    /// The Node UID our own certificate names, if any.
    pub fn node_uid(&self) -> Option<&str> {
        self.node_uid.as_deref()
    }

    /// When our own certificate expires.
    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    /// Time left before our own certificate expires (zero once expired).
    pub fn remaining(&self) -> Duration {
        self.not_after
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO)
    }

    /// The digest of the CA certificates this material trusts
    /// ([`crate::trust_digest`]).
    pub fn trust_digest(&self) -> Option<String> {
        crate::trust_digest(&self.raw[2])
    }

    /// Time left before the first CA this material trusts expires (zero
    /// once expired or when none parses).
    pub fn trust_remaining(&self) -> Duration {
        crate::earliest_expiry(&self.raw[2])
            .and_then(|t| t.duration_since(SystemTime::now()).ok())
            .unwrap_or(Duration::ZERO)
    }

    /// Whether the proxy holding this material may hand agents `bundle`
    /// (the signer's `ca.crt`, its first certificate the signing CA): it
    /// must trust the signing CA (or it could not verify the certificates
    /// it signs), and its own certificate must chain to the bundle (or the
    /// agents given it would refuse the proxy). During a CA rotation the
    /// signer's files and the proxy's own can change at different moments.
    pub fn can_hand_out(&self, bundle: &[u8]) -> Result<(), BundleMismatch> {
        let path = Path::new("the signer's ca.crt");
        let certs =
            parse_certs(path, bundle).map_err(|e| BundleMismatch::Unusable(e.to_string()))?;
        let trusted = parse_certs(path, &self.raw[2]).unwrap_or_default();
        if !trusted.contains(&certs[0]) {
            return Err(BundleMismatch::SignerUntrusted);
        }
        let (client_verifier, _) =
            verifiers(path, bundle).map_err(|e| BundleMismatch::Unusable(e.to_string()))?;
        let (leaf, intermediates) = self
            .certified_key
            .cert
            .split_first()
            .ok_or_else(|| BundleMismatch::OwnOutside("no certificate".into()))?;
        client_verifier
            .verify_client_cert(leaf, intermediates, UnixTime::now())
            .map(|_| ())
            .map_err(|e| BundleMismatch::OwnOutside(e.to_string()))
    }

    pub(crate) fn same_files(&self, raw: &[Vec<u8>; 3]) -> bool {
        &self.raw == raw
    }
}

impl std::fmt::Debug for Material {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Material")
            .field("identity", &self.identity)
            .field("serial", &self.serial)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

/// The client and server verifiers that trust the CA certificates in `pem`.
fn verifiers(
    path: &Path,
    pem: &[u8],
) -> Result<(Arc<dyn ClientCertVerifier>, Arc<WebPkiServerVerifier>), CertError> {
    let roots = parse_certs(path, pem)?;
    let mut store = RootCertStore::empty();
    for root in roots {
        store.add(root).map_err(|e| CertError::BadPem {
            path: path.to_owned(),
            reason: format!("unusable CA certificate: {e}"),
        })?;
    }
    let store = Arc::new(store);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let unusable = |e: rustls::server::VerifierBuilderError| CertError::BadPem {
        path: path.to_owned(),
        reason: format!("cannot build a verifier from the CA: {e}"),
    };
    let client_verifier =
        WebPkiClientVerifier::builder_with_provider(store.clone(), provider.clone())
            .build()
            .map_err(unusable)?;
    let server_verifier = WebPkiServerVerifier::builder_with_provider(store, provider)
        .build()
        .map_err(unusable)?;
    Ok((client_verifier, server_verifier))
}

/// Every certificate in `pem` (read from `path`); at least one.
pub(crate) fn parse_certs(
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, CertError> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| CertError::BadPem {
            path: path.to_owned(),
            reason: format!("malformed PEM: {e}"),
        })?;
    if certs.is_empty() {
        return Err(CertError::BadPem {
            path: path.to_owned(),
            reason: "no CERTIFICATE block".into(),
        });
    }
    Ok(certs)
}

/// Serial number (hex) and notAfter of a DER certificate.
pub(crate) fn serial_and_expiry(der: &[u8]) -> Option<(String, SystemTime)> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let serial = cert.tbs_certificate.raw_serial_as_string().replace(':', "");
    let secs = cert.validity().not_after.timestamp();
    let not_after = SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).ok()?);
    Some((serial, not_after))
}

/// notBefore of a DER certificate.
fn not_before_of(der: &[u8]) -> Option<SystemTime> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let secs = cert.validity().not_before.timestamp();
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).ok()?))
}
