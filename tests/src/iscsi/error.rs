//! What can go wrong talking iSCSI, typed so the lab can react to each case
//! the way a production initiator's caller would (a wrong CHAP secret is not
//! a network outage).

use std::net::SocketAddr;

/// An iSCSI failure.
#[derive(Debug, thiserror::Error)]
pub enum IscsiError {
    /// The TCP connection to the portal could not be made.
    #[error("iSCSI portal {portal} unreachable: {source}")]
    Unreachable {
        /// The portal dialled.
        portal: SocketAddr,
        /// Why the connect failed.
        #[source]
        source: std::io::Error,
    },
    /// The established connection failed (reset, closed, write error).
    #[error("iSCSI connection failed: {0}")]
    Connection(#[source] std::io::Error),
    /// The target did not answer within the allotted time. The session is
    /// unusable afterwards (a PDU may be half read).
    #[error("iSCSI operation timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// Login status 0x0201: the CHAP exchange failed (wrong user or secret,
    /// CHAP required but not offered), or the target failed our mutual CHAP
    /// check.
    #[error("iSCSI authentication failed{}", detail_suffix(.0))]
    AuthenticationFailed(Option<String>),
    /// Login status 0x0202: the initiator is authenticated (or needs no
    /// authentication) but not allowed to access the target.
    #[error("iSCSI authorization failure: the target refuses this initiator")]
    AuthorizationFailure,
    /// Login status 0x0203: no such target at this portal. tgtd also answers
    /// this when its initiator ACL (address or name) excludes the initiator,
    /// so that a refused initiator cannot tell the target exists.
    #[error("iSCSI target not found (or not visible to this initiator)")]
    TargetNotFound,
    /// Any other non-success login status (class, detail), e.g. 0x0301
    /// "service unavailable" or a redirection (class 1).
    #[error("iSCSI login rejected with status class {class:#04x} detail {detail:#04x}")]
    LoginRejected {
        /// Status-Class.
        class: u8,
        /// Status-Detail.
        detail: u8,
    },
    /// The peer broke the protocol (malformed PDU, unexpected opcode, a
    /// Reject, an oversized data segment, ...).
    #[error("iSCSI protocol error: {0}")]
    Protocol(String),
    /// The command ended in CHECK CONDITION with this sense.
    #[error("SCSI CHECK CONDITION: sense key {sense_key:#x}, ASC {asc:#04x}, ASCQ {ascq:#04x}")]
    ScsiCheckCondition {
        /// Sense key (0x5 ILLEGAL REQUEST, 0x6 UNIT ATTENTION, ...).
        sense_key: u8,
        /// Additional sense code.
        asc: u8,
        /// Additional sense code qualifier.
        ascq: u8,
    },
    /// The command ended with another SCSI status (BUSY, RESERVATION
    /// CONFLICT, TASK SET FULL, ...), or an iSCSI response code other than
    /// "command completed at target".
    #[error("SCSI command failed: iSCSI response {response:#04x}, SCSI status {status:#04x}")]
    ScsiStatus {
        /// iSCSI Response field (0 = completed at target).
        response: u8,
        /// SCSI status byte.
        status: u8,
    },
    /// An earlier timeout or protocol error left the session in an unknown
    /// state; log in again.
    #[error("iSCSI session is broken by an earlier error; log in again")]
    SessionBroken,
}

fn detail_suffix(detail: &Option<String>) -> String {
    detail
        .as_ref()
        .map(|d| format!(": {d}"))
        .unwrap_or_default()
}

impl IscsiError {
    /// Maps a non-zero login status to its error.
    pub(crate) fn from_login_status(class: u8, detail: u8) -> Self {
        match (class, detail) {
            (0x02, 0x01) => Self::AuthenticationFailed(None),
            (0x02, 0x02) => Self::AuthorizationFailure,
            (0x02, 0x03) => Self::TargetNotFound,
            (class, detail) => Self::LoginRejected { class, detail },
        }
    }

    /// Whether the session must not be used after this error (the byte
    /// stream may be out of step with the PDU boundaries).
    pub(crate) fn breaks_session(&self) -> bool {
        matches!(
            self,
            Self::Connection(_) | Self::Timeout(_) | Self::Protocol(_) | Self::SessionBroken
        )
    }
}
