//! What every test harness here shares: the workspace's binaries run as
//! real processes (`daemon`), and a real Kubernetes control plane built
//! from the project's pinned Go modules (`kube`). The proxy's backend
//! tests use it directly; the end-to-end tests and the lab through
//! `csi-scsi-tests`.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod binaries;
pub mod daemon;
pub mod kube;
