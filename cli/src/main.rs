//! `csi-scsi`: look at a running csi-scsi agent or proxy without curl and
//! jq. Reads its `/status` (and `/readyz`) over HTTP and prints aligned
//! tables, or JSON with `-o json`.
//!
//! ```text
//! csi-scsi --url http://198.18.0.11:9811 status  # an agent, at its node's address
//! csi-scsi --url 127.0.0.1:9812 agents           # the proxy, through a port-forward
//! CSI_SCSI_STATUS_URL=198.18.0.11:9811 csi-scsi devices -o json
//! ```
//!
//! There is no default address: on Kubernetes no loopback address serves
//! one (the agents bind their node's address), so a missing `--url` is a
//! usage error that says where the endpoints are ([`WHERE`]).
#![forbid(unsafe_code)]

mod fetch;
mod render;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use csi_scsi_status::{Header, SCHEMA, SchemaError, Status};
use serde_json::Value;

/// Where the status endpoints of an install are, as `deploy/` runs them
/// (`--help` ends with it; a missing `--url` prints it).
const WHERE: &str = "\
Where the status endpoints are (deploy/'s manifests, namespace csi-scsi):
  the proxy:   kubectl -n csi-scsi port-forward deploy/csi-scsi-controller 9812
               then --url 127.0.0.1:9812 (the full view: it arrives from loopback)
  an agent:    --url <node address>:9811 (the DaemonSet binds the node's address,
               not loopback); the IP column of
               kubectl -n csi-scsi get pods -l app.kubernetes.io/name=csi-scsi-node -o wide
  without Kubernetes: the process's --status-listen address";

/// Inspect a csi-scsi agent or proxy through its status endpoint.
///
/// Point --url at an agent's --status-listen address (port 9811 in the
/// manifests) or the proxy's (port 9812). Tables go to stdout; `-o json`
/// prints the same data as JSON for scripts.
#[derive(Parser, Debug)]
#[command(name = "csi-scsi", version, about, long_about, after_help = WHERE)]
struct Cli {
    /// Status endpoint: http://host:port, or just host:port. Required
    /// (no default).
    #[arg(long, short = 'u', env = "CSI_SCSI_STATUS_URL", global = true)]
    url: Option<String>,

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
    let Some(url) = cli.url.as_deref() else {
        missing_url().exit()
    };
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
    match runtime.block_on(run(&cli, url)) {
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

/// The usage error (exit status 2) for a missing `--url`, saying where
/// the endpoints are.
fn missing_url() -> clap::Error {
    Cli::command().error(
        clap::error::ErrorKind::MissingRequiredArgument,
        format!("no status endpoint: pass --url or set CSI_SCSI_STATUS_URL\n\n{WHERE}"),
    )
}

async fn run(cli: &Cli, url: &str) -> anyhow::Result<String> {
    let endpoint = fetch::Endpoint::parse(url)?;
    let timeout = Duration::from_secs(cli.timeout.max(1));
    let raw: Value = endpoint.get_json("/status", timeout).await?;
    let doc = read_status(&endpoint, &raw)?;
    let ready = match cli.command {
        Command::Status => Some(endpoint.readiness(timeout).await?),
        _ => None,
    };
    show(&endpoint, raw, &doc, cli.command, cli.output, ready)
}

/// `raw` as a `/status` document of the schema this CLI reads, or why not.
fn read_status(endpoint: &fetch::Endpoint, raw: &Value) -> anyhow::Result<Status> {
    let not_status = |why: &str| {
        anyhow::anyhow!("{endpoint} does not look like a csi-scsi status endpoint ({why})")
    };
    let header: Header = serde_json::from_value(raw.clone())
        .map_err(|_| not_status("no component in its /status"))?;
    match header.check() {
        Ok(()) => {}
        Err(SchemaError::NoComponent) => return Err(not_status("no component in its /status")),
        Err(SchemaError::UnknownComponent(c)) => {
            return Err(not_status(&format!("its /status is of component {c:?}")));
        }
        Err(e @ SchemaError::Unsupported { .. }) => anyhow::bail!("{endpoint}/status: {e}"),
    }
    serde_json::from_value(raw.clone()).with_context(|| {
        format!(
            "{endpoint}/status does not read as a schema {SCHEMA} {} document",
            header.component.as_deref().unwrap_or("?")
        )
    })
}

/// What `command` prints from `doc` (`raw` is the same document as
/// served; `ready` is `/readyz`'s answer, asked for `status` only).
fn show(
    endpoint: &fetch::Endpoint,
    raw: Value,
    doc: &Status,
    command: Command,
    output: Output,
    ready: Option<Result<(), Vec<String>>>,
) -> anyhow::Result<String> {
    let ready = ready.unwrap_or(Ok(()));
    match (command, output, doc) {
        // The document as served, with the readiness added.
        (Command::Status, Output::Json, _) => {
            let mut raw = raw;
            if let Some(map) = raw.as_object_mut() {
                map.insert("ready".into(), Value::Bool(ready.is_ok()));
                map.insert(
                    "not_ready".into(),
                    Value::from(ready.err().unwrap_or_default()),
                );
            }
            Ok(render::json(&raw))
        }
        (Command::Status, Output::Table, _) => Ok(render::status(doc, &ready)),
        (Command::Agents, _, Status::Agent(a)) => anyhow::bail!(
            "`agents` is the proxy's view; {endpoint} is the agent of node {}: point --url at the proxy's status address",
            a.node
        ),
        (command, Output::Json, _) => Ok(render::section(doc, command)),
        (Command::Devices, Output::Table, Status::Agent(a)) => Ok(render::agent_devices(a)),
        (Command::Devices, Output::Table, Status::Proxy(p)) => Ok(render::proxy_devices(p)),
        (Command::Volumes, Output::Table, Status::Agent(a)) => Ok(render::agent_volumes(a)),
        (Command::Volumes, Output::Table, Status::Proxy(p)) => Ok(render::proxy_volumes(p)),
        (Command::Agents, Output::Table, Status::Proxy(p)) => Ok(render::agents(p)),
        (Command::Errors, Output::Table, _) => Ok(render::errors(doc)),
    }
}

#[cfg(test)]
mod tests;
