//! The agent's command line, read and checked once before anything binds.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use csi_scsi_certs::{MaterialPaths, TrustDomain};
use csi_scsi_daemon::{ProcessArgs, parse_csi_endpoint};

use crate::host::Host;
use crate::host::command::CommandRunner;
use crate::registration::RegistrationPaths;

/// csi-scsi node agent: serves CSI Identity and Node to kubelet on a Unix
/// socket, and the agent API (discover, attach, detach, wipe, rescan) to the
/// csi-scsi proxy over mutual TLS.
///
/// The agent API accepts only a client certificate issued by the cluster CA
/// that names spiffe://<trust-domain>/proxy; its own certificate must name
/// spiffe://<trust-domain>/node/<node-name>. Certificate files are reloaded
/// when they change.
#[derive(Parser, Debug)]
#[command(name = "csi-scsi-agent", version, about, long_about)]
pub struct Args {
    /// Kubernetes name of this node; must match the agent certificate.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,

    /// CSI socket served to kubelet: unix:///path/csi.sock or /path/csi.sock.
    #[arg(
        long,
        env = "CSI_ENDPOINT",
        value_parser = parse_csi_endpoint,
        default_value = "unix:///var/lib/kubelet/plugins/csi-scsi.io/csi.sock"
    )]
    pub csi_endpoint: PathBuf,

    /// Address the mutual-TLS agent API listens on.
    #[arg(long, env = "AGENT_LISTEN", default_value = "0.0.0.0:9810")]
    pub agent_listen: SocketAddr,

    /// Address of the operators' HTTP endpoints (/healthz, /readyz,
    /// /metrics, /status); port 0 picks a free port (logged at start).
    /// Unauthenticated: the default is loopback; a DaemonSet binds the pod
    /// IP (`$(POD_IP):9811`), never every interface of a hostNetwork pod.
    #[arg(long, env = "STATUS_LISTEN", default_value = "127.0.0.1:9811")]
    pub status_listen: SocketAddr,

    /// Directory with tls.crt, tls.key and ca.crt (a mounted Secret).
    #[arg(long, env = "TLS_DIR", default_value = "/etc/csi-scsi/tls")]
    pub tls_dir: PathBuf,

    /// Enrol with this projected ServiceAccount token (audience
    /// csi-scsi-enrolment), re-read at every enrolment: with it, an agent
    /// whose --tls-dir holds no usable certificate serves only the
    /// Enrolment service until the proxy has signed one, and the proxy
    /// renews it before it expires (docs/certificates.md, "Enrolment").
    #[arg(long, value_name = "PATH", conflicts_with = "join_token_file")]
    pub enrol_token_file: Option<PathBuf>,

    /// Enrol with the one-time join token in this file (embedded mode:
    /// `csi-scsi-proxy join-token`); as --enrol-token-file otherwise.
    #[arg(long, value_name = "PATH")]
    pub join_token_file: Option<PathBuf>,

    /// The CA certificate to trust while enrolling, when --tls-dir has no
    /// ca.crt yet (a mounted ConfigMap); only the proxy it signed may
    /// enrol this agent.
    #[arg(long, value_name = "PATH")]
    pub enrol_ca_file: Option<PathBuf>,

    /// Host tools that must be present for the agent to report ready
    /// (comma-separated names on $PATH or absolute paths).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "mkfs.ext4,mkfs.xfs,mount,umount,e2fsck,resize2fs,xfs_growfs"
    )]
    pub required_tools: Vec<PathBuf>,

    /// Root of sysfs (a prepared tree in tests and the lab).
    #[arg(long, default_value = "/sys")]
    pub sysfs_root: PathBuf,

    /// Root of device nodes, with disk/by-id and disk/by-path beneath it.
    #[arg(long, default_value = "/dev")]
    pub dev_root: PathBuf,

    /// The mount table to read.
    #[arg(long, default_value = "/proc/self/mountinfo")]
    pub mountinfo: PathBuf,

    /// kubelet's root directory: staging and target paths must lie under it.
    #[arg(long, env = "KUBELET_DIR", default_value = "/var/lib/kubelet")]
    pub kubelet_dir: PathBuf,

    /// Register the driver with kubelet's plugin watcher, as
    /// node-driver-registrar would (the agent replaces that sidecar): on in
    /// a cluster; off where no kubelet watches (a lab without kubelet).
    /// kubelet's verdict shows on /status; while it is a refusal, /readyz
    /// fails (waiting for kubelet does not: it registers only a serving
    /// agent).
    #[arg(
        long,
        env = "KUBELET_REGISTRATION",
        value_enum,
        default_value = "on",
        value_name = "on|off"
    )]
    pub kubelet_registration: Switch,

    /// The directory kubelet's plugin watcher watches; the agent serves
    /// <dir>/csi-scsi.io-reg.sock there and removes it on shutdown (kubelet
    /// then deregisters the driver). Default: <kubelet-dir>/plugins_registry.
    #[arg(long, env = "REGISTRATION_DIR")]
    pub registration_dir: Option<PathBuf>,

    /// The CSI socket's absolute path as kubelet sees it, handed to kubelet
    /// at registration. Default: the --csi-endpoint path (the DaemonSet
    /// mounts the kubelet directory at the host's path).
    #[arg(long)]
    pub kubelet_registration_path: Option<PathBuf>,

    /// open-iscsi's node record directory: CHAP settings are written into
    /// the records there, never passed to iscsiadm on its command line.
    #[arg(long, default_value = "/etc/iscsi/nodes")]
    pub iscsi_node_dir: PathBuf,

    /// Use this path for a host tool instead of $PATH, e.g.
    /// --tool iscsiadm=/usr/sbin/iscsiadm (repeatable).
    #[arg(long = "tool", value_name = "NAME=PATH")]
    pub tools: Vec<String>,

    /// Where the agent keeps its small state (which LUNs it attached).
    #[arg(long, default_value = "/var/lib/csi-scsi-agent")]
    pub state_dir: PathBuf,

    /// Login timeout of one iSCSI portal (dead portals are reported, not waited for).
    #[arg(long, default_value = "15", value_name = "SECONDS")]
    pub login_timeout: u64,

    /// Timeout of one host tool run (mkfs, iscsiadm, ...).
    #[arg(long, default_value = "120", value_name = "SECONDS")]
    pub command_timeout: u64,

    /// Most volumes kubelet may place on this node (0: no limit).
    #[arg(long, default_value = "0")]
    pub max_volumes: u64,

    /// The flags every daemon takes alike.
    #[command(flatten)]
    pub process: ProcessArgs,
}

/// A feature switch on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Switch {
    /// Enabled.
    On,
    /// Disabled.
    Off,
}

/// Validated configuration.
#[derive(Debug)]
pub struct Config {
    pub host: Host,
    pub state_dir: PathBuf,
    pub login_timeout: Duration,
    pub max_volumes: u64,
    pub node_name: String,
    pub csi_socket: PathBuf,
    /// Where to register with kubelet; `None` when registration is off.
    pub registration: Option<RegistrationPaths>,
    pub agent_listen: SocketAddr,
    pub status_listen: SocketAddr,
    pub tls: MaterialPaths,
    /// How this agent proves its node when it enrols; `None`: certificates
    /// come as files only.
    pub enrolment: Option<crate::api::enrolment::Credential>,
    /// The CA trusted while enrolling, when `tls.ca` does not exist yet.
    pub enrol_ca: Option<PathBuf>,
    pub trust_domain: TrustDomain,
    pub required_tools: Vec<PathBuf>,
    pub grace_period: Duration,
    pub tls_poll_interval: Duration,
}

impl Args {
    /// Checks every value; the error says which flag is wrong.
    pub fn validate(self) -> Result<Config, String> {
        let csi_socket = self.csi_endpoint;
        let trust_domain = self.process.trust_domain.clone();
        if self.node_name.is_empty() {
            return Err("--node-name: must not be empty".into());
        }
        csi_scsi_certs::validate_node_name(&self.node_name)
            .map_err(|e| format!("--node-name: {e}"))?;
        let mut tools = BTreeMap::new();
        for spec in &self.tools {
            let (name, path) = spec
                .split_once('=')
                .filter(|(n, p)| !n.is_empty() && !p.is_empty())
                .ok_or_else(|| format!("--tool: {spec:?} is not NAME=PATH"))?;
            tools.insert(name.to_owned(), PathBuf::from(path));
        }
        let kubelet_dir =
            std::fs::canonicalize(&self.kubelet_dir).unwrap_or(self.kubelet_dir.clone());
        let registration = match self.kubelet_registration {
            Switch::Off => None,
            Switch::On => Some(registration_paths(
                self.registration_dir,
                self.kubelet_registration_path,
                &kubelet_dir,
                &csi_socket,
            )?),
        };
        let host = Host {
            sysfs: self.sysfs_root,
            dev: self.dev_root,
            mountinfo: self.mountinfo,
            kubelet_dir,
            iscsi_nodes: self.iscsi_node_dir,
            tools,
            runner: CommandRunner::new(Duration::from_secs(self.command_timeout.max(1))),
        };
        Ok(Config {
            state_dir: self.state_dir,
            login_timeout: Duration::from_secs(self.login_timeout.max(1)),
            host,
            max_volumes: self.max_volumes,
            node_name: self.node_name,
            csi_socket,
            registration,
            agent_listen: self.agent_listen,
            status_listen: self.status_listen,
            tls: MaterialPaths::in_dir(&self.tls_dir),
            enrolment: match (self.enrol_token_file, self.join_token_file) {
                (Some(path), _) => {
                    Some(crate::api::enrolment::Credential::ServiceAccountToken(path))
                }
                (None, Some(path)) => Some(crate::api::enrolment::Credential::JoinToken(path)),
                (None, None) => None,
            },
            enrol_ca: self.enrol_ca_file,
            trust_domain,
            required_tools: self.required_tools,
            grace_period: self.process.grace(),
            tls_poll_interval: self.process.tls_poll(),
        })
    }
}

/// The registration socket and the endpoint handed to kubelet; kubelet
/// resolves neither against a working directory, so both must be absolute.
fn registration_paths(
    dir: Option<PathBuf>,
    endpoint: Option<PathBuf>,
    kubelet_dir: &Path,
    csi_socket: &Path,
) -> Result<RegistrationPaths, String> {
    let dir = dir.unwrap_or_else(|| kubelet_dir.join("plugins_registry"));
    if !dir.is_absolute() {
        return Err(format!(
            "--registration-dir: {} must be an absolute path",
            dir.display()
        ));
    }
    let endpoint = endpoint.unwrap_or_else(|| csi_socket.to_owned());
    if !endpoint.is_absolute() {
        return Err(format!(
            "--kubelet-registration-path: {} must be an absolute path",
            endpoint.display()
        ));
    }
    Ok(RegistrationPaths::new(&dir, endpoint))
}
