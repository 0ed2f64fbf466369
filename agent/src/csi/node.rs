//! The CSI Node service: a thin shell. Each RPC opens a span, parses its
//! request ([`request`]), takes the volume's in-flight guard, calls the
//! domain ([`crate::volume`]) and maps the outcome ([`status`]). Requests
//! are never logged whole: their secrets are redacted, but mount flags may
//! be sensitive too (the spec says so), so only IDs and paths are logged.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use csi_scsi_daemon::{OpGuard, OpGuards};
use csi_scsi_proto::csi::node_server::Node;
use csi_scsi_proto::csi::node_service_capability::{
    Rpc, Type as CapabilityType, rpc::Type as RpcType,
};
use csi_scsi_proto::csi::volume_usage::Unit;
use csi_scsi_proto::csi::{
    NodeExpandVolumeRequest, NodeExpandVolumeResponse, NodeGetCapabilitiesRequest,
    NodeGetCapabilitiesResponse, NodeGetInfoRequest, NodeGetInfoResponse,
    NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse, NodePublishVolumeRequest,
    NodePublishVolumeResponse, NodeServiceCapability, NodeStageVolumeRequest,
    NodeStageVolumeResponse, NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse,
    NodeUnstageVolumeRequest, NodeUnstageVolumeResponse, Topology, VolumeCondition, VolumeUsage,
};
use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::request::{self, KubeletPath};
use super::status;
use crate::error::AgentError;
use crate::host::Host;
use crate::volume::{expand, publish, stage, stats};
use crate::volume_id::VolumeId;
use crate::wwid::Wwid;

/// The topology key under which NodeGetInfo reports the node's name; the
/// controller's accessible topology uses the same key.
pub const TOPOLOGY_NODE_KEY: &str = csi_scsi_daemon::NODE_TOPOLOGY_KEY;

/// What this Node service supports (NodeGetCapabilities).
pub const CAPABILITIES: [RpcType; 5] = [
    RpcType::StageUnstageVolume,
    RpcType::GetVolumeStats,
    RpcType::ExpandVolume,
    RpcType::VolumeCondition,
    RpcType::SingleNodeMultiWriter,
];

/// The CSI Node service of one agent.
#[derive(Debug)]
pub struct NodeService {
    host: Arc<Host>,
    node_id: String,
    max_volumes: u64,
    /// One operation at a time per LUN and per path. Keyed by WWID, not
    /// volume ID, so that a stale call about an old binding of the LUN
    /// cannot interleave with one about the current binding; and by path,
    /// so that two volumes can never race for one staging or target path.
    in_flight: OpGuards<InFlight>,
}

// === impl NodeService ===

impl NodeService {
    /// A Node service for node `node_id` on `host`, reporting at most
    /// `max_volumes` volumes (0: no limit).
    pub fn new(host: Arc<Host>, node_id: String, max_volumes: u64) -> Self {
        Self {
            host,
            node_id,
            max_volumes,
            in_flight: OpGuards::new(),
        }
    }

    /// Takes the in-flight guards of the LUN and of `path`, or answers
    /// ABORTED ("Operation pending for volume") holding neither.
    fn begin(
        &self,
        volume: &VolumeId,
        path: &KubeletPath,
    ) -> Result<[OpGuard<InFlight>; 2], AgentError> {
        let lun = self
            .in_flight
            .try_begin(InFlight::Lun(volume.wwid.clone()))
            .ok_or_else(|| AgentError::Busy(format!("volume {volume}")))?;
        let path = self
            .in_flight
            .try_begin(InFlight::Path(path.as_path().to_owned()))
            .ok_or_else(|| AgentError::Busy(path.as_path().display().to_string()))?;
        Ok([lun, path])
    }
}

/// What an operation in flight holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum InFlight {
    /// A LUN, whatever binding the call names.
    Lun(Wwid),
    /// A staging, target or volume path.
    Path(PathBuf),
}

/// Runs one RPC's `work` in `span`, then logs its outcome and maps an error.
async fn run<T>(
    rpc: &'static str,
    span: tracing::Span,
    work: impl Future<Output = Result<T, AgentError>>,
) -> Result<Response<T>, Status> {
    let result = work.instrument(span.clone()).await;
    span.in_scope(|| answer(rpc, result))
}

/// Logs the outcome of `rpc` and maps an error to its status.
fn answer<T>(rpc: &str, result: Result<T, AgentError>) -> Result<Response<T>, Status> {
    match result {
        Ok(v) => {
            tracing::info!(rpc, "ok");
            Ok(Response::new(v))
        }
        Err(e) => {
            let s = status::status(&e);
            tracing::warn!(rpc, code = ?s.code(), error = %e, "failed");
            Err(s)
        }
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let r = request.into_inner();
        let span = tracing::info_span!("NodeStageVolume", volume_id = %r.volume_id, staging = %r.staging_target_path);
        run("NodeStageVolume", span, async {
            let req = request::stage(&self.host, &r)?;
            let _guard = self.begin(&req.volume, &req.staging)?;
            stage::stage(&self.host, &req).await?;
            Ok(NodeStageVolumeResponse {})
        })
        .await
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let r = request.into_inner();
        let span = tracing::info_span!("NodeUnstageVolume", volume_id = %r.volume_id, staging = %r.staging_target_path);
        run("NodeUnstageVolume", span, async {
            let req = request::unstage(&self.host, &r)?;
            let _guard = self.begin(&req.volume, &req.staging)?;
            stage::unstage(&self.host, &req).await?;
            Ok(NodeUnstageVolumeResponse {})
        })
        .await
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let r = request.into_inner();
        let span = tracing::info_span!("NodePublishVolume", volume_id = %r.volume_id, target = %r.target_path, readonly = r.readonly);
        run("NodePublishVolume", span, async {
            let req = request::publish(&self.host, &r)?;
            let _guard = self.begin(&req.volume, &req.target)?;
            publish::publish(&self.host, &req).await?;
            Ok(NodePublishVolumeResponse {})
        })
        .await
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let r = request.into_inner();
        let span = tracing::info_span!("NodeUnpublishVolume", volume_id = %r.volume_id, target = %r.target_path);
        run("NodeUnpublishVolume", span, async {
            let req = request::unpublish(&self.host, &r)?;
            let _guard = self.begin(&req.volume, &req.target)?;
            publish::unpublish(&self.host, &req).await?;
            Ok(NodeUnpublishVolumeResponse {})
        })
        .await
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let r = request.into_inner();
        let span = tracing::debug_span!("NodeGetVolumeStats", volume_id = %r.volume_id, path = %r.volume_path);
        // Read-only and polled by kubelet: no in-flight guard, so a stage
        // or expand in progress never turns a stats poll into ABORTED.
        span.in_scope(|| {
            let result =
                request::stats(&self.host, &r).and_then(|req| stats::stats(&self.host, &req));
            match result {
                Ok(s) => Ok(Response::new(stats_response(s))),
                Err(e) => answer("NodeGetVolumeStats", Err(e)),
            }
        })
    }

    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let r = request.into_inner();
        let span = tracing::info_span!("NodeExpandVolume", volume_id = %r.volume_id, path = %r.volume_path);
        run("NodeExpandVolume", span, async {
            let req = request::expand(&self.host, &r)?;
            let _guard = self.begin(&req.volume, &req.path)?;
            let size = expand::expand(&self.host, &req).await?;
            Ok(NodeExpandVolumeResponse {
                capacity_bytes: i64::try_from(size).unwrap_or(i64::MAX),
            })
        })
        .await
    }

    async fn node_get_capabilities(
        &self,
        _request: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        let capabilities = CAPABILITIES
            .iter()
            .map(|&t| NodeServiceCapability {
                r#type: Some(CapabilityType::Rpc(Rpc { r#type: t as i32 })),
            })
            .collect();
        Ok(Response::new(NodeGetCapabilitiesResponse { capabilities }))
    }

    async fn node_get_info(
        &self,
        _request: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            // Spec: zero means "the CO decides"; never negative.
            max_volumes_per_node: i64::try_from(self.max_volumes).unwrap_or(i64::MAX),
            accessible_topology: Some(Topology {
                segments: HashMap::from([(TOPOLOGY_NODE_KEY.to_owned(), self.node_id.clone())]),
            }),
        }))
    }
}

/// The CSI form of a volume's stats.
fn stats_response(s: stats::VolumeStats) -> NodeGetVolumeStatsResponse {
    let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let usage = match s.usage {
        None => Vec::new(),
        Some(stats::Usage::Block { total_bytes }) => vec![VolumeUsage {
            available: 0,
            total: int(total_bytes),
            used: 0,
            unit: Unit::Bytes as i32,
        }],
        Some(stats::Usage::Filesystem(u)) => vec![
            VolumeUsage {
                available: int(u.available_bytes),
                total: int(u.total_bytes),
                used: int(u.used_bytes),
                unit: Unit::Bytes as i32,
            },
            VolumeUsage {
                available: int(u.free_inodes),
                total: int(u.total_inodes),
                used: int(u.used_inodes),
                unit: Unit::Inodes as i32,
            },
        ],
    };
    NodeGetVolumeStatsResponse {
        usage,
        volume_condition: Some(VolumeCondition {
            abnormal: s.condition.abnormal,
            message: s.condition.message,
        }),
    }
}
