//! Keep trust material current: reload when the files change (a Secret
//! volume swaps its `..data` symlink), keep the old material when the new
//! files are bad, and publish each change.

use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::watch;

use crate::pem_files::{io_err, write_file};
use crate::{CertError, Material, MaterialPaths, Role, TrustDomain};
use csi_scsi_textfs::file_watch;

/// Lets the several files of one rotation (a symlink swap) land together.
const SETTLE: Duration = Duration::from_millis(100);

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
        Ok(Self::serving(paths, role, domain, material))
    }

    fn serving(
        paths: MaterialPaths,
        role: Role,
        domain: TrustDomain,
        material: Material,
    ) -> Arc<Self> {
        Arc::new(Self {
            paths,
            role,
            domain,
            current: ArcSwap::from_pointee(material),
            generation: watch::channel(0).0,
            rejected: std::sync::Mutex::new(None),
        })
    }

    /// Loads the files, or, when they hold no usable certificate, serves
    /// the enrolling stand-in ([`Material::enrolling`], trusting the CA in
    /// `bootstrap_ca`, else in `paths.ca`) until [`MaterialStore::install`] or the files bring a
    /// real one. Returns why the files were not used, if they were not.
    pub fn load_or_enrol(
        paths: MaterialPaths,
        role: Role,
        domain: TrustDomain,
        bootstrap_ca: Option<&std::path::Path>,
    ) -> Result<(Arc<Self>, Option<CertError>), CertError> {
        let (material, why) = match Material::load(&paths, &role, &domain) {
            Ok(m) => (m, None),
            Err(e) => {
                // The CA given for enrolment (the operator's current one)
                // over a ca.crt left in the files, which may be a CA since
                // rotated out.
                let ca = bootstrap_ca.unwrap_or(&paths.ca);
                (Material::enrolling(ca, &role)?, Some(e))
            }
        };
        Ok((Self::serving(paths, role, domain, material), why))
    }

    /// Checks `issued` as a reload would (key matches, chains to its CA,
    /// names this role, valid now), writes it over the files and serves it
    /// from the next handshake. The files are left alone if it is refused.
    pub fn install(&self, issued: &crate::IssuedCertificate) -> Result<(), CertError> {
        let raw = [
            issued.cert_pem.as_bytes().to_vec(),
            issued.key_pem.as_bytes().to_vec(),
            issued.ca_pem.as_bytes().to_vec(),
        ];
        let material = Material::from_raw(&self.paths, raw, &self.role, &self.domain)?;
        // The key last: until it lands, a reload reads a mismatched set and
        // keeps what it has; the CA first, so the new leaf chains.
        for (path, pem, mode) in [
            (&self.paths.ca, &issued.ca_pem, 0o644),
            (&self.paths.cert, &issued.cert_pem, 0o644),
            (&self.paths.key, &issued.key_pem, 0o600),
        ] {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|source| io_err(dir, source))?;
            }
            write_file(path, pem, mode)?;
        }
        self.swap_in(material, "installed a newly issued certificate");
        Ok(())
    }

    /// Serves `material` from the next handshake and tells subscribers.
    fn swap_in(&self, material: Material, what: &'static str) {
        tracing::info!(
            identity = %material.identity(),
            serial = material.serial(),
            trust = material.trust_digest().unwrap_or_default(),
            "{what}"
        );
        self.current.store(Arc::new(material));
        self.generation.send_modify(|g| *g += 1);
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
        let raw = match self.paths.read_raw() {
            Ok(raw) => raw,
            // Enrolling: no files yet is the expected state, not news;
            // any other read error is reported as it is when enrolled.
            Err(CertError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound
                    && !self.current.load().is_enrolled() =>
            {
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
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
        self.swap_in(material, "loaded rotated TLS material");
        Ok(true)
    }

    /// Reloads whenever the files change ([`csi_scsi_textfs::file_watch`], polling
    /// every `poll` as the fallback). Stops when the store is dropped. Needs
    /// a Tokio runtime.
    pub fn watch(self: &Arc<Self>, poll: Duration) {
        let paths = [&self.paths.cert, &self.paths.key, &self.paths.ca];
        let mut changes = file_watch::watch_paths(paths, poll, SETTLE);
        // Ends when the store, which owns the sender, is dropped.
        let mut alive = self.generation.subscribe();
        let store: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                // The first pass catches a change between load and watch.
                let Some(store) = store.upgrade() else { return };
                if let Err(e) = store.reload() {
                    tracing::warn!(error = %e, "new TLS material rejected; keeping the current one");
                }
                drop(store);
                tokio::select! {
                    changed = changes.changed() => if changed.is_err() { return },
                    // Our own reloads bump the generation; only its end counts.
                    () = async { while alive.changed().await.is_ok() {} } => return,
                }
            }
        });
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
