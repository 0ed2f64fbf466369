//! CSI Identity, shared by the proxy and the agent: they differ only in the
//! capabilities they list and the checks behind `Probe`.

use csi_scsi_proto::csi::identity_server::Identity;
use csi_scsi_proto::csi::plugin_capability::{self, service};
use csi_scsi_proto::csi::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, PluginCapability, ProbeRequest, ProbeResponse,
};
use tonic::{Request, Response, Status};

use crate::Readiness;

/// The CSI driver name registered with Kubernetes.
pub const PLUGIN_NAME: &str = "csi-scsi.io";

/// The topology key under which every node reports its name in
/// NodeGetInfo, and which CreateVolume's accessibility requirements use.
pub const NODE_TOPOLOGY_KEY: &str = "topology.csi-scsi.io/node";

/// The Identity service of one process.
#[derive(Debug)]
pub struct IdentityService {
    version: String,
    services: Vec<service::Type>,
    expansion: Option<plugin_capability::volume_expansion::Type>,
    readiness: Readiness,
}

// === impl IdentityService ===

impl IdentityService {
    /// `version` is the crate version; `services` the plugin capabilities
    /// this process really serves; `readiness` decides `Probe`.
    pub fn new(version: &str, services: Vec<service::Type>, readiness: Readiness) -> Self {
        Self {
            version: version.to_owned(),
            services,
            expansion: None,
            readiness,
        }
    }

    /// Also advertise volume expansion of this kind.
    pub fn with_expansion(mut self, kind: plugin_capability::volume_expansion::Type) -> Self {
        self.expansion = Some(kind);
        self
    }
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _request: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: PLUGIN_NAME.to_owned(),
            vendor_version: self.version.clone(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _request: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        let capabilities = self
            .services
            .iter()
            .map(|&t| PluginCapability {
                r#type: Some(plugin_capability::Type::Service(
                    plugin_capability::Service { r#type: t as i32 },
                )),
            })
            .collect();
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn probe(
        &self,
        _request: Request<ProbeRequest>,
    ) -> Result<Response<ProbeResponse>, Status> {
        let failures = self.readiness.failures();
        for (check, why) in &failures {
            tracing::info!(check = %check, reason = %why, "probe: not ready");
        }
        Ok(Response::new(ProbeResponse {
            ready: Some(failures.is_empty()),
        }))
    }
}
