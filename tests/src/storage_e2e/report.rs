//! Ginkgo's JSON report of a pass: every spec's outcome, the tally, the
//! tally per test pattern, and the text `conformance --kubernetes` prints.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::bail;
use serde::Deserialize;

/// One spec's outcome.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Its full name.
    pub name: String,
    /// `passed`, `failed`, `skipped`, `panicked`, `timedout`, ...
    pub state: String,
    /// The failure or skip message.
    pub message: String,
    /// Seconds it took.
    pub seconds: f64,
}

impl Spec {
    /// Ran and passed.
    pub fn passed(&self) -> bool {
        self.state == "passed"
    }

    /// Left out by the focus or skip: ginkgo reports it skipped without a
    /// message (one the suite skipped at run time says why).
    pub fn not_selected(&self) -> bool {
        self.state == "skipped" && self.message.is_empty()
    }
}

/// The outcome of one pass.
#[derive(Clone, Debug)]
pub struct Pass {
    /// The definition file.
    pub driver: PathBuf,
    /// Every spec that ran or was skipped at run time.
    pub specs: Vec<Spec>,
    /// How the suite exited (ginkgo exits non-zero when a spec failed,
    /// and when a process died before it reported).
    pub exit: std::process::ExitStatus,
}

impl Pass {
    /// Specs by state (`not selected`: left out by the focus or skip).
    pub fn tally(&self) -> BTreeMap<&str, usize> {
        let mut t = BTreeMap::new();
        for s in &self.specs {
            let state = if s.not_selected() {
                "not selected"
            } else {
                s.state.as_str()
            };
            *t.entry(state).or_default() += 1;
        }
        t
    }

    /// Per test pattern and suite (`Dynamic PV (block volmode) volumes`):
    /// passed, failed, skipped at run time; specs not selected left out.
    pub fn by_pattern(&self) -> BTreeMap<String, [usize; 3]> {
        let mut t: BTreeMap<String, [usize; 3]> = BTreeMap::new();
        for s in &self.specs {
            let column = match s.state.as_str() {
                "passed" => 0,
                _ if s.not_selected() => continue,
                "skipped" => 2,
                _ => 1,
            };
            t.entry(pattern(&s.name)).or_default()[column] += 1;
        }
        t
    }

    /// Whether the suite exited cleanly, some spec passed and none failed.
    pub fn passed(&self) -> bool {
        self.exit.success()
            && self.specs.iter().any(Spec::passed)
            && self
                .specs
                .iter()
                .all(|s| s.passed() || s.state == "skipped")
    }
}

/// Ginkgo's JSON report: one entry per suite.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SuiteReport {
    #[serde(default)]
    spec_reports: Vec<SpecReport>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SpecReport {
    #[serde(default)]
    container_hierarchy_texts: Vec<String>,
    #[serde(default)]
    leaf_node_text: String,
    #[serde(default)]
    leaf_node_type: String,
    state: String,
    #[serde(default)]
    run_time: i64,
    #[serde(default)]
    failure: Option<Failure>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Failure {
    #[serde(default)]
    message: String,
}

/// The specs of a ginkgo JSON report (suite setup nodes left out).
pub(super) fn read(path: &Path) -> anyhow::Result<Vec<Spec>> {
    let suites: Vec<SuiteReport> = serde_json::from_slice(&std::fs::read(path)?)?;
    let mut specs = Vec::new();
    for suite in suites {
        for r in suite.spec_reports {
            if r.leaf_node_type != "It" {
                if r.state != "passed" {
                    bail!(
                        "the suite's {} failed: {}",
                        r.leaf_node_type,
                        r.failure.map(|f| f.message).unwrap_or_default()
                    );
                }
                continue;
            }
            let mut name = r.container_hierarchy_texts.join(" ");
            name.push(' ');
            name.push_str(&r.leaf_node_text);
            specs.push(Spec {
                name,
                state: r.state,
                message: r.failure.map(|f| f.message).unwrap_or_default(),
                seconds: r.run_time as f64 / 1e9,
            });
        }
    }
    Ok(specs)
}

/// The test pattern and suite of a spec name: `[Testpattern: P] suite`
/// as `P suite`; the whole name when it has none.
fn pattern(name: &str) -> String {
    const MARK: &str = "[Testpattern: ";
    let Some(start) = name.find(MARK) else {
        return name.to_owned();
    };
    let rest = &name[start + MARK.len()..];
    // Patterns nest parentheses but no brackets: the first `]` closes it.
    let Some(end) = rest.find(']') else {
        return name.to_owned();
    };
    let suite = rest[end + 1..]
        .split_whitespace()
        .next()
        .unwrap_or_default();
    format!("{} {suite}", &rest[..end])
}

/// The tally, every failure and every skip with its reason.
pub fn render(passes: &[Pass]) -> String {
    let mut out = String::new();
    for p in passes {
        let tally: Vec<String> = p.tally().iter().map(|(k, v)| format!("{v} {k}")).collect();
        out.push_str(&format!(
            "{}: {} ({})\n",
            p.driver.display(),
            tally.join(", "),
            p.exit
        ));
        out.push_str("  pattern and suite: passed / failed / skipped at run time\n");
        for (pattern, [passed, failed, skipped]) in p.by_pattern() {
            out.push_str(&format!("  {pattern}: {passed} / {failed} / {skipped}\n"));
        }
        // A spec the focus or skip left out is "skipped" without a message;
        // one the suite skipped at run time says why.
        for s in p.specs.iter().filter(|s| !s.passed() && !s.not_selected()) {
            let first = s.message.lines().next().unwrap_or_default();
            out.push_str(&format!(
                "  {} [{:.0}s] {}\n    {first}\n",
                s.state, s.seconds, s.name
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pattern_is_the_test_pattern_and_its_suite() {
        for (name, want) in [
            (
                "External Storage [Driver: csi-scsi.io] [Testpattern: Dynamic PV (block volmode)] volumes should store data",
                "Dynamic PV (block volmode) volumes",
            ),
            (
                "External Storage [Driver: csi-scsi.io] [Testpattern: Dynamic PV (ext4)(allowExpansion)] volume-expand Verify if offline PVC expansion works",
                "Dynamic PV (ext4)(allowExpansion) volume-expand",
            ),
            (
                "External Storage [Driver: csi-scsi.io] something else",
                "External Storage [Driver: csi-scsi.io] something else",
            ),
        ] {
            assert_eq!(pattern(name), want, "{name}");
        }
    }
}
