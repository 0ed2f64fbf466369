//! iSCSI node records as open-iscsi keeps them: one file per target and
//! portal, `<root>/etc/iscsi/nodes/<iqn>/<address>,<port>,1/default`, with
//! `key = value` lines. The agent writes the CHAP settings into these
//! files itself (never on iscsiadm's command line), so the stand-in reads
//! them from here at login, as iscsid does.

use std::io;
use std::path::{Path, PathBuf};

use super::state::NodeRecord;

/// Where a node's records live (the agent's `--iscsi-node-dir`).
pub fn nodes_dir(root: &Path) -> PathBuf {
    root.join("etc/iscsi/nodes")
}

fn record_file(root: &Path, iqn: &str, portal: &str) -> PathBuf {
    let (address, port) = portal.rsplit_once(':').unwrap_or((portal, "3260"));
    nodes_dir(root)
        .join(iqn)
        .join(format!("{address},{port},1"))
        .join("default")
}

/// `-o new`: a record with iscsid.conf's defaults (re-creating resets it).
pub fn create(root: &Path, iqn: &str, portal: &str) -> io::Result<()> {
    let file = record_file(root, iqn, portal);
    std::fs::create_dir_all(file.parent().unwrap_or(root))?;
    std::fs::write(
        &file,
        format!(
            "node.name = {iqn}\nnode.conn[0].address = {portal}\nnode.startup = automatic\nnode.session.auth.authmethod = None\nnode.conn[0].timeo.login_timeout = 15\n"
        ),
    )
}

/// `-o update -n <key> -v <value>`; `Ok(false)` when there is no record.
pub fn update(root: &Path, iqn: &str, portal: &str, key: &str, value: &str) -> io::Result<bool> {
    let file = record_file(root, iqn, portal);
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| l.split_once('=').is_none_or(|(k, _)| k.trim() != key))
        .map(str::to_owned)
        .collect();
    lines.push(format!("{key} = {value}"));
    std::fs::write(&file, lines.join("\n") + "\n")?;
    Ok(true)
}

/// `-o delete`; `Ok(false)` when there was no record.
pub fn delete(root: &Path, iqn: &str, portal: &str) -> io::Result<bool> {
    let file = record_file(root, iqn, portal);
    let Some(dir) = file.parent() else {
        return Ok(false);
    };
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {
            let _ = std::fs::remove_dir(dir.parent().unwrap_or(dir));
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// The record, as iscsid reads it at login.
pub fn read(root: &Path, iqn: &str, portal: &str) -> io::Result<Option<NodeRecord>> {
    let text = match std::fs::read_to_string(record_file(root, iqn, portal)) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut rec = NodeRecord {
        login_timeout: 15,
        ..NodeRecord::default()
    };
    for (k, v) in text.lines().filter_map(|l| l.split_once('=')) {
        let v = v.trim().to_owned();
        match k.trim() {
            "node.session.auth.authmethod" => rec.authmethod = v,
            "node.session.auth.username" => rec.username = v,
            "node.session.auth.password" => rec.password = v,
            "node.session.auth.username_in" => rec.username_in = v,
            "node.session.auth.password_in" => rec.password_in = v,
            "node.conn[0].timeo.login_timeout" => rec.login_timeout = v.parse().unwrap_or(15),
            _ => {}
        }
    }
    Ok(Some(rec))
}

/// Every record, as `(portal, iqn)` (`-m node`).
pub fn list(root: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for target in std::fs::read_dir(nodes_dir(root))
        .into_iter()
        .flatten()
        .flatten()
    {
        let iqn = target.file_name().to_string_lossy().into_owned();
        for portal in std::fs::read_dir(target.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = portal.file_name().to_string_lossy().into_owned();
            let mut parts = name.rsplitn(3, ',');
            let (_tpgt, port, address) = (parts.next(), parts.next(), parts.next());
            if let (Some(port), Some(address)) = (port, address) {
                out.push((format!("{address}:{port}"), iqn.clone()));
            }
        }
    }
    out.sort();
    out
}
