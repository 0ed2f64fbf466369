//! What proves which node an agent runs on: the credential it relays in
//! BeginEnrolment, checked here before anything is signed.

use csi_scsi_certs::{JoinTokenRefused, JoinTokens};
use csi_scsi_contract::NodeName;
use csi_scsi_proto::agent::CredentialKind;

/// A credential checked: the node it proves, and that Node's UID when the
/// backend has Node objects (it goes into the certificate).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proven {
    /// The Node object's UID, if any.
    pub node_uid: Option<String>,
}

/// Why a credential was refused. Each says what was wrong, never the
/// credential itself.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The agent sent a kind this proxy does not accept.
    #[error("a {0:?} credential is not accepted here ({1})")]
    WrongKind(CredentialKind, &'static str),
    /// A join token was refused.
    #[error(transparent)]
    JoinToken(#[from] JoinTokenRefused),
    /// The API server did not authenticate the token.
    #[error("the ServiceAccount token does not authenticate: {0}")]
    NotAuthenticated(String),
    /// The token is valid but not for the enrolment audience.
    #[error("the token is not bound to the audience {0:?}")]
    WrongAudience(String),
    /// The token belongs to another ServiceAccount.
    #[error("the token is {presented}'s, not the agent's ServiceAccount {expected}")]
    WrongServiceAccount {
        /// The agent's ServiceAccount user name.
        expected: String,
        /// Whose token it is.
        presented: String,
    },
    /// The token is not bound to a Pod (a TokenRequest without a bound
    /// object, or a legacy Secret token).
    #[error("the token is not bound to a Pod on a node ({0} missing)")]
    NotPodBound(&'static str),
    /// The token's Pod runs on another node than the agent says.
    #[error("the token's Pod runs on node {token_node}, but the agent asks for node {asked}")]
    WrongNode {
        /// The node the token names.
        token_node: String,
        /// The node the agent claimed.
        asked: NodeName,
    },
    /// The token's Pod is not (or no longer) a Pod of the agent DaemonSet
    /// on that node.
    #[error("the token's Pod {pod} is not a Pod of DaemonSet {daemonset} on node {node}: {why}")]
    NotAnAgentPod {
        /// namespace/name.
        pod: String,
        /// The DaemonSet required.
        daemonset: String,
        /// The node.
        node: NodeName,
        /// What did not match.
        why: String,
    },
    /// The API server could not be asked: doubt, so no certificate.
    #[error("cannot check the token now: {0}")]
    Unavailable(String),
}

/// Checks the credential an agent relays for `node`.
#[async_trait::async_trait]
pub trait CredentialCheck: Send + Sync {
    /// The node proven, or why not.
    async fn check(
        &self,
        node: &NodeName,
        kind: CredentialKind,
        credential: &str,
    ) -> Result<Proven, Refusal>;
}

/// Join tokens (embedded mode): one-time, expiring, made per node.
pub struct JoinTokenCheck(pub JoinTokens);

#[async_trait::async_trait]
impl CredentialCheck for JoinTokenCheck {
    async fn check(
        &self,
        node: &NodeName,
        kind: CredentialKind,
        credential: &str,
    ) -> Result<Proven, Refusal> {
        if kind != CredentialKind::JoinToken {
            return Err(Refusal::WrongKind(
                kind,
                "this proxy enrols with join tokens (--join-tokens-dir)",
            ));
        }
        self.0.consume(credential, node.as_str())?;
        Ok(Proven { node_uid: None })
    }
}

/// No way to enrol a node from scratch: only renewals over a connection
/// on which the agent's current certificate was verified.
pub struct RenewalsOnly;

#[async_trait::async_trait]
impl CredentialCheck for RenewalsOnly {
    async fn check(
        &self,
        _node: &NodeName,
        kind: CredentialKind,
        _credential: &str,
    ) -> Result<Proven, Refusal> {
        Err(Refusal::WrongKind(
            kind,
            "this proxy has neither join tokens nor ServiceAccount tokens to check; only renewals",
        ))
    }
}
