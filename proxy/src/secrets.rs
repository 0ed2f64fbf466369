//! CHAP credentials from Secret references. Targets name a Secret, never
//! the credentials. With the Kubernetes backend the Secret is read through
//! the API when it is needed ([`KubeSecrets`]), from one namespace only
//! (`--chap-secret-namespace`, by default the driver's). Embedded mode reads a directory laid out like mounted Secrets:
//! `<dir>/<secret-name>/{username,password,mutual_username,mutual_password}`.
//! No error here ever carries a Secret's content.

use std::path::PathBuf;

use async_trait::async_trait;
use csi_scsi_proto::agent::ChapCredentials;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

use crate::device::SecretRef;
use crate::resources::is_dns_subdomain;

/// Why a CHAP Secret could not be used. Names the Secret, never its content.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// The reference names a namespace other than the CHAP Secrets' one,
    /// which the proxy may not read (and must not: a target would borrow
    /// another tenant's Secret).
    #[error(
        "CHAP Secret {namespace}/{name} is outside the CHAP Secrets' namespace {driver}: the proxy reads CHAP Secrets only there (--chap-secret-namespace); create the Secret in {driver} and point chapSecretRef at it"
    )]
    ForeignNamespace {
        /// The Secret name.
        name: String,
        /// The namespace the reference names.
        namespace: String,
        /// The namespace the proxy reads CHAP Secrets from.
        driver: String,
    },
    /// Not a valid Secret name.
    #[error("CHAP Secret name {0:?} is not a valid object name")]
    InvalidName(String),
    /// No such Secret (yet).
    #[error("CHAP Secret {0} does not exist; create it (keys username, password) and retry")]
    NotFound(String),
    /// The Secret lacks a key the credentials need.
    #[error("CHAP Secret {secret} has no key {key} (or it is not UTF-8)")]
    MissingKey {
        /// The Secret.
        secret: String,
        /// The key.
        key: &'static str,
    },
    /// The Secret could not be read (API error, file system error).
    #[error("CHAP Secret {secret} could not be read: {reason}")]
    Unreadable {
        /// The Secret.
        secret: String,
        /// Why.
        reason: String,
    },
    /// No source of Secrets is configured.
    #[error("CHAP Secret {0} is referenced, but no secret source is configured (--secrets-dir)")]
    NoSource(String),
}

/// Where Secret contents come from.
#[async_trait]
pub trait SecretSource: Send + Sync {
    /// The CHAP credentials in `secret`.
    async fn chap(&self, secret: &SecretRef) -> Result<ChapCredentials, SecretError>;
}

/// Secrets read through the Kubernetes API, in one namespace only.
pub struct KubeSecrets {
    api: Api<Secret>,
    namespace: String,
}

impl KubeSecrets {
    /// Reads Secrets of `namespace` (`--chap-secret-namespace`) with `client`.
    pub fn new(client: Client, namespace: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
        }
    }
}

#[async_trait]
impl SecretSource for KubeSecrets {
    async fn chap(&self, secret: &SecretRef) -> Result<ChapCredentials, SecretError> {
        // Refused before any API call: the role grants only this namespace.
        if !secret.namespace.is_empty() && secret.namespace != self.namespace {
            return Err(SecretError::ForeignNamespace {
                name: secret.name.clone(),
                namespace: secret.namespace.clone(),
                driver: self.namespace.clone(),
            });
        }
        let shown = format!("{}/{}", self.namespace, secret.name);
        if !is_dns_subdomain(&secret.name) {
            return Err(SecretError::InvalidName(secret.name.clone()));
        }
        let found = match self.api.get_opt(&secret.name).await {
            Ok(Some(s)) => s,
            Ok(None) => return Err(SecretError::NotFound(shown)),
            Err(e) => {
                let reason = match e {
                    kube::Error::Api(s) => format!("{} ({})", s.message, s.code),
                    other => other.to_string(),
                };
                return Err(SecretError::Unreadable {
                    secret: shown,
                    reason,
                });
            }
        };
        let data = found.data.unwrap_or_default();
        let value = |key: &'static str| -> Option<String> {
            data.get(key)
                .and_then(|v| String::from_utf8(v.0.clone()).ok())
                .map(|v| v.trim_end_matches(['\n', '\r']).to_owned())
        };
        credentials(&shown, value)
    }
}

/// Secrets as files under a directory (embedded mode; the namespace of a
/// reference is ignored there).
pub struct DirSecrets(pub PathBuf);

#[async_trait]
impl SecretSource for DirSecrets {
    async fn chap(&self, secret: &SecretRef) -> Result<ChapCredentials, SecretError> {
        if secret.name.is_empty() || secret.name.contains('/') || secret.name.starts_with('.') {
            return Err(SecretError::InvalidName(secret.name.clone()));
        }
        let dir = self.0.join(&secret.name);
        match std::fs::metadata(&dir) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(SecretError::NotFound(secret.name.clone()));
            }
            Err(e) => {
                return Err(SecretError::Unreadable {
                    secret: secret.name.clone(),
                    reason: e.kind().to_string(),
                });
            }
        }
        let value = |key: &'static str| -> Option<String> {
            std::fs::read_to_string(dir.join(key))
                .ok()
                .map(|v| v.trim_end_matches(['\n', '\r']).to_owned())
        };
        credentials(&secret.name, value)
    }
}

/// No Secrets at all: any reference is an error.
pub struct NoSecrets;

#[async_trait]
impl SecretSource for NoSecrets {
    async fn chap(&self, secret: &SecretRef) -> Result<ChapCredentials, SecretError> {
        Err(SecretError::NoSource(secret.name.clone()))
    }
}

/// The credentials from a Secret's keys (`value` reads one).
fn credentials(
    secret: &str,
    value: impl Fn(&'static str) -> Option<String>,
) -> Result<ChapCredentials, SecretError> {
    let required = |key: &'static str| {
        value(key).ok_or_else(|| SecretError::MissingKey {
            secret: secret.to_owned(),
            key,
        })
    };
    // Mutual CHAP is optional.
    Ok(ChapCredentials {
        username: required("username")?,
        password: required("password")?,
        mutual_username: value("mutual_username").unwrap_or_default(),
        mutual_password: value("mutual_password").unwrap_or_default(),
    })
}
