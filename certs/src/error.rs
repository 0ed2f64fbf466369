//! Errors of the certs crate.

use std::path::PathBuf;

/// What went wrong while issuing, loading or checking trust material.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A PEM file held no usable certificate or key.
    #[error("{path}: {reason}")]
    BadPem {
        /// The file.
        path: PathBuf,
        /// What was missing or malformed.
        reason: String,
    },
    /// rcgen refused to build a certificate.
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    /// rustls refused the material (for example a key that does not match).
    #[error("TLS material rejected: {0}")]
    Rustls(#[from] rustls::Error),
    /// A name that cannot appear in a certificate.
    #[error("invalid {what} {value:?}: {reason}")]
    InvalidName {
        /// Which name (node, trust domain).
        what: &'static str,
        /// The rejected value.
        value: String,
        /// Why.
        reason: &'static str,
    },
    /// Our own certificate does not carry the identity this process needs.
    #[error("certificate {path} names {found}, expected {expected}")]
    WrongIdentity {
        /// The certificate file.
        path: PathBuf,
        /// The identity required.
        expected: String,
        /// The identity found.
        found: String,
    },
    /// Our own certificate does not chain to the CA, or has expired.
    #[error("certificate {path} is not valid against {ca}: {source}")]
    Untrusted {
        /// The certificate file.
        path: PathBuf,
        /// The CA file.
        ca: PathBuf,
        /// Why rustls refused it.
        #[source]
        source: rustls::Error,
    },
    /// The private key does not belong to the certificate.
    #[error("private key {key} does not match certificate {cert}")]
    KeyMismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
    },
}
