//! LUN backing stores for tests and the lab: sparse files attached as loop
//! devices. Detached (and the file kept or removed) when dropped.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A sparse file attached to a loop device.
#[derive(Debug)]
pub struct LoopLun {
    /// The backing file.
    pub file: PathBuf,
    /// The loop device (`/dev/loopN`).
    pub device: PathBuf,
}

impl LoopLun {
    /// Creates a sparse file of `size` bytes and attaches it.
    pub fn create(file: &Path, size: u64) -> std::io::Result<Self> {
        let f = std::fs::File::create(file)?;
        f.set_len(size)?;
        drop(f);
        Self::attach(file)
    }

    /// Attaches an existing file to a free loop device.
    pub fn attach(file: &Path) -> std::io::Result<Self> {
        Ok(Self {
            device: attach_file(file)?,
            file: file.to_owned(),
        })
    }

    /// Grows the backing file to `size` and tells the loop driver
    /// (`losetup -c`), as an array administrator growing a LUN.
    pub fn grow(&self, size: u64) -> std::io::Result<()> {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&self.file)?
            .set_len(size)?;
        let st = Command::new("losetup")
            .arg("-c")
            .arg(&self.device)
            .status()?;
        if st.success() {
            Ok(())
        } else {
            Err(std::io::Error::other("losetup -c failed"))
        }
    }

    /// Size of the loop device in bytes.
    pub fn size(&self) -> std::io::Result<u64> {
        use std::io::{Seek, SeekFrom};
        std::fs::File::open(&self.device)?.seek(SeekFrom::End(0))
    }
}

impl Drop for LoopLun {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.device).status();
    }
}

/// Attaches `file` to a free loop device that stays attached (no guard).
pub fn attach_file(file: &Path) -> std::io::Result<PathBuf> {
    let out = Command::new("losetup")
        .args(["--find", "--show"])
        .arg(file)
        .output()?;
    if !out.status.success() {
        return Err(std::io::Error::other(format!(
            "losetup {}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}
