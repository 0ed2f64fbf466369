//! Request builders shared by the tables, the garbage rounds and the
//! dangerous calls: the fields a case varies are arguments, every other
//! field is what a well-formed request carries.

use std::collections::HashMap;
use std::time::Duration;

use csi_scsi_proto::agent as api;
use csi_scsi_proto::csi::volume_capability::access_mode::Mode;
use csi_scsi_proto::csi::volume_capability::{AccessMode, AccessType, MountVolume};
use csi_scsi_proto::csi::*;

use super::Sweep;
use super::fixture::Fixture;
use crate::lab::scenario::capability;

/// The fs fixture's capability.
pub(super) fn fs_cap() -> VolumeCapability {
    capability(false, "xfs", Mode::SingleNodeWriter)
}

/// A raw block capability, which the fs fixture was not created with.
pub(super) fn block_cap() -> VolumeCapability {
    capability(true, "", Mode::SingleNodeWriter)
}

/// A mount or block capability with a raw access-mode value.
pub(super) fn cap_mode(block: bool, mode: i32) -> VolumeCapability {
    let mut c = capability(
        block,
        if block { "" } else { "xfs" },
        Mode::SingleNodeWriter,
    );
    c.access_mode = Some(AccessMode { mode });
    c
}

/// A mount capability with `fs`, `flags` and `group`.
pub(super) fn mount_cap(fs: &str, flags: &[&str], group: &str) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs.to_owned(),
            mount_flags: flags.iter().map(|s| s.to_string()).collect(),
            volume_mount_group: group.to_owned(),
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

/// `(key, value)` pairs as a parameter map.
fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A capacity range of `(required, limit)`.
fn range(r: Option<(i64, i64)>) -> Option<CapacityRange> {
    r.map(|(required_bytes, limit_bytes)| CapacityRange {
        required_bytes,
        limit_bytes,
    })
}

/// The builders of requests that carry secrets or the fs fixture's volume
/// context.
pub(super) struct Requests {
    /// What every request with a secrets field carries.
    secrets: HashMap<String, String>,
    /// What NodeStage and NodePublish carry as volume context.
    context: HashMap<String, String>,
    /// What NodeExpand carries as staging path.
    staging: String,
}

impl Requests {
    /// Builders with the sweep's secrets and the fs fixture's context.
    pub(super) fn new(sw: &Sweep, fx: &Fixture) -> Self {
        Self {
            secrets: sw.secrets(),
            context: fx.fs.volume_context.clone(),
            staging: fx.fs_staging.display().to_string(),
        }
    }

    /// The same, for Node requests that name no volume context and (for
    /// NodeExpand) no staging path: the garbage rounds' requests.
    pub(super) fn bare(self) -> Self {
        Self {
            context: HashMap::new(),
            staging: String::new(),
            ..self
        }
    }

    /// The secrets map, for requests built in place.
    pub(super) fn secrets(&self) -> HashMap<String, String> {
        self.secrets.clone()
    }

    /// DeleteVolume of `id`.
    pub(super) fn delete_volume(&self, id: &str) -> DeleteVolumeRequest {
        DeleteVolumeRequest {
            volume_id: id.to_owned(),
            secrets: self.secrets(),
        }
    }

    /// ControllerPublishVolume of `id` to `node`, read-write.
    pub(super) fn controller_publish(
        &self,
        id: &str,
        node: &str,
        cap: Option<VolumeCapability>,
    ) -> ControllerPublishVolumeRequest {
        ControllerPublishVolumeRequest {
            volume_id: id.to_owned(),
            node_id: node.to_owned(),
            volume_capability: cap,
            readonly: false,
            secrets: self.secrets(),
            volume_context: HashMap::new(),
        }
    }

    /// ControllerUnpublishVolume of `id` from `node`.
    pub(super) fn controller_unpublish(
        &self,
        id: &str,
        node: &str,
    ) -> ControllerUnpublishVolumeRequest {
        ControllerUnpublishVolumeRequest {
            volume_id: id.to_owned(),
            node_id: node.to_owned(),
            secrets: self.secrets(),
        }
    }

    /// ValidateVolumeCapabilities of `id` for `caps` and `params`.
    pub(super) fn validate(
        &self,
        id: &str,
        caps: Vec<VolumeCapability>,
        params: &[(&str, &str)],
    ) -> ValidateVolumeCapabilitiesRequest {
        ValidateVolumeCapabilitiesRequest {
            volume_id: id.to_owned(),
            volume_context: HashMap::new(),
            volume_capabilities: caps,
            parameters: map(params),
            secrets: self.secrets(),
            mutable_parameters: HashMap::new(),
        }
    }

    /// ControllerExpandVolume of `id` to `(required, limit)`.
    pub(super) fn controller_expand(
        &self,
        id: &str,
        required: Option<(i64, i64)>,
        cap: Option<VolumeCapability>,
    ) -> ControllerExpandVolumeRequest {
        ControllerExpandVolumeRequest {
            volume_id: id.to_owned(),
            capacity_range: range(required),
            secrets: self.secrets(),
            volume_capability: cap,
        }
    }

    /// NodeStageVolume of `id` at `path`.
    pub(super) fn node_stage(
        &self,
        id: &str,
        path: &str,
        cap: Option<VolumeCapability>,
    ) -> NodeStageVolumeRequest {
        NodeStageVolumeRequest {
            volume_id: id.to_owned(),
            publish_context: HashMap::new(),
            staging_target_path: path.to_owned(),
            volume_capability: cap,
            secrets: self.secrets(),
            volume_context: self.context.clone(),
        }
    }

    /// NodePublishVolume of `id` from `staging` at `target`.
    pub(super) fn node_publish(
        &self,
        id: &str,
        staging: &str,
        target: &str,
        cap: Option<VolumeCapability>,
        readonly: bool,
    ) -> NodePublishVolumeRequest {
        NodePublishVolumeRequest {
            volume_id: id.to_owned(),
            publish_context: HashMap::new(),
            staging_target_path: staging.to_owned(),
            target_path: target.to_owned(),
            volume_capability: cap,
            readonly,
            secrets: self.secrets(),
            volume_context: self.context.clone(),
        }
    }

    /// NodeExpandVolume of `id` at `path` to `(required, limit)`.
    pub(super) fn node_expand(
        &self,
        id: &str,
        path: &str,
        required: Option<(i64, i64)>,
        cap: Option<VolumeCapability>,
    ) -> NodeExpandVolumeRequest {
        NodeExpandVolumeRequest {
            volume_id: id.to_owned(),
            volume_path: path.to_owned(),
            capacity_range: range(required),
            staging_target_path: self.staging.clone(),
            volume_capability: cap,
            secrets: self.secrets(),
        }
    }
}

/// ControllerGetVolume of `id`.
pub(super) fn get_volume(id: &str) -> ControllerGetVolumeRequest {
    ControllerGetVolumeRequest {
        volume_id: id.to_owned(),
    }
}

/// ListVolumes: a page of `max` from `token`.
pub(super) fn list_volumes(max: i32, token: &str) -> ListVolumesRequest {
    ListVolumesRequest {
        max_entries: max,
        starting_token: token.to_owned(),
    }
}

/// GetCapacity for `caps` and `params`, on the topology `(key, value)`.
pub(super) fn get_capacity(
    caps: Vec<VolumeCapability>,
    params: &[(&str, &str)],
    topo: Option<(&str, &str)>,
) -> GetCapacityRequest {
    GetCapacityRequest {
        volume_capabilities: caps,
        parameters: map(params),
        accessible_topology: topo.map(|(k, v)| Topology {
            segments: HashMap::from([(k.to_owned(), v.to_owned())]),
        }),
    }
}

/// NodeUnstageVolume of `id` at `path`.
pub(super) fn node_unstage(id: &str, path: &str) -> NodeUnstageVolumeRequest {
    NodeUnstageVolumeRequest {
        volume_id: id.to_owned(),
        staging_target_path: path.to_owned(),
    }
}

/// NodeUnpublishVolume of `id` at `path`.
pub(super) fn node_unpublish(id: &str, path: &str) -> NodeUnpublishVolumeRequest {
    NodeUnpublishVolumeRequest {
        volume_id: id.to_owned(),
        target_path: path.to_owned(),
    }
}

/// NodeGetVolumeStats of `id` at `path`.
pub(super) fn node_stats(id: &str, path: &str) -> NodeGetVolumeStatsRequest {
    NodeGetVolumeStatsRequest {
        volume_id: id.to_owned(),
        volume_path: path.to_owned(),
        staging_target_path: String::new(),
    }
}

/// An iSCSI target for the agent API with `portals` and `iqn`.
pub(super) fn iscsi(
    name: &str,
    portals: &[&str],
    iqn: &str,
    chap: Option<(&str, &str)>,
) -> api::Target {
    api::Target {
        name: name.to_owned(),
        transport: Some(api::target::Transport::Iscsi(api::IscsiTarget {
            portals: portals.iter().map(|s| s.to_string()).collect(),
            iqn: iqn.to_owned(),
            chap: chap.map(|(u, p)| api::ChapCredentials {
                username: u.to_owned(),
                password: p.to_owned(),
                mutual_username: String::new(),
                mutual_password: String::new(),
            }),
        })),
    }
}

/// Attach of `wwid` at LUN `lun` of `targets`.
pub(super) fn attach(wwid: &str, targets: Vec<api::Target>, lun: u32) -> api::AttachRequest {
    api::AttachRequest {
        wwid: wwid.to_owned(),
        targets,
        lun,
    }
}

/// Detach of `wwid`, logging out of `targets` if unused.
pub(super) fn detach(wwid: &str, targets: Vec<api::Target>) -> api::DetachRequest {
    api::DetachRequest {
        wwid: wwid.to_owned(),
        targets,
    }
}

/// Wipe of `wwid` in `mode`.
pub(super) fn wipe(wwid: &str, mode: i32) -> api::WipeRequest {
    api::WipeRequest {
        wwid: wwid.to_owned(),
        mode,
        expected_size_bytes: 0,
    }
}

/// Rescan of `wwid`.
pub(super) fn rescan(wwid: &str) -> api::RescanRequest {
    api::RescanRequest {
        wwid: wwid.to_owned(),
    }
}

/// `req` with a deadline of its own, shorter than the sweep's call limit.
pub(super) fn bounded<R>(req: R, deadline: Duration) -> tonic::Request<R> {
    let mut req = tonic::Request::new(req);
    req.set_timeout(deadline);
    req
}
