//! StorageClass parameters: `deviceSelector`, `cleanup`, `fsType`
//! ([`KEYS`]). Any other key is refused, except the `csi.storage.k8s.io/`
//! keys ([`PROVISIONER_PREFIX`]) the external-provisioner adds itself.

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
    #[error("unknown parameter {0:?} (known: {known})", known = KEYS.join(", "))]
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

/// Which LUNs may back the volume: a label selector.
const DEVICE_SELECTOR: &str = "deviceSelector";
/// What DeleteVolume does to the LUN.
const CLEANUP: &str = "cleanup";
/// The filesystem (the deprecated spelling of `csi.storage.k8s.io/fstype`).
const FS_TYPE: &str = "fsType";

/// Every key [`ClassParameters::parse`] accepts outside
/// [`PROVISIONER_PREFIX`] (the list `docs/parameters.md` is checked against).
pub const KEYS: [&str; 3] = [DEVICE_SELECTOR, CLEANUP, FS_TYPE];

/// Prefix of the keys the external-provisioner adds or reads itself
/// (`--extra-create-metadata`, `csi.storage.k8s.io/fstype`): ignored.
pub const PROVISIONER_PREFIX: &str = "csi.storage.k8s.io/";
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
                DEVICE_SELECTOR => out.selector = Selector::parse(v)?,
                CLEANUP => out.cleanup = cleanup(v)?,
                FS_TYPE => out.fs_type = Some(fs_type(v)?),
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
        key: FS_TYPE,
        reason: format!("{:?} is not supported (ext4, xfs)", excerpt(v)),
    })
}

/// Checks a cleanup mode.
fn cleanup(v: &str) -> Result<Cleanup, InvalidParameter> {
    Cleanup::parse(v).ok_or_else(|| InvalidParameter::Value {
        key: CLEANUP,
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
    fn every_listed_key_is_accepted_and_the_refusal_names_them_all() {
        // A valid value for each key, so a key dropped from the parser (or
        // added to KEYS alone) fails here.
        let valid = |key: &str| match key {
            DEVICE_SELECTOR => "tier=fast",
            CLEANUP => "none",
            FS_TYPE => "ext4",
            other => panic!("no valid value known for {other:?}: add it here"),
        };
        for key in KEYS {
            let c = ClassParameters::parse(&p(&[(key, valid(key))]))
                .unwrap_or_else(|e| panic!("{key} is in KEYS but refused: {e}"));
            assert_eq!(c.identity.len(), 1, "{key} identifies the request");
        }
        let refused = ClassParameters::parse(&p(&[("replicas", "3")]))
            .expect_err("an unknown key is refused");
        assert_eq!(
            refused.to_string(),
            "unknown parameter \"replicas\" (known: deviceSelector, cleanup, fsType)"
        );
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        assert_eq!(
            ClassParameters::parse(&p(&[("replicas", "3")])).err(),
            Some(InvalidParameter::Unknown("replicas".into()))
        );
        // The node plugin reads mkfsOptions from the volume context; it is
        // no StorageClass parameter (docs/parameters.md).
        assert_eq!(
            ClassParameters::parse(&p(&[("mkfsOptions", "-m 0")])).err(),
            Some(InvalidParameter::Unknown("mkfsOptions".into()))
        );
        assert!(ClassParameters::parse(&p(&[("cleanup", "shred")])).is_err());
        assert!(ClassParameters::parse(&p(&[("fsType", "btrfs")])).is_err());
        assert!(ClassParameters::parse(&p(&[("deviceSelector", "a in b")])).is_err());
    }
}
