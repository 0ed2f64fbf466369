//! The process shell both binaries share: configuration errors exit 64
//! (EX_USAGE) before anything binds; then logging, the crypto provider, the
//! runtime, and one error line on failure.

use std::future::Future;
use std::process::ExitCode;

use crate::{LogFormat, init_logging};

/// Exit code for a bad command line or configuration.
pub const EX_USAGE: u8 = 64;

/// Parses the command line; a usage error exits 64 (EX_USAGE), like any
/// other configuration error, while `--help` and `--version` exit 0.
pub fn parse_args<A: clap::Parser>() -> A {
    match A::try_parse() {
        Ok(args) => args,
        Err(e) => {
            let code = if e.use_stderr() { EX_USAGE.into() } else { 0 };
            let _ = e.print();
            std::process::exit(code);
        }
    }
}

/// Runs `serve(config)` on a multi-threaded runtime and turns the outcome
/// into an exit code.
pub fn run_main<C, F, Fut>(
    name: &str,
    config: Result<C, String>,
    log_format: LogFormat,
    serve: F,
) -> ExitCode
where
    F: FnOnce(C) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let config = match config {
        Ok(config) => config,
        Err(e) => {
            eprintln!("{name}: {e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    init_logging(log_format);
    csi_scsi_certs::install_crypto_provider();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name}: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("{name}: {e:#}");
            ExitCode::FAILURE
        }
    }
}
