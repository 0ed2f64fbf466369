//! The leader gate: a tower layer that answers the Controller calls which
//! change state with UNAVAILABLE on a replica that does not lead.

use tonic::codegen::http;

use super::LeaderHandle;

/// A tower layer over the Controller service that answers the calls which
/// change state ([`ControllerMethod::needs_leader`]) with UNAVAILABLE
/// unless this replica leads. Reads are served by every replica: each keeps
/// its own watch caches. The sidecars' own elections follow the proxy's
/// through [`LeaderCheck`] and [`exit_when_leadership_lost`]; the gate is
/// the fence for any caller that did not wait.
#[derive(Clone, Debug)]
pub struct LeaderGate(pub LeaderHandle);

/// The service [`LeaderGate`] makes.
#[derive(Clone, Debug)]
pub struct LeaderGated<S> {
    inner: S,
    leader: LeaderHandle,
}

/// A Controller RPC, named by its gRPC path: what the leader gate decides on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControllerMethod {
    /// CreateVolume.
    CreateVolume,
    /// DeleteVolume.
    DeleteVolume,
    /// ControllerPublishVolume.
    ControllerPublishVolume,
    /// ControllerUnpublishVolume.
    ControllerUnpublishVolume,
    /// ValidateVolumeCapabilities.
    ValidateVolumeCapabilities,
    /// ListVolumes.
    ListVolumes,
    /// GetCapacity.
    GetCapacity,
    /// ControllerGetCapabilities.
    ControllerGetCapabilities,
    /// CreateSnapshot.
    CreateSnapshot,
    /// DeleteSnapshot.
    DeleteSnapshot,
    /// ListSnapshots.
    ListSnapshots,
    /// GetSnapshot.
    GetSnapshot,
    /// ControllerExpandVolume.
    ControllerExpandVolume,
    /// ControllerGetVolume.
    ControllerGetVolume,
    /// ControllerModifyVolume.
    ControllerModifyVolume,
}

// === impl ControllerMethod ===

impl ControllerMethod {
    /// The method `path` (`/csi.v1.Controller/<Method>`) names; `None` for
    /// any other path.
    pub fn from_path(path: &str) -> Option<Self> {
        let method = path
            .strip_prefix('/')?
            .strip_prefix(csi_scsi_proto::csi::controller_server::SERVICE_NAME)?
            .strip_prefix('/')?;
        Some(match method {
            "CreateVolume" => Self::CreateVolume,
            "DeleteVolume" => Self::DeleteVolume,
            "ControllerPublishVolume" => Self::ControllerPublishVolume,
            "ControllerUnpublishVolume" => Self::ControllerUnpublishVolume,
            "ValidateVolumeCapabilities" => Self::ValidateVolumeCapabilities,
            "ListVolumes" => Self::ListVolumes,
            "GetCapacity" => Self::GetCapacity,
            "ControllerGetCapabilities" => Self::ControllerGetCapabilities,
            "CreateSnapshot" => Self::CreateSnapshot,
            "DeleteSnapshot" => Self::DeleteSnapshot,
            "ListSnapshots" => Self::ListSnapshots,
            "GetSnapshot" => Self::GetSnapshot,
            "ControllerExpandVolume" => Self::ControllerExpandVolume,
            "ControllerGetVolume" => Self::ControllerGetVolume,
            "ControllerModifyVolume" => Self::ControllerModifyVolume,
            _ => return None,
        })
    }

    /// Whether only the leader may serve it: every call that changes state
    /// (the inventory, an attachment, a LUN). The others read the watch
    /// caches every replica keeps.
    pub fn needs_leader(self) -> bool {
        match self {
            Self::CreateVolume
            | Self::DeleteVolume
            | Self::ControllerPublishVolume
            | Self::ControllerUnpublishVolume
            | Self::ControllerExpandVolume
            | Self::ControllerModifyVolume
            | Self::CreateSnapshot
            | Self::DeleteSnapshot => true,
            Self::ControllerGetCapabilities
            | Self::ValidateVolumeCapabilities
            | Self::ListVolumes
            | Self::GetCapacity
            | Self::ControllerGetVolume
            | Self::ListSnapshots
            | Self::GetSnapshot => false,
        }
    }
}

// === impl LeaderGate ===

impl<S> tower::Layer<S> for LeaderGate {
    type Service = LeaderGated<S>;

    fn layer(&self, inner: S) -> Self::Service {
        LeaderGated {
            inner,
            leader: self.0.clone(),
        }
    }
}

impl<S, B> tower::Service<http::Request<B>> for LeaderGated<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        futures::future::Either<S::Future, std::future::Ready<Result<Self::Response, Self::Error>>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let path = request.uri().path();
        // A method this table does not know is gated: it may write.
        let method = ControllerMethod::from_path(path);
        if method.is_none_or(ControllerMethod::needs_leader) && !self.leader.is_leader() {
            let refusal = tonic::Status::unavailable(format!(
                "{}: this csi-scsi-proxy replica is not the leader, and only the leader changes state; retry (the leader holds the Lease)",
                method.map_or("this method", |_| path.trim_start_matches('/'))
            ));
            return futures::future::Either::Right(std::future::ready(Ok(refusal.into_http())));
        }
        futures::future::Either::Left(self.inner.call(request))
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for LeaderGated<S> {
    const NAME: &'static str = S::NAME;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_calls_that_change_state_need_the_leader() {
        // (path, method, needs the leader)
        let table = [
            ("CreateVolume", ControllerMethod::CreateVolume, true),
            ("DeleteVolume", ControllerMethod::DeleteVolume, true),
            (
                "ControllerPublishVolume",
                ControllerMethod::ControllerPublishVolume,
                true,
            ),
            (
                "ControllerUnpublishVolume",
                ControllerMethod::ControllerUnpublishVolume,
                true,
            ),
            (
                "ControllerExpandVolume",
                ControllerMethod::ControllerExpandVolume,
                true,
            ),
            (
                "ControllerModifyVolume",
                ControllerMethod::ControllerModifyVolume,
                true,
            ),
            ("CreateSnapshot", ControllerMethod::CreateSnapshot, true),
            ("DeleteSnapshot", ControllerMethod::DeleteSnapshot, true),
            (
                "ControllerGetCapabilities",
                ControllerMethod::ControllerGetCapabilities,
                false,
            ),
            (
                "ValidateVolumeCapabilities",
                ControllerMethod::ValidateVolumeCapabilities,
                false,
            ),
            ("ListVolumes", ControllerMethod::ListVolumes, false),
            ("GetCapacity", ControllerMethod::GetCapacity, false),
            (
                "ControllerGetVolume",
                ControllerMethod::ControllerGetVolume,
                false,
            ),
            ("ListSnapshots", ControllerMethod::ListSnapshots, false),
            ("GetSnapshot", ControllerMethod::GetSnapshot, false),
        ];
        for (name, method, gated) in table {
            let path = format!("/csi.v1.Controller/{name}");
            assert_eq!(ControllerMethod::from_path(&path), Some(method), "{path}");
            assert_eq!(method.needs_leader(), gated, "{path}");
        }
        for other in [
            "/csi.v1.Controller/Frobnicate",
            "/csi.v1.Identity/Probe",
            "/csi.v1.Controller/",
            "csi.v1.Controller/CreateVolume",
            "/csi.v1.Controller/CreateVolume/x",
        ] {
            assert_eq!(ControllerMethod::from_path(other), None, "{other}");
        }
    }
}
