//! Turning a `/status` document into aligned tables (or JSON sections).

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

/// The part of the document a command shows, for `-o json`.
pub fn section(doc: &Value, command: Command, agent: bool) -> Value {
    match command {
        Command::Status => doc.clone(),
        Command::Devices => doc["devices"].clone(),
        Command::Volumes if agent => doc["volumes"].clone(),
        Command::Volumes => Value::Array(proxy_volume_list(doc).into_iter().cloned().collect()),
        Command::Agents => doc["agents"].clone(),
        Command::Errors => doc["recent_errors"].clone(),
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) if s.is_empty() => "-".into(),
        Value::String(s) => s.clone(),
        Value::Bool(b) => if *b { "yes" } else { "no" }.into(),
        Value::Array(a) if a.is_empty() => "-".into(),
        Value::Array(a) => a.iter().map(text).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

fn list(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or(&[])
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

fn size(v: &Value) -> String {
    v.as_u64().map(bytes).unwrap_or_else(|| "-".into())
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
pub fn status(doc: &Value, ready: &Result<(), Vec<String>>) -> String {
    let mut t = Table::new(&["", ""]);
    let mut kv = |k: &str, v: String| t.row(vec![k.to_owned(), v]);
    kv("component", text(&doc["component"]));
    if doc["component"] == "agent" {
        kv("node", text(&doc["node"]));
    }
    kv("version", text(&doc["version"]));
    kv(
        "uptime",
        doc["uptime_seconds"]
            .as_u64()
            .map(duration)
            .unwrap_or_else(|| "-".into()),
    );
    kv(
        "ready",
        match ready {
            Ok(()) => "yes".into(),
            Err(why) => format!("NO: {}", why.join("; ")),
        },
    );
    if doc["component"] == "agent" {
        let sessions = list(&doc["sessions"]);
        let logged_in = sessions
            .iter()
            .filter(|s| s["state"] == "LOGGED_IN")
            .count();
        kv(
            "sessions",
            format!("{} ({} logged in)", sessions.len(), logged_in),
        );
        kv("devices", list(&doc["devices"]).len().to_string());
        kv("staged", list(&doc["volumes"]["staged"]).len().to_string());
        kv(
            "published",
            list(&doc["volumes"]["published"]).len().to_string(),
        );
    } else {
        let leader = &doc["leader"];
        kv(
            "leader",
            format!(
                "{} ({})",
                text(&leader["mode"]),
                if leader["this_replica_leads"] == true {
                    "this replica leads"
                } else {
                    "this replica does not lead"
                }
            ),
        );
        let inv = &doc["inventory"];
        let phases: Vec<String> = inv["devices_by_phase"]
            .as_object()
            .map(|m| m.iter().map(|(k, v)| format!("{k} {v}")).collect())
            .unwrap_or_default();
        kv(
            "devices",
            format!("{} ({})", text(&inv["devices_total"]), phases.join(", ")),
        );
        let agents = list(&doc["agents"]);
        let up = agents.iter().filter(|a| a["reachable"] == true).count();
        let down = agents.iter().filter(|a| a["reachable"] == false).count();
        kv(
            "agents",
            format!(
                "{} ({up} reachable, {down} unreachable, {} not probed yet)",
                agents.len(),
                agents.len() - up - down
            ),
        );
        kv(
            "pending resizes",
            list(&doc["pending_resizes"]).len().to_string(),
        );
    }
    let errors = list(&doc["recent_errors"]);
    kv("recent errors", errors.len().to_string());
    for p in list(&doc["problems"]) {
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
pub fn agent_devices(doc: &Value) -> String {
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
    for d in list(&doc["devices"]) {
        let paths: Vec<String> = list(&d["paths"])
            .iter()
            .map(|p| {
                format!(
                    "{}({}, {})",
                    text(&p["name"]),
                    text(&p["hctl"]),
                    text(&p["state"])
                )
            })
            .collect();
        let mut targets: Vec<String> = list(&d["paths"])
            .iter()
            .map(|p| text(&p["target"]))
            .collect();
        targets.sort();
        targets.dedup();
        t.row(vec![
            text(&d["wwid"]),
            size(&d["size_bytes"]),
            text(&d["vendor"]),
            text(&d["model"]),
            text(&d["multipath"]),
            if paths.is_empty() {
                "-".into()
            } else {
                paths.join(" ")
            },
            if targets.is_empty() {
                "-".into()
            } else {
                targets.join(",")
            },
            text(&d["holders"]),
        ]);
    }
    t.render("(no devices)")
}

/// The proxy's inventory.
pub fn proxy_devices(doc: &Value) -> String {
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
    for d in list(&doc["devices"]) {
        t.row(vec![
            text(&d["wwid"]),
            text(&d["phase"]),
            size(&d["size_bytes"]),
            text(&d["target"]),
            text(&d["lun"]),
            text(&d["volume_name"]),
            text(&d["nodes"]),
            text(&d["published"]),
            text(&d["reason"]),
        ]);
    }
    let mut out = t.render("(no devices)");
    if doc["devices_truncated"] == true {
        out.push_str(&format!(
            "(first {} of {} devices)\n",
            list(&doc["devices"]).len(),
            text(&doc["inventory"]["devices_total"])
        ));
    }
    out
}

/// An agent's staged and published volumes.
pub fn agent_volumes(doc: &Value) -> String {
    let mut t = Table::new(&["STATE", "VOLUME", "WWID", "DEVICE", "FS", "RO", "PATH"]);
    for (state, key) in [("staged", "staged"), ("published", "published")] {
        for v in list(&doc["volumes"][key]) {
            t.row(vec![
                state.to_owned(),
                text(&v["volume"]),
                text(&v["wwid"]),
                text(&v["device"]),
                text(&v["fs_type"]),
                text(&v["read_only"]),
                text(&v["path"]),
            ]);
        }
    }
    t.render("(no volumes staged or published on this node)")
}

fn proxy_volume_list(doc: &Value) -> Vec<&Value> {
    list(&doc["devices"])
        .iter()
        .filter(|d| !d["volume_id"].is_null())
        .collect()
}

/// The proxy's bound volumes.
pub fn proxy_volumes(doc: &Value) -> String {
    let mut t = Table::new(&["VOLUME", "VOLUME-ID", "PHASE", "SIZE", "PUBLISHED", "NODES"]);
    for d in proxy_volume_list(doc) {
        t.row(vec![
            text(&d["volume_name"]),
            text(&d["volume_id"]),
            text(&d["phase"]),
            size(&d["size_bytes"]),
            text(&d["published"]),
            text(&d["nodes"]),
        ]);
    }
    t.render("(no volumes)")
}

/// The proxy's agents.
pub fn agents(doc: &Value) -> String {
    let mut t = Table::new(&[
        "NODE",
        "ADDRESS",
        "REACHABLE",
        "RTT",
        "VERSION",
        "LAST-PROBE",
        "ERROR",
    ]);
    for a in list(&doc["agents"]) {
        t.row(vec![
            text(&a["node"]),
            text(&a["address"]),
            match &a["reachable"] {
                Value::Bool(true) => "yes".into(),
                Value::Bool(false) => "NO".into(),
                _ => "unknown".into(),
            },
            a["round_trip_ms"]
                .as_f64()
                .map(|ms| {
                    if ms >= 1000.0 {
                        format!("{:.1}s", ms / 1000.0)
                    } else {
                        format!("{ms:.1}ms")
                    }
                })
                .unwrap_or_else(|| "-".into()),
            text(&a["version"]),
            text(&a["last_probe"]),
            text(&a["error"]),
        ]);
    }
    t.render("(no agents in the directory)")
}

fn error_table(errors: &[Value]) -> String {
    let mut t = Table::new(&["TIME", "SOURCE", "METHOD", "CODE", "REQUEST-ID", "MESSAGE"]);
    for e in errors {
        t.row(vec![
            text(&e["time"]),
            text(&e["source"]),
            text(&e["method"]),
            text(&e["code"]),
            text(&e["request_id"]),
            text(&e["message"]).replace('\n', " "),
        ]);
    }
    t.render("(no recent errors)")
}

/// The recent failures, newest first.
pub fn errors(doc: &Value) -> String {
    error_table(list(&doc["recent_errors"]))
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
