//! The lab's storage as a cluster admin declares it: the CHAP Secret and
//! one SCSITarget per lab array, created through the API.

use super::KubeLab;
use crate::lab::{CHAP_USER, LAB_ARRAY};

/// The lab arrays' SCSITargets: name, IQN suffix, CHAP, device labels.
const TARGETS: &[(&str, &str, bool, &str)] = &[
    ("array-a", "array-a", true, r#"{"array":"a","tier":"fast"}"#),
    (
        "array-b",
        "array-b",
        false,
        r#"{"array":"b","tier":"capacity"}"#,
    ),
    (
        "array-c",
        "array-c",
        false,
        r#"{"array":"c","tier":"pool"}"#,
    ),
];

/// Creates (or updates) the CHAP Secret of array-a and the three targets,
/// all of one tgtd (`array`: the LUN array-a and array-b both export is
/// one device, not a conflict).
pub fn create_targets(lab: &KubeLab) -> anyhow::Result<()> {
    let k = &lab.kubectl;
    let ns = &lab.namespace;
    let portal = format!("{}:3260", lab.lab.net.host_ip());
    k.apply(&format!(
        r#"{{"apiVersion":"v1","kind":"Secret","metadata":{{"name":"chap-array-a","namespace":"{ns}"}},
            "stringData":{{"username":"{CHAP_USER}","password":"{secret}"}}}}"#,
        secret = crate::lab::chap_secret_for_lab()
    ))?;
    for (name, iqn, chap, labels) in TARGETS {
        let chap_ref = if *chap {
            format!(r#","chapSecretRef":{{"name":"chap-array-a","namespace":"{ns}"}}"#)
        } else {
            String::new()
        };
        k.apply(&format!(
            r#"{{"apiVersion":"csi-scsi.io/v1alpha1","kind":"SCSITarget","metadata":{{"name":"{name}"}},
                "spec":{{"iscsi":{{"portals":["{portal}"],"iqn":"iqn.2026-11.io.csi-scsi.lab:{iqn}"{chap_ref}}},
                "deviceLabels":{labels},"array":"{LAB_ARRAY}"}}}}"#
        ))?;
    }
    Ok(())
}
