//! `csi-scsi`: look at a running csi-scsi agent or proxy without curl and
//! jq. Reads its `/status` (and `/readyz`) over HTTP and prints aligned
//! tables, or JSON with `-o json`.
//!
//! ```text
//! csi-scsi --url http://10.0.0.5:9811 status     # an agent
//! csi-scsi --url http://10.0.0.9:9812 agents     # the proxy
//! csi-scsi devices -o json
//! ```
#![forbid(unsafe_code)]

mod fetch;
mod render;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use serde_json::Value;

/// Inspect a csi-scsi agent or proxy through its status endpoint.
///
/// Point --url at an agent's --status-listen address (default port 9811)
/// or the proxy's (default port 9812). Tables go to stdout; `-o json`
/// prints the same data as JSON for scripts.
#[derive(Parser, Debug)]
#[command(name = "csi-scsi", version, about, long_about)]
struct Cli {
    /// Status endpoint: http://host:port, or just host:port.
    #[arg(
        long,
        short = 'u',
        env = "CSI_SCSI_STATUS_URL",
        default_value = "http://127.0.0.1:9811",
        global = true
    )]
    url: String,

    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value = "table", global = true)]
    output: Output,

    /// Seconds to wait for an answer.
    #[arg(long, default_value = "10", global = true)]
    timeout: u64,

    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Output {
    /// Aligned columns for people.
    Table,
    /// JSON for scripts.
    Json,
}

#[derive(Subcommand, Debug, Clone, Copy, PartialEq, Eq)]
enum Command {
    /// Summary: what the process is, whether it is ready, what it holds.
    Status,
    /// Devices: an agent's LUNs (WWID, paths, size, holders) or the
    /// proxy's inventory (phase, volume, nodes).
    Devices,
    /// Volumes: an agent's staged and published volumes, or the proxy's
    /// bound volumes with the nodes they are published to.
    Volumes,
    /// Agents the proxy knows, with reachability and round trip (proxy only).
    Agents,
    /// The most recent failed calls, with their request IDs.
    Errors,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("csi-scsi: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&cli)) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("csi-scsi: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: &Cli) -> anyhow::Result<String> {
    let endpoint = fetch::Endpoint::parse(&cli.url)?;
    let timeout = Duration::from_secs(cli.timeout.max(1));
    let doc: Value = endpoint.get_json("/status", timeout).await?;
    let component = doc
        .get("component")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    if component != "agent" && component != "proxy" {
        anyhow::bail!(
            "{} does not look like a csi-scsi status endpoint (no component in its /status)",
            endpoint
        );
    }
    let agent = component == "agent";
    match (cli.command, cli.output) {
        (Command::Status, Output::Json) => {
            let ready = endpoint.readiness(timeout).await?;
            let mut doc = doc;
            if let Some(map) = doc.as_object_mut() {
                map.insert("ready".into(), Value::Bool(ready.is_ok()));
                map.insert(
                    "not_ready".into(),
                    Value::from(ready.err().unwrap_or_default()),
                );
            }
            Ok(render::json(&doc))
        }
        (Command::Status, Output::Table) => {
            let ready = endpoint.readiness(timeout).await?;
            Ok(render::status(&doc, &ready))
        }
        (Command::Agents, _) if agent => anyhow::bail!(
            "`agents` is the proxy's view; {endpoint} is the agent of node {}: point --url at the proxy's status address",
            doc.get("node").and_then(Value::as_str).unwrap_or("?")
        ),
        (command, Output::Json) => Ok(render::json(&render::section(&doc, command, agent))),
        (Command::Devices, Output::Table) if agent => Ok(render::agent_devices(&doc)),
        (Command::Devices, Output::Table) => Ok(render::proxy_devices(&doc)),
        (Command::Volumes, Output::Table) if agent => Ok(render::agent_volumes(&doc)),
        (Command::Volumes, Output::Table) => Ok(render::proxy_volumes(&doc)),
        (Command::Agents, Output::Table) => Ok(render::agents(&doc)),
        (Command::Errors, Output::Table) => Ok(render::errors(&doc)),
    }
}
