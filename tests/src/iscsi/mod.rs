//! A minimal iSCSI initiator (RFC 7143) for the lab, where it stands in
//! for the kernel initiator: a real login over TCP against a real target
//! (tgtd), so a wrong CHAP secret or an initiator ACL fails exactly as in
//! production, then the SCSI commands that tell a LUN's identity and size.
//!
//! Scope: one connection per session, no digests, InitialR2T=Yes,
//! ImmediateData=No, ErrorRecoveryLevel=0, READ-direction commands only,
//! one command outstanding at a time. Every wire read is bounded (our
//! MaxRecvDataSegmentLength, transfer and text caps) and every operation
//! has a timeout; malformed input is an [`IscsiError`], never a panic.
//!
//! Files: `pdu` PDU framing and text keys, `conn` the TCP connection and
//! sequence numbers, `login` the login phase, `chap` CHAP, `session` full
//! feature commands, Text and Logout, `scsi` CDBs and response parsing,
//! `error` the errors.
//!
//! What tgtd answers at login (pinned by `tests/tests/iscsi.rs`): a wrong
//! CHAP secret, an unknown CHAP user, or no CHAP offered where it is
//! required is status 0x0201 ([`IscsiError::AuthenticationFailed`]); an
//! initiator excluded by the target's ACL (by name or address), like a
//! target that does not exist, is status 0x0203
//! ([`IscsiError::TargetNotFound`]): tgtd never answers 0x0202.

mod chap;
mod conn;
mod error;
mod login;
mod pdu;
mod scsi;
mod session;

use std::net::SocketAddr;
use std::time::Duration;

pub use chap::Chap;
pub use error::IscsiError;
pub use scsi::{
    Designator, StdInquiry, TYPE_CONTROLLER, TYPE_DISK, hex, lun_from_wire, lun_to_wire,
    parse_designators, parse_unit_serial,
};
pub use session::Session;

use conn::{Connection, bounded};
use login::LoginRequest;

/// Logs in to `target_iqn` at `portal` as `initiator_iqn` (AuthMethod None
/// when `chap` is `None`, CHAP otherwise) and returns the session in full
/// feature phase. `timeout` bounds the whole login and, afterwards, each
/// command of the session.
pub async fn login(
    portal: SocketAddr,
    target_iqn: &str,
    initiator_iqn: &str,
    chap: Option<&Chap>,
    timeout: Duration,
) -> Result<Session, IscsiError> {
    let req = LoginRequest {
        initiator_iqn,
        target_iqn: Some(target_iqn),
        chap,
    };
    let mut broken = false;
    let (conn, outcome) = bounded(&mut broken, timeout, async {
        let mut conn = Connection::connect(portal, timeout).await?;
        let outcome = login::login(&mut conn, &req).await?;
        Ok((conn, outcome))
    })
    .await?;
    Ok(Session::new(conn, target_iqn, outcome, timeout))
}

/// Discovery: logs in to `portal` with SessionType=Discovery, asks
/// `SendTargets=All`, logs out, and returns each target with its portals
/// as the target wrote them (`"ip:port,tpgt"`).
pub async fn sendtargets(
    portal: SocketAddr,
    initiator_iqn: &str,
    chap: Option<&Chap>,
    timeout: Duration,
) -> Result<Vec<(String, Vec<String>)>, IscsiError> {
    let req = LoginRequest {
        initiator_iqn,
        target_iqn: None,
        chap,
    };
    let mut broken = false;
    bounded(&mut broken, timeout, async {
        let mut conn = Connection::connect(portal, timeout).await?;
        login::login(&mut conn, &req).await?;
        let keys =
            session::text_exchange(&mut conn, &[("SendTargets".to_owned(), "All".to_owned())])
                .await?;
        session::logout_conn(&mut conn).await?;
        conn.close().await;
        let mut targets: Vec<(String, Vec<String>)> = Vec::new();
        for (k, v) in keys {
            match (k.as_str(), targets.last_mut()) {
                ("TargetName", _) => targets.push((v, Vec::new())),
                ("TargetAddress", Some((_, portals))) => portals.push(v),
                ("TargetAddress", None) => {
                    return Err(IscsiError::Protocol(
                        "TargetAddress before any TargetName".into(),
                    ));
                }
                _ => {}
            }
        }
        Ok(targets)
    })
    .await
}
