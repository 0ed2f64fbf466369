//! gRPC bindings for csi-scsi: the CSI v1.12 spec (`csi`), our agent API
//! (`agent`) and kubelet's plugin registration API (`pluginregistration`),
//! generated at build time from `proto/` with protox and tonic-prost-build.
//! Nothing else lives here, except the redacting `Debug` of messages that
//! carry secrets.

pub mod csi {
    //! CSI v1.12 (`csi.v1`), byte-identical to the spec's csi.proto.
    #![allow(missing_docs, clippy::all, unreachable_pub, rust_2018_idioms)]
    tonic::include_proto!("csi.v1");
}

pub mod agent {
    //! The agent API (`csi.agent.v1`), served by every agent over mTLS.
    #![allow(missing_docs, clippy::all, unreachable_pub, rust_2018_idioms)]
    tonic::include_proto!("csi.agent.v1");
}

pub mod pluginregistration {
    //! kubelet's plugin registration API (`pluginregistration`, upstream
    //! `k8s.io/kubelet/pkg/apis/pluginregistration/v1`), served by the
    //! agent so kubelet finds its CSI socket.
    #![allow(missing_docs, clippy::all, unreachable_pub, rust_2018_idioms)]
    tonic::include_proto!("pluginregistration");
}

mod redact;

pub mod publish_context {
    //! Keys of the `publish_context` ControllerPublishVolume returns and
    //! the CO hands to NodeStageVolume and NodePublishVolume unchanged.

    /// The node-local device path the attach found (informational).
    pub const DEVICE_PATH: &str = "devicePath";
    /// The LUN's WWID.
    pub const WWID: &str = "wwid";
    /// Present, as `"true"`, when the volume was published read-only: the
    /// node stages and publishes it read-only and never formats it.
    pub const READONLY: &str = "readonly";
}

/// The text printed in place of a secret value.
pub const REDACTED: &str = "<redacted>";
