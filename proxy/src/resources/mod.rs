//! The custom resources of group `csi-scsi.io`, version `v1alpha1`: the
//! Rust types are the schema. `crdgen` writes their CustomResourceDefinitions
//! to `deploy/crds/`, and a test fails when the checked-in files differ.
//!
//! - `SCSITarget` (cluster-scoped): how nodes reach a set of LUNs.
//! - `SCSIDevice` (cluster-scoped): one LUN, named from its WWID.
//! - `PendingResizeRequest` (namespaced, beside its PVC).

mod pending_resize;
mod scsi_device;
mod scsi_target;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde_json::Value;

pub use pending_resize::{
    PendingResizeRequest, PendingResizeRequestSpec, PendingResizeRequestStatus,
};
pub use scsi_device::{
    DeviceObjectError, RETIRED_REASON, SCSIDevice, SCSIDeviceSpec, SCSIDeviceStatus,
    TARGET_CONFLICT_CONDITION, conflict_message, size_text,
};
pub use scsi_target::{
    FibreChannelSpec, IscsiSpec, SCSITarget, SCSITargetSpec, SCSITargetStatus, SecretReference,
    TargetNodeStatus,
};

/// The API group.
pub const GROUP: &str = "csi-scsi.io";
/// The API version.
pub const VERSION: &str = "v1alpha1";
/// On an SCSIDevice that holds a volume: a `kubectl delete` only marks it
/// for deletion until the volume is released, so the LUN is never
/// re-created Available (and bound twice) while its data lives.
pub const DEVICE_FINALIZER: &str = "csi-scsi.io/bound-volume";
/// On an SCSITarget through which a bound device is reached: attach and
/// detach keep their target until the last such volume is released.
pub const TARGET_FINALIZER: &str = "csi-scsi.io/target-in-use";
/// The longest Kubernetes object name (a DNS subdomain).
const MAX_NAME: usize = 253;

/// Every CRD, in a stable order, ready to apply.
pub fn crds() -> Vec<CustomResourceDefinition> {
    [
        SCSITarget::crd(),
        SCSIDevice::crd(),
        PendingResizeRequest::crd(),
    ]
    .into_iter()
    .map(normalize)
    .collect()
}

/// `(file name, YAML)` for each CRD, as checked in under `deploy/crds/`.
pub fn crd_files() -> Result<Vec<(String, String)>, serde_saphyr::SerializeError> {
    crds()
        .into_iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let body = serde_saphyr::to_string(&crd)?;
            Ok((
                format!("{name}.yaml"),
                format!(
                    "# Generated from proxy/src/resources by `cargo run -p csi-scsi-proxy --bin crdgen -- --write deploy/crds`.\n# Do not edit by hand: a test compares this file with the Rust types.\n{body}"
                ),
            ))
        })
        .collect()
}

/// The object name for `key` (a WWID, a volume name): `key` itself when it
/// is already a valid DNS subdomain name (`naa.600a0b80...`), otherwise a
/// lower-cased form with every other character mapped to `-`, followed by
/// a hash of the original, so two keys never share a name.
pub fn object_name(key: &str) -> String {
    if is_dns_subdomain(key) {
        return key.to_owned();
    }
    let mut safe = String::with_capacity(key.len());
    for c in key.chars() {
        let c = c.to_ascii_lowercase();
        let mapped = if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' {
            c
        } else {
            '-'
        };
        // No "--", "..", ".-" or "-.": labels stay valid.
        let prev = safe.chars().last();
        match (prev, mapped) {
            (Some('-' | '.'), '-' | '.') | (None, '-' | '.') => {}
            _ => safe.push(mapped),
        }
    }
    let hash = format!("{:016x}", fnv1a(key.as_bytes()));
    safe.truncate(MAX_NAME - hash.len() - 1);
    let safe = safe.trim_end_matches(['-', '.']);
    if safe.is_empty() {
        format!("x-{hash}")
    } else {
        format!("{safe}-{hash}")
    }
}

/// Whether `s` is a valid DNS subdomain name (RFC 1123), as Kubernetes
/// requires of most object names.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b.first().is_some_and(u8::is_ascii_alphanumeric)
                && b.last().is_some_and(u8::is_ascii_alphanumeric)
        })
}

/// FNV-1a, 64 bits: stable across builds and platforms (std's hasher is not).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Rewrites integer formats the API server does not know (`uint64`,
/// `uint32`, ... from unsigned Rust fields) into `int64` with the matching
/// bounds, which it validates.
fn normalize(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    let Ok(mut value) = serde_json::to_value(&crd) else {
        return crd;
    };
    fix_formats(&mut value);
    serde_json::from_value(value).unwrap_or(crd)
}

fn fix_formats(v: &mut Value) {
    match v {
        Value::Object(map) => {
            let unsigned = map.get("type").and_then(Value::as_str) == Some("integer")
                && map
                    .get("format")
                    .and_then(Value::as_str)
                    .is_some_and(|f| f.starts_with("uint"));
            if unsigned {
                let max = match map.get("format").and_then(Value::as_str) {
                    Some("uint8") => Some(u64::from(u8::MAX)),
                    Some("uint16") => Some(u64::from(u16::MAX)),
                    Some("uint32") => Some(u64::from(u32::MAX)),
                    _ => None,
                };
                map.insert("format".into(), Value::from("int64"));
                map.insert("minimum".into(), Value::from(0));
                if let Some(max) = max {
                    map.insert("maximum".into(), Value::from(max));
                }
            }
            map.values_mut().for_each(fix_formats);
        }
        Value::Array(items) => items.iter_mut().for_each(fix_formats),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn naa_wwid_is_its_own_name() {
        assert_eq!(
            object_name("naa.600a0b800012345600000000deadbeef"),
            "naa.600a0b800012345600000000deadbeef"
        );
        assert_eq!(object_name("eui.0123456789abcdef"), "eui.0123456789abcdef");
    }

    #[test]
    fn t10_wwid_maps_to_a_valid_distinct_name() {
        let a = object_name("t10.ATA_QEMU_HARDDISK_QM00001");
        let b = object_name("t10.ata_qemu_harddisk_qm00001");
        assert!(is_dns_subdomain(&a), "{a}");
        assert!(is_dns_subdomain(&b), "{b}");
        assert!(a.starts_with("t10.ata-qemu-harddisk-qm00001-"), "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn awkward_keys_map_to_valid_names() {
        for key in [
            "",
            "-",
            "..",
            "name.iqn.2003-01.org:disk 1",
            "t10.  __ x",
            &"A".repeat(400),
        ] {
            let n = object_name(key);
            assert!(is_dns_subdomain(&n), "{key:?} -> {n:?}");
        }
    }

    #[test]
    fn crds_have_no_unsigned_formats() {
        let text = serde_json::to_string(&crds()).unwrap_or_default();
        assert!(
            !text.contains("uint"),
            "unsigned integer format left in a CRD"
        );
        assert!(text.contains("has(self.iscsi) != has(self.fibreChannel)"));
    }
}
