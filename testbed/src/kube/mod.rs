//! A real Kubernetes control plane for the tests and the lab: etcd,
//! kube-apiserver (client certificates, RBAC, service-account tokens),
//! kube-controller-manager and kube-scheduler, built from the project's Go
//! modules (`tools/`), with the real kubectl and helm to drive it.

pub mod control_plane;
pub mod helm;
pub mod kubectl;
pub mod pki;
pub mod shared;
pub mod tools;

pub use control_plane::{ControlPlane, ControlPlaneConfig};
pub use helm::Helm;
pub use kubectl::Kubectl;
pub use pki::KubePki;
pub use shared::shared_plane;
pub use tools::{GoTools, KubeMinor, MINOR_ENV};
