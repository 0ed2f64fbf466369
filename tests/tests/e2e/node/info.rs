//! NodeGetCapabilities and NodeGetInfo.

use std::collections::HashMap;

use csi_scsi_proto::csi::node_service_capability::Type as CapabilityType;
use csi_scsi_proto::csi::node_service_capability::rpc::Type as Rpc;
use csi_scsi_proto::csi::{NodeGetCapabilitiesRequest, NodeGetInfoRequest};

use super::lab::Lab;

#[tokio::test]
async fn the_node_lists_its_capabilities() {
    let Some(lab) = Lab::start(&[]).await else {
        return;
    };
    let caps = lab
        .client
        .clone()
        .node_get_capabilities(NodeGetCapabilitiesRequest {})
        .await
        .expect("capabilities")
        .into_inner()
        .capabilities;
    let rpcs: Vec<Rpc> = caps
        .into_iter()
        .filter_map(|c| match c.r#type {
            Some(CapabilityType::Rpc(r)) => Rpc::try_from(r.r#type).ok(),
            None => None,
        })
        .collect();
    assert_eq!(
        rpcs,
        vec![
            Rpc::StageUnstageVolume,
            Rpc::GetVolumeStats,
            Rpc::ExpandVolume,
            Rpc::VolumeCondition,
            Rpc::SingleNodeMultiWriter
        ]
    );
}

#[tokio::test]
async fn node_info_names_the_node_its_volume_limit_and_topology() {
    let Some(lab) = Lab::start(&[]).await else {
        return;
    };
    let info = lab
        .client
        .clone()
        .node_get_info(NodeGetInfoRequest {})
        .await
        .expect("info")
        .into_inner();
    assert_eq!(info.node_id, "node-a");
    assert_eq!(info.max_volumes_per_node, 16);
    assert_eq!(
        info.accessible_topology.expect("topology").segments,
        HashMap::from([("topology.csi-scsi.io/node".to_owned(), "node-a".to_owned())])
    );
}
