//! `iscsiadm`, as far as the agent uses it, backed by a real iSCSI login.
//! Exit codes are open-iscsi's (iscsi_err.h): 0 ok, 4 transport, 8
//! timeout, 15 session exists, 19 fatal login, 21 no objects found, 24
//! login authentication/authorization failed.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use super::records;
use super::state::{DiskRecord, NodeState, SessionRecord};
use super::{NodeContext, attach_loop, detach_loop, kernel_wwid, refresh_loop};
use crate::fabric::Fabric;
use crate::iscsi::{self, Chap, IscsiError, TYPE_DISK};
use crate::node_tree::{DiskPath, NodeTree, PathTransport};

/// The outcome of one invocation: exit code, stdout, stderr.
pub type Outcome = (i32, String, String);

fn fail(code: i32, msg: impl Into<String>) -> Outcome {
    (code, String::new(), format!("iscsiadm: {}\n", msg.into()))
}

fn ok(out: impl Into<String>) -> Outcome {
    (0, out.into(), String::new())
}

/// Runs one `iscsiadm` invocation for the node in `ctx`.
pub async fn run(ctx: &NodeContext, args: &[String]) -> Outcome {
    let mut mode = None;
    let (mut target, mut portal, mut op, mut name, mut value, mut sid) =
        (None, None, None, None, None, None);
    let (mut login, mut logout, mut rescan) = (false, false, false);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-m" | "--mode" => mode = it.next().cloned(),
            "-T" | "--targetname" => target = it.next().cloned(),
            "-p" | "--portal" => portal = it.next().cloned(),
            "-o" | "--op" => op = it.next().cloned(),
            "-n" | "--name" => name = it.next().cloned(),
            "-v" | "--value" => value = it.next().cloned(),
            "-r" | "--sid" => sid = it.next().and_then(|s| s.parse::<u32>().ok()),
            "-t" | "--type" | "-P" | "--print" => {
                it.next();
            }
            "--login" | "-l" => login = true,
            "--logout" | "-u" => logout = true,
            "--rescan" | "-R" => rescan = true,
            _ => {}
        }
    }
    let locked = match NodeState::lock(&ctx.root) {
        Ok(l) => l,
        Err(e) => return fail(12, format!("cannot read node state: {e}")),
    };
    match (mode.as_deref(), target, portal) {
        (Some("node"), Some(t), Some(p)) => {
            if login {
                login_node(ctx, locked, &t, &p).await
            } else if logout {
                logout_node(ctx, locked, &t, &p)
            } else {
                drop(locked);
                node_op(
                    ctx,
                    &t,
                    &p,
                    op.as_deref(),
                    name.as_deref(),
                    value.as_deref(),
                )
            }
        }
        (Some("node"), _, _) => {
            let list: String = records::list(&ctx.root)
                .into_iter()
                .map(|(p, t)| format!("{p},1 {t}\n"))
                .collect();
            if list.is_empty() {
                fail(21, "No records found")
            } else {
                ok(list)
            }
        }
        (Some("session"), _, _) if rescan => match sid {
            Some(sid) => rescan_session(ctx, locked, sid).await,
            None => fail(7, "--rescan needs -r <sid>"),
        },
        (Some("session"), _, _) => {
            let list: String = locked
                .state
                .sessions
                .iter()
                .map(|s| format!("tcp: [{}] {},1 {} (non-flash)\n", s.sid, s.portal, s.iqn))
                .collect();
            if list.is_empty() {
                fail(21, "No active sessions.")
            } else {
                ok(list)
            }
        }
        _ => fail(7, format!("unsupported invocation {args:?}")),
    }
}

fn node_op(
    ctx: &NodeContext,
    iqn: &str,
    portal: &str,
    op: Option<&str>,
    name: Option<&str>,
    value: Option<&str>,
) -> Outcome {
    let done = match op {
        Some("new") => records::create(&ctx.root, iqn, portal).map(|()| true),
        Some("delete") => records::delete(&ctx.root, iqn, portal),
        Some("update") => records::update(
            &ctx.root,
            iqn,
            portal,
            name.unwrap_or_default(),
            value.unwrap_or_default(),
        ),
        _ => return fail(7, "unsupported node operation"),
    };
    match done {
        Ok(true) => ok(""),
        Ok(false) => fail(21, "No records found"),
        Err(e) => fail(12, format!("cannot save node record: {e}")),
    }
}

fn resolve(portal: &str) -> Option<SocketAddr> {
    let with_port = if portal
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        portal.to_owned()
    } else {
        format!("{portal}:3260")
    };
    with_port.to_socket_addrs().ok()?.next()
}

fn login_error(e: &IscsiError, who: &str) -> Outcome {
    match e {
        IscsiError::AuthenticationFailed(_) | IscsiError::AuthorizationFailure => fail(
            24,
            format!(
                "Could not login to {who}.\niscsiadm: initiator reported error (24 - iSCSI login failed due to authorization failure)"
            ),
        ),
        IscsiError::Timeout(_) => {
            fail(8, format!("Could not login to {who}: connection timed out"))
        }
        IscsiError::Unreachable { .. } | IscsiError::Connection(_) => {
            fail(4, format!("cannot make connection to {who}: {e}"))
        }
        IscsiError::TargetNotFound => {
            fail(19, format!("Could not login to {who}: target not found"))
        }
        other => fail(19, format!("Could not login to {who}: {other}")),
    }
}

async fn login_node(
    ctx: &NodeContext,
    mut locked: super::state::Locked,
    iqn: &str,
    portal: &str,
) -> Outcome {
    let rec = match records::read(&ctx.root, iqn, portal) {
        Ok(Some(rec)) => rec,
        Ok(None) => return fail(21, "No records found"),
        Err(e) => return fail(12, format!("cannot read node record: {e}")),
    };
    if locked
        .state
        .sessions
        .iter()
        .any(|s| s.iqn == iqn && s.portal == portal)
    {
        return fail(15, "default: 1 session requested, but 1 already present.");
    }
    let who = format!("[iface: default, target: {iqn}, portal: {portal}]");
    let Some(addr) = resolve(portal) else {
        return fail(4, format!("cannot resolve portal {portal}"));
    };
    let chap = (rec.authmethod == "CHAP").then(|| Chap {
        username: rec.username.clone(),
        password: rec.password.clone(),
        mutual: (!rec.username_in.is_empty())
            .then(|| (rec.username_in.clone(), rec.password_in.clone())),
    });
    let timeout = Duration::from_secs(rec.login_timeout.max(1));
    let mut session = match iscsi::login(addr, iqn, &ctx.initiator, chap.as_ref(), timeout).await {
        Ok(s) => s,
        Err(e) => return login_error(&e, &who),
    };
    let fabric = match Fabric::load(&ctx.fabric) {
        Ok(f) => f,
        Err(e) => return fail(19, format!("lab fabric unreadable: {e}")),
    };
    let (sid, host) = locked.state.next_ids();
    let tree = match NodeTree::create(&ctx.root) {
        Ok(t) => t,
        Err(e) => return fail(12, format!("node tree: {e}")),
    };
    if let Err(e) = tree.add_iscsi_session(host, sid, iqn, portal, &ctx.initiator) {
        return fail(12, format!("session: {e}"));
    }
    locked.state.sessions.push(SessionRecord {
        sid,
        host,
        iqn: iqn.to_owned(),
        portal: portal.to_owned(),
        disks: Vec::new(),
    });
    // Saved before the scan (and by the scan after each disk it adds): a
    // stand-in killed mid-login (an agent's command timeout) must leave a
    // state that knows every session and disk it made, or a disk stays in
    // the tree that no rescan or logout ever acts on again.
    if let Err(e) = locked.save() {
        return fail(12, format!("cannot save session: {e}"));
    }
    let pos = locked.state.sessions.len() - 1;
    let added = scan(&mut session, &fabric, &tree, &mut locked, pos).await;
    let _ = session.logout().await;
    match added {
        Ok(_) => ok(format!(
            "Logging in to {who} (multiple)\nLogin to {who} successful.\n"
        )),
        Err(e) => fail(19, format!("login ok but LUN scan failed: {e}")),
    }
}

/// Adds the disk LUNs the session reports that are not present yet, and
/// refreshes the size of the ones that are. `pos` is the session's place in
/// the state, which is saved as each disk is added.
async fn scan(
    session: &mut iscsi::Session,
    fabric: &Fabric,
    tree: &NodeTree,
    locked: &mut super::state::Locked,
    pos: usize,
) -> Result<usize, String> {
    let record = locked.state.sessions[pos].clone();
    let luns = session.report_luns().await.map_err(|e| e.to_string())?;
    let mut added = 0;
    for lun in luns {
        let Ok(lun32) = u32::try_from(lun) else {
            continue;
        };
        let inq = session.inquiry(lun).await.map_err(|e| e.to_string())?;
        if inq.device_type != TYPE_DISK {
            continue;
        }
        let disks = &locked.state.sessions[pos].disks;
        if let Some(existing) = disks.iter().find(|d| d.lun == lun32) {
            refresh_loop(&existing.loop_device);
            let _ = tree.rescan_size(&existing.kernel_name, &existing.loop_device);
            continue;
        }
        let Some(file) = fabric.iscsi_file(&record.iqn, lun32) else {
            eprintln!(
                "lab kernel: no backing file known for {} LUN {lun}; skipped",
                record.iqn
            );
            continue;
        };
        let pg83 = session
            .vpd_page(lun, 0x83)
            .await
            .map_err(|e| e.to_string())?;
        let pg80 = session
            .vpd_page(lun, 0x80)
            .await
            .map_err(|e| e.to_string())?;
        let Some(wwid) = kernel_wwid(&pg83) else {
            eprintln!(
                "lab kernel: {} LUN {lun} has no logical-unit designator; skipped",
                record.iqn
            );
            continue;
        };
        let serial = iscsi::parse_unit_serial(&pg80).unwrap_or_default();
        let loop_device = attach_loop(file).map_err(|e| e.to_string())?;
        let disk = DiskPath {
            transport: PathTransport::Iscsi {
                host: record.host,
                session: record.sid,
                portal: record.portal.clone(),
                iqn: record.iqn.clone(),
            },
            target: 0,
            lun: lun32,
            wwid,
            vendor: inq.vendor.clone(),
            model: inq.model.clone(),
            serial,
            backing: loop_device.clone(),
        };
        let name = match tree.add_disk(&disk) {
            Ok(n) => n,
            Err(e) => {
                detach_loop(&loop_device);
                return Err(e.to_string());
            }
        };
        // The kernel caches the raw pages; the agent may read them.
        let dev_dir = tree.sys().join(format!("block/{name}/device"));
        let _ = std::fs::write(dev_dir.join("vpd_pg83"), &pg83);
        let _ = std::fs::write(dev_dir.join("vpd_pg80"), &pg80);
        locked.state.sessions[pos].disks.push(DiskRecord {
            lun: lun32,
            kernel_name: name,
            loop_device,
        });
        locked
            .save()
            .map_err(|e| format!("cannot save the disk: {e}"))?;
        added += 1;
    }
    Ok(added)
}

fn logout_node(
    ctx: &NodeContext,
    mut locked: super::state::Locked,
    iqn: &str,
    portal: &str,
) -> Outcome {
    let Some(pos) = locked
        .state
        .sessions
        .iter()
        .position(|s| s.iqn == iqn && s.portal == portal)
    else {
        return fail(21, "No matching sessions found");
    };
    let s = locked.state.sessions.remove(pos);
    let Ok(tree) = NodeTree::create(&ctx.root) else {
        return fail(12, "node tree unreadable");
    };
    for d in &s.disks {
        let _ = tree.remove_disk(&d.kernel_name);
        detach_loop(&d.loop_device);
    }
    let _ = tree.remove_iscsi_session(s.host, s.sid);
    if let Err(e) = locked.save() {
        return fail(12, format!("cannot save state: {e}"));
    }
    let who = format!("[sid: {}, target: {iqn}, portal: {portal}]", s.sid);
    ok(format!(
        "Logging out of session {who}\nLogout of {who} successful.\n"
    ))
}

/// `-m session -r <sid> --rescan`: a new login to list the LUNs again.
pub async fn rescan_session(
    ctx: &NodeContext,
    mut locked: super::state::Locked,
    sid: u32,
) -> Outcome {
    let Some(pos) = locked.state.sessions.iter().position(|s| s.sid == sid) else {
        return fail(21, "No session found.");
    };
    let record = locked.state.sessions[pos].clone();
    let rec = records::read(&ctx.root, &record.iqn, &record.portal)
        .ok()
        .flatten()
        .unwrap_or_default();
    let chap = (rec.authmethod == "CHAP").then(|| Chap {
        username: rec.username.clone(),
        password: rec.password.clone(),
        mutual: (!rec.username_in.is_empty())
            .then(|| (rec.username_in.clone(), rec.password_in.clone())),
    });
    let Some(addr) = resolve(&record.portal) else {
        return fail(4, "cannot resolve portal");
    };
    let mut session = match iscsi::login(
        addr,
        &record.iqn,
        &ctx.initiator,
        chap.as_ref(),
        Duration::from_secs(15),
    )
    .await
    {
        Ok(s) => s,
        Err(e) => return login_error(&e, &record.iqn),
    };
    let Ok(fabric) = Fabric::load(&ctx.fabric) else {
        return fail(19, "lab fabric unreadable");
    };
    let Ok(tree) = NodeTree::create(&ctx.root) else {
        return fail(12, "node tree unreadable");
    };
    let r = scan(&mut session, &fabric, &tree, &mut locked, pos).await;
    let _ = session.logout().await;
    match r {
        Ok(_) => ok(format!(
            "Rescanning session [sid: {sid}, target: {}, portal: {}]\n",
            record.iqn, record.portal
        )),
        Err(e) => fail(19, format!("rescan failed: {e}")),
    }
}
