//! csi-scsi-proxy, the controller plugin: CSI Identity and Controller for
//! the sidecars, the device inventory (its only writer), the agent
//! directory, and the fan-out client that is the only caller of agents.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod agents;
pub mod config;
pub mod csi;
pub mod device;
pub mod directory;
pub mod enrolment;
pub mod error;
pub mod events;
mod fault;
pub mod inventory;
mod kube_wiring;
pub mod leader;
pub mod lifecycle;
pub mod parameters;
pub mod reconcile;
mod reflect;
pub mod resources;
pub mod secrets;
pub mod selector;
pub mod serve;
pub mod status;

/// A node name for unit tests.
#[cfg(test)]
pub(crate) fn node(name: &str) -> csi_scsi_contract::NodeName {
    csi_scsi_contract::NodeName::parse(name).expect("a test node name")
}
