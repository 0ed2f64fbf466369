//! csi-scsi-agent, the node plugin: CSI Identity and Node for kubelet on a
//! Unix socket, and the agent API (discover, attach, detach, wipe, rescan)
//! for the proxy over mutual TLS, and its own registration with kubelet
//! ([`registration`]). All host access goes through [`host`].
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod api;
pub mod config;
pub mod csi;
pub mod device;
pub mod error;
pub mod host;
mod registration;
pub mod serve;
mod status;
mod volume;
pub mod vpd;
