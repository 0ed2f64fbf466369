//! The CSI Controller service: each RPC opens a span, parses its request,
//! calls the life cycle, and maps the result. Unsupported RPCs answer
//! UNIMPLEMENTED.

use std::collections::HashMap;
use std::sync::Arc;

use csi_scsi_contract::NodeName;
use csi_scsi_daemon::RequestId;
use csi_scsi_proto::csi::controller_server::Controller;
use csi_scsi_proto::csi::controller_service_capability::rpc::Type as Rpc;
use csi_scsi_proto::csi::controller_service_capability::{Rpc as RpcCap, Type as CapType};
use csi_scsi_proto::csi::*;
use csi_scsi_textfs::text;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::request::{self, required};
use crate::agents::deadline;
use crate::device::FsType;
use crate::lifecycle::{CreateRequest, Lifecycle, NODE_TOPOLOGY_KEY, VolumeView};
use crate::parameters::ClassParameters;
use crate::selector::Selector;

/// The RPCs this controller serves, as listed in ControllerGetCapabilities.
/// Not PUBLISH_READONLY: the agent attaches the LUN read-write, and a
/// read-only mount does not stop writes to a raw block device node, so a
/// read-only publication is not enforced end to end.
const CAPABILITIES: [Rpc; 9] = [
    Rpc::CreateDeleteVolume,
    Rpc::PublishUnpublishVolume,
    Rpc::ListVolumes,
    Rpc::GetCapacity,
    Rpc::ExpandVolume,
    Rpc::ListVolumesPublishedNodes,
    Rpc::VolumeCondition,
    Rpc::GetVolume,
    Rpc::SingleNodeMultiWriter,
];

/// Most bytes of a refused `starting_token` quoted back.
const MAX_TOKEN_QUOTE: usize = 64;

/// The Controller service.
pub struct ControllerService {
    life: Arc<Lifecycle>,
}

impl ControllerService {
    /// A service over `life`.
    pub fn new(life: Arc<Lifecycle>) -> Self {
        Self { life }
    }
}

/// Node names as CSI's node IDs.
fn node_ids(nodes: Vec<NodeName>) -> Vec<String> {
    nodes.into_iter().map(|n| n.to_string()).collect()
}

/// Nodes as CSI topologies under the node key.
fn topology(nodes: Vec<NodeName>) -> Vec<Topology> {
    nodes
        .into_iter()
        .map(|n| Topology {
            segments: HashMap::from([(NODE_TOPOLOGY_KEY.to_owned(), n.to_string())]),
        })
        .collect()
}

/// `v` as CSI reports a volume, accessible from `accessible`.
fn volume_of(v: &VolumeView, accessible: Vec<NodeName>) -> Volume {
    let fs = v.device.binding.as_ref().and_then(|b| b.fs_type());
    let mut context = HashMap::from([("wwid".to_owned(), v.device.wwid.to_string())]);
    if let Some(fs) = fs {
        context.insert("fsType".to_owned(), fs.as_str().to_owned());
    }
    Volume {
        capacity_bytes: i64::try_from(v.device.size_bytes).unwrap_or(i64::MAX),
        volume_id: v.volume_id.clone(),
        volume_context: context,
        content_source: None,
        accessible_topology: topology(accessible),
    }
}

fn condition(v: &VolumeView) -> VolumeCondition {
    VolumeCondition {
        abnormal: v.abnormal.is_some(),
        message: v
            .abnormal
            .clone()
            .unwrap_or_else(|| "LUN is visible and bound".into()),
    }
}

/// The proxy's deadline for `request`: the caller's `grpc-timeout` less a
/// margin, from now (see `agents::deadline`).
fn caller_deadline<T>(request: &Request<T>) -> Option<tokio::time::Instant> {
    deadline::from_metadata(request.metadata(), tokio::time::Instant::now())
}

fn span(method: &'static str, volume: &str, request_id: &str) -> tracing::Span {
    tracing::info_span!("csi", method, volume_id = %volume, request_id = %request_id)
}

/// What every state-changing handler does around its work: takes the
/// request id and the caller's deadline, opens the span naming `method`
/// and the volume (`volume` picks it from the message), and runs
/// `work(message, request id)` in that span within the deadline.
async fn traced<T, R, Work>(
    method: &'static str,
    request: Request<T>,
    volume: fn(&T) -> &str,
    work: impl FnOnce(T, String) -> Work,
) -> Result<Response<R>, Status>
where
    Work: Future<Output = Result<Response<R>, Status>>,
{
    let rid = RequestId::of(&request).to_string();
    let until = caller_deadline(&request);
    let req = request.into_inner();
    let span = span(method, volume(&req), &rid);
    deadline::within(until, work(req, rid).instrument(span)).await
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        traced(
            "CreateVolume",
            request,
            |r| &r.name,
            |req, _rid| async move {
                let name = required("name", &req.name)?.to_owned();
                let access = request::accesses(&req.volume_capabilities)?;
                let parameters = ClassParameters::parse(&req.parameters)
                    .map_err(crate::error::ProxyError::from)?;
                if req.volume_content_source.is_some() {
                    return Err(crate::error::ProxyError::InvalidArgument {
                        field: "volume_content_source",
                        reason: "cloning and snapshots are not supported".into(),
                    }
                    .into());
                }
                if !req.mutable_parameters.is_empty() {
                    return Err(crate::error::ProxyError::InvalidArgument {
                        field: "mutable_parameters",
                        reason: "no mutable parameters are supported".into(),
                    }
                    .into());
                }
                let (required_bytes, limit_bytes) = request::capacity(req.capacity_range.as_ref())?;
                let placement = request::placement(req.accessibility_requirements.as_ref())?;
                let dev = self
                    .life
                    .create(CreateRequest {
                        name,
                        required_bytes,
                        limit_bytes,
                        access,
                        parameters,
                        placement: placement.clone(),
                    })
                    .await?;
                // A new binding and a repeated call alike: the LUN's nodes
                // the requirements allow (never none: the LUN was chosen,
                // or the existing one accepted, for being seen by one).
                let accessible = placement.accessible(&dev.node_names());
                let view = VolumeView {
                    volume_id: dev.volume_id().unwrap_or_default(),
                    device: dev,
                    abnormal: None,
                };
                Ok(Response::new(CreateVolumeResponse {
                    volume: Some(volume_of(&view, accessible)),
                }))
            },
        )
        .await
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        traced(
            "DeleteVolume",
            request,
            |r| &r.volume_id,
            |req, rid| async move {
                required("volume_id", &req.volume_id)?;
                self.life.delete(&req.volume_id, &rid).await?;
                Ok(Response::new(DeleteVolumeResponse {}))
            },
        )
        .await
    }

    async fn controller_publish_volume(
        &self,
        request: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        traced(
            "ControllerPublishVolume",
            request,
            |r| &r.volume_id,
            |req, rid| async move {
                required("volume_id", &req.volume_id)?;
                let node = request::node_id(&req.node_id)?;
                let cap = req.volume_capability.as_ref().ok_or_else(|| {
                    crate::error::ProxyError::InvalidArgument {
                        field: "volume_capability",
                        reason: "is required".into(),
                    }
                })?;
                // Spec, ControllerPublishVolumeRequest.readonly: "CO MUST set
                // this field to false if SP does not have the PUBLISH_READONLY
                // controller capability." Publishing read-write what was asked
                // read-only would break a promise, so refuse it.
                if req.readonly {
                    return Err(crate::error::ProxyError::InvalidArgument {
                        field: "readonly",
                        reason: "must be false: this plugin does not advertise PUBLISH_READONLY \
                                 (it cannot attach a LUN read-only)"
                            .into(),
                    }
                    .into());
                }
                let access = request::access(cap)?;
                let publish_context = self
                    .life
                    .publish(&req.volume_id, &node, &access, &rid)
                    .await?;
                Ok(Response::new(ControllerPublishVolumeResponse {
                    publish_context,
                }))
            },
        )
        .await
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        traced(
            "ControllerUnpublishVolume",
            request,
            |r| &r.volume_id,
            |req, rid| async move {
                required("volume_id", &req.volume_id)?;
                // Empty: every node. One that is no node name was never
                // published to, so the volume is unpublished from it ("SHOULD
                // return 0 OK" for a node that cannot be found).
                let node = match req.node_id.as_str() {
                    "" => None,
                    id => match NodeName::parse(id) {
                        Ok(node) => Some(node),
                        Err(_) => return Ok(Response::new(ControllerUnpublishVolumeResponse {})),
                    },
                };
                self.life
                    .unpublish(&req.volume_id, node.as_ref(), &rid)
                    .await?;
                Ok(Response::new(ControllerUnpublishVolumeResponse {}))
            },
        )
        .await
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let req = request.into_inner();
        required("volume_id", &req.volume_id)?;
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument(
                "volume_capabilities: at least one is required",
            ));
        }
        let view = self.life.volume(&req.volume_id).await?;
        let mut unsupported = Vec::new();
        for cap in &req.volume_capabilities {
            match (request::access(cap), view.device.binding.as_ref()) {
                (Ok(a), Some(b)) if b.allows(b.resolve(&a)) => {}
                (Ok(a), Some(b)) => unsupported.push(b.resolve(&a).to_string()),
                (Ok(_), None) => unsupported.push("the volume has no binding".into()),
                (Err(e), _) => unsupported.push(e.to_string()),
            }
        }
        if let Err(e) = ClassParameters::parse(&req.parameters) {
            unsupported.push(e.to_string());
        }
        let response = if unsupported.is_empty() {
            ValidateVolumeCapabilitiesResponse {
                confirmed: Some(validate_volume_capabilities_response::Confirmed {
                    volume_context: req.volume_context,
                    volume_capabilities: req.volume_capabilities,
                    parameters: req.parameters,
                    mutable_parameters: HashMap::new(),
                }),
                message: String::new(),
            }
        } else {
            ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: format!("not supported by this volume: {}", unsupported.join("; ")),
            }
        };
        Ok(Response::new(response))
    }

    async fn list_volumes(
        &self,
        request: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        let req = request.into_inner();
        let max = usize::try_from(req.max_entries)
            .map_err(|_| Status::invalid_argument("max_entries: must not be negative"))?;
        let (views, next) = match self.life.volumes(&req.starting_token, max).await {
            Ok(page) => page,
            Err(None) => {
                return Err(Status::aborted(format!(
                    "starting_token {} is not valid",
                    text::quote(&req.starting_token, MAX_TOKEN_QUOTE)
                )));
            }
            Err(Some(e)) => return Err(e.into()),
        };
        let entries = views
            .iter()
            .map(|v| list_volumes_response::Entry {
                volume: Some(volume_of(v, v.device.node_names())),
                status: Some(list_volumes_response::VolumeStatus {
                    published_node_ids: node_ids(v.device.published_nodes()),
                    volume_condition: Some(condition(v)),
                }),
            })
            .collect();
        Ok(Response::new(ListVolumesResponse {
            entries,
            next_token: next.unwrap_or_default(),
        }))
    }

    async fn get_capacity(
        &self,
        request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        let req = request.into_inner();
        let access = req
            .volume_capabilities
            .iter()
            .map(request::access)
            .collect::<Result<Vec<_>, _>>()?;
        let params =
            ClassParameters::parse(&req.parameters).map_err(crate::error::ProxyError::from)?;
        // As CreateVolume resolves them: a mount without a filesystem
        // takes the class's, else the default.
        let default_fs = params.fs_type.unwrap_or(FsType::DEFAULT);
        let capabilities: Vec<_> = access.iter().map(|a| a.resolve(default_fs)).collect();
        let nodes = match &req.accessible_topology {
            Some(t) => request::topology_nodes(Some(&TopologyRequirement {
                requisite: vec![t.clone()],
                preferred: Vec::new(),
            }))?,
            None => Vec::new(),
        };
        let selector: &Selector = &params.selector;
        let (total, largest) = self.life.capacity(&nodes, selector, &capabilities).await?;
        Ok(Response::new(GetCapacityResponse {
            available_capacity: i64::try_from(total).unwrap_or(i64::MAX),
            maximum_volume_size: Some(i64::try_from(largest).unwrap_or(i64::MAX)),
            minimum_volume_size: None,
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _request: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        let capabilities = CAPABILITIES
            .iter()
            .map(|&r| ControllerServiceCapability {
                r#type: Some(CapType::Rpc(RpcCap { r#type: r as i32 })),
            })
            .collect();
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn create_snapshot(
        &self,
        _r: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        Err(Status::unimplemented("snapshots are not supported"))
    }

    async fn delete_snapshot(
        &self,
        _r: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        Err(Status::unimplemented("snapshots are not supported"))
    }

    async fn list_snapshots(
        &self,
        _r: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        Err(Status::unimplemented("snapshots are not supported"))
    }

    async fn get_snapshot(
        &self,
        _r: Request<GetSnapshotRequest>,
    ) -> Result<Response<GetSnapshotResponse>, Status> {
        Err(Status::unimplemented("snapshots are not supported"))
    }

    async fn controller_expand_volume(
        &self,
        request: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        traced(
            "ControllerExpandVolume",
            request,
            |r| &r.volume_id,
            |req, rid| async move {
                required("volume_id", &req.volume_id)?;
                let (required_bytes, _) = request::capacity(req.capacity_range.as_ref())?;
                if req.capacity_range.is_none() {
                    return Err(Status::invalid_argument("capacity_range: is required"));
                }
                let block = req
                    .volume_capability
                    .as_ref()
                    .map(request::access)
                    .transpose()?
                    .map(|a| a.block);
                let (bytes, node) = self
                    .life
                    .expand(&req.volume_id, required_bytes, block, &rid)
                    .await?;
                Ok(Response::new(ControllerExpandVolumeResponse {
                    capacity_bytes: i64::try_from(bytes).unwrap_or(i64::MAX),
                    node_expansion_required: node,
                }))
            },
        )
        .await
    }

    async fn controller_get_volume(
        &self,
        request: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        let req = request.into_inner();
        required("volume_id", &req.volume_id)?;
        let v = self.life.volume(&req.volume_id).await?;
        Ok(Response::new(ControllerGetVolumeResponse {
            volume: Some(volume_of(&v, v.device.node_names())),
            status: Some(controller_get_volume_response::VolumeStatus {
                published_node_ids: node_ids(v.device.published_nodes()),
                volume_condition: Some(condition(&v)),
            }),
        }))
    }

    async fn controller_modify_volume(
        &self,
        _r: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "volume modification is not supported",
        ))
    }
}
