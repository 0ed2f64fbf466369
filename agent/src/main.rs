//! csi-scsi-agent: the node plugin. Reads its configuration, then serves
//! CSI on the kubelet socket and the agent API over mutual TLS until
//! SIGTERM, draining in-flight calls within the grace period.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use csi_scsi_agent::{config, serve};

fn main() -> ExitCode {
    let args: config::Args = csi_scsi_daemon::parse_args();
    let format = args.process.log_format;
    csi_scsi_daemon::run_main("csi-scsi-agent", args.validate(), format, serve::run)
}
