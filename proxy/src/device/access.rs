//! Access capabilities, typed: block or mount (with a filesystem), and the
//! access mode. Their canonical text is what a binding records.

/// The CSI access modes this driver understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// SINGLE_NODE_WRITER.
    SingleNodeWriter,
    /// SINGLE_NODE_READER_ONLY.
    SingleNodeReaderOnly,
    /// MULTI_NODE_READER_ONLY.
    MultiNodeReaderOnly,
    /// MULTI_NODE_SINGLE_WRITER (block only).
    MultiNodeSingleWriter,
    /// MULTI_NODE_MULTI_WRITER (block only: clustered apps, VM live migration).
    MultiNodeMultiWriter,
    /// SINGLE_NODE_SINGLE_WRITER.
    SingleNodeSingleWriter,
    /// SINGLE_NODE_MULTI_WRITER.
    SingleNodeMultiWriter,
}

/// One requested capability.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// Raw block (true) or a filesystem mount.
    pub block: bool,
    /// Filesystem of a mount volume (`None`: the class default or ext4).
    pub fs_type: Option<String>,
    /// Access mode.
    pub mode: Mode,
}

impl Mode {
    /// Whether only one node may have the volume published.
    pub fn single_node(self) -> bool {
        matches!(
            self,
            Self::SingleNodeWriter
                | Self::SingleNodeReaderOnly
                | Self::SingleNodeSingleWriter
                | Self::SingleNodeMultiWriter
        )
    }

    /// The spec's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SingleNodeWriter => "SINGLE_NODE_WRITER",
            Self::SingleNodeReaderOnly => "SINGLE_NODE_READER_ONLY",
            Self::MultiNodeReaderOnly => "MULTI_NODE_READER_ONLY",
            Self::MultiNodeSingleWriter => "MULTI_NODE_SINGLE_WRITER",
            Self::MultiNodeMultiWriter => "MULTI_NODE_MULTI_WRITER",
            Self::SingleNodeSingleWriter => "SINGLE_NODE_SINGLE_WRITER",
            Self::SingleNodeMultiWriter => "SINGLE_NODE_MULTI_WRITER",
        }
    }
}

impl Access {
    /// Canonical text: `block:<MODE>` or `mount:<fs>:<MODE>`.
    pub fn canonical(&self, default_fs: &str) -> String {
        if self.block {
            format!("block:{}", self.mode.as_str())
        } else {
            format!(
                "mount:{}:{}",
                self.fs_type.as_deref().unwrap_or(default_fs),
                self.mode.as_str()
            )
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

/// The filesystem named by the mount capabilities of a binding (as
/// [`Access::canonical`] writes them), if it has any.
pub fn mount_fs(capabilities: &[String]) -> Option<&str> {
    capabilities
        .iter()
        .find_map(|c| c.strip_prefix("mount:")?.split(':').next())
}
