//! The lab's storage as a cluster admin declares it: the CHAP Secret and
//! one SCSITarget per lab array, created through the API.

use std::collections::BTreeMap;

use csi_scsi_proxy::resources::{IscsiSpec, SCSITarget, SCSITargetSpec, SecretReference};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::KubeLab;
use super::api::Typed;
use crate::lab::{CHAP_USER, LAB_ARRAY};

/// The Secret with array-a's CHAP credentials.
pub(super) const CHAP_SECRET: &str = "chap-array-a";

/// The lab arrays' SCSITargets: name, IQN suffix, CHAP, device labels.
type TargetRow = (
    &'static str,
    &'static str,
    bool,
    &'static [(&'static str, &'static str)],
);

const TARGETS: &[TargetRow] = &[
    (
        "array-a",
        "array-a",
        true,
        &[("array", "a"), ("tier", "fast")],
    ),
    (
        "array-b",
        "array-b",
        false,
        &[("array", "b"), ("tier", "capacity")],
    ),
    (
        POOL_TARGET,
        "array-c",
        false,
        &[("array", "c"), ("tier", "pool")],
    ),
];

/// When a lab's pool (array-c) is declared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pool {
    /// With the other targets, when the lab has one.
    Now,
    /// Later ([`create_pool_target`]): under TCG every LUN a guest logs in
    /// to costs it udev and multipath work, so the VM lab's guests see the
    /// pool only in the step that uses it.
    Later,
}

/// Creates (or updates) the CHAP Secret of array-a and the three targets,
/// all of one tgtd (`array`: the LUN array-a and array-b both export is
/// one device, not a conflict); array-c only when the lab has a pool and
/// `pool` is [`Pool::Now`].
pub fn create_targets(lab: &KubeLab, pool: Pool) -> anyhow::Result<()> {
    let k = &lab.kubectl;
    let ns = &lab.namespace;
    k.apply_object(&Secret {
        metadata: ObjectMeta {
            name: Some(CHAP_SECRET.into()),
            namespace: Some(ns.clone()),
            ..ObjectMeta::default()
        },
        string_data: Some(BTreeMap::from([
            ("username".into(), CHAP_USER.into()),
            ("password".into(), crate::lab::chap_secret_for_lab().into()),
        ])),
        ..Secret::default()
    })?;
    let pool = lab.lab.config.has_pool() && pool == Pool::Now;
    for row in TARGETS {
        if row.0 == POOL_TARGET && !pool {
            continue;
        }
        k.apply_object(&target_of(lab, row))?;
    }
    Ok(())
}

/// The pool's target, array-c.
pub const POOL_TARGET: &str = "array-c";

/// Creates (or updates) the pool's target, array-c; fails when the lab
/// has no pool.
pub fn create_pool_target(lab: &KubeLab) -> anyhow::Result<()> {
    anyhow::ensure!(
        lab.lab.config.has_pool(),
        "the lab has no pool (--pool, --pool-large)"
    );
    let row = TARGETS
        .iter()
        .find(|row| row.0 == POOL_TARGET)
        .expect("TARGETS holds the pool's row");
    lab.kubectl.apply_object(&target_of(lab, row)).map(drop)
}

/// The SCSITarget of one row of [`TARGETS`].
fn target_of(lab: &KubeLab, (name, iqn, chap, labels): &TargetRow) -> SCSITarget {
    let mut target = lab_target(lab, name, iqn, chap.then_some(lab.namespace.as_str()));
    target.spec.device_labels = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    target
}

/// The lab's tgtd portals: the host's address, and on VM nodes the second
/// one too (two paths to every LUN, one per guest NIC).
fn portals(lab: &KubeLab) -> Vec<String> {
    let net = &lab.lab.net;
    let mut portals = vec![format!("{}:3260", net.host_ip())];
    if lab.lab.config.vm {
        portals.push(format!("{}:3260", net.second_host_ip()));
    }
    portals
}

/// An SCSITarget `name` of the lab's tgtd (portal on the host, IQN
/// `iqn.2026-11.io.csi-scsi.lab:<iqn>`, array [`LAB_ARRAY`]), with the
/// CHAP Secret in `chap_namespace` when given.
pub(super) fn lab_target(
    lab: &KubeLab,
    name: &str,
    iqn: &str,
    chap_namespace: Option<&str>,
) -> SCSITarget {
    let spec = SCSITargetSpec {
        iscsi: Some(IscsiSpec {
            portals: portals(lab),
            iqn: format!("iqn.2026-11.io.csi-scsi.lab:{iqn}"),
            chap_secret_ref: chap_namespace.map(|ns| SecretReference {
                name: CHAP_SECRET.into(),
                namespace: Some(ns.into()),
            }),
        }),
        array: Some(LAB_ARRAY.into()),
        ..SCSITargetSpec::default()
    };
    SCSITarget::new(name, spec)
}
