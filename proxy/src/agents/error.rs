//! What an agent call came to, when not the reply: the agent's gRPC answer
//! read once, here, into what it means for the caller. Lifecycle code
//! decides from these variants, never from raw codes.

use csi_scsi_contract::NodeName;
use tonic::{Code, Status};

use super::pool::PoolError;

/// Why an agent call did not do what was asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// The call never left the proxy (no agent known, no channel).
    #[error(transparent)]
    NotSent(#[from] PoolError),
    /// No answer: the agent is down or cut off. It may have done the work.
    #[error("agent on {node} unreachable: {detail}")]
    Unreachable {
        /// The node.
        node: NodeName,
        /// What happened.
        detail: String,
    },
    /// The agent ran out of the call's time. It may have done part of it.
    #[error("agent on {node} ran out of time: {detail}")]
    TimedOut {
        /// The node.
        node: NodeName,
        /// Its message.
        detail: String,
    },
    /// The agent is still busy with the same object (an earlier call).
    #[error("agent on {node} is busy with it: {detail}")]
    Busy {
        /// The node.
        node: NodeName,
        /// Its message.
        detail: String,
    },
    /// What the call names is not on that node.
    #[error("agent on {node}: {detail}")]
    NotFound {
        /// The node.
        node: NodeName,
        /// Its message.
        detail: String,
    },
    /// The agent refused before doing anything.
    #[error("agent on {node} refused: {detail}")]
    Refused {
        /// The node.
        node: NodeName,
        /// Why, as a kind.
        why: Refusal,
        /// Its message.
        detail: String,
    },
    /// The agent failed while doing it; part of it may have happened.
    #[error("agent on {node} failed: {detail}")]
    Failed {
        /// The node.
        node: NodeName,
        /// Its message.
        detail: String,
    },
}

/// Why an agent refused a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The node is not in a state that allows it (device in use, WWID
    /// mismatch, not permitted): the caller must change something first.
    Precondition,
    /// The node is out of a resource.
    Exhausted,
    /// The proxy sent what the agent cannot take (a defect on our side).
    Defect,
}

impl AgentError {
    /// What the agent's `status` means. `Ok` never arrives as an error; if
    /// it does, it is a defect of the transport and reads as a failure.
    pub fn answer(node: &NodeName, status: Status) -> Self {
        let node = node.clone();
        let detail = status.message().to_owned();
        let refused = |why| Self::Refused {
            node: node.clone(),
            why,
            detail: detail.clone(),
        };
        match status.code() {
            Code::Unavailable | Code::Cancelled => Self::Unreachable { node, detail },
            Code::DeadlineExceeded => Self::TimedOut { node, detail },
            Code::Aborted => Self::Busy { node, detail },
            Code::NotFound => Self::NotFound { node, detail },
            Code::FailedPrecondition
            | Code::AlreadyExists
            | Code::PermissionDenied
            | Code::Unauthenticated => refused(Refusal::Precondition),
            Code::ResourceExhausted => refused(Refusal::Exhausted),
            Code::InvalidArgument | Code::OutOfRange | Code::Unimplemented => {
                refused(Refusal::Defect)
            }
            Code::Internal | Code::Unknown | Code::DataLoss | Code::Ok => {
                Self::Failed { node, detail }
            }
        }
    }

    /// Whether the call surely did nothing: refused, not found, or never
    /// sent. No answer, a timeout or a busy agent proves nothing.
    pub fn surely_did_nothing(&self) -> bool {
        match self {
            Self::NotSent(_) | Self::NotFound { .. } | Self::Refused { .. } => true,
            Self::Unreachable { .. }
            | Self::TimedOut { .. }
            | Self::Busy { .. }
            | Self::Failed { .. } => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_a_meaning_and_only_refusals_prove_nothing_happened() {
        // (code, did nothing for sure)
        let cases = [
            (Code::Ok, false),
            (Code::Cancelled, false),
            (Code::Unknown, false),
            (Code::InvalidArgument, true),
            (Code::DeadlineExceeded, false),
            (Code::NotFound, true),
            (Code::AlreadyExists, true),
            (Code::PermissionDenied, true),
            (Code::ResourceExhausted, true),
            (Code::FailedPrecondition, true),
            (Code::Aborted, false),
            (Code::OutOfRange, true),
            (Code::Unimplemented, true),
            (Code::Internal, false),
            (Code::Unavailable, false),
            (Code::DataLoss, false),
            (Code::Unauthenticated, true),
        ];
        for (code, nothing) in cases {
            let e = AgentError::answer(&crate::node("node-a"), Status::new(code, "why"));
            assert_eq!(e.surely_did_nothing(), nothing, "{code:?}: {e:?}");
            assert!(e.to_string().contains("node-a"), "{e}");
        }
    }
}
