//! The benchmark rows behind the `bench` binary (`tests/src/bin/bench.rs`).
//! Every figure is measured next to a baseline in the same run, since these
//! machines are shared and noisy; `BENCHMARKS.md` explains each row.
//!
//! 1. [`forwarding`]: ControllerPublishVolume through the proxy vs a bare
//!    mTLS echo with the same certificates.
//! 2. [`fanout`]: Discover across 10, 100 and 1,000 agents vs the slowest one.
//! 3. [`inventory`]: CreateVolume + DeleteVolume over 500 to 50,000 devices
//!    (and, for row 4, the proxy's memory holding them).
//! 4. [`memory`]: the agent's memory, idle and with 100 volumes staged.
//! 5. [`node_path`]: NodeStage + NodePublish vs `mount` + a bind mount.
//! 6. [`kube`]: N PVCs and Pods in the Kubernetes lab vs the embedded lab
//!    publishing the same N volumes over CSI; proxy memory and API requests.
//! 7. [`storm`]: 100 volumes published, staged and mounted at once on one
//!    node vs one alone; the agent's peak memory and descriptors.

pub mod fanout;
pub mod fixture;
pub mod forwarding;
pub mod helpers;
pub mod inventory;
pub mod kube;
pub mod memory;
pub mod node_path;
pub mod proc;
pub mod stats;
pub mod storm;
pub mod table;

/// How big a run is.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// The small CI run: every row, tiny sizes, figures not meaningful.
    pub quick: bool,
}

impl Options {
    /// `full` normally, `quick` with `--quick`.
    pub fn pick<T>(&self, full: T, quick: T) -> T {
        if self.quick { quick } else { full }
    }
}

/// Whether this process may make loop devices, device nodes and mounts.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Runs a row that starts a lab on a runtime of its own (a lab's progress
/// callback is not `Send`, so the row cannot be a spawned task): skipped
/// without root, and a failure becomes an error row.
pub fn on_own_runtime(
    section: u8,
    name: &str,
    needs: &str,
    rows: impl std::future::Future<Output = anyhow::Result<Vec<table::Row>>>,
) -> Vec<table::Row> {
    if !is_root() {
        return vec![table::Row::skipped(
            section,
            name,
            table::Unit::Millis,
            needs,
        )];
    }
    let measured = tokio::runtime::Runtime::new()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(rows));
    match measured {
        Ok(rows) => rows,
        Err(e) => vec![table::Row::error(section, name, format!("{e:#}"))],
    }
}
