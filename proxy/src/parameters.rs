//! StorageClass parameters: `deviceSelector`, `cleanup`, `fsType`. Any
//! other key is refused, except the `csi.storage.k8s.io/` keys the
//! external-provisioner adds itself.

use std::collections::BTreeMap;

use csi_scsi_proto::agent::WipeMode;

use crate::selector::{InvalidSelector, Selector, excerpt};

/// What DeleteVolume does to a LUN before it is offered again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cleanup {
    /// Nothing: the next volume may see the old data. Only for trusted use.
    None,
    /// Discard every block (zero where the device cannot discard).
    Discard,
    /// Write zeroes over the whole LUN (the default).
    Zero,
    /// One pass of random data.
    Random1,
    /// Three passes of random data.
    Random3,
}

/// Parsed, validated StorageClass parameters.
#[derive(Clone, Debug)]
pub struct ClassParameters {
    /// Which devices may back the volume.
    pub selector: Selector,
    /// What delete does to the LUN.
    pub cleanup: Cleanup,
    /// Filesystem for mount volumes when the capability names none.
    pub fs_type: Option<String>,
    /// The parameters that identify the request (provisioner keys removed).
    pub identity: BTreeMap<String, String>,
}

/// Why the parameters were refused. A key or value is quoted as an
/// excerpt, never whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidParameter {
    /// A key this driver does not know.
    #[error("unknown parameter {0:?} (known: deviceSelector, cleanup, fsType)")]
    Unknown(String),
    /// A value out of its set.
    #[error("parameter {key}: {reason}")]
    Value {
        /// The key.
        key: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The selector does not parse.
    #[error("parameter deviceSelector: {0}")]
    Selector(#[from] InvalidSelector),
}

/// Prefix of the keys the external-provisioner adds (`--extra-create-metadata`).
const PROVISIONER_PREFIX: &str = "csi.storage.k8s.io/";

impl ClassParameters {
    /// Validates every key and value.
    pub fn parse(
        params: &std::collections::HashMap<String, String>,
    ) -> Result<Self, InvalidParameter> {
        let mut out = Self {
            selector: Selector::default(),
            cleanup: Cleanup::Zero,
            fs_type: None,
            identity: BTreeMap::new(),
        };
        for (k, v) in params {
            if k.starts_with(PROVISIONER_PREFIX) {
                continue;
            }
            out.identity.insert(k.clone(), v.clone());
            match k.as_str() {
                "deviceSelector" => out.selector = Selector::parse(v)?,
                "cleanup" => out.cleanup = Cleanup::parse(v)?,
                "fsType" => out.fs_type = Some(fs_type(v)?),
                other => return Err(InvalidParameter::Unknown(excerpt(other))),
            }
        }
        Ok(out)
    }
}

/// Checks a filesystem name: ext4 or xfs.
pub fn fs_type(v: &str) -> Result<String, InvalidParameter> {
    match v {
        "ext4" | "xfs" => Ok(v.to_owned()),
        other => Err(InvalidParameter::Value {
            key: "fsType",
            reason: format!("{:?} is not supported (ext4, xfs)", excerpt(other)),
        }),
    }
}

impl Cleanup {
    /// Parses `none`, `discard`, `zero`, `random-1`, `random-3`.
    pub fn parse(v: &str) -> Result<Self, InvalidParameter> {
        Ok(match v {
            "none" => Self::None,
            "discard" => Self::Discard,
            "zero" => Self::Zero,
            "random-1" => Self::Random1,
            "random-3" => Self::Random3,
            other => {
                return Err(InvalidParameter::Value {
                    key: "cleanup",
                    reason: format!(
                        "{:?} is not one of none, discard, zero, random-1, random-3",
                        excerpt(other)
                    ),
                });
            }
        })
    }

    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Discard => "discard",
            Self::Zero => "zero",
            Self::Random1 => "random-1",
            Self::Random3 => "random-3",
        }
    }

    /// The agent's wipe mode (`None` for no agent call at all).
    pub fn wipe_mode(self) -> Option<WipeMode> {
        match self {
            Self::None => None,
            Self::Discard => Some(WipeMode::Discard),
            Self::Zero => Some(WipeMode::Zero),
            Self::Random1 => Some(WipeMode::Random1),
            Self::Random3 => Some(WipeMode::Random3),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn p(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn known_parameters_parse_and_provisioner_keys_are_ignored() {
        let c = ClassParameters::parse(&p(&[
            ("deviceSelector", "tier=fast"),
            ("cleanup", "random-3"),
            ("fsType", "xfs"),
            ("csi.storage.k8s.io/pvc/name", "data"),
        ]))
        .expect("valid");
        assert_eq!(c.cleanup, Cleanup::Random3);
        assert_eq!(c.fs_type.as_deref(), Some("xfs"));
        assert_eq!(c.identity.len(), 3);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        assert_eq!(
            ClassParameters::parse(&p(&[("replicas", "3")])).err(),
            Some(InvalidParameter::Unknown("replicas".into()))
        );
        assert!(ClassParameters::parse(&p(&[("cleanup", "shred")])).is_err());
        assert!(ClassParameters::parse(&p(&[("fsType", "btrfs")])).is_err());
        assert!(ClassParameters::parse(&p(&[("deviceSelector", "a in b")])).is_err());
    }
}
