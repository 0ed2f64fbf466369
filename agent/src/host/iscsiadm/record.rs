//! The node record's authentication settings, written into the record file
//! itself (`<nodes>/<target>/<address>,<port>,<tpgt>/default`, the layout
//! `iscsiadm -o new` creates), never passed to `iscsiadm`: a CHAP secret on
//! a command line is readable in `/proc/<pid>/cmdline` by any local user
//! and any pod with hostPID for as long as the tool runs.

use std::path::{Path, PathBuf};

use super::{Chap, IscsiError, Portal};
use crate::host::Host;

/// The keys this module owns in a record; every other line is iscsiadm's.
const AUTH_KEYS: [&str; 5] = [
    "node.session.auth.authmethod",
    "node.session.auth.username",
    "node.session.auth.password",
    "node.session.auth.username_in",
    "node.session.auth.password_in",
];

/// Sets (or, with `None`, turns off) CHAP on every record of `target` at
/// `portal`, rewriting each record file durably with mode 0600. The record
/// must exist (`create_node` first).
pub async fn write_auth(
    host: &Host,
    target: &str,
    portal: &Portal,
    chap: Option<&Chap>,
) -> Result<(), IscsiError> {
    let files = record_files(host, target, portal)?;
    if files.is_empty() {
        return Err(IscsiError::NoNodeRecord {
            target: target.to_owned(),
            portal: portal.to_string(),
        });
    }
    let mut auth = vec![format!(
        "{} = {}",
        AUTH_KEYS[0],
        if chap.is_some() { "CHAP" } else { "None" }
    )];
    if let Some(c) = chap {
        auth.push(format!("{} = {}", AUTH_KEYS[1], c.username));
        auth.push(format!("{} = {}", AUTH_KEYS[2], c.password.expose()));
        if let Some(m) = &c.mutual {
            auth.push(format!("{} = {}", AUTH_KEYS[3], m.username));
            auth.push(format!("{} = {}", AUTH_KEYS[4], m.password.expose()));
        }
    }
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(|e| record_error(&file, &e))?;
        let mut lines: Vec<String> = text
            .lines()
            .filter(|l| !AUTH_KEYS.contains(&key_of(l)))
            .map(str::to_owned)
            .collect();
        lines.extend(auth.iter().cloned());
        let mut body = lines.join("\n");
        body.push('\n');
        csi_scsi_textfs::write_durably(&file, body.as_bytes(), 0o600)
            .map_err(|e| record_error(&file, &e))?;
    }
    Ok(())
}

/// The record files of `target` at `portal`: `<address>,<port>,<tpgt>/default`
/// (current open-iscsi) or a plain file `<address>,<port>` (older ones).
fn record_files(host: &Host, target: &str, portal: &Portal) -> Result<Vec<PathBuf>, IscsiError> {
    let dir = host.iscsi_nodes.join(target);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(record_error(&dir, &e)),
    };
    let exact = format!("{},{}", portal.address(), portal.port());
    let with_tpgt = format!("{exact},");
    let mut files = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name != exact && !name.starts_with(&with_tpgt) {
            continue;
        }
        let path = entry.path();
        files.push(if path.is_dir() {
            path.join("default")
        } else {
            path
        });
    }
    files.sort();
    Ok(files)
}

fn key_of(line: &str) -> &str {
    line.split_once('=').map_or("", |(k, _)| k.trim())
}

fn record_error(path: &Path, e: &std::io::Error) -> IscsiError {
    IscsiError::NodeRecordFile {
        path: path.to_owned(),
        detail: e.to_string(),
    }
}
