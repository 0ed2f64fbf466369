//! Agent enrolment (docs/certificates.md, "Enrolment"): the leader holds
//! the cluster CA and keeps every agent's certificate current. For each
//! agent the directory knows (Ready or not), it asks the agent's Enrolment
//! service what certificate it serves:
//!
//! - over a verified connection (the agent's certificate from the CA, naming
//!   the node dialled and, when known, the Node's UID now): a certificate
//!   past two thirds of its life is renewed there, the agent's relayed
//!   ServiceAccount token checked again when it has one;
//! - otherwise (no certificate yet, expired, or issued to a Node since
//!   deleted) over an enrolment connection, which does not trust the agent:
//!   the credential it relays must prove its node before anything is signed.
//!
//! The agent makes its key; the proxy signs the CSR's public key with the
//! names it verified, never the names in the request.
//!
//! A CA rotation (docs/certificates.md) changes the signer's files: the
//! proxy reloads them ([`Enroller::watch_signer`]) and renews every agent
//! whose trust bundle is not the signer's, so each step of the rotation
//! reaches every agent without a restart.

pub mod credentials;
pub mod token_review;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use csi_scsi_certs::{CertError, CertificateAuthority, MaterialStore, Validity};
use csi_scsi_contract::NodeName;
use csi_scsi_proto::agent::enrolment_client::EnrolmentClient;
use csi_scsi_proto::agent::{
    BeginEnrolmentRequest, CertificateStatusRequest, CertificateStatusResponse,
    CompleteEnrolmentRequest, CredentialKind,
};
use futures::StreamExt;
use tonic::transport::Channel;

use crate::directory::AgentDirectory;
pub use credentials::{CredentialCheck, JoinTokenCheck, Proven, Refusal, RenewalsOnly};
pub use token_review::TokenReviewCheck;

/// Agents looked at in parallel in one pass.
const PARALLEL: usize = 8;

/// Why an agent was not (re)enrolled this pass. Logged; the next pass
/// tries again.
#[derive(Debug, thiserror::Error)]
pub enum EnrolError {
    /// The agent did not answer.
    #[error("cannot reach the agent of {node} at {address}: {reason}")]
    Unreachable {
        /// The node.
        node: NodeName,
        /// Where it was dialled.
        address: String,
        /// Why.
        reason: String,
    },
    /// The agent at the node's address says it is on another node.
    #[error("the agent at {address} says it runs on node {says}, not {node}: nothing signed")]
    WrongAgent {
        /// The node dialled.
        node: NodeName,
        /// Where.
        address: String,
        /// What it said.
        says: String,
    },
    /// The credential did not prove the node.
    #[error("enrolment of {node} refused: {refusal}")]
    Refused {
        /// The node.
        node: NodeName,
        /// Why.
        #[source]
        refusal: Refusal,
    },
    /// The CSR could not be signed.
    #[error("cannot sign the certificate of {node}: {source}")]
    Sign {
        /// The node.
        node: NodeName,
        /// Why.
        #[source]
        source: CertError,
    },
    /// The agent refused the certificate it was sent.
    #[error("the agent of {node} did not install its certificate: {reason}")]
    Install {
        /// The node.
        node: NodeName,
        /// What it said.
        reason: String,
    },
}

/// What one look at an agent did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Its certificate is good for a while yet.
    Current,
    /// It got its first certificate (or one after losing its own).
    Enrolled {
        /// Serial of the new certificate.
        serial: String,
    },
    /// Its certificate was renewed over a verified connection.
    Renewed {
        /// Serial of the new certificate.
        serial: String,
    },
}

/// What the signer tells operators: when its CA expires, and how many
/// agents a CA rotation step has yet to reach.
#[derive(Clone, Debug, Default)]
pub struct EnrolmentMetrics {
    signer_expiry: prometheus_client::metrics::gauge::Gauge,
    agents_on_other_trust: prometheus_client::metrics::gauge::Gauge,
}

impl EnrolmentMetrics {
    /// Registers the series with `metrics`.
    pub fn register(metrics: &csi_scsi_daemon::Metrics) -> Self {
        let m = Self::default();
        metrics.register(
            "signer_ca_expiry_timestamp_seconds",
            "When the CA that signs the agents' certificates expires (Unix seconds)",
            m.signer_expiry.clone(),
        );
        metrics.register(
            "enrolment_agents_on_other_trust",
            "Agents not yet known to trust the signer's CA bundle (the leader's count; 0 once a CA rotation step reached every agent)",
            m.agents_on_other_trust.clone(),
        );
        m
    }
}

/// The signer: the CA, the lifetime it signs for, and the check of the
/// credentials agents relay.
pub struct Enroller {
    directory: Arc<dyn AgentDirectory>,
    tls: Arc<MaterialStore>,
    /// Swapped whole when the signer's files change.
    ca: std::sync::RwLock<Arc<CertificateAuthority>>,
    lifetime: Duration,
    check: Arc<dyn CredentialCheck>,
    timeout: Duration,
    /// What the last look at each Ready agent found: a pass does not dial
    /// an agent (a handshake each) whose certificate it knows is not due.
    known: std::sync::Mutex<HashMap<NodeName, Known>>,
    metrics: EnrolmentMetrics,
}

/// An agent's certificate as last seen, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Known {
    address: String,
    uid: Option<String>,
    /// When it is due for renewal (Unix seconds).
    due_at: i64,
    /// The digest of the trust bundle it was given (or reported).
    trust: String,
}

impl Enroller {
    /// Signs with `ca` for `lifetime`; dials the agents of `directory` with
    /// the proxy's `tls`; proves nodes with `check`.
    pub fn new(
        directory: Arc<dyn AgentDirectory>,
        tls: Arc<MaterialStore>,
        ca: CertificateAuthority,
        lifetime: Duration,
        check: Arc<dyn CredentialCheck>,
    ) -> Self {
        Self {
            directory,
            tls,
            ca: std::sync::RwLock::new(Arc::new(ca)),
            lifetime,
            check,
            timeout: Duration::from_secs(10),
            known: std::sync::Mutex::new(HashMap::new()),
            metrics: EnrolmentMetrics::default(),
        }
    }

    /// Reports to `metrics`.
    pub fn with_metrics(mut self, metrics: EnrolmentMetrics) -> Self {
        self.metrics = metrics;
        self.show_signer();
        self
    }

    fn show_signer(&self) {
        let expiry = unix(self.signer().not_after());
        self.metrics.signer_expiry.set(expiry);
    }

    /// The CA it signs with now.
    pub fn signer(&self) -> Arc<CertificateAuthority> {
        self.ca.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Loads the signer's files again; a CA that does not load (a key that
    /// is not the first certificate's, a bundle that does not parse) is
    /// refused and the current one kept. Returns whether it changed.
    pub fn reload_signer(&self, cert: &std::path::Path, key: &std::path::Path) -> bool {
        match CertificateAuthority::load(cert, key) {
            Ok(ca) => {
                let current = self.signer();
                if ca.cert_pem() == current.cert_pem() && ca.key_pem() == current.key_pem() {
                    return false;
                }
                tracing::info!(
                    trust = %ca.trust_digest(),
                    "the signer's CA changed; agents trusting another bundle are renewed at the next pass"
                );
                *self.ca.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(ca);
                self.show_signer();
                // Every agent is behind the new bundle until a pass says
                // otherwise: never a stale 0 right after the change.
                let behind = i64::try_from(self.agents_on_other_trust()).unwrap_or(i64::MAX);
                self.metrics.agents_on_other_trust.set(behind);
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "new signer CA files refused; keeping the current CA");
                false
            }
        }
    }

    /// Reloads the signer whenever its files change (a mounted Secret
    /// updated: `..data` swapped), polling every `poll` too; `changed` is
    /// told after each reload that changed it. Runs until dropped.
    pub async fn watch_signer(
        self: Arc<Self>,
        dir: std::path::PathBuf,
        poll: Duration,
        changed: Arc<tokio::sync::Notify>,
    ) {
        let (cert, key) = (
            dir.join(csi_scsi_certs::CA_CERT_FILE),
            dir.join(csi_scsi_certs::CA_KEY_FILE),
        );
        let mut rx = csi_scsi_textfs::file_watch::watch_paths(
            [cert.clone(), key.clone()],
            poll,
            Duration::from_millis(500),
        );
        while rx.changed().await.is_ok() {
            if self.reload_signer(&cert, &key) {
                changed.notify_one();
            }
        }
    }

    /// Agents in the directory not yet known to trust the signer's bundle:
    /// 0 once a rotation step has reached every agent.
    pub fn agents_on_other_trust(&self) -> usize {
        let trust = self.signer().trust_digest();
        let known = self.known();
        self.directory
            .snapshot()
            .keys()
            .filter(|node| known.get(*node).is_none_or(|k| k.trust != trust))
            .count()
    }

    /// A pass now, then one every `interval` and whenever the directory
    /// changes (a new agent Pod), until dropped.
    pub async fn run(
        self: Arc<Self>,
        interval: Duration,
        signer_changed: Arc<tokio::sync::Notify>,
    ) {
        let mut changes = self.directory.subscribe();
        let mut waiting = self.directory.subscribe_unready();
        loop {
            self.pass().await;
            let unready_changed = async {
                match waiting.as_mut() {
                    Some(rx) => rx.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                () = signer_changed.notified() => {}
                changed = changes.changed() => if changed.is_err() { return },
                open = unready_changed => if !open { return },
            }
        }
    }

    /// Looks at every agent once; logs and returns what happened to each.
    pub async fn pass(&self) -> Vec<(NodeName, Result<Outcome, EnrolError>)> {
        let signer = self.signer();
        // Signing now would cut agents off: wait for the proxy's own files
        // (a CA rotation step whose Secrets kubelet updates one by one).
        if let Err(why) = self
            .tls
            .current()
            .can_hand_out(signer.cert_pem().as_bytes())
        {
            tracing::warn!(reason = %why, "holding every enrolment and renewal until the proxy's own TLS material fits the signer's CA");
            let behind = i64::try_from(self.agents_on_other_trust()).unwrap_or(i64::MAX);
            self.metrics.agents_on_other_trust.set(behind);
            return Vec::new();
        }
        let now = unix(SystemTime::now());
        let trust = signer.trust_digest();
        // Ready agents whose certificate is known not to be due, under the
        // signer's bundle, are not dialled; an unready one (enrolling, or
        // its certificate lost) is.
        let mut agents: Vec<(NodeName, String, Option<String>)> = self
            .directory
            .snapshot()
            .iter()
            .filter(|(node, a)| {
                !self.known().get(*node).is_some_and(|k| {
                    k.address == a.address
                        && k.uid == a.node_uid
                        && now < k.due_at
                        && k.trust == trust
                })
            })
            .map(|(node, a)| (node.clone(), a.address.clone(), a.node_uid.clone()))
            .collect();
        agents.extend(
            self.directory
                .unready()
                .into_iter()
                .map(|u| (u.node, u.address, u.node_uid)),
        );
        let results: Vec<_> = futures::stream::iter(agents)
            .map(|(node, address, uid)| async move {
                let result = self.visit(&node, &address, uid.as_deref()).await;
                if result.is_err() {
                    self.known().remove(&node);
                }
                match &result {
                    Ok(Outcome::Current) => {}
                    Ok(Outcome::Enrolled { serial }) => {
                        tracing::info!(%node, %serial, lifetime = ?self.lifetime, "enrolled the agent: its first certificate signed")
                    }
                    Ok(Outcome::Renewed { serial }) => {
                        tracing::info!(%node, %serial, lifetime = ?self.lifetime, "renewed the agent's certificate")
                    }
                    Err(e) => tracing::warn!(%node, error = %e, "agent enrolment"),
                }
                (node, result)
            })
            .buffer_unordered(PARALLEL)
            .collect()
            .await;
        let behind = i64::try_from(self.agents_on_other_trust()).unwrap_or(i64::MAX);
        self.metrics.agents_on_other_trust.set(behind);
        results
    }

    /// Renews or enrols one agent if its certificate needs it.
    pub async fn visit(
        &self,
        node: &NodeName,
        address: &str,
        uid: Option<&str>,
    ) -> Result<Outcome, EnrolError> {
        let unreachable = |reason: String| EnrolError::Unreachable {
            node: node.clone(),
            address: address.to_owned(),
            reason,
        };
        // Verified first: the agent's certificate is from the CA, names the
        // node and, when known, its Node UID now.
        let mut untrusted = None;
        if let Ok((channel, _)) = csi_scsi_daemon::severable_agent_channel(
            address,
            node.as_str(),
            uid,
            self.tls.clone(),
            self.timeout,
        ) {
            let mut client = EnrolmentClient::new(channel);
            match client
                .certificate_status(self.request(CertificateStatusRequest {}))
                .await
            {
                Ok(status) => {
                    let status = status.into_inner();
                    let trust = self.signer().trust_digest();
                    if !due(&status, SystemTime::now(), self.lifetime, &trust) {
                        // What the agent says it trusts, not the signer's:
                        // one that reports nothing (older than the field) is
                        // not counted as having reached a rotation step.
                        self.remember(node, address, uid, status.not_after, &status.trust_sha256);
                        return Ok(Outcome::Current);
                    }
                    let serial = self.enrol(&mut client, node, address, uid, true).await?;
                    return Ok(Outcome::Renewed { serial });
                }
                Err(s) => {
                    let why = crate::agents::transport_failure(&s);
                    // Doubt is not distrust: a handshake that timed out or
                    // a reset leaves the agent's certificate as it is (a
                    // starved node answers late; the next pass asks again).
                    // Only a certificate refused, or an answer from the
                    // agent, sends the proxy to the node's credential.
                    if let Some(why) = &why
                        && !csi_scsi_daemon::certificate_refused(&s)
                    {
                        return Err(unreachable(why.clone()));
                    }
                    untrusted = Some(why.unwrap_or_else(|| s.message().to_owned()));
                }
            }
        }
        // No certificate we trust: the credential alone proves the node.
        let channel = csi_scsi_daemon::enrolment_channel(
            address,
            node.as_str(),
            self.tls.clone(),
            self.timeout,
        )
        .map_err(|e| unreachable(e.to_string()))?;
        let mut client = EnrolmentClient::new(channel);
        let status = client
            .certificate_status(self.request(CertificateStatusRequest {}))
            .await
            .map_err(|s| unreachable(s.message().to_owned()))?
            .into_inner();
        if status.has_certificate {
            // It has one, but not one the proxy trusts for this node now
            // (expired, another CA, or a deleted Node's UID): say why.
            tracing::warn!(
                %node,
                reason = untrusted.as_deref().unwrap_or("unknown"),
                "the agent's certificate is refused; enrolling it afresh"
            );
        }
        let serial = self.enrol(&mut client, node, address, uid, false).await?;
        Ok(Outcome::Enrolled { serial })
    }

    /// Begin, check, sign, complete. `verified`: the connection verified the
    /// agent's current certificate for `node` (a renewal).
    async fn enrol(
        &self,
        client: &mut EnrolmentClient<Channel>,
        node: &NodeName,
        address: &str,
        uid: Option<&str>,
        verified: bool,
    ) -> Result<String, EnrolError> {
        let unreachable = |s: tonic::Status| EnrolError::Unreachable {
            node: node.clone(),
            address: address.to_owned(),
            reason: s.message().to_owned(),
        };
        let begin = client
            .begin_enrolment(self.request(BeginEnrolmentRequest {}))
            .await
            .map_err(unreachable)?
            .into_inner();
        if node.as_str() != begin.node {
            return Err(EnrolError::WrongAgent {
                node: node.clone(),
                address: address.to_owned(),
                says: begin.node,
            });
        }
        let refused = |refusal| EnrolError::Refused {
            node: node.clone(),
            refusal,
        };
        let kind = begin.credential_kind();
        let proven = match kind {
            // A join token works once: a renewal rests on the certificate
            // the connection verified.
            CredentialKind::None | CredentialKind::JoinToken | CredentialKind::Unspecified
                if verified =>
            {
                Proven {
                    node_uid: uid.map(str::to_owned),
                }
            }
            CredentialKind::None | CredentialKind::Unspecified => {
                return Err(refused(Refusal::WrongKind(
                    kind,
                    "an agent without a trusted certificate must relay a credential",
                )));
            }
            _ => self
                .check
                .check(node, kind, &begin.credential)
                .await
                .map_err(refused)?,
        };
        let ca = self.signer();
        let signed = ca
            .sign_agent_csr(
                &begin.csr_pem,
                node.as_str(),
                proven.node_uid.as_deref(),
                Validity::lasting(self.lifetime),
            )
            .map_err(|source| EnrolError::Sign {
                node: node.clone(),
                source,
            })?;
        client
            .complete_enrolment(self.request(CompleteEnrolmentRequest {
                certificate_pem: signed.cert_pem,
                ca_pem: signed.ca_pem,
            }))
            .await
            .map_err(|s| EnrolError::Install {
                node: node.clone(),
                reason: s.message().to_owned(),
            })?;
        self.remember(
            node,
            address,
            uid,
            unix(signed.not_after),
            &ca.trust_digest(),
        );
        Ok(signed.serial)
    }

    fn known(&self) -> std::sync::MutexGuard<'_, HashMap<NodeName, Known>> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes that `node`'s certificate, valid until `not_after`, is due
    /// with a third of the lifetime left, and that it trusts `trust`.
    fn remember(
        &self,
        node: &NodeName,
        address: &str,
        uid: Option<&str>,
        not_after: i64,
        trust: &str,
    ) {
        let third = i64::try_from(self.lifetime.as_secs() / 3).unwrap_or(i64::MAX);
        self.known().insert(
            node.clone(),
            Known {
                address: address.to_owned(),
                uid: uid.map(str::to_owned),
                due_at: not_after.saturating_sub(third),
                trust: trust.to_owned(),
            },
        );
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(message);
        req.set_timeout(self.timeout);
        req
    }
}

/// Unix seconds.
fn unix(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Whether a certificate needs renewing: none, or less than a third of
/// `lifetime` (what this signer issues for) left. Measured from the end:
/// notBefore is set back for clock skew, and a certificate issued by hand
/// for a year is renewed in time too, with a short one. Also due: an agent
/// trusting another bundle than the signer's `trust` (a CA rotation step);
/// an agent that reports none (older than the field) is judged by time.
fn due(
    status: &CertificateStatusResponse,
    now: SystemTime,
    lifetime: Duration,
    trust: &str,
) -> bool {
    if !status.has_certificate {
        return true;
    }
    if !status.trust_sha256.is_empty() && status.trust_sha256 != trust {
        return true;
    }
    let now = unix(now);
    let third = i64::try_from(lifetime.as_secs() / 3).unwrap_or(i64::MAX);
    status.not_after - now <= third
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_is_due_with_a_third_of_the_lifetime_left_or_without_a_certificate() {
        let status = |has, na| CertificateStatusResponse {
            has_certificate: has,
            not_before: 2700,
            not_after: na,
            ..Default::default()
        };
        let at = |s: u64| UNIX_EPOCH + Duration::from_secs(s);
        let life = Duration::from_secs(3000);
        assert!(!due(&status(true, 6000), at(4999), life, "t1"));
        assert!(due(&status(true, 6000), at(5000), life, "t1"));
        assert!(due(&status(false, 0), at(1), life, "t1"));
        // A year's certificate by hand: renewed only near its end.
        assert!(!due(&status(true, 40_000_000), at(5000), life, "t1"));
    }

    #[test]
    fn renewal_is_due_when_the_agent_trusts_another_bundle_than_the_signer() {
        let status = |trust: &str| CertificateStatusResponse {
            has_certificate: true,
            not_after: 40_000_000,
            trust_sha256: trust.into(),
            ..Default::default()
        };
        let (now, life) = (
            UNIX_EPOCH + Duration::from_secs(5000),
            Duration::from_secs(3000),
        );
        assert!(!due(&status("t1"), now, life, "t1"));
        assert!(due(&status("t0"), now, life, "t1"));
        // An agent that reports no bundle: by time alone.
        assert!(!due(&status(""), now, life, "t1"));
    }
}
