//! The one mapping from `AgentError` to the status the proxy gets. Every
//! variant (and every variant of the host errors it wraps) is matched by
//! name, with no catch-all, so a new variant does not compile until
//! someone picks its code here. Doubt (a device, a session or iscsid that
//! may answer later) is UNAVAILABLE, which the proxy retries; a state the
//! caller must change first is FAILED_PRECONDITION.

use csi_scsi_textfs::text;
use tonic::{Code, Status};

use crate::error::AgentError;
use crate::host::command::CommandError;
use crate::host::iscsiadm::IscsiError;

/// The agent API's status for `e`.
pub(super) fn to_status(e: AgentError) -> Status {
    Status::new(
        code(&e),
        text::bounded(&e.to_string(), text::STATUS_MAX).into_owned(),
    )
}

/// The agent API's code for `e`.
pub(super) fn code(e: &AgentError) -> Code {
    match e {
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
        // A stale leader's destructive call: refused, nothing done; the
        // proxy that sent it no longer leads.
        AgentError::StaleLeader { .. } => Code::FailedPrecondition,
        AgentError::InvalidLeaderEpoch(_) => Code::InvalidArgument,
        // Doubt about the highest epoch seen is never "no leader since".
        AgentError::LeaderEpochUnknown { .. } => Code::Unavailable,
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
        AgentError::Iscsi(i) => iscsi_code(i),
        AgentError::Tool(t) => tool_code(t),
        AgentError::Io { .. } | AgentError::Mount { .. } => Code::Internal,
        AgentError::WipeFailed { .. } | AgentError::Unreachable(_) => Code::Internal,
    }
}

/// The code of an `iscsiadm` failure.
fn iscsi_code(e: &IscsiError) -> Code {
    match e {
        IscsiError::InvalidArgument { .. } => Code::InvalidArgument,
        IscsiError::AuthFailed { .. } | IscsiError::LoginRefused { .. } => Code::Unauthenticated,
        IscsiError::Timeout { .. } | IscsiError::PortalUnreachable { .. } => Code::Unavailable,
        // iscsid down or restarting, or the transport module not loaded
        // yet: retry once it answers.
        IscsiError::DaemonUnavailable { .. } => Code::Unavailable,
        // The session or the node record went between our look and our
        // use (a logout, another iscsiadm user): a retry sees the new
        // state and writes the record anew.
        IscsiError::SessionNotFound { .. } | IscsiError::NoNodeRecord { .. } => Code::Unavailable,
        // The session's devices are in use: free them first.
        IscsiError::SessionBusy { .. } => Code::FailedPrecondition,
        IscsiError::Tool(t) => tool_code(t),
        // The node's own record file, or an exit we cannot interpret.
        IscsiError::NodeRecordFile { .. } | IscsiError::Failed { .. } => Code::Internal,
    }
}

/// The code of a host tool that could not be run or did not finish.
fn tool_code(e: &CommandError) -> Code {
    match e {
        CommandError::Timeout { .. } => Code::DeadlineExceeded,
        CommandError::Spawn { .. } | CommandError::Failed { .. } => Code::Internal,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use csi_scsi_contract::Wwid;

    fn wwid() -> Wwid {
        Wwid::parse("naa.6001405d27e5d898829468b90ce4ef8c").expect("wwid")
    }

    #[test]
    fn doubt_is_retryable_and_refusals_are_not() {
        let timeout = || CommandError::Timeout {
            tool: "iscsiadm".into(),
            after: Duration::from_secs(1),
        };
        let table = [
            (AgentError::Busy("naa.1".into()), Code::Aborted),
            (
                AgentError::DeviceInUse {
                    wwid: wwid(),
                    holder: "/mnt".into(),
                },
                Code::FailedPrecondition,
            ),
            (AgentError::Tool(timeout()), Code::DeadlineExceeded),
            (
                AgentError::Iscsi(IscsiError::Tool(timeout())),
                Code::DeadlineExceeded,
            ),
            (
                AgentError::Iscsi(IscsiError::DaemonUnavailable {
                    code: 20,
                    detail: "can not connect to iSCSI daemon".into(),
                }),
                Code::Unavailable,
            ),
            (
                AgentError::Iscsi(IscsiError::SessionNotFound { sid: 3 }),
                Code::Unavailable,
            ),
            (
                AgentError::Iscsi(IscsiError::SessionBusy {
                    target: "iqn.2003-01.org.example:a".into(),
                    portal: "198.18.0.1:3260".into(),
                    detail: "device in use".into(),
                }),
                Code::FailedPrecondition,
            ),
            (
                AgentError::Iscsi(IscsiError::AuthFailed {
                    target: "iqn.2003-01.org.example:a".into(),
                    portal: "198.18.0.1:3260".into(),
                }),
                Code::Unauthenticated,
            ),
            (
                AgentError::Iscsi(IscsiError::Failed {
                    operation: "logout",
                    code: 7,
                    detail: String::new(),
                }),
                Code::Internal,
            ),
        ];
        for (err, want) in table {
            let s = to_status(err);
            assert_eq!(s.code(), want, "{}", s.message());
        }
    }

    #[test]
    fn a_huge_message_is_cut_to_the_status_bound() {
        let s = to_status(AgentError::InvalidArgument {
            field: "wwid",
            reason: "x".repeat(1 << 20),
        });
        assert_eq!(s.code(), Code::InvalidArgument);
        assert!(
            s.message().len() <= text::STATUS_MAX,
            "{}",
            s.message().len()
        );
    }
}
