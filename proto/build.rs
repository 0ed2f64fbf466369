//! Compiles `csi.proto`, `agent.proto` and kubelet's plugin registration
//! API (`pluginregistration/v1/api.proto`) with protox (pure Rust, no system
//! `protoc`) and generates prost messages plus tonic clients and servers.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/csi.proto",
        "proto/agent.proto",
        "proto/pluginregistration/v1/api.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // These CSI requests carry `csi_secret` fields; prost drops that
        // option, so the crate gives them a redacting Debug of its own.
        .skip_debug(SECRET_BEARING.iter().copied())
        .compile_fds(descriptors)?;
    Ok(())
}

/// Messages with at least one field marked `csi_secret` in csi.proto, or a
/// secret field in agent.proto.
const SECRET_BEARING: &[&str] = &[
    ".csi.v1.ControllerExpandVolumeRequest",
    ".csi.v1.ControllerModifyVolumeRequest",
    ".csi.v1.ControllerPublishVolumeRequest",
    ".csi.v1.ControllerUnpublishVolumeRequest",
    ".csi.v1.CreateSnapshotRequest",
    ".csi.v1.CreateVolumeGroupSnapshotRequest",
    ".csi.v1.CreateVolumeRequest",
    ".csi.v1.DeleteSnapshotRequest",
    ".csi.v1.DeleteVolumeGroupSnapshotRequest",
    ".csi.v1.DeleteVolumeRequest",
    ".csi.v1.GetMetadataAllocatedRequest",
    ".csi.v1.GetMetadataDeltaRequest",
    ".csi.v1.GetSnapshotRequest",
    ".csi.v1.GetVolumeGroupSnapshotRequest",
    ".csi.v1.ListSnapshotsRequest",
    ".csi.v1.NodeExpandVolumeRequest",
    ".csi.v1.NodePublishVolumeRequest",
    ".csi.v1.NodeStageVolumeRequest",
    ".csi.v1.ValidateVolumeCapabilitiesRequest",
    ".csi.agent.v1.ChapCredentials",
    ".csi.agent.v1.BeginEnrolmentResponse",
];
