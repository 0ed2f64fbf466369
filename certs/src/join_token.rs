//! One-time join tokens: how an agent proves its node to the proxy where
//! there is no Kubernetes to vouch for it (the embedded mode). The operator
//! makes one per node (`csi-scsi-certs join-token`) and hands the token to
//! that node's agent; the proxy keeps only its SHA-256, in a file named by
//! it, and consumes it at first use: the file is renamed away atomically,
//! so a token works once even if two agents race with it.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::CertError;

/// Bytes of randomness in a token (256 bits).
const TOKEN_BYTES: usize = 32;

/// Why a join token was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JoinTokenRefused {
    /// No such token, or it was used already.
    #[error("unknown join token, or one used already (a join token works once)")]
    Unknown,
    /// It was made for another node.
    #[error("the join token was made for node {made_for}, not {presented_by}; it is used up")]
    WrongNode {
        /// The node named when it was made.
        made_for: String,
        /// The node that presented it.
        presented_by: String,
    },
    /// It expired.
    #[error("the join token for node {node} expired {ago_secs} s ago; make a new one")]
    Expired {
        /// Its node.
        node: String,
        /// How long ago.
        ago_secs: u64,
    },
    /// The record is unreadable: refuse rather than guess.
    #[error("the join token's record {0} is unreadable")]
    Unreadable(PathBuf),
}

/// The proxy's directory of join tokens (their digests).
#[derive(Clone, Debug)]
pub struct JoinTokens {
    dir: PathBuf,
}

impl JoinTokens {
    /// The tokens recorded in `dir`.
    pub fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_owned(),
        }
    }

    /// Makes a token for `node`, valid for `ttl`; records its digest and
    /// returns the token (shown once, never stored).
    pub fn create(&self, node: &str, ttl: Duration) -> Result<String, CertError> {
        crate::validate_node_name(node)?;
        let mut bytes = [0u8; TOKEN_BYTES];
        rustls::crypto::ring::default_provider()
            .secure_random
            .fill(&mut bytes)
            .map_err(|_| CertError::BadPem {
                path: self.dir.clone(),
                reason: "the system has no source of randomness".into(),
            })?;
        let token = format!("csjt_{}", hex(&bytes));
        let expires = SystemTime::now()
            .checked_add(ttl)
            .unwrap_or(SystemTime::now())
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        std::fs::create_dir_all(&self.dir).map_err(|source| CertError::Io {
            path: self.dir.clone(),
            source,
        })?;
        let path = self.record(&token);
        crate::write_private_file(&path, &format!("node={node}\nexpires={expires}\n"))?;
        Ok(token)
    }

    /// Consumes `token` if it was made for `node` and has not expired. A
    /// token presented is used up whatever the answer: one that leaked and
    /// was tried from elsewhere must not work for its node afterwards.
    pub fn consume(&self, token: &str, node: &str) -> Result<(), JoinTokenRefused> {
        let path = self.record(token.trim());
        let used = path.with_extension(format!(
            "used-{}",
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        // The atomic step: only one caller renames it.
        match std::fs::rename(&path, &used) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(JoinTokenRefused::Unknown);
            }
            Err(_) => return Err(JoinTokenRefused::Unreadable(path)),
        }
        let text = std::fs::read_to_string(&used)
            .map_err(|_| JoinTokenRefused::Unreadable(used.clone()))?;
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
                .map(str::to_owned)
        };
        let (Some(made_for), Some(expires)) = (
            field("node"),
            field("expires").and_then(|e| e.parse::<u64>().ok()),
        ) else {
            return Err(JoinTokenRefused::Unreadable(used));
        };
        if made_for != node {
            return Err(JoinTokenRefused::WrongNode {
                made_for,
                presented_by: node.to_owned(),
            });
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if now > expires {
            return Err(JoinTokenRefused::Expired {
                node: made_for,
                ago_secs: now - expires,
            });
        }
        Ok(())
    }

    /// The record of a token: its SHA-256, never the token itself.
    fn record(&self, token: &str) -> PathBuf {
        let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
        self.dir.join(format!("{}.token", hex(digest.as_ref())))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_works_once_for_its_node_only_and_not_after_it_expires() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tokens = JoinTokens::new(dir.path());
        let t = tokens
            .create("node-a", Duration::from_secs(600))
            .expect("token");
        // The token itself is nowhere on disk.
        for e in std::fs::read_dir(dir.path()).expect("dir") {
            let text = std::fs::read_to_string(e.expect("entry").path()).expect("read");
            assert!(!text.contains(&t));
        }
        assert_eq!(tokens.consume(&t, "node-a"), Ok(()));
        assert_eq!(tokens.consume(&t, "node-a"), Err(JoinTokenRefused::Unknown));

        let other = tokens
            .create("node-a", Duration::from_secs(600))
            .expect("token");
        assert!(matches!(
            tokens.consume(&other, "node-b"),
            Err(JoinTokenRefused::WrongNode { .. })
        ));
        // Tried from the wrong node, it is used up for its own too.
        assert_eq!(
            tokens.consume(&other, "node-a"),
            Err(JoinTokenRefused::Unknown)
        );

        let expired = tokens.create("node-a", Duration::ZERO).expect("token");
        std::thread::sleep(Duration::from_millis(1100));
        assert!(matches!(
            tokens.consume(&expired, "node-a"),
            Err(JoinTokenRefused::Expired { .. })
        ));
        assert_eq!(
            tokens.consume("csjt_made-up", "node-a"),
            Err(JoinTokenRefused::Unknown)
        );
    }
}
