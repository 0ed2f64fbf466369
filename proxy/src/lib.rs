//! csi-scsi-proxy, the controller plugin: CSI Identity and Controller for
//! the sidecars, the device inventory (its only writer), the agent
//! directory, and the fan-out client that is the only caller of agents.
#![forbid(unsafe_code)]

pub mod config;
pub mod inventory;
pub mod selector;
pub mod serve;
