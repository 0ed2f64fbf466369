//! Registration with kubelet, in place of the node-driver-registrar
//! sidecar: the agent serves kubelet's plugin registration API on
//! `<registration dir>/csi-scsi.io-reg.sock`. kubelet's plugin watcher
//! finds the socket, asks `GetInfo` for the driver name and the CSI
//! endpoint, calls `NodeGetInfo` on that endpoint itself, and reports the
//! outcome with `NotifyRegistrationStatus`. The last outcome is logged,
//! shown on `/status` and, when it is a refusal, keeps `/readyz` failing.
//! Removing the socket (at shutdown) makes kubelet deregister the driver.
//!
//! Neither call can fail, so the service has no error enum of its own.

mod authority;

pub(crate) use authority::fix_authority;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use csi_scsi_daemon::{Check, PLUGIN_NAME, rfc3339};
use csi_scsi_proto::pluginregistration::registration_server::Registration;
use csi_scsi_proto::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use csi_scsi_status::agent as doc;
use csi_scsi_textfs::text::{STATUS_MAX, bounded};
use tonic::{Request, Response, Status};

/// The plugin type kubelet's watcher hands CSI drivers to.
pub(crate) const PLUGIN_TYPE: &str = "CSIPlugin";

/// The registration API versions the agent speaks.
pub(crate) const SUPPORTED_VERSIONS: &[&str] = &["1.0.0"];

/// The registration socket's file name, as node-driver-registrar names it.
pub(crate) fn socket_name() -> String {
    format!("{PLUGIN_NAME}-reg.sock")
}

/// Where the agent registers and what it tells kubelet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistrationPaths {
    /// The registration socket the agent serves.
    pub socket: PathBuf,
    /// The CSI socket's path as kubelet sees it.
    pub endpoint: PathBuf,
}

/// What kubelet last reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Nothing yet since the agent started.
    Pending,
    /// kubelet registered the driver.
    Registered,
    /// kubelet refused it, with its reason.
    Failed(String),
}

/// The registration's state, shared by the service, `/status` and
/// `/readyz`.
#[derive(Clone, Debug)]
pub(crate) struct KubeletRegistration {
    paths: Arc<RegistrationPaths>,
    state: Arc<Mutex<State>>,
}

#[derive(Debug)]
struct State {
    outcome: Outcome,
    info_requested: Option<SystemTime>,
    reported: Option<SystemTime>,
}

/// kubelet's `Registration` service over a [`KubeletRegistration`].
#[derive(Debug)]
pub(crate) struct RegistrationService(KubeletRegistration);

/// `/readyz` fails while kubelet's last report is a refusal: kubelet will
/// not call this node's CSI service, so no volume can be used here.
#[derive(Debug)]
pub(crate) struct RegistrationCheck(pub KubeletRegistration);

// === impl RegistrationPaths ===

impl RegistrationPaths {
    /// The socket [`socket_name`] in `dir`, announcing `endpoint`.
    pub fn new(dir: &Path, endpoint: PathBuf) -> Self {
        Self {
            socket: dir.join(socket_name()),
            endpoint,
        }
    }
}

// === impl KubeletRegistration ===

impl KubeletRegistration {
    /// A registration nothing has been reported about yet.
    pub(crate) fn new(paths: RegistrationPaths) -> Self {
        Self {
            paths: Arc::new(paths),
            state: Arc::new(Mutex::new(State {
                outcome: Outcome::Pending,
                info_requested: None,
                reported: None,
            })),
        }
    }

    /// The socket and the endpoint.
    pub(crate) fn paths(&self) -> &RegistrationPaths {
        &self.paths
    }

    /// What kubelet last reported.
    pub(crate) fn outcome(&self) -> Outcome {
        self.lock().outcome.clone()
    }

    /// The answer to `GetInfo`; notes that kubelet found the socket.
    pub(crate) fn info(&self) -> PluginInfo {
        self.lock().info_requested = Some(SystemTime::now());
        tracing::info!(
            socket = %self.paths.socket.display(),
            endpoint = %self.paths.endpoint.display(),
            "kubelet asked for the plugin's registration info"
        );
        PluginInfo {
            r#type: PLUGIN_TYPE.to_owned(),
            name: PLUGIN_NAME.to_owned(),
            endpoint: self.paths.endpoint.display().to_string(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect(),
        }
    }

    /// Keeps and logs kubelet's verdict; the last one stands (kubelet may
    /// try again after a refusal).
    pub(crate) fn record(&self, status: &RegistrationStatus) {
        let outcome = if status.plugin_registered {
            Outcome::Registered
        } else if status.error.is_empty() {
            Outcome::Failed("kubelet gave no reason".to_owned())
        } else {
            // kubelet's text goes verbatim to /status and /readyz: bounded.
            Outcome::Failed(bounded(&status.error, STATUS_MAX).into_owned())
        };
        match &outcome {
            Outcome::Registered => {
                tracing::info!(driver = PLUGIN_NAME, "kubelet registered the driver")
            }
            Outcome::Failed(error) => {
                tracing::error!(driver = PLUGIN_NAME, %error, "kubelet refused the driver")
            }
            Outcome::Pending => {}
        }
        let mut state = self.lock();
        state.outcome = outcome;
        state.reported = Some(SystemTime::now());
    }

    /// The `/status` block.
    pub(crate) fn report(&self) -> doc::KubeletRegistration {
        let state = self.lock();
        let (state_name, error) = match &state.outcome {
            Outcome::Pending => (doc::RegistrationState::Pending, None),
            Outcome::Registered => (doc::RegistrationState::Registered, None),
            Outcome::Failed(e) => (doc::RegistrationState::Failed, Some(e.clone())),
        };
        doc::KubeletRegistration {
            socket: self.paths.socket.display().to_string(),
            endpoint: self.paths.endpoint.display().to_string(),
            state: state_name,
            error,
            info_requested: state.info_requested.map(rfc3339),
            reported: state.reported.map(rfc3339),
        }
    }

    // The state is plain data, whole after any panic: poison is ignored.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

// === impl RegistrationService ===

impl RegistrationService {
    /// Serves `registration`.
    pub(crate) fn new(registration: KubeletRegistration) -> Self {
        Self(registration)
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(
        &self,
        _request: Request<InfoRequest>,
    ) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(self.0.info()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        self.0.record(request.get_ref());
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

// === impl RegistrationCheck ===

impl Check for RegistrationCheck {
    fn name(&self) -> &str {
        "kubelet-registration"
    }

    fn check(&self) -> Result<(), String> {
        match self.0.outcome() {
            // Pending must not block: kubelet registers only a serving agent.
            Outcome::Pending | Outcome::Registered => Ok(()),
            Outcome::Failed(error) => Err(format!("kubelet refused the driver: {error}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registration() -> KubeletRegistration {
        KubeletRegistration::new(RegistrationPaths::new(
            Path::new("/var/lib/kubelet/plugins_registry"),
            PathBuf::from("/var/lib/kubelet/plugins/csi-scsi.io/csi.sock"),
        ))
    }

    #[test]
    fn info_names_the_driver_and_its_endpoint() {
        let r = registration();
        assert_eq!(
            r.paths().socket,
            Path::new("/var/lib/kubelet/plugins_registry/csi-scsi.io-reg.sock")
        );
        assert_eq!(r.report().info_requested, None);
        let info = r.info();
        assert_eq!(info.r#type, "CSIPlugin");
        assert_eq!(info.name, "csi-scsi.io");
        assert_eq!(
            info.endpoint,
            "/var/lib/kubelet/plugins/csi-scsi.io/csi.sock"
        );
        assert_eq!(info.supported_versions, ["1.0.0"]);
        assert!(r.report().info_requested.is_some());
    }

    #[test]
    fn the_last_report_stands_and_only_a_refusal_fails_readiness() {
        let r = registration();
        let check = RegistrationCheck(r.clone());
        assert_eq!(r.outcome(), Outcome::Pending);
        assert_eq!(r.report().state, doc::RegistrationState::Pending);
        assert_eq!(check.check(), Ok(()));

        r.record(&RegistrationStatus {
            plugin_registered: false,
            error: "node ID mismatch".into(),
        });
        assert_eq!(r.outcome(), Outcome::Failed("node ID mismatch".into()));
        let report = r.report();
        assert_eq!(report.state, doc::RegistrationState::Failed);
        assert_eq!(report.error.as_deref(), Some("node ID mismatch"));
        assert!(report.reported.is_some());
        let why = check.check().expect_err("refused");
        assert!(why.contains("node ID mismatch"), "{why}");

        r.record(&RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        });
        assert_eq!(r.report().state, doc::RegistrationState::Registered);
        assert_eq!(r.report().error, None);
        assert_eq!(check.check(), Ok(()));

        r.record(&RegistrationStatus {
            plugin_registered: false,
            error: String::new(),
        });
        assert_eq!(
            r.outcome(),
            Outcome::Failed("kubelet gave no reason".into())
        );
    }
}
