//! [`FsType`]: the filesystems this driver makes on a mount volume, by the
//! names `mkfs.<name>`, `mount -t`, blkid and mountinfo use, and the
//! smallest LUN each can be made on. The proxy binds by it; the agent
//! formats, mounts and grows by it.

use std::fmt;

use csi_scsi_textfs::excerpt;

/// A filesystem this driver creates and grows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FsType {
    /// ext4: the default when neither the capability nor the class names one.
    Ext4,
    /// xfs (the LUN must have 300 MiB or more: [`FsType::min_bytes`]).
    Xfs,
}

/// A name that is not one of the filesystems this driver makes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input:?} is not a supported filesystem (ext4 or xfs)")]
pub struct UnknownFsType {
    /// What was given (an excerpt of a long input).
    pub input: String,
}

/// One mebibyte.
const MIB: u64 = 1024 * 1024;

// === impl FsType ===

impl FsType {
    /// Every supported filesystem, for messages.
    pub const ALL: [Self; 2] = [Self::Ext4, Self::Xfs];

    /// What a mount volume gets when nothing names a filesystem.
    pub const DEFAULT: Self = Self::Ext4;

    /// The name `mkfs.<name>`, `mount -t`, blkid and mountinfo use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ext4 => "ext4",
            Self::Xfs => "xfs",
        }
    }

    /// [`FsType::name`], by the name the controller service reads.
    pub fn as_str(self) -> &'static str {
        self.name()
    }

    /// Parses `ext4` or `xfs`, exactly.
    pub fn parse(s: &str) -> Result<Self, UnknownFsType> {
        Self::ALL
            .into_iter()
            .find(|fs| fs.name() == s)
            .ok_or_else(|| UnknownFsType { input: excerpt(s) })
    }

    /// [`FsType::parse`] without the reason, for a name read from the host
    /// (mountinfo, blkid), where the caller says what it does not support.
    pub fn from_name(s: &str) -> Option<Self> {
        Self::parse(s).ok()
    }

    /// The smallest LUN its `mkfs` accepts: a volume of this filesystem is
    /// never bound to a smaller one (it could never be staged).
    pub const fn min_bytes(self) -> u64 {
        match self {
            // mke2fs 1.47 refuses below 112 KiB ("too small for a
            // journal"); 1 MiB leaves room for other versions' defaults.
            Self::Ext4 => MIB,
            // mkfs.xfs (xfsprogs 5.19 on, Debian 12's 6.1) refuses below
            // 300 MiB ("Filesystem must be larger than 300MB").
            Self::Xfs => 300 * MIB,
        }
    }

    /// Its minimum as people read it (`300 MiB`): minimums are whole MiB.
    pub fn min_size_text(self) -> String {
        format!("{} MiB", self.min_bytes() / MIB)
    }
}

impl fmt::Display for FsType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for FsType {
    type Err = UnknownFsType;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_filesystem_reads_back_from_its_name_and_nothing_else_parses() {
        for fs in FsType::ALL {
            assert_eq!(FsType::parse(fs.name()), Ok(fs));
            assert_eq!(fs.to_string().parse::<FsType>(), Ok(fs));
            assert_eq!(FsType::from_name(fs.name()), Some(fs));
        }
        for bad in ["", "EXT4", "ext3", "btrfs", " xfs", "xfs\n"] {
            assert!(FsType::parse(bad).is_err(), "{bad:?}");
            assert_eq!(FsType::from_name(bad), None, "{bad:?}");
        }
        assert_eq!(FsType::DEFAULT, FsType::Ext4);
    }

    #[test]
    fn minimums_are_whole_mebibytes() {
        assert_eq!(FsType::Ext4.min_size_text(), "1 MiB");
        assert_eq!(FsType::Xfs.min_size_text(), "300 MiB");
        assert_eq!(FsType::Xfs.min_bytes(), 300 * MIB);
    }
}
