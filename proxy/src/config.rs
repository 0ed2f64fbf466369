//! The proxy's command line, read and checked once before anything binds.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use csi_scsi_certs::{MaterialPaths, TrustDomain};
use csi_scsi_daemon::{ProcessArgs, parse_csi_endpoint};

use crate::agents::{Backoff, CallConfig};
use crate::reconcile::qualify::QualifyConfig;
use crate::reconcile::release::ReleaseConfig;

/// csi-scsi proxy (controller plugin): serves CSI Identity and Controller to
/// the external-provisioner, -attacher and -resizer sidecars on a Unix
/// socket, keeps the inventory of SCSI LUNs, and forwards node-local work
/// to each node's csi-scsi-agent over mutual TLS.
///
/// Its client certificate must name spiffe://<trust-domain>/proxy; when it
/// dials the agent of node X it accepts only a certificate naming
/// spiffe://<trust-domain>/node/X. Certificate files are reloaded when they
/// change.
///
/// A flag given twice takes its last value, so a kustomize overlay or a
/// chart value can append an argument that overrides an earlier one.
#[derive(Parser, Debug)]
#[command(
    name = "csi-scsi-proxy",
    version,
    about,
    long_about,
    args_override_self = true
)]
pub struct Args {
    /// CSI socket served to the sidecars: unix:///path/csi.sock or /path/csi.sock.
    #[arg(
        long,
        env = "CSI_ENDPOINT",
        value_parser = parse_csi_endpoint,
        default_value = "unix:///csi/csi.sock"
    )]
    pub csi_endpoint: PathBuf,

    /// Directory with tls.crt, tls.key and ca.crt (a mounted Secret).
    #[arg(long, env = "TLS_DIR", default_value = "/etc/csi-scsi/tls")]
    pub tls_dir: PathBuf,

    /// The embedded inventory database (SQLite), used when not in Kubernetes.
    #[arg(long, env = "STORE", default_value = "/var/lib/csi-scsi/inventory.db")]
    pub store: PathBuf,

    /// Where the inventory and the agent directory live: `embedded` (an
    /// SQLite store and an agents file) or `kubernetes` (custom resources,
    /// agent Pods, a Lease for leader election).
    #[arg(long, env = "BACKEND", default_value = "embedded", value_parser = ["embedded", "kubernetes"])]
    pub backend: String,

    /// File of agents: `<node> <host:port> [label=value,...]` per line.
    /// Required with the embedded backend; with the kubernetes backend it
    /// replaces the agent Pods (agents run outside the cluster, as in the
    /// Kubernetes lab until the DaemonSet runs there).
    #[arg(long, env = "AGENTS_FILE")]
    pub agents_file: Option<PathBuf>,

    /// How long a node must stay out of the agents file (every clean read
    /// of it) before it counts as gone: its publish records are then
    /// dropped without a detach. Until then calls for it answer
    /// UNAVAILABLE, so a half-written file drops nothing. Counted from the
    /// first clean read without the node (after a restart, the first one
    /// since: nothing is remembered across restarts).
    #[arg(long, default_value = "300", value_name = "SECONDS")]
    pub node_removal_grace: u64,

    /// The driver's namespace (kubernetes backend).
    #[arg(long, env = "POD_NAMESPACE", default_value = "csi-scsi")]
    pub namespace: String,

    /// The one namespace CHAP Secrets are read from (kubernetes backend;
    /// default: --namespace). Only the proxy's ServiceAccount may read
    /// Secrets there (deploy/rbac/controller.yaml).
    #[arg(long, value_name = "NAMESPACE")]
    pub chap_secret_namespace: Option<String>,

    /// This replica's name, its identity in the Lease (kubernetes backend).
    #[arg(long, env = "POD_NAME", default_value = "")]
    pub pod_name: String,

    /// Label selector of the agent DaemonSet's Pods (kubernetes backend).
    #[arg(long, default_value = "app.kubernetes.io/name=csi-scsi-node")]
    pub agent_selector: String,

    /// Agent API port when an agent Pod declares no `agent-api` port.
    #[arg(long, default_value = "9810")]
    pub agent_port: u16,

    /// Name of the leader-election Lease (kubernetes backend).
    #[arg(long, default_value = "csi-scsi-proxy")]
    pub lease_name: String,

    /// JSON file of SCSI targets (embedded mode's SCSITargets).
    #[arg(long, env = "TARGETS_FILE")]
    pub targets_file: Option<PathBuf>,

    /// Directory of Secrets (one directory per Secret, one file per key)
    /// holding CHAP credentials that targets refer to (embedded backend;
    /// ignored with kubernetes, which reads Secrets through the API).
    #[arg(long, env = "SECRETS_DIR")]
    pub secrets_dir: Option<PathBuf>,

    /// Address of the operators' HTTP endpoints (/healthz, /readyz,
    /// /metrics, /status); port 0 picks a free port (logged at start).
    #[arg(long, env = "STATUS_LISTEN", default_value = "0.0.0.0:9812")]
    pub status_listen: std::net::SocketAddr,

    /// An address kubelet's probes come from (repeatable, or
    /// comma-separated in the env): it may take the status port's slots
    /// kept for probes, as loopback may. On the Pod network that is the
    /// node's address toward Pods, which depends on the CNI (a bridge's
    /// address, or the node's own): docs/operations.md. Still served the
    /// redacted /status.
    #[arg(
        long = "status-probe-source",
        env = "STATUS_PROBE_SOURCES",
        value_delimiter = ',',
        value_name = "IP"
    )]
    pub status_probe_sources: Vec<std::net::IpAddr>,

    /// Seconds between probes of every agent (reachability and round trip
    /// shown on /status).
    #[arg(long, default_value = "15", value_name = "SECONDS")]
    pub agent_probe_interval: u64,

    /// Seconds between discovery passes (targets changes trigger one at once).
    #[arg(long, default_value = "60", value_name = "SECONDS")]
    pub discovery_interval: u64,

    /// Seconds after which a device that no node reports and that holds no
    /// volume is removed from the inventory (only after a pass in which
    /// every node asked answered); 0: never.
    #[arg(long, default_value = "604800", value_name = "SECONDS")]
    pub device_forget_after: u64,

    /// Overall deadline of one agent call (retries included).
    #[arg(long, default_value = "60", value_name = "SECONDS")]
    pub agent_timeout: u64,

    /// Overall deadline of one wipe.
    #[arg(long, default_value = "7200", value_name = "SECONDS")]
    pub wipe_timeout: u64,

    /// Wipes of deleted volumes' LUNs running at once (leader only;
    /// DeleteVolume answers before the wipe).
    #[arg(long, default_value = "4")]
    pub release_workers: usize,

    /// Seconds between scans for LUNs still to be wiped (DeleteVolume
    /// starts one at once; the scan resumes releases after a restart).
    #[arg(long, default_value = "60", value_name = "SECONDS")]
    pub release_scan_interval: u64,

    /// Probes of new LUNs running at once (leader only): a LUN a target
    /// shows for the first time is offered once a node reads it blank.
    #[arg(long, default_value = "2")]
    pub probe_workers: usize,

    /// Seconds before a LUN held for the data a probe found on it is
    /// probed again (one erased on the array is then offered).
    #[arg(long, default_value = "600", value_name = "SECONDS")]
    pub held_lun_reprobe: u64,

    /// Agent calls in flight at once (bounds every fan-out).
    #[arg(long, default_value = "64")]
    pub agent_concurrency: usize,

    /// Tries per agent call that meets UNAVAILABLE.
    #[arg(long, default_value = "4")]
    pub agent_attempts: u32,

    /// The cluster CA (ca.crt, ca.key; a mounted Secret): with it, the
    /// proxy enrols agents (signs their certificates after checking the
    /// credential each relays) and renews each at two thirds of its life
    /// (docs/certificates.md, "Enrolment").
    #[arg(long, env = "SIGNER_CA_DIR", value_name = "DIR")]
    pub signer_ca_dir: Option<PathBuf>,

    /// Lifetime of the agent certificates the proxy signs (default 12
    /// hours); each is renewed with a third of it left.
    #[arg(long, default_value = "43200", value_name = "SECONDS")]
    pub agent_cert_lifetime: u64,

    /// Seconds between enrolment passes over the agents (a new agent is
    /// also looked at as soon as the directory lists it).
    #[arg(long, default_value = "30", value_name = "SECONDS")]
    pub enrol_interval: u64,

    /// Join tokens' records (`csi-scsi-certs join-token --dir`): how agents
    /// prove their node in embedded mode.
    #[arg(long, env = "JOIN_TOKENS_DIR", value_name = "DIR")]
    pub join_tokens_dir: Option<PathBuf>,

    /// Audience of the agents' projected ServiceAccount tokens (kubernetes
    /// backend).
    #[arg(long, default_value = "csi-scsi-enrolment")]
    pub enrol_audience: String,

    /// The agent DaemonSet and its ServiceAccount, in --namespace: a token
    /// is accepted only from a Pod of that DaemonSet running as that
    /// ServiceAccount on the node it names.
    #[arg(long, default_value = "csi-scsi-node")]
    pub agent_daemonset: String,

    /// See --agent-daemonset.
    #[arg(long, default_value = "csi-scsi-node")]
    pub agent_service_account: String,

    /// Let SCSITargets select nodes by Node labels a node's kubelet can set
    /// on its own Node (any key outside node-restriction.kubernetes.io/ and
    /// the other kubernetes.io/, k8s.io/ keys NodeRestriction keeps from
    /// kubelets), with a warning at each discovery pass. Off: such a target
    /// selects no node (its status says Refused), since any node whose
    /// root adds the label would get its CHAP credentials and LUNs. Only
    /// for clusters that trust every node's root alike.
    #[arg(long)]
    pub allow_kubelet_settable_selectors: bool,

    /// The flags every daemon takes alike.
    #[command(flatten)]
    pub process: ProcessArgs,
}

/// Agent enrolment: who signs, for how long, and how nodes prove who they are.
#[derive(Debug, Clone)]
pub struct EnrolmentConfig {
    /// ca.crt and ca.key.
    pub ca_dir: PathBuf,
    /// Lifetime of a signed agent certificate.
    pub lifetime: Duration,
    /// Between passes.
    pub interval: Duration,
    /// Join tokens (embedded mode).
    pub join_tokens: Option<PathBuf>,
    /// What a ServiceAccount token must say (kubernetes backend).
    pub token: TokenRules,
}

/// Whose ServiceAccount tokens enrol an agent.
#[derive(Debug, Clone)]
pub struct TokenRules {
    /// The audience the token is bound to.
    pub audience: String,
    /// The agents' namespace.
    pub namespace: String,
    /// The agent DaemonSet.
    pub daemonset: String,
    /// Its ServiceAccount.
    pub service_account: String,
}

/// Where the inventory and the agent directory live.
#[derive(Debug, Clone)]
pub enum Backend {
    /// An SQLite store and an agents file.
    Embedded {
        /// The agents file.
        agents_file: AgentsFile,
    },
    /// Custom resources, agent Pods and a Lease.
    Kubernetes {
        /// The driver's namespace.
        namespace: String,
        /// Where CHAP Secrets are read.
        chap_secret_namespace: String,
        /// This replica's Lease identity.
        pod_name: String,
        /// Where the agents are listed.
        agents: AgentSource,
        /// Lease name.
        lease_name: String,
    },
}

/// Where the Kubernetes backend finds the agents.
#[derive(Clone, Debug)]
pub enum AgentSource {
    /// The agent DaemonSet's Pods, by label selector.
    Pods {
        /// Label selector of the agent Pods.
        selector: String,
        /// Agent API port when a Pod declares no `agent-api` port.
        port: u16,
        /// The DaemonSet that must control a Pod for it to count.
        daemonset: String,
    },
    /// An agents file (agents outside the cluster).
    File(AgentsFile),
}

/// An agents file and how long a node must stay out of it to be gone.
#[derive(Clone, Debug)]
pub struct AgentsFile {
    /// The file.
    pub path: PathBuf,
    /// `--node-removal-grace`.
    pub removal_grace: Duration,
}

/// Validated configuration.
#[derive(Debug)]
pub struct Config {
    pub store: PathBuf,
    pub backend: Backend,
    pub targets_file: Option<PathBuf>,
    pub secrets_dir: Option<PathBuf>,
    pub discovery_interval: Duration,
    /// `None`: devices are never forgotten.
    pub device_forget_after: Option<Duration>,
    pub status_listen: std::net::SocketAddr,
    /// Addresses besides loopback that may take the probes' slots.
    pub status_probe_sources: Vec<std::net::IpAddr>,
    pub agent_probe_interval: Duration,
    pub calls: CallConfig,
    pub release: ReleaseConfig,
    /// The qualification workers (probes of new LUNs).
    pub qualify: QualifyConfig,
    pub csi_socket: PathBuf,
    pub tls: MaterialPaths,
    pub trust_domain: TrustDomain,
    pub grace_period: Duration,
    pub tls_poll_interval: Duration,
    /// `None`: agents' certificates come as files only.
    pub enrolment: Option<EnrolmentConfig>,
    /// `--allow-kubelet-settable-selectors`.
    pub allow_kubelet_settable_selectors: bool,
}

impl Args {
    /// Checks every value; the error says which flag is wrong.
    pub fn validate(self) -> Result<Config, String> {
        let csi_socket = self.csi_endpoint;
        let trust_domain = self.process.trust_domain.clone();
        let backoff = Backoff::try_new(Duration::from_millis(100), Duration::from_secs(5), 0.5)
            .map_err(|e| e.to_string())?;
        if self.agent_concurrency == 0 {
            return Err("--agent-concurrency: must be at least 1".into());
        }
        if self.release_workers == 0 {
            return Err("--release-workers: must be at least 1".into());
        }
        // A failed wipe (in use, I/O errors) is retried, but not hammered.
        let release = ReleaseConfig {
            workers: self.release_workers,
            scan_interval: Duration::from_secs(self.release_scan_interval.max(1)),
            retry: Backoff::try_new(Duration::from_secs(10), Duration::from_secs(1800), 0.2)
                .map_err(|e| e.to_string())?,
        };
        if self.probe_workers == 0 {
            return Err("--probe-workers: must be at least 1".into());
        }
        let qualify = QualifyConfig {
            workers: self.probe_workers,
            scan_interval: release.scan_interval,
            reprobe: Duration::from_secs(self.held_lun_reprobe.max(1)),
            retry: Backoff::try_new(Duration::from_secs(5), Duration::from_secs(600), 0.2)
                .map_err(|e| e.to_string())?,
        };
        let calls = CallConfig {
            connect_timeout: Duration::from_secs(5),
            deadline: Duration::from_secs(self.agent_timeout.max(1)),
            wipe_deadline: Duration::from_secs(self.wipe_timeout.max(1)),
            attempts: self.agent_attempts.max(1),
            backoff,
            concurrency: self.agent_concurrency,
        };
        // Renewal passes run every --enrol-interval: a lifetime shorter
        // than a few of them would expire between two.
        if self.agent_cert_lifetime < 3 * self.enrol_interval.max(1) {
            return Err(format!(
                "--agent-cert-lifetime: {} s is less than three --enrol-interval passes ({} s each)",
                self.agent_cert_lifetime, self.enrol_interval
            ));
        }
        let enrolment = self.signer_ca_dir.map(|ca_dir| EnrolmentConfig {
            ca_dir,
            lifetime: Duration::from_secs(self.agent_cert_lifetime),
            interval: Duration::from_secs(self.enrol_interval.max(1)),
            join_tokens: self.join_tokens_dir,
            token: TokenRules {
                audience: self.enrol_audience,
                namespace: self.namespace.clone(),
                daemonset: self.agent_daemonset.clone(),
                service_account: self.agent_service_account,
            },
        });
        let removal_grace = Duration::from_secs(self.node_removal_grace);
        let backend = match self.backend.as_str() {
            "kubernetes" => {
                if self.pod_name.is_empty() {
                    return Err("--pod-name (POD_NAME): required with --backend kubernetes".into());
                }
                Backend::Kubernetes {
                    chap_secret_namespace: self
                        .chap_secret_namespace
                        .unwrap_or_else(|| self.namespace.clone()),
                    namespace: self.namespace,
                    pod_name: self.pod_name,
                    agents: match self.agents_file {
                        Some(path) => AgentSource::File(AgentsFile {
                            path,
                            removal_grace,
                        }),
                        None => AgentSource::Pods {
                            selector: self.agent_selector,
                            port: self.agent_port,
                            daemonset: self.agent_daemonset.clone(),
                        },
                    },
                    lease_name: self.lease_name,
                }
            }
            _ => Backend::Embedded {
                agents_file: AgentsFile {
                    path: self
                        .agents_file
                        .ok_or("--agents-file: required with the embedded backend")?,
                    removal_grace,
                },
            },
        };
        Ok(Config {
            store: self.store,
            backend,
            targets_file: self.targets_file,
            secrets_dir: self.secrets_dir,
            discovery_interval: Duration::from_secs(self.discovery_interval.max(1)),
            device_forget_after: (self.device_forget_after > 0)
                .then(|| Duration::from_secs(self.device_forget_after)),
            status_listen: self.status_listen,
            status_probe_sources: self.status_probe_sources,
            agent_probe_interval: Duration::from_secs(self.agent_probe_interval.max(1)),
            calls,
            release,
            qualify,
            csi_socket,
            tls: MaterialPaths::in_dir(&self.tls_dir),
            trust_domain,
            grace_period: self.process.grace(),
            tls_poll_interval: self.process.tls_poll(),
            enrolment,
            allow_kubelet_settable_selectors: self.allow_kubelet_settable_selectors,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_given_twice_takes_its_last_value() {
        let args = Args::try_parse_from([
            "csi-scsi-proxy",
            "--agent-cert-lifetime=120",
            "--agent-cert-lifetime=900",
        ])
        .expect("parsed");
        assert_eq!(args.agent_cert_lifetime, 900);
    }

    #[test]
    fn a_repeatable_flag_still_accumulates() {
        let args = Args::try_parse_from([
            "csi-scsi-proxy",
            "--status-probe-source=127.0.0.1",
            "--status-probe-source=::1",
        ])
        .expect("parsed");
        let want: Vec<std::net::IpAddr> =
            vec!["127.0.0.1".parse().expect("v4"), "::1".parse().expect("v6")];
        assert_eq!(args.status_probe_sources, want);
    }
}
