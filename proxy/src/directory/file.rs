//! The file-backed agent directory: one agent per line,
//! `<node> <host:port> [label=value,...]`, `#` comments. Edits are picked up
//! through inotify and a slow poll; a bad file keeps the last good map. The
//! file is also the list of nodes, but a node missing from it is only
//! unknown at first: a half-written file (an editor's save cut short, a
//! copy still under way) lists fewer nodes than there are. A node is
//! removed once it has been out of every clean read of the file for the
//! grace period, counted from the first clean read without it: for one
//! never listed since the proxy started, the first clean read after the
//! start. Nothing is persisted, so a restart waits the grace period again
//! rather than take a node absent at start for gone. A read that fails
//! (unreadable, malformed, empty) keeps the last good map and starts no
//! clock, and while the file reads badly no missing node is removed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use csi_scsi_contract::NodeName;
use csi_scsi_textfs::file_watch;
use tokio::sync::watch;

use super::{AgentDirectory, AgentEntry, Agents, LabelSource, Standing};
use crate::selector::excerpt;

/// Lets an editor's save (write, rename) land before rereading.
const SETTLE: Duration = Duration::from_millis(50);

/// How long a node must stay out of the agents file before it is removed
/// (`--node-removal-grace`): ten 30-second polls, and time enough to see a
/// mistaken edit in the log and undo it.
pub const DEFAULT_REMOVAL_GRACE: Duration = Duration::from_secs(300);

/// Agents listed in a file.
pub struct FileDirectory {
    path: PathBuf,
    tx: watch::Sender<Agents>,
    removal_grace: Duration,
    absence: Mutex<Absence>,
}

/// What the reads of the file say about the nodes missing from it.
#[derive(Debug)]
struct Absence {
    /// The first clean read: a node never listed since counts as absent
    /// from then.
    start: Option<Instant>,
    /// Nodes listed since the start and then left out by a clean read:
    /// since when.
    left: BTreeMap<NodeName, Instant>,
    /// Whether the last read was clean. One that failed (unreadable,
    /// malformed, empty) keeps the last good map and puts every missing
    /// node in doubt until a clean read.
    clean: bool,
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
    /// The file holds nothing, not even a comment: more likely a write cut
    /// short than an operator removing every node.
    #[error("{path}: empty (half-written?); to list no node on purpose, leave a `#` comment in it")]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

impl FileDirectory {
    /// Reads `path` once, with the default removal grace period; fails on
    /// a missing or malformed file.
    pub fn load(path: &Path) -> Result<Arc<Self>, DirectoryError> {
        Self::load_with_grace(path, DEFAULT_REMOVAL_GRACE)
    }

    /// Reads `path` once; a node missing from it is removed only after
    /// `removal_grace` (see the module doc). Fails on a missing or
    /// malformed file; an empty one is read as no agent, with every node
    /// in doubt until a clean read.
    pub fn load_with_grace(
        path: &Path,
        removal_grace: Duration,
    ) -> Result<Arc<Self>, DirectoryError> {
        let (agents, clean) = match read(path) {
            Ok(agents) => (agents, true),
            Err(e @ DirectoryError::Empty { .. }) => {
                tracing::warn!(error = %e, "agent directory file empty; no agent until it lists some");
                (BTreeMap::new(), false)
            }
            Err(e) => return Err(e),
        };
        Ok(Arc::new(Self {
            path: path.to_owned(),
            tx: watch::channel(Arc::new(agents)).0,
            removal_grace,
            absence: Mutex::new(Absence {
                start: clean.then(Instant::now),
                left: BTreeMap::new(),
                clean,
            }),
        }))
    }

    /// Rereads the file; publishes a new snapshot when it changed. On an
    /// error the last good map stays, and no missing node is removed until
    /// a clean read.
    pub fn reload(&self) -> Result<bool, DirectoryError> {
        let mut absence = self.absence.lock().unwrap_or_else(|e| e.into_inner());
        let agents = match read(&self.path) {
            Ok(agents) => agents,
            Err(e) => {
                absence.clean = false;
                return Err(e);
            }
        };
        absence.clean = true;
        let now = Instant::now();
        absence.start.get_or_insert(now);
        let before = self.tx.borrow().clone();
        for node in before.keys().filter(|n| !agents.contains_key(*n)) {
            tracing::warn!(
                node = %node,
                grace_s = self.removal_grace.as_secs(),
                "node left the agents file; it counts as gone (its publish records dropped \
                 without a detach) once it has stayed out for the grace period \
                 (--node-removal-grace); until then calls for it wait"
            );
            absence.left.entry(node.clone()).or_insert(now);
        }
        absence.left.retain(|n, _| !agents.contains_key(n));
        let changed = *before != agents;
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
                    tracing::warn!(error = %e, "agent directory file rejected; keeping the last good one, and no node missing from it counts as gone until it reads cleanly");
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

    fn label_source(&self) -> LabelSource {
        LabelSource::AgentsFile
    }

    /// The file is the list of nodes: a node out of every clean read of it
    /// for the grace period is removed.
    fn standing(&self, node: &NodeName) -> Standing {
        let absence = self.absence.lock().unwrap_or_else(|e| e.into_inner());
        if self.tx.borrow().contains_key(node) || !absence.clean {
            return Standing::Member;
        }
        let since = absence.left.get(node).copied().or(absence.start);
        if since.is_some_and(|t| t.elapsed() >= self.removal_grace) {
            Standing::Removed
        } else {
            Standing::Leaving
        }
    }
}

fn read(path: &Path) -> Result<BTreeMap<NodeName, AgentEntry>, DirectoryError> {
    let text = std::fs::read_to_string(path).map_err(|source| DirectoryError::Io {
        path: path.to_owned(),
        source,
    })?;
    if text.trim().is_empty() {
        return Err(DirectoryError::Empty {
            path: path.to_owned(),
        });
    }
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
pub(crate) fn parse(text: &str) -> Result<BTreeMap<NodeName, AgentEntry>, (usize, String)> {
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
        // Every name a certificate can carry is one; the check stays so the
        // map's key type is the parsed one.
        let node = NodeName::parse(node).map_err(|e| (i + 1, e.to_string()))?;
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
                node.clone(),
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
    use crate::directory::NodeAgent;
    use crate::node;

    #[test]
    fn parses_nodes_addresses_and_labels() {
        let map = parse("# lab\nnode-a 198.18.0.2:9810 zone=a,rack=1\nnode-b 198.18.0.3:9810\n")
            .expect("valid");
        assert_eq!(map.len(), 2);
        assert_eq!(map[&node("node-a")].address, "198.18.0.2:9810");
        assert_eq!(map[&node("node-a")].labels["zone"], "a");
        assert!(map[&node("node-b")].labels.is_empty());
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
            assert!(
                parse(&text).is_ok_and(|m| m.contains_key(&node(ok))),
                "{ok}"
            );
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
        assert!(directory.snapshot().contains_key(&node("node-b")));

        std::fs::write(&path, "not a valid line\n").expect("write");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            directory.snapshot().contains_key(&node("node-b")),
            "the last good map stays"
        );
    }

    /// Long enough that a loaded machine cannot sleep through it between a
    /// reload and the assertion after it.
    const GRACE: Duration = Duration::from_secs(2);

    /// An agents file in a temporary directory.
    struct File {
        _dir: tempfile::TempDir,
        path: PathBuf,
    }

    impl File {
        fn new(text: &str) -> Self {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join("agents");
            let file = Self { _dir: dir, path };
            file.write(text);
            file
        }

        fn write(&self, text: &str) {
            std::fs::write(&self.path, text).expect("write");
        }

        fn load(&self) -> Arc<FileDirectory> {
            FileDirectory::load_with_grace(&self.path, GRACE).expect("load")
        }
    }

    const A_AND_B: &str = "node-a 198.18.0.2:9810\nnode-b 198.18.0.3:9810\n";
    const A: &str = "node-a 198.18.0.2:9810\n";

    fn reload(directory: &FileDirectory, file: &File) -> Result<bool, DirectoryError> {
        assert_eq!(directory.path, file.path);
        directory.reload()
    }

    fn locate(directory: &FileDirectory, name: &str) -> NodeAgent {
        (directory as &dyn AgentDirectory).locate(&node(name))
    }

    #[test]
    fn a_node_that_leaves_the_file_is_unlisted_until_it_stayed_out_for_the_grace_period() {
        let file = File::new(A_AND_B);
        let directory = file.load();
        // A save cut short at a line boundary reads as a clean file
        // without node-b: only time tells it from the operator's edit.
        file.write(A);
        assert!(reload(&directory, &file).expect("clean"));
        assert_eq!(locate(&directory, "node-b"), NodeAgent::Unlisted);
        assert!(matches!(locate(&directory, "node-a"), NodeAgent::Listed(_)));

        // The writer finishes: node-b is back, and its clock stops.
        file.write(A_AND_B);
        assert!(reload(&directory, &file).expect("clean"));
        assert!(matches!(locate(&directory, "node-b"), NodeAgent::Listed(_)));

        // Removed for good: gone once out of every clean read for GRACE.
        file.write(A);
        reload(&directory, &file).expect("clean");
        std::thread::sleep(GRACE / 2);
        reload(&directory, &file).expect("clean");
        assert_eq!(
            locate(&directory, "node-b"),
            NodeAgent::Unlisted,
            "the clock runs from when it left, not from the last read"
        );
        std::thread::sleep(GRACE / 2 + Duration::from_millis(100));
        assert_eq!(locate(&directory, "node-b"), NodeAgent::Gone);
        assert!(matches!(locate(&directory, "node-a"), NodeAgent::Listed(_)));
    }

    #[test]
    fn a_garbled_or_empty_file_keeps_the_last_good_map_and_makes_no_node_gone() {
        let file = File::new(A_AND_B);
        let directory = file.load();
        // Cut short mid-line, then emptied (truncated before the write).
        for bad in ["node-a 198.18.0.2:9810\nnode-b 198.1", "", " \n\n"] {
            file.write(bad);
            let e = reload(&directory, &file).expect_err(bad);
            assert!(
                matches!(
                    e,
                    DirectoryError::Parse { line: 2, .. } | DirectoryError::Empty { .. }
                ),
                "{bad:?}: {e}"
            );
            assert_eq!(
                directory.snapshot().len(),
                2,
                "{bad:?}: the last good map stays"
            );
            assert!(matches!(locate(&directory, "node-b"), NodeAgent::Listed(_)));
        }
        // A bad file for longer than the grace period starts no clock: the
        // first clean read without node-b does.
        std::thread::sleep(GRACE + Duration::from_millis(100));
        file.write(A);
        reload(&directory, &file).expect("clean");
        assert_eq!(locate(&directory, "node-b"), NodeAgent::Unlisted);

        // While the file is bad, a node out of it is in doubt, however long.
        file.write("node-a 198.18.0.2:9810\nnode-");
        reload(&directory, &file).expect_err("garbled");
        std::thread::sleep(GRACE + Duration::from_millis(100));
        assert_eq!(locate(&directory, "node-b"), NodeAgent::Unreachable);
        assert!(matches!(locate(&directory, "node-a"), NodeAgent::Listed(_)));
        // Clean again, and node-b has been out of every clean read since it
        // left, for longer than the grace period.
        file.write(A);
        reload(&directory, &file).expect("clean");
        assert_eq!(locate(&directory, "node-b"), NodeAgent::Gone);

        // A comment alone is the operator emptying the file on purpose.
        file.write("# every node decommissioned\n");
        assert!(reload(&directory, &file).expect("clean"));
        assert!(directory.snapshot().is_empty());
        assert_eq!(locate(&directory, "node-a"), NodeAgent::Unlisted);
    }

    #[test]
    fn after_a_restart_a_node_absent_from_the_file_is_gone_only_a_grace_period_later() {
        // The proxy restarts while node-b's line is missing (half-written,
        // or removed a moment ago): nothing says how long it has been out.
        let file = File::new(A);
        let directory = file.load();
        assert_eq!(locate(&directory, "node-b"), NodeAgent::Unlisted);
        std::thread::sleep(GRACE + Duration::from_millis(100));
        assert_eq!(locate(&directory, "node-b"), NodeAgent::Gone);

        // An empty file at start lists no agent and makes no node gone.
        let empty = File::new("");
        let directory = empty.load();
        assert!(directory.snapshot().is_empty());
        std::thread::sleep(GRACE + Duration::from_millis(100));
        assert_eq!(locate(&directory, "node-a"), NodeAgent::Unreachable);
        // The clock of a node never listed starts at the first clean read.
        empty.write(A);
        assert!(reload(&directory, &empty).expect("clean"));
        assert_eq!(locate(&directory, "node-b"), NodeAgent::Unlisted);
        std::thread::sleep(GRACE + Duration::from_millis(100));
        assert_eq!(locate(&directory, "node-b"), NodeAgent::Gone);
    }

    #[test]
    fn malformed_lines_name_the_line() {
        assert_eq!(parse("node-a\n").map_err(|e| e.0), Err(1));
        assert_eq!(parse("a 1.2.3.4:1\nb nope\n").map_err(|e| e.0), Err(2));
        assert_eq!(parse("a 1.2.3.4:1\na 1.2.3.4:2\n").map_err(|e| e.0), Err(2));
    }
}
