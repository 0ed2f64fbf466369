//! Lab disks that can fail. Each LUN's backing file is served again, through
//! FUSE, as a file of one mount; the kernel stand-in attaches that file to
//! the loop device behind the LUN's `/dev/sdX` instead of the backing file
//! itself. Reads and writes reach the LUN's data unchanged, until a test
//! gives a disk a [`Fault`]: EIO on reads or writes of a byte range, every
//! I/O stalled, or every I/O failing (the LUN unmapped). [`FaultyDisks::heal`]
//! lifts them; stalled I/O then goes on.
//!
//! The FUSE server runs in the harness's process (threads of the test, the
//! suite or `lab`), so the disks live as long as the [`crate::lab::Lab`]
//! that owns them. A lab without fault injection keeps the plain loop
//! devices (no FUSE hop).

mod fault;
mod fs;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub use self::fault::{Fault, Io, Verdict, judge};
use self::fs::{Disk, DiskFs, DiskState, Shared};

/// The mounted disks; their fault control is [`DiskControl`] (deref).
pub struct FaultyDisks {
    control: DiskControl,
    session: Option<fuser::BackgroundSession>,
}

/// The fault control of the mounted disks: a handle, cheap to clone.
#[derive(Clone)]
pub struct DiskControl {
    mount: PathBuf,
    shared: Arc<Shared>,
}

/// What `FaultyDisks::state` reports about one disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskReport {
    /// Its faults now.
    pub faults: Vec<Fault>,
    /// I/Os waiting out a stall now.
    pub waiting: usize,
    /// I/Os failed with EIO since mount.
    pub failed: u64,
}

impl FaultyDisks {
    /// Mounts a FUSE filesystem at `mount` (created if missing) serving
    /// each `(name, backing file)` as `mount/name`.
    pub fn mount(mount: &Path, disks: &[(String, PathBuf)]) -> anyhow::Result<Self> {
        use anyhow::Context;
        std::fs::create_dir_all(mount)?;
        let mut opened = Vec::new();
        for (name, file) in disks {
            anyhow::ensure!(
                !name.is_empty() && !name.contains('/'),
                "disk name {name:?}: not a file name"
            );
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(file)
                .with_context(|| format!("opening {}", file.display()))?;
            opened.push(Disk {
                name: name.clone(),
                file,
            });
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(opened.iter().map(|_| DiskState::default()).collect()),
            disks: opened,
            healed: Condvar::new(),
        });
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            fuser::MountOption::FSName("csi-scsi-lab-disks".into()),
            fuser::MountOption::NoExec,
            fuser::MountOption::NoSuid,
            fuser::MountOption::NoDev,
        ];
        config.n_threads = Some(2);
        let session = fuser::Session::new(DiskFs(shared.clone()), mount, &config)
            .and_then(fuser::Session::spawn)
            .with_context(|| format!("mounting the lab's disks (FUSE) at {}", mount.display()))?;
        Ok(Self {
            control: DiskControl {
                mount: mount.to_owned(),
                shared,
            },
            session: Some(session),
        })
    }
}

impl std::ops::Deref for FaultyDisks {
    type Target = DiskControl;

    fn deref(&self) -> &DiskControl {
        &self.control
    }
}

impl DiskControl {
    /// The file the kernel stand-in attaches for disk `name`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.mount.join(name)
    }

    /// Gives disk `name` one more fault.
    pub fn inject(&self, name: &str, fault: Fault) -> anyhow::Result<()> {
        let i = self.index(name)?;
        let mut state = self.lock();
        state[i].faults.push(fault);
        Ok(())
    }

    /// Lifts every fault of disk `name`; stalled I/O goes on.
    pub fn heal(&self, name: &str) -> anyhow::Result<()> {
        let i = self.index(name)?;
        self.lock()[i].faults.clear();
        self.shared.healed.notify_all();
        Ok(())
    }

    /// Lifts every fault of every disk.
    pub fn heal_all(&self) {
        for s in self.lock().iter_mut() {
            s.faults.clear();
        }
        self.shared.healed.notify_all();
    }

    /// What disk `name` is going through.
    pub fn state(&self, name: &str) -> anyhow::Result<DiskReport> {
        let i = self.index(name)?;
        let state = self.lock();
        Ok(DiskReport {
            faults: state[i].faults.clone(),
            waiting: state[i].waiting,
            failed: state[i].failed,
        })
    }

    /// Waits (up to `within`) until at least one I/O of disk `name` is
    /// stalled: the proof that a caller is now blocked on it.
    pub async fn until_stalled(&self, name: &str, within: Duration) -> anyhow::Result<()> {
        let start = Instant::now();
        while self.state(name)?.waiting == 0 {
            anyhow::ensure!(
                start.elapsed() < within,
                "no I/O of disk {name} stalled within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    fn index(&self, name: &str) -> anyhow::Result<usize> {
        self.shared
            .disks
            .iter()
            .position(|d| d.name == name)
            .ok_or_else(|| anyhow::anyhow!("no lab disk named {name}"))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<DiskState>> {
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for FaultyDisks {
    fn drop(&mut self) {
        // Nothing may stay blocked on a stalled disk while it goes.
        self.heal_all();
        drop(self.session.take());
    }
}

/// The first 4 MiB and the last MiB of `file`, where every signature and
/// the start of every filesystem this driver makes lie: equal before and
/// after a call that failed means that call wrote nothing that matters.
pub fn ends_of(file: &Path) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(file)?;
    let len = f.metadata()?.len();
    let head = (4u64 << 20).min(len);
    let tail = (1u64 << 20).min(len);
    let mut out = vec![0u8; usize::try_from(head + tail).map_err(std::io::Error::other)?];
    let (h, t) = out.split_at_mut(head as usize);
    f.read_exact_at(h, 0)?;
    f.read_exact_at(t, len - tail)?;
    Ok(out)
}
