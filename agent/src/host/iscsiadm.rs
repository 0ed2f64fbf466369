//! `iscsiadm`, open-iscsi's CLI, run through the host's command runner:
//! node records, CHAP, login and logout with a per-portal timeout, and
//! session rescans. Sessions are read from sysfs
//! ([`super::sysfs`]), not from the tool's listings.
//!
//! Exit codes are open-iscsi's (`include/iscsi_err.h`); each is turned into
//! a typed [`IscsiError`], or into success where it means "already done".
//! CHAP settings are written into the node record file itself
//! ([`record`]), never onto a command line; they never appear in `Debug`
//! or in an error.

use std::fmt;
use std::time::Duration;

pub use csi_scsi_contract::iscsi::{DEFAULT_PORT, InvalidPortal, Portal};
use csi_scsi_contract::iscsi::{MAX_CHAP_LEN, MAX_NAME_LEN};

use super::Host;
use super::command::{Arg, CommandError, Output};

/// Extra time given to `iscsiadm --login` beyond the login timeout set in
/// the node record, so that iscsid reports its own timeout (exit 8) before
/// we kill the CLI.
const LOGIN_SLACK: Duration = Duration::from_secs(5);

/// A secret (a CHAP password): shown as `<redacted>` by `Debug`, no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

/// CHAP credentials for a node record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chap {
    /// The initiator's CHAP name (`node.session.auth.username`).
    pub username: String,
    /// The initiator's secret (`node.session.auth.password`).
    pub password: Secret,
    /// Mutual CHAP: the target's name and secret (`username_in`, `password_in`).
    pub mutual: Option<MutualChap>,
}

/// The target's credentials for mutual CHAP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MutualChap {
    /// `node.session.auth.username_in`.
    pub username: String,
    /// `node.session.auth.password_in`.
    pub password: Secret,
}

/// What a login did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoginOutcome {
    /// A new session was created.
    LoggedIn,
    /// A session to this target and portal already existed (exit 15).
    AlreadyLoggedIn,
}

/// What a logout did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogoutOutcome {
    /// The session was closed.
    LoggedOut,
    /// No session to this target and portal existed (exit 21).
    NotLoggedIn,
}

/// Why an `iscsiadm` operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IscsiError {
    /// A target name, portal or CHAP field we were given is malformed; the
    /// tool was not run.
    #[error("invalid {field}: {reason}")]
    InvalidArgument {
        /// The field.
        field: &'static str,
        /// What was wrong.
        reason: &'static str,
    },
    /// The target refused our CHAP credentials or our initiator name (exit
    /// 24, ISCSI_ERR_LOGIN_AUTH_FAILED; an ACL that excludes the initiator
    /// is reported the same way by the target).
    #[error("iSCSI login to {target} at {portal} failed authentication or authorization")]
    AuthFailed {
        /// The target.
        target: String,
        /// The portal.
        portal: String,
    },
    /// The portal did not answer in time (exit 8, ISCSI_ERR_TRANS_TIMEOUT;
    /// exit 11, ISCSI_ERR_PDU_TIMEOUT; or the CLI outlived its deadline).
    #[error("iSCSI {operation} at {portal} timed out")]
    Timeout {
        /// The operation.
        operation: &'static str,
        /// The portal.
        portal: String,
    },
    /// The portal could not be reached (exit 4, ISCSI_ERR_TRANS: connection
    /// refused, no route).
    #[error("iSCSI portal {portal} is unreachable: {detail}")]
    PortalUnreachable {
        /// The portal.
        portal: String,
        /// The tool's words.
        detail: String,
    },
    /// The target rejected the login for another reason (exit 5,
    /// ISCSI_ERR_LOGIN; exit 19, ISCSI_ERR_FATAL_LOGIN: e.g. target not
    /// found at that portal).
    #[error("iSCSI login to {target} at {portal} was refused (exit {code}): {detail}")]
    LoginRefused {
        /// The target.
        target: String,
        /// The portal.
        portal: String,
        /// The exit code.
        code: i32,
        /// The tool's words.
        detail: String,
    },
    /// There is no node record for this target and portal (exit 21 on an
    /// operation that needs one: create it first).
    #[error("no iSCSI node record for {target} at {portal}")]
    NoNodeRecord {
        /// The target.
        target: String,
        /// The portal.
        portal: String,
    },
    /// A node record file could not be read or written.
    #[error("iSCSI node record {}: {detail}", path.display())]
    NodeRecordFile {
        /// The record file.
        path: std::path::PathBuf,
        /// What failed.
        detail: String,
    },
    /// No such session (exit 2, ISCSI_ERR_SESS_NOT_FOUND, or 21).
    #[error("no iSCSI session {sid}")]
    SessionNotFound {
        /// The session id.
        sid: u32,
    },
    /// The session's devices are in use (exit 28, ISCSI_ERR_BUSY).
    #[error("iSCSI session to {target} at {portal} is busy: {detail}")]
    SessionBusy {
        /// The target.
        target: String,
        /// The portal.
        portal: String,
        /// The tool's words.
        detail: String,
    },
    /// iscsid is not running or not reachable, or the kernel lacks the
    /// transport (exit 20, ISCSI_ERR_ISCSID_NOTCONN; 18,
    /// ISCSI_ERR_ISCSID_COMM_ERR; 12, ISCSI_ERR_TRANS_NOT_FOUND).
    #[error("iscsid is not available (exit {code}): {detail}")]
    DaemonUnavailable {
        /// The exit code.
        code: i32,
        /// The tool's words.
        detail: String,
    },
    /// Any other non-zero exit.
    #[error("iscsiadm {operation} failed with exit code {code}: {detail}")]
    Failed {
        /// The operation.
        operation: &'static str,
        /// The exit code.
        code: i32,
        /// The tool's words (secrets scrubbed).
        detail: String,
    },
    /// The tool could not be run.
    #[error(transparent)]
    Tool(#[from] CommandError),
}

/// Which `iscsiadm` operation ran, for errors and exit-code meaning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    CreateNode,
    DeleteNode,
    UpdateNode,
    Login,
    Logout,
    Rescan,
}

/// The node a command is about, for errors.
struct Subject<'a> {
    target: &'a str,
    portal: String,
    sid: Option<u32>,
}

// Exit codes of open-iscsi (include/iscsi_err.h) that we interpret.
/// ISCSI_ERR_SESS_NOT_FOUND: session could not be found.
const ERR_SESS_NOT_FOUND: i32 = 2;
/// ISCSI_ERR_TRANS: transport error (connect refused, no route).
const ERR_TRANS: i32 = 4;
/// ISCSI_ERR_LOGIN: generic login failure.
const ERR_LOGIN: i32 = 5;
/// ISCSI_ERR_TRANS_TIMEOUT: the connection timer expired while connecting.
const ERR_TRANS_TIMEOUT: i32 = 8;
/// ISCSI_ERR_PDU_TIMEOUT: an iSCSI PDU timed out.
const ERR_PDU_TIMEOUT: i32 = 11;
/// ISCSI_ERR_TRANS_NOT_FOUND: transport module not loaded in kernel or iscsid.
const ERR_TRANS_NOT_FOUND: i32 = 12;
/// ISCSI_ERR_SESS_EXISTS: a session is already logged in.
const ERR_SESS_EXISTS: i32 = 15;
/// ISCSI_ERR_ISCSID_COMM_ERR: a read/write to iscsid failed.
const ERR_ISCSID_COMM: i32 = 18;
/// ISCSI_ERR_FATAL_LOGIN: fatal login error (target says no, not retryable).
const ERR_FATAL_LOGIN: i32 = 19;
/// ISCSI_ERR_ISCSID_NOTCONN: could not connect to iscsid.
const ERR_ISCSID_NOTCONN: i32 = 20;
/// ISCSI_ERR_NO_OBJS_FOUND: no records/targets/sessions/portals to act on.
const ERR_NO_OBJS_FOUND: i32 = 21;
/// ISCSI_ERR_LOGIN_AUTH_FAILED: login failed due to an authorization failure.
const ERR_LOGIN_AUTH_FAILED: i32 = 24;
/// ISCSI_ERR_BUSY: device or resource in use.
const ERR_BUSY: i32 = 28;

/// Creates the node record for `target` at `portal` (`-m node -T -p -o new`).
/// Re-creating an existing record resets it to iscsid.conf defaults, so set
/// CHAP and timeouts after this.
pub async fn create_node(host: &Host, target: &str, portal: &Portal) -> Result<(), IscsiError> {
    check_target(target)?;
    let mut args = node_args(target, portal);
    args.extend(["-o".into(), "new".into()]);
    run(
        host,
        Op::CreateNode,
        &args,
        None,
        &subject(target, portal),
        &[],
    )
    .await?;
    // Only the agent logs in: a reboot must not log in to every target the
    // node ever used.
    update(host, target, portal, "node.startup", "manual".into(), &[]).await
}

/// Deletes the node record (`-o delete`). A missing record (exit 21) is
/// success: that is the state asked for.
pub async fn delete_node(host: &Host, target: &str, portal: &Portal) -> Result<(), IscsiError> {
    check_target(target)?;
    let mut args = node_args(target, portal);
    args.extend(["-o".into(), "delete".into()]);
    let out = output(host, Op::DeleteNode, &args, None, &subject(target, portal)).await?;
    match out.code {
        0 | ERR_NO_OBJS_FOUND => Ok(()),
        code => Err(classify(
            Op::DeleteNode,
            code,
            &out,
            &subject(target, portal),
            &[],
        )),
    }
}

/// Sets CHAP (or mutual CHAP) on the node record: authmethod, username and
/// password, and `username_in`/`password_in` for mutual CHAP, written into
/// the record file (see [`record`]): no secret is ever an argument.
pub async fn set_chap(
    host: &Host,
    target: &str,
    portal: &Portal,
    chap: &Chap,
) -> Result<(), IscsiError> {
    check_target(target)?;
    check_chap_text("CHAP username", &chap.username)?;
    check_chap_text("CHAP password", chap.password.expose())?;
    if let Some(m) = &chap.mutual {
        check_chap_text("mutual CHAP username", &m.username)?;
        check_chap_text("mutual CHAP password", m.password.expose())?;
    }
    record::write_auth(host, target, portal, Some(chap)).await
}

/// Turns CHAP off on the node record (`authmethod = None`, no names or
/// secrets left in the file).
pub async fn clear_chap(host: &Host, target: &str, portal: &Portal) -> Result<(), IscsiError> {
    check_target(target)?;
    record::write_auth(host, target, portal, None).await
}

/// Logs in to `target` at `portal`, giving up after about `timeout`: the node
/// record is set to one login attempt of `timeout` (iscsid's total is
/// `login_timeout * initial_login_retry_max`), so a dead portal costs one
/// timeout instead of iscsid's default two minutes, and iscsid stops trying
/// too. An existing session (exit 15) is [`LoginOutcome::AlreadyLoggedIn`].
pub async fn login(
    host: &Host,
    target: &str,
    portal: &Portal,
    timeout: Duration,
) -> Result<LoginOutcome, IscsiError> {
    check_target(target)?;
    let secs = timeout.as_secs().max(1);
    update(
        host,
        target,
        portal,
        "node.conn[0].timeo.login_timeout",
        secs.to_string().into(),
        &[],
    )
    .await?;
    update(
        host,
        target,
        portal,
        "node.session.initial_login_retry_max",
        "1".into(),
        &[],
    )
    .await?;
    let mut args = node_args(target, portal);
    args.push("--login".into());
    let who = subject(target, portal);
    let out = output(
        host,
        Op::Login,
        &args,
        Some(Duration::from_secs(secs) + LOGIN_SLACK),
        &who,
    )
    .await?;
    match out.code {
        0 => Ok(LoginOutcome::LoggedIn),
        // ISCSI_ERR_SESS_EXISTS: already logged in to this portal; the
        // caller wanted a session and has one.
        ERR_SESS_EXISTS => Ok(LoginOutcome::AlreadyLoggedIn),
        code => Err(classify(Op::Login, code, &out, &who, &[])),
    }
}

/// Logs out of `target` at `portal`. No session (exit 21) is
/// [`LogoutOutcome::NotLoggedIn`]: the state asked for.
pub async fn logout(
    host: &Host,
    target: &str,
    portal: &Portal,
) -> Result<LogoutOutcome, IscsiError> {
    check_target(target)?;
    let mut args = node_args(target, portal);
    args.push("--logout".into());
    let who = subject(target, portal);
    let out = output(host, Op::Logout, &args, None, &who).await?;
    match out.code {
        0 => Ok(LogoutOutcome::LoggedOut),
        // ISCSI_ERR_NO_OBJS_FOUND: no matching session; nothing to do.
        ERR_NO_OBJS_FOUND => Ok(LogoutOutcome::NotLoggedIn),
        code => Err(classify(Op::Logout, code, &out, &who, &[])),
    }
}

/// Asks session `sid` to scan its target for new LUNs and size changes
/// (`-m session -r SID --rescan`).
pub async fn rescan_session(host: &Host, sid: u32) -> Result<(), IscsiError> {
    let args: Vec<Arg> = vec![
        "-m".into(),
        "session".into(),
        "-r".into(),
        sid.to_string().into(),
        "--rescan".into(),
    ];
    let who = Subject {
        target: "",
        portal: String::new(),
        sid: Some(sid),
    };
    run(host, Op::Rescan, &args, None, &who, &[]).await?;
    Ok(())
}

// === impl Secret ===

impl Secret {
    /// Wraps a secret.
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    /// The secret itself, to hand to the tool.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

// === impl Op ===

impl Op {
    fn name(self) -> &'static str {
        match self {
            Self::CreateNode => "node create",
            Self::DeleteNode => "node delete",
            Self::UpdateNode => "node update",
            Self::Login => "login",
            Self::Logout => "logout",
            Self::Rescan => "session rescan",
        }
    }
}

/// `-m node -T <target> -p <portal>`.
fn node_args(target: &str, portal: &Portal) -> Vec<Arg> {
    vec![
        "-m".into(),
        "node".into(),
        "-T".into(),
        target.into(),
        "-p".into(),
        portal.to_string().into(),
    ]
}

/// `-o update -n <name> -v <value>` on the node record; `secrets` are
/// scrubbed from any error.
async fn update(
    host: &Host,
    target: &str,
    portal: &Portal,
    name: &str,
    value: Arg,
    secrets: &[&str],
) -> Result<(), IscsiError> {
    let mut args = node_args(target, portal);
    args.extend([
        "-o".into(),
        "update".into(),
        "-n".into(),
        name.into(),
        "-v".into(),
        value,
    ]);
    run(
        host,
        Op::UpdateNode,
        &args,
        None,
        &subject(target, portal),
        secrets,
    )
    .await?;
    Ok(())
}

/// Runs `iscsiadm args`, any exit code.
async fn output(
    host: &Host,
    op: Op,
    args: &[Arg],
    timeout: Option<Duration>,
    who: &Subject<'_>,
) -> Result<Output, IscsiError> {
    let tool = host.tool("iscsiadm");
    let result = match timeout {
        Some(t) => host.runner.output_within(&tool, args, t).await,
        None => host.runner.output(&tool, args).await,
    };
    match result {
        Ok(out) => Ok(out),
        Err(CommandError::Timeout { .. }) if op == Op::Login => Err(IscsiError::Timeout {
            operation: op.name(),
            portal: who.portal.clone(),
        }),
        Err(e) => Err(e.into()),
    }
}

/// Runs `iscsiadm args`; exit 0 or a classified error.
async fn run(
    host: &Host,
    op: Op,
    args: &[Arg],
    timeout: Option<Duration>,
    who: &Subject<'_>,
    secrets: &[&str],
) -> Result<Output, IscsiError> {
    let out = output(host, op, args, timeout, who).await?;
    if out.code == 0 {
        Ok(out)
    } else {
        Err(classify(op, out.code, &out, who, secrets))
    }
}

/// Turns a non-zero exit into an [`IscsiError`] (codes: include/iscsi_err.h).
fn classify(op: Op, code: i32, out: &Output, who: &Subject<'_>, secrets: &[&str]) -> IscsiError {
    let detail = scrub(&out.error_tail(3, TAIL_MAX), secrets);
    let target = who.target.to_owned();
    let portal = who.portal.clone();
    match code {
        ERR_LOGIN_AUTH_FAILED => IscsiError::AuthFailed { target, portal },
        ERR_TRANS_TIMEOUT | ERR_PDU_TIMEOUT => IscsiError::Timeout {
            operation: op.name(),
            portal,
        },
        ERR_TRANS => IscsiError::PortalUnreachable { portal, detail },
        ERR_LOGIN | ERR_FATAL_LOGIN => IscsiError::LoginRefused {
            target,
            portal,
            code,
            detail,
        },
        ERR_SESS_NOT_FOUND => match who.sid {
            Some(sid) => IscsiError::SessionNotFound { sid },
            None => IscsiError::Failed {
                operation: op.name(),
                code,
                detail,
            },
        },
        // ISCSI_ERR_NO_OBJS_FOUND where an object was required.
        ERR_NO_OBJS_FOUND => match (who.sid, op) {
            (Some(sid), _) => IscsiError::SessionNotFound { sid },
            (None, Op::UpdateNode | Op::Login) => IscsiError::NoNodeRecord { target, portal },
            (None, _) => IscsiError::Failed {
                operation: op.name(),
                code,
                detail,
            },
        },
        ERR_BUSY => IscsiError::SessionBusy {
            target,
            portal,
            detail,
        },
        ERR_ISCSID_NOTCONN | ERR_ISCSID_COMM | ERR_TRANS_NOT_FOUND => {
            IscsiError::DaemonUnavailable { code, detail }
        }
        _ => IscsiError::Failed {
            operation: op.name(),
            code,
            detail,
        },
    }
}

fn subject<'a>(target: &'a str, portal: &Portal) -> Subject<'a> {
    Subject {
        target,
        portal: portal.to_string(),
        sid: None,
    }
}

/// Most bytes of iscsiadm's output an error quotes.
const TAIL_MAX: usize = 400;

/// `text` with every non-empty secret replaced by `<redacted>`.
fn scrub(text: &str, secrets: &[&str]) -> String {
    secrets
        .iter()
        .filter(|s| !s.is_empty())
        .fold(text.to_owned(), |t, s| t.replace(s, "<redacted>"))
}

/// Refuses a target name the tool should never see: empty, too long, with
/// blanks or control characters, or looking like an option.
fn check_target(target: &str) -> Result<(), IscsiError> {
    let reason = if target.is_empty() {
        "empty"
    } else if target.len() > MAX_NAME_LEN {
        "longer than 223 bytes"
    } else if target.starts_with('-') {
        "starts with '-'"
    } else if !valid_name(target) {
        "contains blanks or control characters"
    } else {
        return Ok(());
    };
    Err(IscsiError::InvalidArgument {
        field: "target name",
        reason,
    })
}

/// A CHAP name or secret must be non-empty printable text without line
/// breaks (iscsid stores it as a `key = value` line).
fn check_chap_text(field: &'static str, value: &str) -> Result<(), IscsiError> {
    let reason = if value.is_empty() {
        "empty"
    } else if value.len() > MAX_CHAP_LEN {
        "longer than 255 bytes"
    } else if value.chars().any(char::is_control) {
        "contains control characters"
    } else {
        return Ok(());
    };
    Err(IscsiError::InvalidArgument { field, reason })
}

/// An iSCSI name: printable, no blanks.
fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME_LEN && name.chars().all(|c| c.is_ascii_graphic())
}

pub mod record;

#[cfg(test)]
mod tests;
