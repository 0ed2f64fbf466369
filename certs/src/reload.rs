//! Keep trust material current: reload when the files change (a Secret
//! volume swaps its `..data` symlink), keep the old material when the new
//! files are bad, and publish each change.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use notify::{RecursiveMode, Watcher};
use tokio::sync::{mpsc, watch};

use crate::{CertError, Material, MaterialPaths, Role, TrustDomain};

/// The current trust material of one process, swapped atomically on reload.
/// Handshakes read it through the resolvers and verifiers in [`crate::tls`],
/// so open connections are untouched and new ones see the new material.
pub struct MaterialStore {
    paths: MaterialPaths,
    role: Role,
    domain: TrustDomain,
    current: ArcSwap<Material>,
    generation: watch::Sender<u64>,
    /// Files last refused, so a bad set is reported once, not every poll.
    rejected: std::sync::Mutex<Option<[Vec<u8>; 3]>>,
}

// === impl MaterialStore ===

impl MaterialStore {
    /// Loads the files once; fails if they are missing or inconsistent.
    pub fn load(
        paths: MaterialPaths,
        role: Role,
        domain: TrustDomain,
    ) -> Result<Arc<Self>, CertError> {
        let material = Material::load(&paths, &role, &domain)?;
        Ok(Arc::new(Self {
            paths,
            role,
            domain,
            current: ArcSwap::from_pointee(material),
            generation: watch::channel(0).0,
            rejected: std::sync::Mutex::new(None),
        }))
    }

    /// The material in use now.
    pub fn current(&self) -> Arc<Material> {
        self.current.load_full()
    }

    /// The trust domain identities are checked in.
    pub fn trust_domain(&self) -> &TrustDomain {
        &self.domain
    }

    /// The files this store reads.
    pub fn paths(&self) -> &MaterialPaths {
        &self.paths
    }

    /// A receiver that changes each time new material is swapped in.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Rereads the files now. `Ok(true)` when new material was swapped in,
    /// `Ok(false)` when the files are unchanged (or are the same bad files
    /// already reported), `Err` when they changed but are unusable (the old
    /// material stays in use).
    pub fn reload(&self) -> Result<bool, CertError> {
        let raw = self.paths.read_raw()?;
        if self.current.load().same_files(&raw) {
            return Ok(false);
        }
        let mut rejected = self.rejected.lock().unwrap_or_else(|p| p.into_inner());
        if rejected.as_ref() == Some(&raw) {
            return Ok(false);
        }
        let material = match Material::from_raw(&self.paths, raw.clone(), &self.role, &self.domain)
        {
            Ok(m) => m,
            Err(e) => {
                *rejected = Some(raw);
                return Err(e);
            }
        };
        *rejected = None;
        tracing::info!(
            identity = %material.identity(),
            serial = material.serial(),
            "loaded rotated TLS material"
        );
        self.current.store(Arc::new(material));
        self.generation.send_modify(|g| *g += 1);
        Ok(true)
    }

    /// Watches the files' directories and polls every `poll` as a fallback;
    /// reloads on change. Stops when the store is dropped. Needs a Tokio
    /// runtime.
    pub fn watch(self: &Arc<Self>, poll: Duration) -> Result<(), CertError> {
        let (tx, mut rx) = mpsc::channel::<()>(1);
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                if event.is_ok() {
                    // A full channel already holds a pending wake-up.
                    let _ = tx.try_send(());
                }
            })
            .map_err(|source| CertError::Watch {
                path: self.paths.cert.clone(),
                source,
            })?;
        for dir in watched_dirs(&self.paths) {
            watcher
                .watch(&dir, RecursiveMode::NonRecursive)
                .map_err(|source| CertError::Watch { path: dir, source })?;
        }
        let store: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            // The watcher lives as long as this task.
            let _watcher = watcher;
            let mut ticker = tokio::time::interval(poll);
            ticker.tick().await;
            loop {
                tokio::select! {
                    woke = rx.recv() => {
                        if woke.is_none() {
                            return;
                        }
                        // Let a burst of events (several files, a symlink
                        // swap) settle before reading.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        while rx.try_recv().is_ok() {}
                    }
                    _ = ticker.tick() => {}
                }
                let Some(store) = store.upgrade() else { return };
                if let Err(e) = store.reload() {
                    tracing::warn!(error = %e, "new TLS material rejected; keeping the current one");
                }
            }
        });
        Ok(())
    }
}

impl std::fmt::Debug for MaterialStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MaterialStore")
            .field("paths", &self.paths)
            .field("role", &self.role)
            .field("current", &self.current.load())
            .finish()
    }
}

fn watched_dirs(paths: &MaterialPaths) -> BTreeSet<PathBuf> {
    [&paths.cert, &paths.key, &paths.ca]
        .into_iter()
        .map(|p| p.parent().unwrap_or(Path::new(".")).to_path_buf())
        .map(|p| {
            if p.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                p
            }
        })
        .collect()
}
