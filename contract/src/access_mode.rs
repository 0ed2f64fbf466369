//! [`AccessMode`]: the CSI access modes this driver serves, by the spec's
//! names, and what each allows (one node or several, reads only, how many
//! publications on one node). The proxy records it in a binding; the agent
//! checks NodeStage and NodePublish against it.

use std::fmt;

use csi_scsi_textfs::excerpt;

/// A CSI access mode (the spec's UNKNOWN is no mode: it does not parse).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AccessMode {
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

/// A name that is not one of the spec's access modes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input:?} is not a CSI access mode")]
pub struct UnknownAccessMode {
    /// What was given (an excerpt of a long input).
    pub input: String,
}

// === impl AccessMode ===

impl AccessMode {
    /// Every mode, in the spec's order.
    pub const ALL: [Self; 7] = [
        Self::SingleNodeWriter,
        Self::SingleNodeReaderOnly,
        Self::MultiNodeReaderOnly,
        Self::MultiNodeSingleWriter,
        Self::MultiNodeMultiWriter,
        Self::SingleNodeSingleWriter,
        Self::SingleNodeMultiWriter,
    ];

    /// The spec's name (`SINGLE_NODE_WRITER`, ...).
    pub fn name(self) -> &'static str {
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

    /// Parses the spec's name, exactly as [`AccessMode::name`] spells it.
    pub fn parse(s: &str) -> Result<Self, UnknownAccessMode> {
        Self::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| UnknownAccessMode { input: excerpt(s) })
    }

    /// Whether only one node may have the volume published.
    pub fn single_node(self) -> bool {
        !self.multi_node()
    }

    /// Whether several nodes may use the volume at once.
    pub fn multi_node(self) -> bool {
        matches!(
            self,
            Self::MultiNodeReaderOnly | Self::MultiNodeSingleWriter | Self::MultiNodeMultiWriter
        )
    }

    /// Whether the mode only allows reads.
    pub fn read_only(self) -> bool {
        matches!(self, Self::SingleNodeReaderOnly | Self::MultiNodeReaderOnly)
    }

    /// Whether a second publication on one node (another target path) must
    /// be refused: the spec's second-publish table with
    /// SINGLE_NODE_MULTI_WRITER support says FAILED_PRECONDITION for
    /// SINGLE_NODE_SINGLE_WRITER and the other non-MULTI_NODE modes.
    pub fn one_publication_per_node(self) -> bool {
        matches!(
            self,
            Self::SingleNodeWriter | Self::SingleNodeReaderOnly | Self::SingleNodeSingleWriter
        )
    }
}

impl fmt::Display for AccessMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for AccessMode {
    type Err = UnknownAccessMode;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_reads_back_from_its_name_and_nothing_else_parses() {
        for mode in AccessMode::ALL {
            assert_eq!(AccessMode::parse(mode.name()), Ok(mode));
            assert_eq!(mode.to_string().parse::<AccessMode>(), Ok(mode));
        }
        for bad in [
            "",
            "UNKNOWN",
            "single_node_writer",
            " SINGLE_NODE_WRITER",
            "SINGLE_NODE_WRITER:x",
        ] {
            assert!(AccessMode::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn what_each_mode_allows() {
        use AccessMode::*;
        // (mode, multi_node, read_only, one_publication_per_node)
        for (mode, multi, ro, one) in [
            (SingleNodeWriter, false, false, true),
            (SingleNodeReaderOnly, false, true, true),
            (MultiNodeReaderOnly, true, true, false),
            (MultiNodeSingleWriter, true, false, false),
            (MultiNodeMultiWriter, true, false, false),
            (SingleNodeSingleWriter, false, false, true),
            (SingleNodeMultiWriter, false, false, false),
        ] {
            assert_eq!(mode.multi_node(), multi, "{mode}");
            assert_eq!(mode.single_node(), !multi, "{mode}");
            assert_eq!(mode.read_only(), ro, "{mode}");
            assert_eq!(mode.one_publication_per_node(), one, "{mode}");
        }
    }
}
