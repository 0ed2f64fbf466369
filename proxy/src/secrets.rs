//! CHAP credentials from Secret references. Targets name a Secret, never
//! the credentials. Embedded mode reads a directory laid out like mounted
//! Secrets: `<dir>/<secret-name>/{username,password,mutual_username,mutual_password}`.

use std::path::PathBuf;

use csi_scsi_proto::agent::ChapCredentials;

use crate::device::SecretRef;
use crate::error::ProxyError;

/// Where Secret contents come from.
pub trait SecretSource: Send + Sync {
    /// The CHAP credentials in `secret`.
    fn chap(&self, secret: &SecretRef) -> Result<ChapCredentials, ProxyError>;
}

/// Secrets as files under a directory.
pub struct DirSecrets(pub PathBuf);

impl SecretSource for DirSecrets {
    fn chap(&self, secret: &SecretRef) -> Result<ChapCredentials, ProxyError> {
        let bad = |reason: String| ProxyError::Secret {
            name: secret.name.clone(),
            reason,
        };
        if secret.name.is_empty() || secret.name.contains('/') || secret.name.starts_with('.') {
            return Err(bad("invalid Secret name".into()));
        }
        let dir = self.0.join(&secret.name);
        let read = |key: &str, required: bool| -> Result<String, ProxyError> {
            match std::fs::read_to_string(dir.join(key)) {
                Ok(v) => Ok(v.trim_end_matches(['\n', '\r']).to_owned()),
                Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => {
                    Ok(String::new())
                }
                Err(e) => Err(bad(format!("key {key}: {}", e.kind()))),
            }
        };
        Ok(ChapCredentials {
            username: read("username", true)?,
            password: read("password", true)?,
            mutual_username: read("mutual_username", false)?,
            mutual_password: read("mutual_password", false)?,
        })
    }
}

/// No Secrets at all: any reference is an error.
pub struct NoSecrets;

impl SecretSource for NoSecrets {
    fn chap(&self, secret: &SecretRef) -> Result<ChapCredentials, ProxyError> {
        Err(ProxyError::Secret {
            name: secret.name.clone(),
            reason: "no secret source configured (--secrets-dir)".into(),
        })
    }
}
