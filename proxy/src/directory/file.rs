//! The file-backed agent directory: one agent per line,
//! `<node> <host:port> [label=value,...]`, `#` comments. Edits are picked up
//! through inotify and a slow poll; a bad file keeps the last good map. The
//! file is also the list of nodes: a node removed from it is gone.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use csi_scsi_certs::file_watch;
use tokio::sync::watch;

use super::{AgentDirectory, AgentEntry, Agents};
use crate::selector::excerpt;

/// Lets an editor's save (write, rename) land before rereading.
const SETTLE: Duration = Duration::from_millis(50);

/// Agents listed in a file.
pub struct FileDirectory {
    path: PathBuf,
    tx: watch::Sender<Agents>,
}

/// Why the file could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DirectoryError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A line is malformed.
    #[error("{path}:{line}: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
}

impl FileDirectory {
    /// Reads `path` once; fails on a missing or malformed file.
    pub fn load(path: &Path) -> Result<Arc<Self>, DirectoryError> {
        let agents = read(path)?;
        Ok(Arc::new(Self {
            path: path.to_owned(),
            tx: watch::channel(Arc::new(agents)).0,
        }))
    }

    /// Rereads the file; publishes a new snapshot when it changed.
    pub fn reload(&self) -> Result<bool, DirectoryError> {
        let agents = read(&self.path)?;
        let changed = *self.tx.borrow().as_ref() != agents;
        if changed {
            tracing::info!(agents = agents.len(), path = %self.path.display(), "agent directory changed");
            self.tx.send_replace(Arc::new(agents));
        }
        Ok(changed)
    }

    /// Rereads the file whenever it changes ([`file_watch`], polling every
    /// `poll` as the fallback) until the directory is dropped. Needs a Tokio
    /// runtime.
    pub fn watch(self: &Arc<Self>, poll: Duration) {
        let mut changes = file_watch::watch_paths([&self.path], poll, SETTLE);
        // Ends when the directory, which owns the sender, is dropped.
        let mut alive = self.tx.subscribe();
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                // The first pass catches an edit between load and watch.
                let Some(me) = me.upgrade() else { return };
                if let Err(e) = me.reload() {
                    tracing::warn!(error = %e, "agent directory file rejected; keeping the last good one");
                }
                drop(me);
                tokio::select! {
                    changed = changes.changed() => if changed.is_err() { return },
                    // Our own reloads publish snapshots; only its end counts.
                    () = async { while alive.changed().await.is_ok() {} } => return,
                }
            }
        });
    }
}

impl AgentDirectory for FileDirectory {
    fn snapshot(&self) -> Agents {
        self.tx.borrow().clone()
    }

    fn subscribe(&self) -> watch::Receiver<Agents> {
        self.tx.subscribe()
    }

    /// The file was read whole before the directory existed.
    fn is_synced(&self) -> bool {
        true
    }

    /// The file is the list of nodes: a node removed from it is gone.
    fn node_exists(&self, node: &str) -> bool {
        self.tx.borrow().contains_key(node)
    }
}

fn read(path: &Path) -> Result<BTreeMap<String, AgentEntry>, DirectoryError> {
    let text = std::fs::read_to_string(path).map_err(|source| DirectoryError::Io {
        path: path.to_owned(),
        source,
    })?;
    parse(&text).map_err(|(line, reason)| DirectoryError::Parse {
        path: path.to_owned(),
        line,
        reason,
    })
}

/// Whether an agent's certificate can name `node` (the certs crate's rule,
/// so the file and the certificates never disagree).
fn certificate_can_name(node: &str) -> bool {
    csi_scsi_certs::validate_node_name(node).is_ok()
}

/// Parses the file's text; errors carry the 1-based line number. Node
/// names must be ones an agent's certificate can carry.
pub fn parse(text: &str) -> Result<BTreeMap<String, AgentEntry>, (usize, String)> {
    let mut out = BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let (Some(node), Some(address)) = (words.next(), words.next()) else {
            return Err((i + 1, "expected `<node> <host:port> [labels]`".into()));
        };
        if !certificate_can_name(node) {
            return Err((
                i + 1,
                format!(
                    "node name {:?} is not a Kubernetes node name (a DNS-1123 subdomain: \
                     lower-case letters, digits, '-' and '.', each dot-separated part \
                     starting and ending with a letter or digit and at most 63 long, \
                     at most 253 in all), so no agent certificate can carry it",
                    excerpt(node)
                ),
            ));
        }
        if !address
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
        {
            return Err((i + 1, format!("{address:?} is not host:port")));
        }
        let mut labels = BTreeMap::new();
        if let Some(spec) = words.next() {
            for pair in spec.split(',').filter(|p| !p.is_empty()) {
                let (k, v) = pair
                    .split_once('=')
                    .ok_or_else(|| (i + 1, format!("label {pair:?} is not key=value")))?;
                labels.insert(k.to_owned(), v.to_owned());
            }
        }
        if words.next().is_some() {
            return Err((i + 1, "unexpected text after the labels".into()));
        }
        if out
            .insert(
                node.to_owned(),
                AgentEntry {
                    address: address.to_owned(),
                    labels,
                    node_uid: None,
                },
            )
            .is_some()
        {
            return Err((i + 1, format!("node {node} listed twice")));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nodes_addresses_and_labels() {
        let map = parse("# lab\nnode-a 198.18.0.2:9810 zone=a,rack=1\nnode-b 198.18.0.3:9810\n")
            .expect("valid");
        assert_eq!(map.len(), 2);
        assert_eq!(map["node-a"].address, "198.18.0.2:9810");
        assert_eq!(map["node-a"].labels["zone"], "a");
        assert!(map["node-b"].labels.is_empty());
    }

    #[test]
    fn node_names_no_certificate_can_carry_are_refused_naming_the_line() {
        for ok in [
            "node-a",
            "ip-10-0-0-1.ec2.internal",
            "n1",
            "0",
            &"a".repeat(63),
        ] {
            let text = format!("# nodes\n{ok} 198.18.0.2:9810\n");
            assert!(parse(&text).is_ok_and(|m| m.contains_key(ok)), "{ok}");
        }
        let long = [
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(63),
        ]
        .join(".");
        for bad in [
            "Node_A",
            "Node-a",
            "node_a",
            "-a",
            "a-",
            "a..b",
            ".a",
            "a.",
            "../x",
            "a/b",
            "é",
            &"a".repeat(64),
            &long,
        ] {
            let text = format!("node-a 198.18.0.2:9810\n{bad} 198.18.0.3:9810\n");
            let (line, reason) = parse(&text).expect_err(bad);
            assert_eq!(line, 2, "{bad}");
            assert!(reason.contains("node name"), "{reason}");
            assert!(reason.len() < 512, "{reason}");
        }
    }

    #[test]
    fn a_refused_node_name_names_the_file_and_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("agents");
        std::fs::write(&path, "node-a 198.18.0.2:9810\nNode_B 198.18.0.3:9810\n").expect("write");
        let e = FileDirectory::load(&path).err().expect("refused");
        let shown = e.to_string();
        assert!(
            shown.starts_with(&format!("{}:2: ", path.display())),
            "{shown}"
        );
        assert!(shown.contains("Node_B"), "{shown}");
    }

    #[tokio::test]
    async fn an_edit_is_picked_up_and_a_bad_edit_keeps_the_last_good_map() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("agents");
        std::fs::write(&path, "node-a 198.18.0.2:9810\n").expect("write");
        let directory = FileDirectory::load(&path).expect("load");
        let mut agents = directory.subscribe();
        // An hour: only the notify side can explain a prompt reload.
        directory.watch(Duration::from_secs(3600));

        let tmp = dir.path().join(".agents.tmp");
        std::fs::write(&tmp, "node-a 198.18.0.2:9810\nnode-b 198.18.0.3:9810\n").expect("write");
        std::fs::rename(&tmp, &path).expect("rename over");
        tokio::time::timeout(Duration::from_secs(10), agents.changed())
            .await
            .expect("reloaded within 10 s")
            .expect("directory alive");
        assert!(directory.node_exists("node-b"));

        std::fs::write(&path, "not a valid line\n").expect("write");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(directory.node_exists("node-b"), "the last good map stays");
    }

    #[test]
    fn malformed_lines_name_the_line() {
        assert_eq!(parse("node-a\n").map_err(|e| e.0), Err(1));
        assert_eq!(parse("a 1.2.3.4:1\nb nope\n").map_err(|e| e.0), Err(2));
        assert_eq!(parse("a 1.2.3.4:1\na 1.2.3.4:2\n").map_err(|e| e.0), Err(2));
    }
}
