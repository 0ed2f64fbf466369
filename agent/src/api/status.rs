//! The one mapping from `AgentError` to the status the proxy gets.
//! Exhaustive: a new variant must choose its code here.

use tonic::{Code, Status};

use crate::csi::status::bounded;
use crate::error::AgentError;
use crate::host::iscsiadm::IscsiError;

/// The agent API's status for `e`.
pub fn to_status(e: AgentError) -> Status {
    let code = match &e {
        AgentError::InvalidArgument { .. }
        | AgentError::InvalidVolumeId(_)
        | AgentError::InvalidWwid(_) => Code::InvalidArgument,
        AgentError::UnsupportedCapability(_) | AgentError::CapacityOutOfRange { .. } => {
            Code::InvalidArgument
        }
        AgentError::DeviceNotFound(_)
        | AgentError::VolumeNotAtPath { .. }
        | AgentError::NoSuchVolume { .. } => Code::NotFound,
        AgentError::WwidMismatch { .. } | AgentError::DeviceInUse { .. } => {
            Code::FailedPrecondition
        }
        AgentError::StillPublished { .. } | AgentError::PublishedElsewhere { .. } => {
            Code::FailedPrecondition
        }
        AgentError::ForeignFilesystem { .. } | AgentError::ForeignMount { .. } => {
            Code::FailedPrecondition
        }
        AgentError::DeviceReadOnly { .. }
        | AgentError::PublishedReadOnlyBlank { .. }
        | AgentError::OnlineGrowRefused { .. } => Code::FailedPrecondition,
        AgentError::NotStaged { .. } | AgentError::StagingPathMissing => Code::FailedPrecondition,
        AgentError::PathTaken { .. } | AgentError::Incompatible { .. } => Code::AlreadyExists,
        AgentError::Busy(_) => Code::Aborted,
        // A device whose I/O hangs: retry once it answers.
        AgentError::Stuck { .. } => Code::Unavailable,
        // Doubt about the device is never "blank": retry later.
        AgentError::DeviceNotReady { .. } => Code::Unavailable,
        // The node's disk refused the record: transient, retry.
        AgentError::RecordNotSaved { .. } => Code::Unavailable,
        // The device failed I/O: not wiped, retry once it answers.
        AgentError::WipeIo { .. } => Code::Unavailable,
        // ControllerPublishVolume "Max volumes attached".
        AgentError::AttachLimit { .. } => Code::ResourceExhausted,
        AgentError::LoginRefused { .. } => Code::Unauthenticated,
        AgentError::NoPortalAnswered { .. } => Code::Unavailable,
        AgentError::AttachTimeout { .. } => Code::DeadlineExceeded,
        AgentError::Iscsi(i) => match i {
            IscsiError::InvalidArgument { .. } => Code::InvalidArgument,
            IscsiError::AuthFailed { .. } | IscsiError::LoginRefused { .. } => {
                Code::Unauthenticated
            }
            IscsiError::Timeout { .. } | IscsiError::PortalUnreachable { .. } => Code::Unavailable,
            _ => Code::Internal,
        },
        AgentError::Tool(crate::host::command::CommandError::Timeout { .. }) => {
            Code::DeadlineExceeded
        }
        AgentError::Tool(_) | AgentError::Io { .. } | AgentError::Mount { .. } => Code::Internal,
        AgentError::WipeFailed { .. } | AgentError::Unreachable(_) => Code::Internal,
    };
    Status::new(code, bounded(e.to_string()))
}
