//! Which client sends each request type, and the service and RPC name the
//! report counts its answers under, so a table names its RPC once: by the
//! type of its requests.

use std::future::Future;

use csi_scsi_proto::agent::{self as api, agent_client::AgentClient};
use csi_scsi_proto::csi::controller_client::ControllerClient;
use csi_scsi_proto::csi::identity_client::IdentityClient;
use csi_scsi_proto::csi::node_client::NodeClient;
use csi_scsi_proto::csi::*;
use tonic::Status;
use tonic::transport::Channel;

use super::{AGENT_API, CALL_LIMIT, CONTROLLER, IDENTITY, NODE_SVC, call};

/// A request of one RPC.
pub(super) trait Rpc {
    /// The client that sends it.
    type Client;
    /// What the RPC answers.
    type Reply;
    /// The service the report counts it under.
    const SERVICE: &'static str;
    /// The RPC's name, as the report prints it.
    const NAME: &'static str;
    /// Sends the request, bounded by [`CALL_LIMIT`].
    fn send(self, client: &mut Self::Client) -> impl Future<Output = Result<Self::Reply, Status>>;
}

/// Implements [`Rpc`] for unary RPCs: `Name: method(Request) -> Reply`.
macro_rules! unary {
    ($client:ty, $service:expr; $($name:ident: $method:ident($req:ty) -> $reply:ty;)*) => {$(
        impl Rpc for $req {
            type Client = $client;
            type Reply = $reply;
            const SERVICE: &'static str = $service;
            const NAME: &'static str = stringify!($name);
            async fn send(self, client: &mut $client) -> Result<$reply, Status> {
                call(client.$method(self)).await
            }
        }
    )*};
}

unary! { IdentityClient<Channel>, IDENTITY;
    GetPluginInfo: get_plugin_info(GetPluginInfoRequest) -> GetPluginInfoResponse;
    GetPluginCapabilities: get_plugin_capabilities(GetPluginCapabilitiesRequest)
        -> GetPluginCapabilitiesResponse;
    Probe: probe(ProbeRequest) -> ProbeResponse;
}

unary! { ControllerClient<Channel>, CONTROLLER;
    CreateVolume: create_volume(CreateVolumeRequest) -> CreateVolumeResponse;
    DeleteVolume: delete_volume(DeleteVolumeRequest) -> DeleteVolumeResponse;
    ControllerPublishVolume: controller_publish_volume(ControllerPublishVolumeRequest)
        -> ControllerPublishVolumeResponse;
    ControllerUnpublishVolume: controller_unpublish_volume(ControllerUnpublishVolumeRequest)
        -> ControllerUnpublishVolumeResponse;
    ValidateVolumeCapabilities: validate_volume_capabilities(ValidateVolumeCapabilitiesRequest)
        -> ValidateVolumeCapabilitiesResponse;
    ListVolumes: list_volumes(ListVolumesRequest) -> ListVolumesResponse;
    GetCapacity: get_capacity(GetCapacityRequest) -> GetCapacityResponse;
    ControllerGetCapabilities: controller_get_capabilities(ControllerGetCapabilitiesRequest)
        -> ControllerGetCapabilitiesResponse;
    CreateSnapshot: create_snapshot(CreateSnapshotRequest) -> CreateSnapshotResponse;
    DeleteSnapshot: delete_snapshot(DeleteSnapshotRequest) -> DeleteSnapshotResponse;
    ListSnapshots: list_snapshots(ListSnapshotsRequest) -> ListSnapshotsResponse;
    GetSnapshot: get_snapshot(GetSnapshotRequest) -> GetSnapshotResponse;
    ControllerExpandVolume: controller_expand_volume(ControllerExpandVolumeRequest)
        -> ControllerExpandVolumeResponse;
    ControllerGetVolume: controller_get_volume(ControllerGetVolumeRequest)
        -> ControllerGetVolumeResponse;
    ControllerModifyVolume: controller_modify_volume(ControllerModifyVolumeRequest)
        -> ControllerModifyVolumeResponse;
}

unary! { NodeClient<Channel>, NODE_SVC;
    NodeStageVolume: node_stage_volume(NodeStageVolumeRequest) -> NodeStageVolumeResponse;
    NodeUnstageVolume: node_unstage_volume(NodeUnstageVolumeRequest) -> NodeUnstageVolumeResponse;
    NodePublishVolume: node_publish_volume(NodePublishVolumeRequest) -> NodePublishVolumeResponse;
    NodeUnpublishVolume: node_unpublish_volume(NodeUnpublishVolumeRequest)
        -> NodeUnpublishVolumeResponse;
    NodeGetVolumeStats: node_get_volume_stats(NodeGetVolumeStatsRequest)
        -> NodeGetVolumeStatsResponse;
    NodeExpandVolume: node_expand_volume(NodeExpandVolumeRequest) -> NodeExpandVolumeResponse;
    NodeGetCapabilities: node_get_capabilities(NodeGetCapabilitiesRequest)
        -> NodeGetCapabilitiesResponse;
    NodeGetInfo: node_get_info(NodeGetInfoRequest) -> NodeGetInfoResponse;
}

unary! { AgentClient<Channel>, AGENT_API;
    Discover: discover(api::DiscoverRequest) -> api::DiscoverResponse;
    Attach: attach(api::AttachRequest) -> api::AttachResponse;
    Detach: detach(api::DetachRequest) -> api::DetachResponse;
    Rescan: rescan(api::RescanRequest) -> api::RescanResponse;
    Status: status(api::StatusRequest) -> api::StatusResponse;
}

/// An Attach with a deadline of its own (see [`super::requests::bounded`]):
/// agent.proto bounds the wait for the device by it.
impl Rpc for tonic::Request<api::AttachRequest> {
    type Client = AgentClient<Channel>;
    type Reply = api::AttachResponse;
    const SERVICE: &'static str = AGENT_API;
    const NAME: &'static str = "Attach";
    async fn send(self, client: &mut AgentClient<Channel>) -> Result<api::AttachResponse, Status> {
        call(client.attach(self)).await
    }
}

/// Wipe streams its progress: the answer is the stream's first error, or
/// whether it said it was done.
impl Rpc for api::WipeRequest {
    type Client = AgentClient<Channel>;
    type Reply = bool;
    const SERVICE: &'static str = AGENT_API;
    const NAME: &'static str = "Wipe";
    async fn send(self, client: &mut AgentClient<Channel>) -> Result<bool, Status> {
        let fut = async {
            let mut s = client.wipe(self).await?.into_inner();
            let mut done = false;
            while let Some(p) = s.message().await? {
                done |= p.done;
            }
            Ok(done)
        };
        match tokio::time::timeout(CALL_LIMIT, fut).await {
            Ok(r) => r,
            Err(_) => Err(Status::deadline_exceeded("sweep: wipe did not end")),
        }
    }
}
