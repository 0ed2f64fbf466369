//! The bench's result table: for each row the figure, the baseline it is
//! compared with, the ratio, the target, and whether the target was met.
//! A row that misses its target says MISS; a row that could not run says
//! why. Nothing is dropped.

use std::fmt::Write as _;

use serde::Serialize;

/// What a figure counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// Microseconds.
    Micros,
    /// Milliseconds.
    Millis,
    /// Mebibytes.
    Mebibytes,
    /// Operations per second.
    OpsPerSec,
    /// Open file descriptors.
    Fds,
    /// API requests.
    Requests,
}

/// A row's target.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum Target {
    /// figure / baseline must not exceed this.
    RatioAtMost(f64),
    /// The figure itself must not exceed this (in the row's unit).
    AtMost(f64),
}

/// The outcome of a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The target is met.
    Met,
    /// The target is missed.
    Miss,
    /// No target: reported for information.
    Info,
    /// Not run (the reason is in the note).
    Skipped,
    /// The measurement failed (the error is in the note).
    Error,
}

/// One line of the table.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// Row group, 1 to 6.
    pub section: u8,
    /// What is measured (and against what).
    pub name: String,
    /// Unit of `figure` and `baseline`.
    pub unit: Unit,
    /// The measured figure.
    pub figure: Option<f64>,
    /// The baseline measured in the same run.
    pub baseline: Option<f64>,
    /// figure / baseline.
    pub ratio: Option<f64>,
    /// The target, if the issue sets one.
    pub target: Option<Target>,
    /// Met, missed, or why there is no verdict.
    pub verdict: Verdict,
    /// How it was measured, sample counts, what dominates.
    pub note: String,
}

impl Row {
    /// A measured figure with no baseline and no target yet.
    pub fn new(section: u8, name: impl Into<String>, unit: Unit, figure: f64) -> Self {
        Self {
            section,
            name: name.into(),
            unit,
            figure: Some(figure),
            baseline: None,
            ratio: None,
            target: None,
            verdict: Verdict::Info,
            note: String::new(),
        }
    }

    /// Sets the baseline (and the ratio).
    pub fn baseline(mut self, baseline: f64) -> Self {
        self.baseline = Some(baseline);
        self.judge()
    }

    /// Sets the target (and the verdict).
    pub fn target(mut self, target: Target) -> Self {
        self.target = Some(target);
        self.judge()
    }

    /// Sets the note.
    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.note = note.into();
        self
    }

    /// A row that was not run.
    pub fn skipped(
        section: u8,
        name: impl Into<String>,
        unit: Unit,
        why: impl Into<String>,
    ) -> Self {
        Self {
            section,
            name: name.into(),
            unit,
            figure: None,
            baseline: None,
            ratio: None,
            target: None,
            verdict: Verdict::Skipped,
            note: why.into(),
        }
    }

    /// A row whose measurement failed.
    pub fn error(section: u8, name: impl Into<String>, error: impl Into<String>) -> Self {
        Self {
            verdict: Verdict::Error,
            ..Self::skipped(section, name, Unit::Millis, error)
        }
    }

    fn judge(mut self) -> Self {
        self.ratio = match (self.figure, self.baseline) {
            (Some(f), Some(b)) if b > 0.0 => Some(f / b),
            _ => None,
        };
        self.verdict = match (self.target, self.figure, self.ratio) {
            (None, ..) => Verdict::Info,
            (Some(Target::AtMost(max)), Some(f), _) => verdict(f <= max),
            (Some(Target::RatioAtMost(max)), _, Some(r)) => verdict(r <= max),
            (Some(_), ..) => Verdict::Error,
        };
        self
    }
}

fn verdict(met: bool) -> Verdict {
    if met { Verdict::Met } else { Verdict::Miss }
}

/// A value in a unit, for people.
pub fn format_value(v: f64, unit: Unit) -> String {
    match unit {
        Unit::Micros if v >= 10_000.0 => format!("{:.1} ms", v / 1000.0),
        Unit::Micros => format!("{v:.0} µs"),
        Unit::Millis if v >= 10_000.0 => format!("{:.2} s", v / 1000.0),
        Unit::Millis => format!("{v:.1} ms"),
        Unit::Mebibytes => format!("{v:.1} MiB"),
        Unit::OpsPerSec => format!("{v:.0} ops/s"),
        Unit::Fds => format!("{v:.0} fds"),
        Unit::Requests => format!("{v:.1} req"),
    }
}

fn format_target(t: Target, unit: Unit) -> String {
    match t {
        Target::RatioAtMost(r) => format!("≤ {r}×"),
        Target::AtMost(v) => format!("≤ {}", format_value(v, unit)),
    }
}

/// Row ids: `1a`, `1b`, ... in order within each section.
pub fn ids(rows: &[Row]) -> Vec<String> {
    let mut next = [0u8; 10];
    rows.iter()
        .map(|r| {
            let s = usize::from(r.section.min(9));
            let letter = char::from(b'a' + next[s] % 26);
            next[s] += 1;
            format!("{}{letter}", r.section)
        })
        .collect()
}

/// The table as text (a Markdown table, readable as it is), then the notes.
pub fn render(rows: &[Row]) -> String {
    let ids = ids(rows);
    let mut lines: Vec<[String; 7]> = vec![[
        "id".into(),
        "row".into(),
        "figure".into(),
        "baseline".into(),
        "ratio".into(),
        "target".into(),
        "result".into(),
    ]];
    for (id, r) in ids.iter().zip(rows) {
        let fmt = |v: Option<f64>| {
            v.map(|v| format_value(v, r.unit))
                .unwrap_or_else(|| "—".into())
        };
        lines.push([
            id.clone(),
            r.name.clone(),
            fmt(r.figure),
            fmt(r.baseline),
            r.ratio
                .map(|x| format!("{x:.2}×"))
                .unwrap_or_else(|| "—".into()),
            r.target
                .map(|t| format_target(t, r.unit))
                .unwrap_or_else(|| "—".into()),
            match r.verdict {
                Verdict::Met => "met",
                Verdict::Miss => "**MISS**",
                Verdict::Info => "info",
                Verdict::Skipped => "SKIPPED",
                Verdict::Error => "**ERROR**",
            }
            .into(),
        ]);
    }
    let mut widths = [0usize; 7];
    for l in &lines {
        for (w, cell) in widths.iter_mut().zip(l) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for (i, l) in lines.iter().enumerate() {
        out.push('|');
        for (w, cell) in widths.iter().zip(l) {
            let pad = w - cell.chars().count();
            let _ = write!(out, " {cell}{} |", " ".repeat(pad));
        }
        out.push('\n');
        if i == 0 {
            out.push('|');
            for w in widths {
                let _ = write!(out, "{}|", "-".repeat(w + 2));
            }
            out.push('\n');
        }
    }
    out.push('\n');
    for (id, r) in ids.iter().zip(rows) {
        if !r.note.is_empty() {
            let _ = writeln!(out, "- {id}: {}", r.note);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_follow_targets_and_misses_are_marked() {
        let met = Row::new(1, "a", Unit::Micros, 140.0)
            .baseline(100.0)
            .target(Target::RatioAtMost(1.5));
        assert_eq!(met.verdict, Verdict::Met);
        let miss = Row::new(1, "b", Unit::Micros, 300.0)
            .baseline(100.0)
            .target(Target::RatioAtMost(2.0));
        assert_eq!(miss.verdict, Verdict::Miss);
        let abs = Row::new(4, "c", Unit::Mebibytes, 17.0).target(Target::AtMost(16.0));
        assert_eq!(abs.verdict, Verdict::Miss);
        let text = render(&[met, miss, abs]);
        assert_eq!(text.matches("**MISS**").count(), 2, "{text}");
        assert!(text.contains("| 1b "), "{text}");
    }
}
