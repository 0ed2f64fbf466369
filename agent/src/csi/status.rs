//! The one mapping from [`AgentError`] to the gRPC status kubelet sees.
//! Every variant is matched by name (no catch-all), so a new variant does
//! not compile until someone picks its CSI code. The codes follow the
//! spec's Error Scheme and the per-RPC error tables of the Node service;
//! messages name volumes and paths, never secrets.

use csi_scsi_textfs::text;
use tonic::{Code, Status};

use crate::error::AgentError;
use crate::host::command::CommandError;

/// The status for `err`, with its message for people, cut to
/// [`text::STATUS_MAX`] bytes.
pub(crate) fn status(err: &AgentError) -> Status {
    Status::new(
        code(err),
        text::bounded(&err.to_string(), text::STATUS_MAX).into_owned(),
    )
}

/// The CSI code of `err`.
pub(crate) fn code(err: &AgentError) -> Code {
    match err {
        // Error Scheme: "Missing required field" / "Invalid or unsupported
        // field in the request".
        AgentError::InvalidArgument { .. }
        | AgentError::InvalidVolumeId(_)
        | AgentError::InvalidWwid(_) => Code::InvalidArgument,
        // "Volume does not exist": the LUN is not on this node, or not at
        // the path given (NodeGetVolumeStats, NodeExpandVolume).
        AgentError::DeviceNotFound(_)
        | AgentError::VolumeNotAtPath { .. }
        | AgentError::NoSuchVolume { .. } => Code::NotFound,
        // "Volume published but is incompatible" (stage and publish).
        AgentError::PathTaken { .. } | AgentError::Incompatible { .. } => Code::AlreadyExists,
        // "Staging target path not set" (NodePublishVolume).
        AgentError::StagingPathMissing | AgentError::NotStaged { .. } => Code::FailedPrecondition,
        // "Exceeds capabilities": what is asked cannot be done with this
        // device as it is. A device whose identity does not match its name
        // is a node in the wrong state: retrying will not help until the
        // links are fixed, so FAILED_PRECONDITION, not INTERNAL.
        AgentError::WwidMismatch { .. }
        | AgentError::DeviceInUse { .. }
        | AgentError::ForeignFilesystem { .. }
        | AgentError::DeviceReadOnly { .. }
        | AgentError::PublishedReadOnlyBlank { .. }
        | AgentError::UnsupportedCapability(_)
        | AgentError::ForeignMount { .. }
        | AgentError::StillPublished { .. }
        | AgentError::PublishedElsewhere { .. } => Code::FailedPrecondition,
        // NodeExpandVolume "Volume in use": the filesystem cannot be grown
        // while staged, here because the kernel refuses the online resize.
        AgentError::OnlineGrowRefused { .. } => Code::FailedPrecondition,
        // NodeExpandVolume "Unsupported capacity_range".
        AgentError::CapacityOutOfRange { .. } => Code::OutOfRange,
        // Error Scheme: "Operation pending for volume".
        AgentError::Busy(_) => Code::Aborted,
        // A device whose I/O hangs: retry once it answers.
        AgentError::Stuck { .. } => Code::Unavailable,
        // Doubt about the device is never "blank": retry later.
        AgentError::DeviceNotReady { .. } => Code::Unavailable,
        // The node's disk refused a record the call needs: nothing was
        // done that a retry would not redo; retry.
        AgentError::RecordNotSaved { .. } => Code::Unavailable,
        // The leader fence is the agent API's (proxy calls only); should
        // one reach kubelet, it is a refusal before anything was done.
        AgentError::StaleLeader { .. } => Code::FailedPrecondition,
        AgentError::InvalidLeaderEpoch(_) => Code::InvalidArgument,
        AgentError::LeaderEpochUnknown { .. } => Code::Unavailable,
        // An agent-API refusal (Attach); ControllerPublishVolume's "Max
        // volumes attached".
        AgentError::AttachLimit { .. } => Code::ResourceExhausted,
        AgentError::Tool(e) => match e {
            CommandError::Timeout { .. } => Code::DeadlineExceeded,
            CommandError::Spawn { .. } | CommandError::Failed { .. } => Code::Internal,
        },
        AgentError::Io { .. } | AgentError::Mount { .. } | AgentError::Unreachable(_) => {
            Code::Internal
        }
        // Agent-API failures (sessions, attach, wipe) never reach kubelet's
        // calls; should one, it is the node's fault, not the caller's.
        AgentError::LoginRefused { .. }
        | AgentError::NoPortalAnswered { .. }
        | AgentError::AttachTimeout { .. }
        | AgentError::Iscsi(_)
        | AgentError::WipeIo { .. }
        | AgentError::WipeFailed { .. } => Code::Internal,
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use csi_scsi_contract::Wwid;

    fn wwid() -> Wwid {
        Wwid::parse("naa.6001405d27e5d898829468b90ce4ef8c").expect("wwid")
    }

    #[test]
    fn spec_conditions_get_the_spec_codes() {
        let path = PathBuf::from("/var/lib/kubelet/x");
        let table = [
            (
                AgentError::InvalidArgument {
                    field: "volume_id",
                    reason: "is required".into(),
                },
                Code::InvalidArgument,
            ),
            (AgentError::DeviceNotFound(wwid()), Code::NotFound),
            (
                AgentError::PathTaken {
                    path: path.clone(),
                    holder: "device 7:1".into(),
                },
                Code::AlreadyExists,
            ),
            (AgentError::StagingPathMissing, Code::FailedPrecondition),
            (AgentError::Busy("naa.1".into()), Code::Aborted),
            (
                AgentError::CapacityOutOfRange {
                    size: 1,
                    wanted: "at least 2 bytes".into(),
                },
                Code::OutOfRange,
            ),
            (
                AgentError::StillPublished {
                    volume: "v".into(),
                    targets: vec![path.clone()],
                },
                Code::FailedPrecondition,
            ),
            (
                AgentError::Tool(CommandError::Timeout {
                    tool: "mkfs.xfs".into(),
                    after: std::time::Duration::from_secs(1),
                }),
                Code::DeadlineExceeded,
            ),
        ];
        for (err, want) in table {
            let s = status(&err);
            assert_eq!(s.code(), want, "{err}");
            assert_eq!(s.message(), err.to_string());
        }
    }

    #[test]
    fn a_message_quoting_a_huge_field_is_cut_at_a_character_boundary() {
        let err = AgentError::InvalidArgument {
            field: "volume_id",
            reason: "é".repeat(1 << 20),
        };
        let m = status(&err).message().to_owned();
        assert!(m.len() <= text::STATUS_MAX, "{} bytes", m.len());
        assert!(m.starts_with("invalid volume_id: éé"), "{m}");
        assert!(
            m.ends_with(&format!("({} bytes)", err.to_string().len())),
            "{m}"
        );
    }
}
