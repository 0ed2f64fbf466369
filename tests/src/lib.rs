//! The csi-scsi test harness: real processes, real sockets, real TLS.
//! The end-to-end tests (and, later, the lab) drive the binaries through it.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub use csi_scsi_testbed::{binaries, daemon, kube};

pub mod bench;
pub mod conformance;
pub mod csi_client;
pub mod disks;
pub mod fabric;
pub mod images;
pub mod iscsi;
pub mod kernel;
pub mod lab;
pub mod loop_luns;
pub mod node_tree;
pub mod patience;
pub mod pki;
pub mod reliability;
pub mod storage_e2e;
pub mod tail;
pub mod tgt;
pub mod vm;
