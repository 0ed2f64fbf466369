//! dm-multipath through the `multipath` tool: the topology it prints
//! (`multipath -ll`, also `-l` and multipathd's `show topology`), flushing a
//! map (`multipath -f`), and whether multipath is in use on this node.
//!
//! The topology parser tolerates what real hosts print: warning lines before
//! a map, vendor and product padded as sysfs stores them, the old format
//! without a space before `dm-N` and with `[bracketed]` states, T10 WWIDs
//! with embedded blanks, and multipathd's `create:` prefix. A map whose WWID
//! is not valid is skipped with a warning.

use super::Host;
use super::command::{Arg, CommandError};
use super::sysfs::Hctl;
use crate::wwid::Wwid;

/// One map of `multipath -ll`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopologyMap {
    /// The LUN's identity.
    pub wwid: Wwid,
    /// The map's alias (`mpathb`); `None` when the map is named by its WWID
    /// (`user_friendly_names no`).
    pub alias: Option<String>,
    /// The dm device (`dm-3`).
    pub dm_name: String,
    /// Vendor, blanks trimmed.
    pub vendor: String,
    /// Product, blanks trimmed.
    pub product: String,
    /// `size=` as printed (`100G`).
    pub size: Option<String>,
    /// The paths, in printed order.
    pub paths: Vec<TopologyPath>,
}

/// One path line of a map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopologyPath {
    /// SCSI address.
    pub hctl: Hctl,
    /// Kernel name (`sdd`).
    pub devnode: String,
    /// `major:minor`.
    pub dev_t: Option<String>,
    /// dm's view (`active`, `failed`).
    pub dm_state: Option<String>,
    /// The path checker's view (`ready`, `faulty`, `ghost`, `undef`).
    pub checker_state: Option<String>,
    /// The SCSI device state (`running`, `offline`); absent in the old format.
    pub device_state: Option<String>,
    /// Index of its path group (0 = first printed).
    pub group: usize,
}

/// What a flush did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlushOutcome {
    /// The map was removed.
    Flushed,
    /// No such map: the state asked for.
    NotPresent,
}

/// Why a `multipath` operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MultipathError {
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

/// The maps `multipath -ll` shows (reads state, changes nothing).
pub async fn topology(host: &Host) -> Result<Vec<TopologyMap>, MultipathError> {
    let out = host
        .runner
        .output(&host.tool("multipath"), &["-ll".into()])
        .await?;
    // multipath exits 0 with no maps; 1 means it could not read its config
    // or talk to the kernel, and then nothing it printed is trustworthy.
    if out.code != 0 {
        return Err(MultipathError::Failed {
            operation: "-ll",
            code: out.code,
            detail: out.error_tail(3, TAIL_MAX),
        });
    }
    Ok(parse_topology(&out.stdout))
}

/// Flushes (removes) map `map` (`multipath -f <map>`; a dm name, alias or
/// WWID). Flush buffers and unmount first: an open map is
/// [`MultipathError::MapInUse`]. A map that does not exist is
/// [`FlushOutcome::NotPresent`], so Detach can be repeated.
pub async fn flush(host: &Host, map: &str) -> Result<FlushOutcome, MultipathError> {
    if map.is_empty() || map.starts_with('-') || !map.chars().all(|c| c.is_ascii_graphic()) {
        return Err(MultipathError::InvalidMapName(map.to_owned()));
    }
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

/// Whether this node uses dm-multipath: the operator named the `multipath`
/// tool explicitly (`--tool multipath=...`), or the kernel has the
/// dm-multipath target loaded (`module/dm_multipath` under the sysfs root,
/// which multipathd loads). `/etc/multipath.conf` is not consulted: it lives
/// outside the roots the agent is given, and a node without the module
/// cannot build maps whatever its configuration says.
pub fn is_configured(host: &Host) -> bool {
    host.tools.contains_key("multipath") || host.sys("module/dm_multipath").is_dir()
}

/// Parses `multipath -ll` / `-l` / `show topology` output. Lines that are
/// neither a map header, a size line, a path group nor a path are ignored;
/// a map with an invalid WWID is skipped (with its paths) with a warning.
pub fn parse_topology(text: &str) -> Vec<TopologyMap> {
    let mut maps = Vec::new();
    // Some(map) while inside a valid map; None before the first map or
    // while skipping an invalid one.
    let mut current: Option<TopologyMap> = None;
    let mut group: Option<usize> = None;
    for raw in text.lines() {
        let line = raw.trim_end();
        if line.trim().is_empty() {
            continue;
        }
        let first = line.chars().next().unwrap_or(' ');
        let body = line.trim_start();
        if matches!(body.chars().next(), Some('|' | '`' | '\\')) {
            let Some(map) = current.as_mut() else {
                continue;
            };
            let rest = body.trim_start_matches(['|', '`', '-', '+', '\\', '_', ' ']);
            match parse_path_line(rest) {
                Some((hctl, devnode, dev_t, states)) => {
                    let mut states = states.into_iter();
                    map.paths.push(TopologyPath {
                        hctl,
                        devnode,
                        dev_t,
                        dm_state: states.next(),
                        checker_state: states.next(),
                        device_state: states.next(),
                        group: group.unwrap_or(0),
                    });
                }
                None => group = Some(group.map_or(0, |g| g + 1)),
            }
            continue;
        }
        if first.is_whitespace() {
            // Table rows of `-v4` path lists and other indented chatter.
            continue;
        }
        if let Some(size) = size_of(body) {
            if let Some(map) = current.as_mut() {
                map.size = Some(size);
            }
            continue;
        }
        match parse_header(body) {
            None => tracing::debug!(line = %line.escape_debug(), "ignoring multipath output line"),
            Some(Err(reason)) => {
                if let Some(done) = current.take() {
                    maps.push(done);
                }
                group = None;
                tracing::warn!(line = %line.escape_debug(), reason, "skipping multipath map");
            }
            Some(Ok(map)) => {
                if let Some(done) = current.replace(map) {
                    maps.push(done);
                }
                group = None;
            }
        }
    }
    if let Some(done) = current {
        maps.push(done);
    }
    maps
}

// === impl TopologyMap ===

impl TopologyMap {
    /// The name to pass to `multipath -f`: the alias, else the dm name.
    pub fn name(&self) -> &str {
        self.alias.as_deref().unwrap_or(&self.dm_name)
    }
}

// === impl MultipathError ===

impl MultipathError {
    /// A stable label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::MapInUse { .. } => "map_in_use",
            Self::InvalidMapName(_) => "invalid_map_name",
            Self::Failed { .. } => "failed",
            Self::Tool(_) => "tool",
        }
    }
}

/// A map header (`alias (wwid) dm-N vendor,product`, `wwid dm-N ...`,
/// `wwiddm-N ...`); `None` when the line is not one, `Some(Err)` when it is
/// one with an invalid WWID.
fn parse_header(line: &str) -> Option<Result<TopologyMap, &'static str>> {
    if line.contains(" | ") || line.starts_with("multipathd>") {
        // "Oct 13 10:24:01 | ..." warnings, interactive prompts.
        return None;
    }
    // multipathd prefixes an action: "create: 3600... dm-0 ...".
    let line = match line.split_once(": ") {
        Some((word, rest)) if !word.is_empty() && word.chars().all(|c| c.is_ascii_lowercase()) => {
            rest
        }
        _ => line,
    };
    let (start, end) = dm_token(line)?;
    let before = line[..start].trim();
    let dm_name = line[start..end].to_owned();
    let after = line[end..].trim();
    if before.is_empty() {
        return None;
    }
    let (alias, wwid_text) = match before.strip_suffix(')').and_then(|b| b.split_once(" (")) {
        Some((alias, wwid)) => (Some(alias.trim()), wwid),
        None => (None, before),
    };
    let wwid = match Wwid::parse(wwid_text) {
        Ok(w) => w,
        Err(e) => return Some(Err(e.reason)),
    };
    // `-ll` always prints `vendor,product` (`##,##` when unknown); a row
    // without one is another listing (multipathd's `show maps` table) or a
    // map multipath could not set up.
    let Some((vendor, product)) = after.split_once(',') else {
        return Some(Err("no vendor,product after the dm device"));
    };
    Some(Ok(TopologyMap {
        wwid,
        alias: alias.filter(|a| !a.is_empty()).map(str::to_owned),
        dm_name,
        vendor: vendor.trim().to_owned(),
        product: product.trim().to_owned(),
        size: None,
        paths: Vec::new(),
    }))
}

/// Byte range of the first `dm-<digits>` followed by a blank or the end.
fn dm_token(line: &str) -> Option<(usize, usize)> {
    let mut from = 0;
    while let Some(i) = line.get(from..)?.find("dm-") {
        let start = from + i;
        let digits = line[start + 3..]
            .bytes()
            .take_while(u8::is_ascii_digit)
            .count();
        let end = start + 3 + digits;
        let ends_word = line[end..].chars().next().is_none_or(char::is_whitespace);
        if digits > 0 && ends_word && start > 0 {
            return Some((start, end));
        }
        from = start + 3;
    }
    None
}

/// `size=100G ...` or `[size=466G][features=...]`.
fn size_of(line: &str) -> Option<String> {
    let rest = line
        .strip_prefix("size=")
        .or_else(|| line.strip_prefix("[size="))?;
    let value: String = rest
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != ']')
        .collect();
    (!value.is_empty()).then_some(value)
}

/// `39:0:0:1 sdd 8:48 active ready running` or `5:0:0:0 sdb 8:16
/// [active][ready]`: address, devnode, dev_t and the states.
fn parse_path_line(rest: &str) -> Option<(Hctl, String, Option<String>, Vec<String>)> {
    let mut words = rest.split_whitespace();
    let hctl = Hctl::parse(words.next()?)?;
    let devnode = words.next()?;
    if devnode.is_empty()
        || devnode.len() > 32
        || !devnode
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '!')
    {
        return None;
    }
    let mut dev_t = None;
    let mut states: Vec<String> = Vec::new();
    for w in words {
        if dev_t.is_none()
            && states.is_empty()
            && w.contains(':')
            && w.split(':').all(|p| p.parse::<u32>().is_ok())
        {
            dev_t = Some(w.to_owned());
            continue;
        }
        for s in w.split(['[', ']']).filter(|s| !s.is_empty()) {
            match states.last_mut() {
                // The checker prints "i/o pending" and "i/o timeout": one
                // state in two words.
                Some(last) if last == "i/o" => {
                    last.push(' ');
                    last.push_str(s);
                }
                _ => states.push(s.to_owned()),
            }
        }
    }
    Some((hctl, devnode.to_owned(), dev_t, states))
}

/// Most bytes of multipath's output an error quotes.
const TAIL_MAX: usize = 400;

#[cfg(test)]
mod tests;
