//! The agent's command line, read and checked once before anything binds.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use csi_scsi_certs::{MaterialPaths, TrustDomain};
use csi_scsi_daemon::{LogFormat, parse_csi_endpoint};

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
        default_value = "unix:///var/lib/kubelet/plugins/csi-scsi.io/csi.sock"
    )]
    pub csi_endpoint: String,

    /// Address the mutual-TLS agent API listens on.
    #[arg(long, env = "AGENT_LISTEN", default_value = "0.0.0.0:9810")]
    pub agent_listen: SocketAddr,

    /// Directory with tls.crt, tls.key and ca.crt (a mounted Secret).
    #[arg(long, env = "TLS_DIR", default_value = "/etc/csi-scsi/tls")]
    pub tls_dir: PathBuf,

    /// SPIFFE trust domain of the cluster's certificates.
    #[arg(long, env = "TRUST_DOMAIN", default_value = "csi-scsi.local")]
    pub trust_domain: String,

    /// Host tools that must be present for the agent to report ready
    /// (comma-separated names on $PATH or absolute paths).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "blkid,mkfs.ext4,mkfs.xfs,mount,umount,resize2fs,xfs_growfs"
    )]
    pub required_tools: Vec<PathBuf>,

    /// How long in-flight calls may run after SIGTERM before the agent exits.
    #[arg(long, default_value = "30", value_name = "SECONDS")]
    pub grace_period: u64,

    /// How often certificate files are re-read even without a change event.
    #[arg(long, default_value = "60", value_name = "SECONDS")]
    pub tls_poll_interval: u64,

    /// Log format: text or json.
    #[arg(long, env = "LOG_FORMAT", default_value = "text")]
    pub log_format: LogFormat,
}

/// Validated configuration.
#[derive(Debug)]
pub struct Config {
    pub node_name: String,
    pub csi_socket: PathBuf,
    pub agent_listen: SocketAddr,
    pub tls: MaterialPaths,
    pub trust_domain: TrustDomain,
    pub required_tools: Vec<PathBuf>,
    pub grace_period: Duration,
    pub tls_poll_interval: Duration,
}

impl Args {
    /// Checks every value; the error says which flag is wrong.
    pub fn validate(self) -> Result<Config, String> {
        let csi_socket =
            parse_csi_endpoint(&self.csi_endpoint).map_err(|e| format!("--csi-endpoint: {e}"))?;
        let trust_domain =
            TrustDomain::new(&self.trust_domain).map_err(|e| format!("--trust-domain: {e}"))?;
        if self.node_name.is_empty() {
            return Err("--node-name: must not be empty".into());
        }
        Ok(Config {
            node_name: self.node_name,
            csi_socket,
            agent_listen: self.agent_listen,
            tls: MaterialPaths::in_dir(&self.tls_dir),
            trust_domain,
            required_tools: self.required_tools,
            grace_period: Duration::from_secs(self.grace_period),
            tls_poll_interval: Duration::from_secs(self.tls_poll_interval.max(1)),
        })
    }
}
