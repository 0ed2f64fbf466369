//! The flags every csi-scsi daemon takes alike, parsed into types by clap
//! and flattened into each binary's own `Args`.

use std::time::Duration;

use csi_scsi_certs::TrustDomain;

use crate::logging::LogFormat;

/// Trust domain, drain, certificate polling and log format.
#[derive(Debug, Clone, clap::Args)]
pub struct ProcessArgs {
    /// SPIFFE trust domain of the cluster's certificates.
    #[arg(
        long,
        env = "TRUST_DOMAIN",
        value_parser = TrustDomain::new,
        default_value = "csi-scsi.local"
    )]
    pub trust_domain: TrustDomain,

    /// How long in-flight calls may run after SIGTERM before the process exits.
    #[arg(long, default_value = "30", value_name = "SECONDS")]
    pub grace_period: u64,

    /// How often certificate files are re-read even without a change event.
    #[arg(long, default_value = "60", value_name = "SECONDS")]
    pub tls_poll_interval: u64,

    /// Log format: text or json.
    #[arg(long, env = "LOG_FORMAT", default_value = "text")]
    pub log_format: LogFormat,
}

impl ProcessArgs {
    /// The drain after SIGTERM.
    pub fn grace(&self) -> Duration {
        Duration::from_secs(self.grace_period)
    }

    /// The certificate poll interval, at least a second.
    pub fn tls_poll(&self) -> Duration {
        Duration::from_secs(self.tls_poll_interval.max(1))
    }
}
