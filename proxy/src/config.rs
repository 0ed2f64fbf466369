//! The proxy's command line, read and checked once before anything binds.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use csi_scsi_certs::{MaterialPaths, TrustDomain};
use csi_scsi_daemon::{LogFormat, parse_csi_endpoint};

/// csi-scsi proxy (controller plugin): serves CSI Identity and Controller to
/// the external-provisioner, -attacher and -resizer sidecars on a Unix
/// socket, keeps the inventory of SCSI LUNs, and forwards node-local work
/// to each node's csi-scsi-agent over mutual TLS.
///
/// Its client certificate must name spiffe://<trust-domain>/proxy; when it
/// dials the agent of node X it accepts only a certificate naming
/// spiffe://<trust-domain>/node/X. Certificate files are reloaded when they
/// change.
#[derive(Parser, Debug)]
#[command(name = "csi-scsi-proxy", version, about, long_about)]
pub struct Args {
    /// CSI socket served to the sidecars: unix:///path/csi.sock or /path/csi.sock.
    #[arg(long, env = "CSI_ENDPOINT", default_value = "unix:///csi/csi.sock")]
    pub csi_endpoint: String,

    /// Directory with tls.crt, tls.key and ca.crt (a mounted Secret).
    #[arg(long, env = "TLS_DIR", default_value = "/etc/csi-scsi/tls")]
    pub tls_dir: PathBuf,

    /// SPIFFE trust domain of the cluster's certificates.
    #[arg(long, env = "TRUST_DOMAIN", default_value = "csi-scsi.local")]
    pub trust_domain: String,

    /// How long in-flight calls may run after SIGTERM before the proxy exits.
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
    pub csi_socket: PathBuf,
    pub tls: MaterialPaths,
    pub trust_domain: TrustDomain,
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
        Ok(Config {
            csi_socket,
            tls: MaterialPaths::in_dir(&self.tls_dir),
            trust_domain,
            grace_period: Duration::from_secs(self.grace_period),
            tls_poll_interval: Duration::from_secs(self.tls_poll_interval.max(1)),
        })
    }
}
