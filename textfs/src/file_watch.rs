//! Wake-ups when files change, for everything that rereads a file: notify
//! on the files' directories, debounced, with a metadata poll that always
//! runs as the fallback. One failure policy for every user: when notify
//! cannot start, or fails later, log once and keep polling.

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::{mpsc, watch};
use tokio::time::MissedTickBehavior;

/// A burst that never pauses still wakes after this many `settle` periods.
const MAX_SETTLE_ROUNDS: u32 = 10;

/// Watches `paths` through their directories and polls their metadata every
/// `poll`; the receiver changes once per burst of changes (quiet for
/// `settle`). The watch stops when every receiver is dropped. Needs a Tokio
/// runtime.
pub fn watch_paths<I, P>(paths: I, poll: Duration, settle: Duration) -> watch::Receiver<()>
where
    I: IntoIterator<Item = P>,
    P: Into<PathBuf>,
{
    let paths: Vec<PathBuf> = paths.into_iter().map(Into::into).collect();
    let notifier = match Notifier::start(&paths) {
        Ok(n) => Some(n),
        Err((dir, e)) => {
            tracing::warn!(path = %dir.display(), error = %e, ?poll, "cannot watch files; polling instead");
            None
        }
    };
    spawn(paths, poll, settle, notifier)
}

/// Like [`watch_paths`] but never uses notify: polling only, for
/// filesystems without inotify and for tests.
pub fn poll_paths<I, P>(paths: I, poll: Duration, settle: Duration) -> watch::Receiver<()>
where
    I: IntoIterator<Item = P>,
    P: Into<PathBuf>,
{
    spawn(
        paths.into_iter().map(Into::into).collect(),
        poll,
        settle,
        None,
    )
}

fn spawn(
    paths: Vec<PathBuf>,
    poll: Duration,
    settle: Duration,
    notifier: Option<Notifier>,
) -> watch::Receiver<()> {
    let (tx, rx) = watch::channel(());
    // Taken after the watcher started, so no change falls between the two.
    let seen = fingerprint(&paths);
    let task = Task {
        paths,
        poll,
        settle,
        tx,
        notifier,
        missed: false,
    };
    tokio::spawn(task.run(seen));
    rx
}

/// The notify side: the watcher's callback only flags and wakes the task.
struct Notifier {
    /// Kept alive for as long as events are wanted.
    _watcher: Box<dyn Send>,
    events: mpsc::Receiver<()>,
    shared: Arc<Shared>,
}

/// What the watcher's callback (on notify's thread) tells the task.
#[derive(Default)]
struct Shared {
    /// An event named a watched file (its mtime may look unchanged when
    /// two writes share a timestamp tick).
    direct: AtomicBool,
    /// The watcher's first error; from then on the task polls only.
    error: Mutex<Option<notify::Error>>,
}

// === impl Notifier ===

impl Notifier {
    /// Watches each path's directory (not the file: renames replace it);
    /// fails with the directory that could not be watched.
    fn start(paths: &[PathBuf]) -> Result<Self, (PathBuf, notify::Error)> {
        // notify reports absolute paths (it joins relative ones to the cwd).
        let names: BTreeSet<PathBuf> = paths.iter().map(|p| absolute(p)).collect();
        let dirs: BTreeSet<PathBuf> = names.iter().map(|p| directory_of(p)).collect();
        let shared = Arc::new(Shared::default());
        let (tx, events) = mpsc::channel(1);
        let flags = shared.clone();
        let mut watcher = notify::recommended_watcher(move |e: notify::Result<notify::Event>| {
            match e {
                // Opening and reading the files (this task's own reload
                // among them) changes nothing: without this, every reload
                // would wake the task for another one.
                Ok(e) if matches!(e.kind, notify::EventKind::Access(_)) => return,
                Ok(e) => {
                    if e.need_rescan() || e.paths.iter().any(|p| names.contains(p)) {
                        flags.direct.store(true, Ordering::Relaxed);
                    }
                }
                Err(e) => {
                    let mut first = flags.error.lock().unwrap_or_else(|p| p.into_inner());
                    first.get_or_insert(e);
                }
            }
            // A full channel already holds a pending wake-up.
            let _ = tx.try_send(());
        })
        .map_err(|e| (dirs.first().cloned().unwrap_or_default(), e))?;
        for dir in &dirs {
            watcher
                .watch(dir, RecursiveMode::NonRecursive)
                .map_err(|e| (dir.clone(), e))?;
        }
        Ok(Self {
            _watcher: Box::new(watcher),
            events,
            shared,
        })
    }
}

struct Task {
    paths: Vec<PathBuf>,
    poll: Duration,
    settle: Duration,
    tx: watch::Sender<()>,
    notifier: Option<Notifier>,
    /// notify failed, so a change may have gone unreported.
    missed: bool,
}

// === impl Task ===

impl Task {
    async fn run(mut self, mut seen: Fingerprint) {
        let mut tick = tokio::time::interval(self.poll);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                () = self.tx.closed() => return,
                woke = next_event(&mut self.notifier) => {
                    if !woke {
                        self.fail(&notify::Error::generic("the watcher stopped"));
                    }
                }
                _ = tick.tick() => {
                    if fingerprint(&self.paths) == seen {
                        continue;
                    }
                }
            }
            let now = self.settle().await;
            let direct = self.take_direct();
            if direct || now != seen {
                seen = now;
                if self.tx.send(()).is_err() {
                    return;
                }
            }
        }
    }

    /// Waits until a `settle` period passes with no event and no metadata
    /// change (several files, a symlink swap), so readers see the end state.
    async fn settle(&mut self) -> Fingerprint {
        let mut last = fingerprint(&self.paths);
        for _ in 0..MAX_SETTLE_ROUNDS {
            tokio::time::sleep(self.settle).await;
            let events = self.drain();
            let now = fingerprint(&self.paths);
            if !events && now == last {
                break;
            }
            last = now;
        }
        last
    }

    /// Takes pending wake-ups; true when there were any.
    fn drain(&mut self) -> bool {
        let Some(n) = &mut self.notifier else {
            return false;
        };
        let mut any = false;
        while n.events.try_recv().is_ok() {
            any = true;
        }
        let error = n
            .shared
            .error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(e) = error {
            self.fail(&e);
        }
        any
    }

    /// The one failure policy: log once, drop the watcher for good and keep
    /// polling; wake the reader once, as events may have been lost.
    fn fail(&mut self, error: &notify::Error) {
        tracing::warn!(paths = ?self.paths, %error, poll = ?self.poll, "file watcher failed; polling instead");
        self.notifier = None;
        self.missed = true;
    }

    /// Whether an event named a watched file, or notify failed, since the
    /// last call.
    fn take_direct(&mut self) -> bool {
        let flagged = self
            .notifier
            .as_ref()
            .is_some_and(|n| n.shared.direct.swap(false, Ordering::Relaxed));
        std::mem::take(&mut self.missed) || flagged
    }
}

/// Waits for the next notify wake-up (false: the watcher's thread is gone);
/// never returns once notify is off.
async fn next_event(notifier: &mut Option<Notifier>) -> bool {
    match notifier {
        Some(n) => n.events.recv().await.is_some(),
        None => std::future::pending().await,
    }
}

/// What a poll compares, per path: `None` when unreadable.
type Fingerprint = Vec<Option<Stamp>>;

/// A file's identity, size and times; symlinks are followed, so a Secret
/// volume's `..data` swap shows as a new inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

fn fingerprint(paths: &[PathBuf]) -> Fingerprint {
    paths
        .iter()
        .map(|p| {
            std::fs::metadata(p).ok().map(|m| Stamp {
                dev: m.dev(),
                ino: m.ino(),
                len: m.len(),
                mtime: (m.mtime(), m.mtime_nsec()),
                ctime: (m.ctime(), m.ctime_nsec()),
            })
        })
        .collect()
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_owned())
}

fn directory_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Generous: these machines are noisy; only "it happened" is checked.
    const WITHIN: Duration = Duration::from_secs(10);
    /// Long enough that only notify can explain a prompt wake-up.
    const NO_POLL: Duration = Duration::from_secs(3600);
    const SETTLE: Duration = Duration::from_millis(50);

    async fn woken(rx: &mut watch::Receiver<()>, what: &str) {
        tokio::time::timeout(WITHIN, rx.changed())
            .await
            .unwrap_or_else(|_| panic!("{what}: no wake-up within {WITHIN:?}"))
            .expect("watch task alive");
    }

    /// A scratch directory holding an `agents` file.
    fn agents_file() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("agents");
        std::fs::write(&file, "one\n").expect("write");
        (dir, file)
    }

    async fn quiet_for(rx: &mut watch::Receiver<()>, d: Duration) -> bool {
        tokio::time::timeout(d, rx.changed()).await.is_err()
    }

    #[tokio::test]
    async fn a_write_wakes_the_receiver() {
        let (_dir, file) = agents_file();
        let mut rx = watch_paths([&file], NO_POLL, SETTLE);
        std::fs::write(&file, "two\n").expect("write");
        woken(&mut rx, "write").await;
    }

    #[tokio::test]
    async fn other_files_in_the_directory_do_not_wake_it() {
        let (dir, file) = agents_file();
        let mut rx = watch_paths([&file], NO_POLL, SETTLE);
        std::fs::write(dir.path().join("store.db-wal"), "x").expect("write");
        assert!(quiet_for(&mut rx, Duration::from_millis(500)).await);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_of_writes_wakes_it_a_few_times_not_per_write() {
        const WRITES: usize = 40;
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("targets.json");
        std::fs::write(&file, "[]").expect("write");
        let mut rx = watch_paths([&file], NO_POLL, Duration::from_millis(200));
        let path = file.clone();
        let writer = std::thread::spawn(move || {
            for i in 0..WRITES {
                std::fs::write(&path, format!("[{i}]")).expect("write");
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        woken(&mut rx, "burst").await;
        let mut wakes = 1;
        while !quiet_for(&mut rx, Duration::from_secs(2)).await {
            wakes += 1;
        }
        writer.join().expect("writer");
        assert!(wakes <= 5, "{wakes} wake-ups for {WRITES} writes");
    }

    #[tokio::test]
    async fn a_file_replaced_by_rename_wakes_it() {
        let (dir, file) = agents_file();
        let mut rx = watch_paths([&file], NO_POLL, SETTLE);
        let tmp = dir.path().join(".agents.tmp");
        std::fs::write(&tmp, "two\n").expect("write");
        std::fs::rename(&tmp, &file).expect("rename over");
        woken(&mut rx, "rename over").await;
    }

    /// How kubelet updates a Secret volume: the files are symlinks through
    /// `..data`, which is itself swapped by renaming a new symlink over it.
    #[tokio::test]
    async fn a_secret_volume_data_swap_wakes_it() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        std::fs::create_dir(d.join("..v1")).expect("mkdir");
        std::fs::write(d.join("..v1/tls.crt"), "one").expect("write");
        symlink("..v1", d.join("..data")).expect("symlink");
        symlink("..data/tls.crt", d.join("tls.crt")).expect("symlink");
        let mut rx = watch_paths([d.join("tls.crt")], NO_POLL, SETTLE);

        std::fs::create_dir(d.join("..v2")).expect("mkdir");
        std::fs::write(d.join("..v2/tls.crt"), "two").expect("write");
        symlink("..v2", d.join("..data_tmp")).expect("symlink");
        std::fs::rename(d.join("..data_tmp"), d.join("..data")).expect("swap");
        std::fs::remove_dir_all(d.join("..v1")).expect("remove old");
        woken(&mut rx, "..data swap").await;
    }

    #[tokio::test]
    async fn polling_alone_sees_a_change() {
        let (_dir, file) = agents_file();
        let mut rx = poll_paths([&file], Duration::from_millis(100), SETTLE);
        assert!(
            quiet_for(&mut rx, Duration::from_millis(500)).await,
            "unchanged"
        );
        std::fs::write(&file, "two, longer\n").expect("write");
        woken(&mut rx, "poll").await;
        std::fs::remove_file(&file).expect("remove");
        woken(&mut rx, "removal").await;
    }

    #[tokio::test]
    async fn a_watcher_error_falls_back_to_polling() {
        let (_dir, file) = agents_file();
        // A stand-in watcher whose errors the test injects.
        let shared = Arc::new(Shared::default());
        let (tx, events) = mpsc::channel(1);
        let notifier = Notifier {
            _watcher: Box::new(()),
            events,
            shared: shared.clone(),
        };
        let mut rx = spawn(
            vec![file.clone()],
            Duration::from_millis(100),
            SETTLE,
            Some(notifier),
        );
        *shared.error.lock().expect("lock") = Some(notify::Error::generic("queue lost"));
        tx.try_send(()).expect("send");
        woken(&mut rx, "error (a change may be lost)").await;
        // The stand-in no longer matters: only polling can see this.
        drop(tx);
        std::fs::write(&file, "two, longer\n").expect("write");
        woken(&mut rx, "poll after the error").await;
    }
}
