//! The CSI Node service: a thin shell. Each RPC opens a span, parses its
//! request ([`request`]), takes the volume's in-flight guard, calls the
//! domain ([`crate::volume`]) and maps the outcome ([`status`]). Requests
//! are never logged whole: their secrets are redacted, but mount flags may
//! be sensitive too (the spec says so), so only IDs and paths are logged.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use csi_scsi_daemon::{KeyGuard, KeyedLocks};
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

use super::request::{self, AccessType, ExpandRequest, KubeletPath};
use super::status;
use crate::error::AgentError;
use crate::host::block::{self, DeviceNumber};
use crate::host::mount::{self, BlockRecord};
use crate::host::{Host, sysfs};
use crate::volume::{device, expand, mount_table, publish, stage, stats};
use csi_scsi_contract::{VolumeId, Wwid};

/// The topology key under which NodeGetInfo reports the node's name; the
/// controller's accessible topology uses the same key.
pub(crate) const TOPOLOGY_NODE_KEY: &str = csi_scsi_daemon::NODE_TOPOLOGY_KEY;

/// What this Node service supports (NodeGetCapabilities).
pub(crate) const CAPABILITIES: [RpcType; 5] = [
    RpcType::StageUnstageVolume,
    RpcType::GetVolumeStats,
    RpcType::ExpandVolume,
    RpcType::VolumeCondition,
    RpcType::SingleNodeMultiWriter,
];

/// The CSI Node service of one agent.
#[derive(Debug)]
pub(crate) struct NodeService {
    host: Arc<Host>,
    node_id: String,
    max_volumes: u64,
    /// One operation at a time per LUN, shared with the agent API (so a
    /// stage never runs beside an attach, detach or wipe of the same LUN).
    /// Keyed by WWID, not volume ID, so that a stale call about an old
    /// binding of the LUN cannot interleave with one about the current one.
    luns: KeyedLocks<String>,
    /// One operation at a time per path, so two volumes never race for one
    /// staging or target path.
    paths: KeyedLocks<PathBuf>,
}

// === impl NodeService ===

impl NodeService {
    /// A Node service for node `node_id` on `host`, reporting at most
    /// `max_volumes` volumes (0: no limit), taking LUNs in `luns` (the agent
    /// API's set).
    pub(crate) fn new(
        host: Arc<Host>,
        node_id: String,
        max_volumes: u64,
        luns: KeyedLocks<String>,
    ) -> Self {
        Self {
            host,
            node_id,
            max_volumes,
            luns,
            paths: KeyedLocks::new(),
        }
    }

    /// Takes the in-flight guards of the LUN and of `path`, or answers
    /// ABORTED ("Operation pending for volume") holding neither.
    fn begin(
        &self,
        volume: &VolumeId,
        path: &KubeletPath,
    ) -> Result<(KeyGuard<String>, KeyGuard<PathBuf>), AgentError> {
        let lun = self
            .luns
            .try_lock(volume.wwid().as_str().to_owned())
            .ok_or_else(|| AgentError::Busy(format!("volume {volume}")))?;
        let path = self
            .paths
            .try_lock(path.as_path().to_owned())
            .ok_or_else(|| AgentError::Busy(path.as_path().display().to_string()))?;
        Ok((lun, path))
    }
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
            refuse_other_lun(&self.host, &req.volume, req.staging.as_path())?;
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
            refuse_other_lun(&self.host, &req.volume, req.target.as_path())?;
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
            let result = request::stats(&self.host, &r).and_then(|req| {
                refuse_other_lun(&self.host, &req.volume, req.path.as_path())?;
                stats::stats(&self.host, &req)
            });
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
            refuse_other_lun(&self.host, &req.volume, req.path.as_path())?;
            check_expand_access(&self.host, &req)?;
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

/// Refuses a call about a volume whose LUN is not on this node at a path
/// that holds another LUN that is. The domain accepts any disk at the path
/// of a vanished LUN, so that kubelet can clean up after it; a LUN that is
/// here under another WWID is no such leftover but another volume, which a
/// wrong volume ID must not unmount: "Volume does not exist" (NOT_FOUND).
fn refuse_other_lun(host: &Host, volume: &VolumeId, path: &Path) -> Result<(), AgentError> {
    if device::find(host, volume.wwid())?.is_some() {
        // The domain checks that the path holds this very device.
        return Ok(());
    }
    let table = mount_table(host)?;
    let Some(m) = table.mount_at(path) else {
        return Ok(());
    };
    match lun_of_device(host, device::mounted_device(m)?)? {
        Some(other) => Err(AgentError::VolumeNotAtPath {
            volume: volume.to_string(),
            path: path.to_owned(),
            reason: format!(
                "it holds LUN {other}, and {} is not on this node",
                volume.wwid()
            ),
        }),
        None => Ok(()),
    }
}

/// The WWID of the SCSI disk or multipath map with device number `number`.
fn lun_of_device(host: &Host, number: DeviceNumber) -> Result<Option<Wwid>, AgentError> {
    let io = |e| AgentError::io(host.sys("block"), e);
    let disks = sysfs::scsi_disks(host).map_err(io)?;
    let maps = sysfs::multipath_maps(host).map_err(io)?;
    let named = disks
        .into_iter()
        .map(|d| (d.kernel_name, d.wwid))
        .chain(maps.into_iter().map(|m| (m.kernel_name, m.wwid)));
    for (name, wwid) in named {
        if block::device_number(&host.dev(&name)).ok() == Some(number) {
            return Ok(Some(wwid));
        }
    }
    Ok(None)
}

/// NodeExpandVolume's "Exceeds capabilities" (INVALID_ARGUMENT): raw block
/// asked where a filesystem is mounted, or a filesystem where a raw block
/// volume is.
fn check_expand_access(host: &Host, req: &ExpandRequest) -> Result<(), AgentError> {
    let Some(access) = &req.access else {
        return Ok(());
    };
    let path = req.path.as_path();
    if !mount::exists(path)? {
        // The domain answers NOT_FOUND.
        return Ok(());
    }
    let raw = block::node_number(path)
        .map_err(|e| AgentError::io(path, e))?
        .is_some()
        || (path.is_dir() && BlockRecord::read(path)?.is_some());
    let filesystem = !raw && mount_table(host)?.mount_at(path).is_some();
    let wrong = match access {
        AccessType::Block if filesystem => "asks for raw block, but a filesystem is mounted there",
        AccessType::Mount { .. } if raw => "asks for a filesystem, but a raw block volume is there",
        _ => return Ok(()),
    };
    Err(AgentError::InvalidArgument {
        field: "volume_capability",
        reason: format!("{wrong} ({})", path.display()),
    })
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
