//! csi-scsi-proxy: the controller plugin. Reads its configuration, then
//! serves CSI to the sidecars on a Unix socket until SIGTERM, draining
//! in-flight calls within the grace period.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use csi_scsi_proxy::{config, serve};

fn main() -> ExitCode {
    let args: config::Args = csi_scsi_daemon::parse_args();
    let format = args.process.log_format;
    csi_scsi_daemon::run_main("csi-scsi-proxy", args.validate(), format, serve::run)
}
