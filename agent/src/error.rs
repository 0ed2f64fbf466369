//! `AgentError`: what can go wrong on a node, with the context an operator
//! needs. Mapped to gRPC codes in exactly one place per service
//! (`csi/status.rs` for kubelet, `api/status.rs` for the proxy).

use std::path::PathBuf;

use crate::host::command::CommandError;
use crate::volume_id::InvalidVolumeId;
use crate::wwid::{InvalidWwid, Wwid};

/// A failure on this node.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// A request field is missing or malformed.
    #[error("invalid {field}: {reason}")]
    InvalidArgument {
        /// The field, as named in the request.
        field: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// The volume ID is malformed.
    #[error(transparent)]
    InvalidVolumeId(#[from] InvalidVolumeId),
    /// A WWID is malformed.
    #[error(transparent)]
    InvalidWwid(#[from] InvalidWwid),
    /// No device with this WWID is present on this node.
    #[error("no device with WWID {0} on this node")]
    DeviceNotFound(Wwid),
    /// The device found under the WWID's name reports another WWID.
    #[error("device {device} was expected to be {expected} but reports {found}")]
    WwidMismatch {
        /// The device node.
        device: PathBuf,
        /// The WWID asked for.
        expected: Wwid,
        /// What the device reports.
        found: String,
    },
    /// The device (or one of its paths) is mounted or held open.
    #[error("device {wwid} is in use: {holder}")]
    DeviceInUse {
        /// The device.
        wwid: Wwid,
        /// Who holds it (a mount point, "opened exclusively elsewhere").
        holder: String,
    },
    /// Another operation on the same volume or device is in flight.
    #[error("an operation on {0} is already in progress")]
    Busy(String),
    /// A host tool failed.
    #[error(transparent)]
    Tool(#[from] CommandError),
    /// A host file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl AgentError {
    /// An [`AgentError::Io`] for `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}
