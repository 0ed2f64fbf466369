//! StorageClass parameters: `deviceSelector`, `cleanup`, `fsType`. Any
//! other key is refused, except the `csi.storage.k8s.io/` keys the
//! external-provisioner adds itself.

use std::collections::BTreeMap;

use crate::device::{Cleanup, FsType};
use crate::events::ClaimRef;
use crate::selector::{InvalidSelector, Selector, excerpt};

/// Parsed, validated StorageClass parameters.
#[derive(Clone, Debug)]
pub struct ClassParameters {
    /// Which devices may back the volume.
    pub selector: Selector,
    /// What delete does to the LUN.
    pub cleanup: Cleanup,
    /// Filesystem for mount volumes when the capability names none.
    pub fs_type: Option<FsType>,
    /// The parameters that identify the request (provisioner keys removed).
    pub identity: BTreeMap<String, String>,
    /// The claim behind the request, when the provisioner names it
    /// (`--extra-create-metadata`): Events about it go there.
    pub claim: Option<ClaimRef>,
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
/// The claim's name and namespace among them.
const PVC_NAME: &str = "csi.storage.k8s.io/pvc/name";
const PVC_NAMESPACE: &str = "csi.storage.k8s.io/pvc/namespace";

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
            claim: None,
        };
        for (k, v) in params {
            if k.starts_with(PROVISIONER_PREFIX) {
                continue;
            }
            out.identity.insert(k.clone(), v.clone());
            match k.as_str() {
                "deviceSelector" => out.selector = Selector::parse(v)?,
                "cleanup" => out.cleanup = cleanup(v)?,
                "fsType" => out.fs_type = Some(fs_type(v)?),
                other => return Err(InvalidParameter::Unknown(excerpt(other))),
            }
        }
        if let (Some(name), Some(namespace)) = (params.get(PVC_NAME), params.get(PVC_NAMESPACE)) {
            out.claim = Some(ClaimRef {
                namespace: namespace.clone(),
                name: name.clone(),
            });
        }
        Ok(out)
    }
}

/// Checks a filesystem name: ext4 or xfs.
pub fn fs_type(v: &str) -> Result<FsType, InvalidParameter> {
    FsType::parse(v).map_err(|_| InvalidParameter::Value {
        key: "fsType",
        reason: format!("{:?} is not supported (ext4, xfs)", excerpt(v)),
    })
}

/// Checks a cleanup mode.
fn cleanup(v: &str) -> Result<Cleanup, InvalidParameter> {
    Cleanup::parse(v).ok_or_else(|| InvalidParameter::Value {
        key: "cleanup",
        reason: format!(
            "{:?} is not one of none, discard, zero, random-1, random-3",
            excerpt(v)
        ),
    })
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
        assert_eq!(c.fs_type, Some(FsType::Xfs));
        assert_eq!(c.identity.len(), 3);
        assert_eq!(c.claim, None, "a name without a namespace names no claim");
        let c = ClassParameters::parse(&p(&[
            ("csi.storage.k8s.io/pvc/name", "data"),
            ("csi.storage.k8s.io/pvc/namespace", "lab"),
        ]))
        .expect("valid");
        assert_eq!(
            c.claim,
            Some(ClaimRef {
                namespace: "lab".into(),
                name: "data".into()
            })
        );
        assert!(
            c.identity.is_empty(),
            "provisioner keys do not identify the request"
        );
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
