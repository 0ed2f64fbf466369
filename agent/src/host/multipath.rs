//! dm-multipath through the `multipath` tool: flushing a map (`multipath
//! -f`), and whether multipath is in use on this node. The maps themselves
//! are read from sysfs ([`super::sysfs::multipath_maps`]), not from the
//! tool's listings.

use super::Host;
use super::command::{Arg, CommandError};

/// What a flush did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FlushOutcome {
    /// The map was removed.
    Flushed,
    /// No such map: the state asked for.
    NotPresent,
}

/// Why a `multipath` operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum MultipathError {
    /// The map is open (mounted, or held by a process) and was not removed.
    #[error("multipath map {map} is in use: {detail}")]
    MapInUse {
        /// The map.
        map: String,
        /// The tool's words.
        detail: String,
    },
    /// The map name is not something to pass to the tool.
    #[error("invalid multipath map name {0:?}")]
    InvalidMapName(String),
    /// Any other non-zero exit.
    #[error("multipath {operation} failed with exit code {code}: {detail}")]
    Failed {
        /// The operation.
        operation: &'static str,
        /// The exit code.
        code: i32,
        /// The tool's words.
        detail: String,
    },
    /// The tool could not be run.
    #[error(transparent)]
    Tool(#[from] CommandError),
}

/// Flushes (removes) map `map` (`multipath -f <map>`; a dm name, alias or
/// WWID). Flush buffers and unmount first: an open map is
/// [`MultipathError::MapInUse`]. A map that does not exist is
/// [`FlushOutcome::NotPresent`], so Detach can be repeated.
pub(crate) async fn flush(host: &Host, map: &str) -> Result<FlushOutcome, MultipathError> {
    check_map_name(map)?;
    let args: [Arg; 2] = ["-f".into(), map.into()];
    let out = host.runner.output(&host.tool("multipath"), &args).await?;
    if out.code == 0 {
        return Ok(FlushOutcome::Flushed);
    }
    // multipath -f exits 1 for every failure; its message says which.
    let detail = out.error_tail(3, TAIL_MAX);
    let lower = detail.to_ascii_lowercase();
    if lower.contains("in use") || lower.contains("busy") {
        Err(MultipathError::MapInUse {
            map: map.to_owned(),
            detail,
        })
    } else if lower.contains("not a multipath device")
        || lower.contains("doesn't exist")
        || lower.contains("does not exist")
        || lower.contains("not present")
        || lower.contains("no such")
    {
        Ok(FlushOutcome::NotPresent)
    } else {
        Err(MultipathError::Failed {
            operation: "-f",
            code: out.code,
            detail,
        })
    }
}

/// Grows map `map` to the size of its paths (`multipathd resize map
/// <map>`): a map keeps the size it was built with until multipathd is
/// told, whatever its paths report after a rescan.
pub(crate) async fn resize(host: &Host, map: &str) -> Result<(), MultipathError> {
    check_map_name(map)?;
    multipathd(host, "resize", &["resize".into(), "map".into(), map.into()]).await
}

/// Asks multipathd to add path `path` (a kernel name, `sdb`) to its map
/// (`multipathd add path`): a path that was open while multipathd built
/// the map is left out of it, and multipathd does not try again.
pub(crate) async fn add_path(host: &Host, path: &str) -> Result<(), MultipathError> {
    check_map_name(path)?;
    multipathd(
        host,
        "add path",
        &["add".into(), "path".into(), path.into()],
    )
    .await
}

/// Runs one `multipathd` client command: its client answers "ok" or
/// "fail" (and exits 1 on "fail"); only "ok" with exit 0 is done.
async fn multipathd(
    host: &Host,
    operation: &'static str,
    args: &[Arg],
) -> Result<(), MultipathError> {
    let out = host.runner.output(&host.tool("multipathd"), args).await?;
    if out.code == 0 && out.stdout.trim() == "ok" {
        return Ok(());
    }
    Err(MultipathError::Failed {
        operation,
        code: out.code,
        detail: out.error_tail(3, TAIL_MAX),
    })
}

/// Refuses a map name that is not one to put on the tools' command line
/// (empty, an option, or with blanks or control characters).
fn check_map_name(map: &str) -> Result<(), MultipathError> {
    if map.is_empty() || map.starts_with('-') || !map.chars().all(|c| c.is_ascii_graphic()) {
        return Err(MultipathError::InvalidMapName(map.to_owned()));
    }
    Ok(())
}

/// Whether this node uses dm-multipath: the operator named the `multipath`
/// tool explicitly (`--tool multipath=...`), or the kernel has the
/// dm-multipath target loaded (`module/dm_multipath` under the sysfs root,
/// which multipathd loads). `/etc/multipath.conf` is not consulted: it lives
/// outside the roots the agent is given, and a node without the module
/// cannot build maps whatever its configuration says.
pub(crate) fn is_configured(host: &Host) -> bool {
    host.tools.contains_key("multipath") || host.sys("module/dm_multipath").is_dir()
}

/// Most bytes of multipath's output an error quotes.
const TAIL_MAX: usize = 400;

#[cfg(test)]
mod tests;
