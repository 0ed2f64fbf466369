//! Block device nodes: their device number, size and read-only state, and
//! whether anything holds them. The in-use check opens the node with
//! `O_EXCL`, which the kernel refuses (EBUSY) while a filesystem is mounted
//! from the device in *any* mount namespace, or another opener holds it
//! exclusively: a mount in another namespace is invisible in our mountinfo,
//! but not to this check.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use super::{Host, sysfs};

/// A device number, `major:minor` (`st_rdev` of a node, `st_dev` of a
/// file on the filesystem, the third field of mountinfo).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceNumber {
    /// The major number (the driver).
    pub major: u32,
    /// The minor number (the device of that driver).
    pub minor: u32,
}

/// What an exclusive open of a device found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// Nobody holds the device.
    Free,
    /// A mounted filesystem or an exclusive opener holds it.
    Busy,
}

// === impl DeviceNumber ===

impl DeviceNumber {
    /// From a raw `dev_t`.
    pub fn from_raw(dev: u64) -> Self {
        Self {
            major: nix::sys::stat::major(dev) as u32,
            minor: nix::sys::stat::minor(dev) as u32,
        }
    }
}

impl fmt::Display for DeviceNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

/// The device number of the block device node `node` (following
/// symlinks); an error of kind `InvalidInput` when it is not a block device.
pub fn device_number(node: &Path) -> std::io::Result<DeviceNumber> {
    let meta = std::fs::metadata(node)?;
    if !meta.file_type().is_block_device() {
        return Err(std::io::Error::new(
            ErrorKind::InvalidInput,
            "not a block device",
        ));
    }
    Ok(DeviceNumber::from_raw(meta.rdev()))
}

/// The device number of `path` when it is a block device node (or a bind
/// mount of one), `None` for anything else.
pub fn node_number(path: &Path) -> std::io::Result<Option<DeviceNumber>> {
    match device_number(path) {
        Ok(n) => Ok(Some(n)),
        Err(e) if e.kind() == ErrorKind::InvalidInput => Ok(None),
        Err(e) => Err(e),
    }
}

/// The size of the device behind `node` in bytes, as the kernel sees it now
/// (seek to the end: no sysfs needed, and always the live size).
pub fn size(node: &Path) -> std::io::Result<u64> {
    File::open(node)?.seek(SeekFrom::End(0))
}

/// Whether the kernel marks disk `kernel_name` read-only.
pub fn read_only(host: &Host, kernel_name: &str) -> std::io::Result<bool> {
    sysfs::block_read_only(host, kernel_name)
}

/// Whether anything holds `node`: an exclusive open fails with EBUSY while
/// a filesystem on it is mounted (in any namespace) or another program
/// opened it exclusively (mkfs does). The probe opens read-only and closes
/// at once, so it never changes the device.
pub fn holder(node: &Path) -> std::io::Result<Holder> {
    Ok(match claim(node)? {
        Some(_) => Holder::Free,
        None => Holder::Busy,
    })
}

/// An exclusive claim on a block device, held until dropped: while it is,
/// nobody can mount the device or claim it (mkfs, another detach), in any
/// namespace. What a check of "unused" keeps until the act it allowed.
#[derive(Debug)]
pub struct Claim {
    file: File,
}

/// Claims `node` exclusively (read-only; nothing is written). `None` when
/// something holds it already (EBUSY).
pub fn claim(node: &Path) -> std::io::Result<Option<Claim>> {
    // O_EXCL without O_CREAT on a block device means "claim it exclusively".
    match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(node)
    {
        Ok(file) => Ok(Some(Claim { file })),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(None),
        Err(e) => Err(e),
    }
}

// === impl Claim ===

impl Claim {
    /// A second descriptor of the claimed device, for work done on another
    /// thread (a flush); the claim stays with `self`.
    pub fn descriptor(&self) -> std::io::Result<File> {
        self.file.try_clone()
    }
}

/// The alignment (and granularity) of [`first_nonzero_direct`]'s reads.
pub const DIRECT_ALIGN: u64 = 4096;

/// The offset of the first of `ranges` of the device `node` that holds a
/// byte other than zero, read with `O_DIRECT`: past this node's page
/// cache, which may still hold what the LUN had before another node
/// erased it. `None` when every range reads as zeroes. Each range is
/// aligned down (its start) and up (its length) to [`DIRECT_ALIGN`]; a
/// short read is an error (`UnexpectedEof`), never "zeroes".
pub fn first_nonzero_direct(node: &Path, ranges: &[(u64, u64)]) -> std::io::Result<Option<u64>> {
    use std::os::unix::fs::FileExt;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(node)?;
    let chunk = 1usize << 20;
    // An aligned window into a plain buffer: O_DIRECT wants the memory
    // aligned as well as the offsets.
    let mut raw = vec![0u8; chunk + DIRECT_ALIGN as usize];
    let skew = raw.as_ptr().align_offset(DIRECT_ALIGN as usize);
    let buf = &mut raw[skew..skew + chunk];
    for &(offset, len) in ranges {
        let start = offset - offset % DIRECT_ALIGN;
        let end = (offset + len).next_multiple_of(DIRECT_ALIGN);
        let mut pos = start;
        while pos < end {
            let n = ((end - pos) as usize).min(chunk);
            let got = file.read_at(&mut buf[..n], pos)?;
            if got == 0 {
                return Err(std::io::Error::new(
                    ErrorKind::UnexpectedEof,
                    format!("read of {n} bytes at byte {pos} returned nothing"),
                ));
            }
            if buf[..got].iter().any(|&b| b != 0) {
                return Ok(Some(offset));
            }
            pos += got as u64;
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regular_file_is_not_a_block_device() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("plain");
        std::fs::write(&file, b"x").expect("write");
        let err = device_number(&file).expect_err("not a device");
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert_eq!(node_number(&file).expect("stat"), None);
    }

    #[test]
    fn device_numbers_print_as_major_colon_minor() {
        assert_eq!(
            DeviceNumber {
                major: 8,
                minor: 16
            }
            .to_string(),
            "8:16"
        );
        let raw = nix::sys::stat::makedev(7, 3);
        assert_eq!(
            DeviceNumber::from_raw(raw),
            DeviceNumber { major: 7, minor: 3 }
        );
    }
}
