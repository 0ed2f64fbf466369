//! Turning a `/status` document into aligned tables (or JSON sections).

use csi_scsi_status::{ErrorRecord, Status, agent, proxy};
use serde::Serialize;
use serde_json::Value;

use crate::Command;

/// Columns padded to their widest cell, two spaces apart.
struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(headers: &[&'static str]) -> Self {
        Self {
            headers: headers.to_vec(),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn render(&self, empty: &str) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                if let Some(w) = widths.get_mut(i) {
                    *w = (*w).max(cell.chars().count());
                }
            }
        }
        let line = |cells: &mut dyn Iterator<Item = &str>| {
            let mut out = String::new();
            for (i, cell) in cells.enumerate() {
                if i > 0 {
                    out.push_str("  ");
                }
                out.push_str(cell);
                let pad = widths[i].saturating_sub(cell.chars().count());
                out.extend(std::iter::repeat_n(' ', pad));
            }
            format!("{}\n", out.trim_end())
        };
        // A key/value listing has no header line.
        let mut out = if self.headers.iter().all(|h| h.is_empty()) {
            String::new()
        } else {
            line(&mut self.headers.iter().copied())
        };
        for row in &self.rows {
            out.push_str(&line(&mut row.iter().map(String::as_str)));
        }
        if self.rows.is_empty() {
            out.push_str(empty);
            out.push('\n');
        }
        out
    }
}

/// Pretty JSON with a final newline.
pub fn json(v: &Value) -> String {
    format!(
        "{}\n",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| "null".into())
    )
}

/// `v` as pretty JSON, its keys sorted as in the document it came from.
fn json_of(v: &impl Serialize) -> String {
    serde_json::to_value(v)
        .map(|v| json(&v))
        .unwrap_or_else(|_| "null\n".into())
}

/// The part of the document a command shows, for `-o json` (`status`
/// passes the document itself through, see `main`).
pub fn section(doc: &Status, command: Command) -> String {
    match (command, doc) {
        (Command::Status, d) => json_of(d),
        (Command::Devices, Status::Agent(a)) => json_of(&a.devices),
        (Command::Devices, Status::Proxy(p)) => json_of(&p.devices),
        (Command::Volumes, Status::Agent(a)) => json_of(&a.volumes),
        (Command::Volumes, Status::Proxy(p)) => json_of(&proxy_volume_list(p)),
        (Command::Agents, Status::Agent(_)) => json(&Value::Null),
        (Command::Agents, Status::Proxy(p)) => json_of(&p.agents),
        (Command::Errors, d) => json_of(&d.recent_errors()),
    }
}

/// A cell: `-` for nothing.
fn text(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s.to_owned()
    }
}

/// A cell for an optional value: `-` for none or nothing.
fn opt(s: &Option<String>) -> String {
    s.as_deref().map(text).unwrap_or_else(|| "-".into())
}

/// A cell for a list: comma-separated, `-` for an empty one.
fn list(items: &[String]) -> String {
    if items.is_empty() {
        "-".into()
    } else {
        items.iter().map(|s| text(s)).collect::<Vec<_>>().join(",")
    }
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.into()
}

/// Bytes in binary units: `512Mi`, `1.5Gi`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["", "Ki", "Mi", "Gi", "Ti", "Pi"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n}")
    } else if (value - value.round()).abs() < 0.05 {
        format!("{:.0}{}", value, UNITS[unit])
    } else {
        format!("{:.1}{}", value, UNITS[unit])
    }
}

/// Seconds as `3d4h`, `2h5m`, `4m10s`, `12s`.
pub fn duration(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m{s}s"),
        (0, _, _) => format!("{h}h{m}m"),
        _ => format!("{d}d{h}h"),
    }
}

/// The summary of either component.
pub fn status(doc: &Status, ready: &Result<(), Vec<String>>) -> String {
    let mut t = Table::new(&["", ""]);
    let mut kv = |k: &str, v: String| t.row(vec![k.to_owned(), v]);
    let (component, version, uptime) = match doc {
        Status::Agent(a) => ("agent", &a.version, a.uptime_seconds),
        Status::Proxy(p) => ("proxy", &p.version, p.uptime_seconds),
    };
    kv("component", component.into());
    if let Status::Agent(a) = doc {
        kv("node", text(&a.node));
    }
    kv("version", text(version));
    kv("uptime", duration(uptime));
    kv(
        "ready",
        match ready {
            Ok(()) => "yes".into(),
            Err(why) => format!("NO: {}", why.join("; ")),
        },
    );
    if doc.is_redacted() {
        kv(
            "view",
            "redacted: this reader is not on the server's machine, so no portals, IQNs, WWPNs, Secret names or error messages (docs/operations.md)".into(),
        );
    }
    let problems = match doc {
        Status::Agent(a) => {
            let logged_in = a.sessions.iter().filter(|s| s.state == "LOGGED_IN").count();
            kv(
                "sessions",
                format!("{} ({} logged in)", a.sessions.len(), logged_in),
            );
            kv("devices", a.devices.len().to_string());
            kv("staged", a.volumes.staged.len().to_string());
            kv("published", a.volumes.published.len().to_string());
            &a.problems
        }
        Status::Proxy(p) => {
            kv(
                "leader",
                format!(
                    "{} ({})",
                    text(&p.leader.mode),
                    if p.leader.this_replica_leads {
                        "this replica leads"
                    } else {
                        "this replica does not lead"
                    }
                ),
            );
            let phases: Vec<String> = p
                .inventory
                .devices_by_phase
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            kv(
                "devices",
                format!("{} ({})", p.inventory.devices_total, phases.join(", ")),
            );
            let up = p
                .agents
                .iter()
                .filter(|a| a.reachable == Some(true))
                .count();
            let down = p
                .agents
                .iter()
                .filter(|a| a.reachable == Some(false))
                .count();
            kv(
                "agents",
                format!(
                    "{} ({up} reachable, {down} unreachable, {} not probed yet)",
                    p.agents.len(),
                    p.agents.len() - up - down
                ),
            );
            kv("pending resizes", p.pending_resizes.len().to_string());
            &p.problems
        }
    };
    let errors = doc.recent_errors();
    kv("recent errors", errors.len().to_string());
    for p in problems {
        kv("problem", text(p));
    }
    let mut out = t.render("");
    if !errors.is_empty() {
        out.push_str("\nlatest errors (csi-scsi errors shows all):\n");
        out.push_str(&error_table(&errors[..errors.len().min(5)]));
    }
    out
}

/// An agent's LUNs.
pub fn agent_devices(doc: &agent::Document) -> String {
    let mut t = Table::new(&[
        "WWID",
        "SIZE",
        "VENDOR",
        "MODEL",
        "MULTIPATH",
        "PATHS",
        "TARGETS",
        "HOLDERS",
    ]);
    for d in &doc.devices {
        let paths: Vec<String> = d
            .paths
            .iter()
            .map(|p| format!("{}({}, {})", text(&p.name), text(&p.hctl), text(&p.state)))
            .collect();
        let mut targets: Vec<String> = d.paths.iter().map(|p| text(&p.target)).collect();
        targets.sort();
        targets.dedup();
        t.row(vec![
            text(&d.wwid),
            bytes(d.size_bytes),
            text(&d.vendor),
            text(&d.model),
            opt(&d.multipath),
            if paths.is_empty() {
                "-".into()
            } else {
                paths.join(" ")
            },
            list(&targets),
            list(&d.holders),
        ]);
    }
    t.render("(no devices)")
}

/// The proxy's inventory.
pub fn proxy_devices(doc: &proxy::Document) -> String {
    let mut t = Table::new(&[
        "WWID",
        "PHASE",
        "SIZE",
        "TARGET",
        "LUN",
        "VOLUME",
        "NODES",
        "PUBLISHED",
        "REASON",
    ]);
    for d in &doc.devices {
        t.row(vec![
            text(&d.wwid),
            d.phase.as_str().to_owned(),
            bytes(d.size_bytes),
            text(&d.target),
            d.lun.to_string(),
            opt(&d.volume_name),
            list(&d.nodes),
            list(&d.published),
            text(&d.reason),
        ]);
    }
    let mut out = t.render("(no devices)");
    if doc.devices_truncated {
        out.push_str(&format!(
            "(first {} of {} devices)\n",
            doc.devices.len(),
            doc.inventory.devices_total
        ));
    }
    out
}

/// An agent's staged and published volumes.
pub fn agent_volumes(doc: &agent::Document) -> String {
    let mut t = Table::new(&["STATE", "VOLUME", "WWID", "DEVICE", "FS", "RO", "PATH"]);
    for (state, volumes) in [
        ("staged", &doc.volumes.staged),
        ("published", &doc.volumes.published),
    ] {
        for v in volumes {
            t.row(vec![
                state.to_owned(),
                text(&v.volume),
                opt(&v.wwid),
                text(&v.device),
                text(&v.fs_type),
                yes_no(v.read_only),
                text(&v.path),
            ]);
        }
    }
    t.render("(no volumes staged or published on this node)")
}

/// The proxy's devices that hold a volume.
fn proxy_volume_list(doc: &proxy::Document) -> Vec<&proxy::Device> {
    doc.devices
        .iter()
        .filter(|d| d.volume_id.is_some())
        .collect()
}

/// The proxy's bound volumes.
pub fn proxy_volumes(doc: &proxy::Document) -> String {
    let mut t = Table::new(&["VOLUME", "VOLUME-ID", "PHASE", "SIZE", "PUBLISHED", "NODES"]);
    for d in proxy_volume_list(doc) {
        t.row(vec![
            opt(&d.volume_name),
            opt(&d.volume_id),
            d.phase.as_str().to_owned(),
            bytes(d.size_bytes),
            list(&d.published),
            list(&d.nodes),
        ]);
    }
    t.render("(no volumes)")
}

/// The proxy's agents.
pub fn agents(doc: &proxy::Document) -> String {
    let mut t = Table::new(&[
        "NODE",
        "ADDRESS",
        "REACHABLE",
        "RTT",
        "VERSION",
        "LAST-PROBE",
        "ERROR",
    ]);
    for a in &doc.agents {
        t.row(vec![
            text(&a.node),
            text(&a.address),
            match a.reachable {
                Some(true) => "yes".into(),
                Some(false) => "NO".into(),
                None => "unknown".into(),
            },
            a.round_trip_ms
                .map(|ms| {
                    if ms >= 1000.0 {
                        format!("{:.1}s", ms / 1000.0)
                    } else {
                        format!("{ms:.1}ms")
                    }
                })
                .unwrap_or_else(|| "-".into()),
            opt(&a.version),
            opt(&a.last_probe),
            opt(&a.error),
        ]);
    }
    t.render("(no agents in the directory)")
}

fn error_table(errors: &[ErrorRecord]) -> String {
    let mut t = Table::new(&["TIME", "SOURCE", "METHOD", "CODE", "REQUEST-ID", "MESSAGE"]);
    for e in errors {
        t.row(vec![
            text(&e.time),
            text(&e.source),
            text(&e.method),
            text(&e.code),
            text(&e.request_id),
            text(&e.message).replace('\n', " "),
        ]);
    }
    t.render("(no recent errors)")
}

/// The recent failures, newest first.
pub fn errors(doc: &Status) -> String {
    error_table(doc.recent_errors())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_read_well() {
        assert_eq!(bytes(512), "512");
        assert_eq!(bytes(512 << 20), "512Mi");
        assert_eq!(bytes(3 << 29), "1.5Gi");
        assert_eq!(duration(12), "12s");
        assert_eq!(duration(250), "4m10s");
        assert_eq!(duration(7500), "2h5m");
        assert_eq!(duration(3 * 86400 + 4 * 3600), "3d4h");
    }

    #[test]
    fn columns_are_aligned() {
        let mut t = Table::new(&["A", "LONGER"]);
        t.row(vec!["wide-cell".into(), "x".into()]);
        t.row(vec!["y".into(), "z".into()]);
        assert_eq!(
            t.render(""),
            "A          LONGER\nwide-cell  x\ny          z\n"
        );
        assert_eq!(Table::new(&["A"]).render("(none)"), "A\n(none)\n");
    }
}
