//! Access capabilities, typed: what a request asks for ([`Access`], whose
//! filesystem may be left to the StorageClass) and what a binding records
//! ([`Capability`], filesystem resolved). A capability is stored as its
//! canonical text (`block:<MODE>` or `mount:<fs>:<MODE>`) and parsed back
//! on read, so a record that does not parse is refused, never guessed at.

use std::borrow::Cow;
use std::fmt;

use csi_scsi_contract::{AccessMode as Mode, FsType};
use serde::{Deserialize, Serialize};

/// One capability as a request states it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// Raw block (true) or a filesystem mount.
    pub block: bool,
    /// Filesystem of a mount volume (`None`: the class default, else ext4).
    pub fs_type: Option<FsType>,
    /// Access mode.
    pub mode: Mode,
}

/// One capability as a binding records it: the filesystem is settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Capability {
    /// A raw block device.
    Block(Mode),
    /// A mounted filesystem.
    Mount(FsType, Mode),
}

/// A capability's stored text did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a capability (block:<MODE> or mount:<ext4|xfs>:<MODE>)")]
pub struct UnknownCapability(String);

// === impl Access ===

impl Access {
    /// The capability a binding records for this request: a mount without
    /// a filesystem takes `default`.
    pub fn resolve(&self, default: FsType) -> Capability {
        if self.block {
            Capability::Block(self.mode)
        } else {
            Capability::Mount(self.fs_type.unwrap_or(default), self.mode)
        }
    }

    /// Why this capability cannot be served, if it cannot.
    pub fn unsupported(&self) -> Option<&'static str> {
        match (self.block, self.mode) {
            (false, Mode::MultiNodeMultiWriter | Mode::MultiNodeSingleWriter) => {
                Some("a filesystem cannot be written from several nodes; use a block volume")
            }
            _ => None,
        }
    }
}

// === impl Capability ===

impl Capability {
    /// Its access mode.
    pub fn mode(self) -> Mode {
        match self {
            Self::Block(m) | Self::Mount(_, m) => m,
        }
    }

    /// Its filesystem, for a mount.
    pub fn fs_type(self) -> Option<FsType> {
        match self {
            Self::Block(_) => None,
            Self::Mount(fs, _) => Some(fs),
        }
    }

    /// The smallest LUN a volume used this way can live on (its
    /// filesystem's minimum; none for a raw block volume).
    pub fn min_bytes(self) -> u64 {
        self.fs_type().map_or(0, FsType::min_bytes)
    }

    /// Canonical text: `block:<MODE>` or `mount:<fs>:<MODE>`.
    pub fn canonical(self) -> Cow<'static, str> {
        match self {
            Self::Block(m) => format!("block:{}", m.name()).into(),
            Self::Mount(fs, m) => format!("mount:{}:{}", fs.name(), m.name()).into(),
        }
    }

    /// Parses the canonical text.
    pub fn parse(s: &str) -> Result<Self, UnknownCapability> {
        let unknown = || UnknownCapability(csi_scsi_textfs::text::bounded(s, 64).into_owned());
        let mut parts = s.split(':');
        let cap = match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some("block"), Some(m), None, None) => {
                Self::Block(Mode::parse(m).map_err(|_| unknown())?)
            }
            (Some("mount"), Some(fs), Some(m), None) => Self::Mount(
                FsType::parse(fs).map_err(|_| unknown())?,
                Mode::parse(m).map_err(|_| unknown())?,
            ),
            _ => return Err(unknown()),
        };
        Ok(cap)
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical())
    }
}

impl Serialize for Capability {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.canonical())
    }
}

impl<'de> Deserialize<'de> for Capability {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = Cow::<'de, str>::deserialize(d)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

impl schemars::JsonSchema for Capability {
    fn schema_name() -> Cow<'static, str> {
        "Capability".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "block:<MODE> or mount:<ext4|xfs>:<MODE>"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_capability_round_trips_through_its_text_and_nothing_else_parses() {
        for mode in Mode::ALL {
            for cap in [
                Capability::Block(mode),
                Capability::Mount(FsType::Ext4, mode),
                Capability::Mount(FsType::Xfs, mode),
            ] {
                assert_eq!(Capability::parse(&cap.canonical()), Ok(cap));
                let json = serde_json::to_string(&cap).expect("write");
                assert_eq!(
                    serde_json::from_str::<Capability>(&json).expect("read"),
                    cap
                );
            }
        }
        for bad in [
            "",
            "block",
            "mount:ext4",
            "mount:btrfs:SINGLE_NODE_WRITER",
            "block:SINGLE_NODE_WRITER:x",
            "file:SINGLE_NODE_WRITER",
            "block:single_node_writer",
        ] {
            assert!(Capability::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    /// The mkfs the agent runs, found where Debian installs it.
    fn mkfs(fs: FsType) -> std::path::PathBuf {
        let name = format!("mkfs.{fs}");
        ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
            .iter()
            .map(|d| std::path::Path::new(d).join(&name))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{name} is missing: install e2fsprogs and xfsprogs"))
    }

    /// Formats a sparse file of `size` bytes as the agent formats a LUN.
    fn formats(fs: FsType, size: u64) -> bool {
        let dir = tempfile::tempdir().expect("tempdir");
        let image = dir.path().join("lun");
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(size))
            .expect("image");
        let nodiscard: &[&str] = match fs {
            FsType::Ext4 => &["-E", "nodiscard"],
            FsType::Xfs => &["-K"],
        };
        std::process::Command::new(mkfs(fs))
            .arg("-q")
            .args(nodiscard)
            .arg(&image)
            .output()
            .expect("run mkfs")
            .status
            .success()
    }

    #[test]
    fn each_filesystems_minimum_is_one_its_mkfs_accepts_and_xfs_refuses_less() {
        for fs in [FsType::Ext4, FsType::Xfs] {
            assert!(formats(fs, fs.min_bytes()), "{fs} at its minimum");
        }
        assert!(
            !formats(FsType::Xfs, FsType::Xfs.min_bytes() - 4096),
            "xfs's minimum is mkfs.xfs's own: a LUN just below it is refused"
        );
        assert_eq!(FsType::Xfs.min_size_text(), "300 MiB");
        assert_eq!(Capability::Block(Mode::SingleNodeWriter).min_bytes(), 0);
        assert_eq!(
            Capability::Mount(FsType::Xfs, Mode::MultiNodeReaderOnly).min_bytes(),
            300 * 1024 * 1024
        );
    }

    #[test]
    fn a_mount_without_a_filesystem_takes_the_default_it_is_given() {
        let a = Access {
            block: false,
            fs_type: None,
            mode: Mode::SingleNodeWriter,
        };
        assert_eq!(
            a.resolve(FsType::Xfs),
            Capability::Mount(FsType::Xfs, Mode::SingleNodeWriter)
        );
        let named = Access {
            fs_type: Some(FsType::Ext4),
            ..a
        };
        assert_eq!(
            named.resolve(FsType::Xfs),
            Capability::Mount(FsType::Ext4, Mode::SingleNodeWriter)
        );
    }
}
