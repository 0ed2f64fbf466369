//! Trust material for csi-scsi, in five lines:
//! - one CA per cluster signs every certificate (ECDSA P-256);
//! - an agent's server certificate names its node: URI SAN
//!   `spiffe://<trust-domain>/node/<node>` and DNS SAN `<node>`;
//! - the proxy's client certificate names `spiffe://<trust-domain>/proxy`;
//! - agents accept only the proxy; the proxy dialling node X accepts only X;
//! - files are reloaded when they change; there is never a plaintext fallback.
//!
//! This crate issues certificates (rcgen) and builds the rustls configs; it
//! never opens sockets.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod authority;
mod enrol;
mod error;
mod identity;
mod issue;
mod join_token;
mod material;
mod pem_files;
mod reload;
mod secret;
mod tls;
mod trust;
mod verify;

pub use authority::CertificateAuthority;
pub use enrol::{PendingKey, node_uid_of};
pub use error::CertError;
pub use identity::{Identity, TrustDomain, identity_of, validate_node_name};
pub use issue::{IssuedCertificate, SignedCertificate, Validity};
pub use join_token::{JoinTokenRefused, JoinTokens};
pub use material::{BundleMismatch, Material, MaterialPaths, Role};
pub use pem_files::{
    CA_CERT_FILE, CA_KEY_FILE, TLS_CERT_FILE, TLS_KEY_FILE, write_ca, write_issued,
    write_private_file,
};
pub use reload::MaterialStore;
pub use secret::{ca_manifests, secret_manifest};
pub use tls::{
    client_config_for_node, client_config_for_node_uid, enrolment_client_config, server_config,
};
pub use trust::{earliest_expiry, trust_digest};
pub use verify::{IdentityRejected, verify_proxy_chain};

/// Installs ring as the process-wide rustls crypto provider (idempotent).
pub fn install_crypto_provider() {
    // Fails only when a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
