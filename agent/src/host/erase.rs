//! Erasing a block device: one exclusive open held for the whole wipe (so
//! nobody can mount or claim it meanwhile; EBUSY means it is in use), then
//! zero or discard ranges with `fallocate` (the block layer turns them into
//! WRITE ZEROES / DISCARD; a loop device punches its backing file), or
//! write random data.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{FallocateFlags, fallocate};

use super::block::{self, DeviceNumber};

/// A device opened exclusively for erasing.
pub(crate) struct Eraser {
    file: File,
    path: PathBuf,
    size: u64,
}

/// Why a device could not be claimed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum ClaimError {
    /// Mounted or opened exclusively by someone (in any mount namespace).
    #[error("{0} is in use (mounted or held open)")]
    InUse(PathBuf),
    /// The node changed between the check and the open.
    #[error("{0} changed while it was being opened")]
    Changed(PathBuf),
    /// The device reports a size of 0 (a path in transition): there is
    /// nothing an erase could prove.
    #[error("{0} reports a size of 0 bytes")]
    NoSize(PathBuf),
    /// Another I/O error.
    #[error("{path}: {source}")]
    Io {
        /// The node.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl Eraser {
    /// Claims `node`, which must still be the device `expected`.
    pub(crate) fn claim(node: &Path, expected: DeviceNumber) -> Result<Self, ClaimError> {
        let io = |source| ClaimError::Io {
            path: node.to_owned(),
            source,
        };
        let file = match OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_EXCL)
            .open(node)
        {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                return Err(ClaimError::InUse(node.to_owned()));
            }
            Err(e) => return Err(io(e)),
        };
        let meta = file.metadata().map_err(io)?;
        let device = DeviceNumber::from_raw(std::os::unix::fs::MetadataExt::rdev(&meta));
        if device != expected {
            return Err(ClaimError::Changed(node.to_owned()));
        }
        let mut f = file;
        let size = f.seek(SeekFrom::End(0)).map_err(io)?;
        if size == 0 {
            return Err(ClaimError::NoSize(node.to_owned()));
        }
        Ok(Self {
            file: f,
            path: node.to_owned(),
            size,
        })
    }

    /// Size in bytes.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// Zeroes `[offset, offset+len)`: WRITE ZEROES where supported, else
    /// plain writes of zero buffers.
    pub(crate) fn zero(&self, offset: u64, len: u64) -> std::io::Result<()> {
        match fallocate(
            &self.file,
            FallocateFlags::FALLOC_FL_ZERO_RANGE,
            offset as i64,
            len as i64,
        ) {
            Ok(()) => Ok(()),
            Err(nix::errno::Errno::EOPNOTSUPP) | Err(nix::errno::Errno::EINVAL) => {
                self.write_pattern(offset, len, |b| b.fill(0))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Discards `[offset, offset+len)` such that it reads back as zeroes.
    /// `Ok(false)` when the device cannot discard (the caller zeroes).
    pub(crate) fn discard(&self, offset: u64, len: u64) -> std::io::Result<bool> {
        let flags = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
        match fallocate(&self.file, flags, offset as i64, len as i64) {
            Ok(()) => Ok(true),
            Err(nix::errno::Errno::EOPNOTSUPP) | Err(nix::errno::Errno::EINVAL) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes random data over `[offset, offset+len)`.
    pub(crate) fn randomize(&self, offset: u64, len: u64) -> std::io::Result<()> {
        let mut rng = fastrand::Rng::new();
        self.write_pattern(offset, len, |b| rng.fill(b))
    }

    /// Flushes everything written to stable storage.
    pub(crate) fn sync(&mut self) -> std::io::Result<()> {
        self.file.flush()?;
        self.file.sync_all()
    }

    /// Whether every byte of `[offset, offset+len)` reads back as zero.
    pub(crate) fn reads_zero(&self, offset: u64, len: u64) -> std::io::Result<bool> {
        let mut buf = vec![0u8; 1 << 20];
        let mut pos = offset;
        while pos < offset + len {
            let n = ((offset + len - pos) as usize).min(buf.len());
            self.file.read_exact_at(&mut buf[..n], pos)?;
            if buf[..n].iter().any(|&b| b != 0) {
                return Ok(false);
            }
            pos += n as u64;
        }
        Ok(true)
    }

    fn write_pattern(
        &self,
        offset: u64,
        len: u64,
        mut fill: impl FnMut(&mut [u8]),
    ) -> std::io::Result<()> {
        let mut buf = vec![0u8; 4 << 20];
        let mut pos = offset;
        while pos < offset + len {
            let n = ((offset + len - pos) as usize).min(buf.len());
            fill(&mut buf[..n]);
            self.file.write_all_at(&buf[..n], pos)?;
            pos += n as u64;
        }
        Ok(())
    }
}

impl std::fmt::Debug for Eraser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Eraser")
            .field("path", &self.path)
            .field("size", &self.size)
            .finish()
    }
}

/// The device number of `node`, for [`Eraser::claim`].
pub(crate) fn expected_device(node: &Path) -> std::io::Result<DeviceNumber> {
    block::device_number(node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_of_no_size_is_never_claimed_for_an_erase() {
        // A path in transition reports 0 bytes: an erase of "all" of it
        // would write nothing and read nothing back, and call that done.
        let dir = tempfile::tempdir().expect("dir");
        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").expect("file");
        let plain_file = DeviceNumber::from_raw(0);
        match Eraser::claim(&empty, plain_file) {
            Err(ClaimError::NoSize(p)) => assert_eq!(p, empty),
            other => panic!("claimed a device of no size: {other:?}"),
        }
        let data = dir.path().join("data");
        std::fs::write(&data, vec![7u8; 8192]).expect("file");
        let eraser = Eraser::claim(&data, plain_file).expect("a sized file is claimed");
        assert_eq!(eraser.size(), 8192);
    }
}
