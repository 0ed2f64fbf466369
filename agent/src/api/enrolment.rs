//! The Enrolment service: the proxy (which holds the CA) gets this agent a
//! certificate, first when it has none and then before each expires. The
//! agent makes the key, relays the credential that proves its node, and
//! checks what comes back before it serves with it (docs/certificates.md).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use csi_scsi_certs::{MaterialStore, PendingKey};
use csi_scsi_proto::agent::enrolment_server::Enrolment;
use csi_scsi_proto::agent::{
    BeginEnrolmentRequest, BeginEnrolmentResponse, CertificateStatusRequest,
    CertificateStatusResponse, CompleteEnrolmentRequest, CompleteEnrolmentResponse, CredentialKind,
};
use tonic::{Request, Response, Status};

/// How this agent proves which node it is on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Credential {
    /// A projected ServiceAccount token bound to the agent's Pod (kubelet
    /// rotates the file; it is read at each enrolment).
    ServiceAccountToken(PathBuf),
    /// A one-time join token the operator made for this node.
    JoinToken(PathBuf),
}

/// Why an enrolment step failed.
#[derive(Debug, thiserror::Error)]
pub enum EnrolmentError {
    /// The credential file could not be read.
    #[error("cannot read the enrolment credential {path}: {source}")]
    Credential {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The key pair or CSR could not be made.
    #[error("cannot make a key pair: {0}")]
    Key(#[source] csi_scsi_certs::CertError),
    /// Complete came without a Begin (or after another Complete).
    #[error("no enrolment is pending on this agent: call BeginEnrolment first")]
    NothingPending,
    /// The certificate is not for the pending key, or does not check out.
    #[error("the signed certificate was refused: {0}")]
    Refused(#[source] csi_scsi_certs::CertError),
}

impl From<EnrolmentError> for Status {
    fn from(e: EnrolmentError) -> Self {
        let message = e.to_string();
        match e {
            EnrolmentError::Credential { .. } => Status::unavailable(message),
            EnrolmentError::Key(_) => Status::internal(message),
            EnrolmentError::NothingPending => Status::failed_precondition(message),
            EnrolmentError::Refused(_) => Status::invalid_argument(message),
        }
    }
}

/// The Enrolment service of one agent.
pub(crate) struct EnrolmentService {
    node: String,
    store: Arc<MaterialStore>,
    credential: Option<Credential>,
    /// The key of the enrolment in progress.
    pending: Mutex<Option<PendingKey>>,
}

impl EnrolmentService {
    /// The service of `node`, installing into `store`; `credential` is what
    /// it relays to the proxy (none: renewals over a verified connection).
    pub(crate) fn new(
        node: &str,
        store: Arc<MaterialStore>,
        credential: Option<Credential>,
    ) -> Self {
        Self {
            node: node.to_owned(),
            store,
            credential,
            pending: Mutex::new(None),
        }
    }

    fn read_credential(&self) -> Result<(CredentialKind, String), EnrolmentError> {
        let (kind, path) = match &self.credential {
            None => return Ok((CredentialKind::None, String::new())),
            Some(Credential::ServiceAccountToken(p)) => (CredentialKind::ServiceAccountToken, p),
            Some(Credential::JoinToken(p)) => (CredentialKind::JoinToken, p),
        };
        let text = std::fs::read_to_string(path).map_err(|source| EnrolmentError::Credential {
            path: path.clone(),
            source,
        })?;
        Ok((kind, text.trim().to_owned()))
    }
}

fn unix(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

#[tonic::async_trait]
impl Enrolment for EnrolmentService {
    async fn certificate_status(
        &self,
        _req: Request<CertificateStatusRequest>,
    ) -> Result<Response<CertificateStatusResponse>, Status> {
        let current = self.store.current();
        let enrolled = current.is_enrolled();
        Ok(Response::new(CertificateStatusResponse {
            node: self.node.clone(),
            has_certificate: enrolled,
            not_before: if enrolled {
                unix(current.not_before())
            } else {
                0
            },
            not_after: if enrolled {
                unix(current.not_after())
            } else {
                0
            },
            node_uid: current.node_uid().unwrap_or_default().to_owned(),
            trust_sha256: if enrolled {
                current.trust_digest().unwrap_or_default()
            } else {
                String::new()
            },
        }))
    }

    async fn begin_enrolment(
        &self,
        _req: Request<BeginEnrolmentRequest>,
    ) -> Result<Response<BeginEnrolmentResponse>, Status> {
        let (kind, credential) = self.read_credential()?;
        let key = PendingKey::generate(&self.node).map_err(EnrolmentError::Key)?;
        let csr_pem = key.csr_pem().to_owned();
        *self.pending.lock().unwrap_or_else(|p| p.into_inner()) = Some(key);
        tracing::info!(node = %self.node, credential = ?kind, "enrolment begun: a new key pair, its CSR sent to the proxy");
        Ok(Response::new(BeginEnrolmentResponse {
            node: self.node.clone(),
            credential_kind: kind.into(),
            credential,
            csr_pem,
        }))
    }

    async fn complete_enrolment(
        &self,
        req: Request<CompleteEnrolmentRequest>,
    ) -> Result<Response<CompleteEnrolmentResponse>, Status> {
        let req = req.into_inner();
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let key = pending.as_ref().ok_or(EnrolmentError::NothingPending)?;
        let issued = key
            .accept(&req.certificate_pem, &req.ca_pem)
            .map_err(EnrolmentError::Refused)?;
        self.store
            .install(&issued)
            .map_err(EnrolmentError::Refused)?;
        // Used: a second Complete for the same key is refused.
        pending.take();
        let current = self.store.current();
        Ok(Response::new(CompleteEnrolmentResponse {
            serial: current.serial().to_owned(),
            not_after: unix(current.not_after()),
        }))
    }
}
