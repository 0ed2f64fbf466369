//! The one mapping from `ProxyError` to the gRPC status a CSI caller gets,
//! following the spec's error tables. Exhaustive on purpose: a new variant
//! must choose its code here.

use csi_scsi_textfs::text;
use tonic::{Code, Status};

use crate::agents::{AgentError, PoolError, Refusal};
use crate::error::ProxyError;
use crate::inventory::InventoryError;
use crate::secrets::SecretError;

impl From<ProxyError> for Status {
    fn from(e: ProxyError) -> Self {
        let code = match &e {
            ProxyError::InvalidArgument { .. } | ProxyError::Parameter(_) => Code::InvalidArgument,
            ProxyError::VolumeNotFound(_) | ProxyError::NodeNotFound(_) => Code::NotFound,
            ProxyError::NameConflict { .. } => Code::AlreadyExists,
            ProxyError::NoDeviceFits(_) | ProxyError::ResizePending { .. } => {
                Code::ResourceExhausted
            }
            ProxyError::CapacityOutOfRange(_) => Code::OutOfRange,
            ProxyError::PublishedElsewhere { .. } => Code::FailedPrecondition,
            // The volume is not reachable from that node as the targets
            // are configured: a retry cannot help until an admin changes
            // the target or the node's labels.
            ProxyError::TargetNotForNode { .. } => Code::FailedPrecondition,
            // The same: the target's selector must change (or the proxy's
            // flag) before any node gets anything through it.
            ProxyError::SelectorNotProtected(_) => Code::FailedPrecondition,
            // ControllerPublishVolume: "Volume published but is incompatible".
            ProxyError::PublishedIncompatibly { .. } => Code::AlreadyExists,
            ProxyError::DeviceState { .. } => Code::Unavailable,
            // Only a release worker meets it; the LUN waits, Failed, and
            // the wipe is retried.
            ProxyError::WipeUnproven { .. } => Code::Unavailable,
            ProxyError::Busy(_) => Code::Aborted,
            // The target is misconfigured: retrying cannot help until
            // an administrator fixes it.
            ProxyError::Secret(
                SecretError::ForeignNamespace { .. }
                | SecretError::InvalidName(_)
                | SecretError::NoSource(_),
            ) => Code::FailedPrecondition,
            // Not there yet, or the API is down: the caller retries.
            ProxyError::Secret(
                SecretError::NotFound(_)
                | SecretError::MissingKey { .. }
                | SecretError::Unreadable { .. },
            ) => Code::Unavailable,
            ProxyError::AgentsUnavailable { .. } => Code::Unavailable,
            // The external-attacher retries: the agent may come back.
            ProxyError::NodeUnreachable { .. } => Code::Unavailable,
            // Start-up: the directory lists within seconds; retry.
            ProxyError::DirectoryNotSynced { .. } => Code::Unavailable,
            // The agent's answer is translated deliberately: its codes
            // describe the node, the caller asked about a volume.
            ProxyError::Agent(a) => match a {
                // An agent missing from the directory says nothing about
                // its node (the directory's `locate` decides "gone"): retry.
                AgentError::NotSent(PoolError::UnknownNode(_) | PoolError::Channel { .. }) => {
                    Code::Unavailable
                }
                // This replica stopped leading: the caller retries and
                // reaches the leader (as the leader gate answers).
                AgentError::NotSent(PoolError::NotLeading { .. }) => Code::Unavailable,
                AgentError::Unreachable { .. } => Code::Unavailable,
                AgentError::TimedOut { .. } => Code::DeadlineExceeded,
                AgentError::Busy { .. } => Code::Aborted,
                AgentError::NotFound { .. } => Code::NotFound,
                AgentError::Refused { why, .. } => match why {
                    Refusal::Precondition => Code::FailedPrecondition,
                    Refusal::Exhausted => Code::ResourceExhausted,
                    Refusal::Defect => Code::Internal,
                },
                AgentError::Failed { .. } => Code::Internal,
            },
            ProxyError::Inventory(i) => match i {
                InventoryError::NoFit(_) => Code::ResourceExhausted,
                InventoryError::Conflict(_) | InventoryError::TargetConflict(_) => Code::Aborted,
                InventoryError::NotFound(_) => Code::NotFound,
                InventoryError::Store(_)
                | InventoryError::Sqlite(_)
                | InventoryError::ApiRefused(_) => Code::Internal,
                // The API server is down or overloaded: the caller retries.
                InventoryError::ApiUnavailable(_) => Code::Unavailable,
                // Transient and not the caller's doing: a CO retries
                // UNAVAILABLE. RESOURCE_EXHAUSTED would tell the
                // provisioner to move the pod to another node, which does
                // not help a full or read-only store.
                InventoryError::StoreFull(_) | InventoryError::StoreUnwritable(_) => {
                    Code::Unavailable
                }
            },
        };
        Status::new(code, bounded(e.to_string()))
    }
}

/// `message`, cut to the bound every status message keeps
/// ([`text::STATUS_MAX`]): one echoing a huge request field would overflow
/// the HTTP/2 header it travels in and reach the caller as a transport
/// error instead of its code.
fn bounded(message: String) -> String {
    text::bounded(&message, text::STATUS_MAX).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_message_is_cut_and_keeps_its_code() {
        let s = Status::from(ProxyError::VolumeNotFound("é".repeat(1 << 20)));
        assert_eq!(s.code(), Code::NotFound);
        assert!(
            s.message().len() <= text::STATUS_MAX,
            "{}",
            s.message().len()
        );
        assert!(s.message().ends_with(" bytes)"), "{}", s.message());
        let small = Status::from(ProxyError::VolumeNotFound("v".into()));
        assert!(!small.message().contains("bytes)"));
    }

    /// An API error with HTTP status `code`, as the kube client reports it.
    fn api(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status {
                code,
                message: format!("status {code}"),
                ..kube::core::Status::default()
            }
            .boxed(),
        )
    }

    #[test]
    fn a_refused_api_request_is_internal_and_an_unavailable_api_server_is_retried() {
        let refused = crate::inventory::InventoryError::ApiRefused(api(403));
        let unavailable = crate::inventory::InventoryError::ApiUnavailable(api(503));
        for (e, want) in [(refused, Code::Internal), (unavailable, Code::Unavailable)] {
            let message = e.to_string();
            let s = Status::from(ProxyError::from(e));
            assert_eq!(s.code(), want, "{message}");
            assert!(s.message().contains("Kubernetes API"), "{}", s.message());
        }
    }
}
