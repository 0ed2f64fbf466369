//! csi-sanity's results, read from its Ginkgo JSON report
//! (`--ginkgo.json-report`): every spec with its state and, for a failure
//! or a skip, csi-sanity's own message.

use anyhow::Context;
use serde::Deserialize;

/// How one spec ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecState {
    /// It ran and passed.
    Passed,
    /// csi-sanity skipped it (a capability the driver does not offer).
    Skipped,
    /// It ran and failed (or panicked, timed out, was interrupted).
    Failed,
    /// Marked pending in csi-sanity itself.
    Pending,
}

impl SpecState {
    fn parse(state: &str) -> Self {
        match state {
            "passed" => Self::Passed,
            "skipped" => Self::Skipped,
            "pending" => Self::Pending,
            // "failed", "panicked", "interrupted", "aborted", "timedout" and
            // anything a newer Ginkgo adds: not a pass.
            _ => Self::Failed,
        }
    }
}

/// One spec.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Its full text (containers and leaf, space-separated, as Ginkgo
    /// prints it).
    pub name: String,
    /// How it ended.
    pub state: SpecState,
    /// csi-sanity's message for a failure or a skip.
    pub message: String,
}

/// One csi-sanity run of the whole.
#[derive(Debug)]
pub struct Pass {
    /// Its name.
    pub name: &'static str,
    /// csi-sanity's exit status.
    pub exit: Option<i32>,
    /// csi-sanity's own tally lines.
    pub tally: String,
}

/// The whole run: every pass, and every spec with its state over them.
#[derive(Debug, Default)]
pub struct Report {
    /// Every spec, merged over the passes.
    pub specs: Vec<Spec>,
    /// The csi-sanity runs.
    pub passes: Vec<Pass>,
    /// Skipped specs that `docs/conformance.md` does not list.
    pub undocumented_skips: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SuiteJson {
    #[serde(default)]
    spec_reports: Option<Vec<SpecJson>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SpecJson {
    #[serde(default)]
    container_hierarchy_texts: Option<Vec<String>>,
    #[serde(default)]
    leaf_node_type: String,
    #[serde(default)]
    leaf_node_text: String,
    state: String,
    #[serde(default)]
    failure: Option<FailureJson>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct FailureJson {
    #[serde(default)]
    message: String,
}

impl Report {
    /// Parses Ginkgo's JSON report.
    pub fn parse(json: &[u8]) -> anyhow::Result<Self> {
        let suites: Vec<SuiteJson> =
            serde_json::from_slice(json).context("csi-sanity's JSON report")?;
        let mut specs = Vec::new();
        for suite in suites {
            for s in suite.spec_reports.unwrap_or_default() {
                let state = SpecState::parse(&s.state);
                // Suite set-up and tear-down nodes are reported too; they
                // count only when they fail.
                if s.leaf_node_type != "It" && state != SpecState::Failed {
                    continue;
                }
                let mut parts = s.container_hierarchy_texts.unwrap_or_default();
                parts.push(if s.leaf_node_text.is_empty() {
                    s.leaf_node_type
                } else {
                    s.leaf_node_text
                });
                specs.push(Spec {
                    name: parts.join(" "),
                    state,
                    message: s.failure.map(|f| f.message).unwrap_or_default(),
                });
            }
        }
        Ok(Self {
            specs,
            ..Self::default()
        })
    }

    /// Adds another pass: a spec failed if it failed in any pass, passed
    /// if it passed in one and failed in none, else it stays skipped (or
    /// pending).
    pub fn merge(&mut self, other: Report) {
        self.passes.extend(other.passes);
        for spec in other.specs {
            match self.specs.iter_mut().find(|s| s.name == spec.name) {
                None => self.specs.push(spec),
                Some(s) => {
                    let rank = |st: SpecState| match st {
                        SpecState::Failed => 3,
                        SpecState::Passed => 2,
                        SpecState::Skipped => 1,
                        SpecState::Pending => 0,
                    };
                    if rank(spec.state) > rank(s.state) {
                        *s = spec;
                    }
                }
            }
        }
    }

    /// Specs in `state`.
    pub fn count(&self, state: SpecState) -> usize {
        self.specs.iter().filter(|s| s.state == state).count()
    }

    /// True when nothing failed, every csi-sanity run agreed, and every
    /// skip is documented.
    pub fn passed(&self) -> bool {
        !self.passes.is_empty()
            && self.passes.iter().all(|p| p.exit == Some(0))
            && self.count(SpecState::Failed) == 0
            && self.count(SpecState::Passed) > 0
            && self.undocumented_skips.is_empty()
    }

    /// The report for people: tallies, each failure with its message, each
    /// skip with its reason.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for p in &self.passes {
            out.push_str(&format!(
                "csi-sanity pass {:?}: {}\n",
                p.name,
                p.tally.replace('\n', "\n    ")
            ));
        }
        out.push_str(&format!(
            "specs over all passes: {} passed, {} failed, {} skipped, {} pending\n",
            self.count(SpecState::Passed),
            self.count(SpecState::Failed),
            self.count(SpecState::Skipped),
            self.count(SpecState::Pending)
        ));
        for s in self.specs.iter().filter(|s| s.state == SpecState::Failed) {
            out.push_str(&format!(
                "FAILED  {}\n        {}\n",
                s.name,
                first_lines(&s.message, 6)
            ));
        }
        for s in self.specs.iter().filter(|s| s.state == SpecState::Skipped) {
            out.push_str(&format!(
                "skipped {}\n        {}\n",
                s.name,
                first_lines(&s.message, 1)
            ));
        }
        for name in &self.undocumented_skips {
            out.push_str(&format!(
                "UNDOCUMENTED SKIP (list it in docs/conformance.md, or make it run): `{name}`\n"
            ));
        }
        out
    }
}

fn first_lines(text: &str, n: usize) -> String {
    text.lines().take(n).collect::<Vec<_>>().join("\n        ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"[{"SuitePath":"/x","SpecReports":[
      {"ContainerHierarchyTexts":null,"LeafNodeType":"BeforeSuite","LeafNodeText":"","State":"passed"},
      {"ContainerHierarchyTexts":["Node Service","NodeGetCapabilities"],"LeafNodeType":"It",
       "LeafNodeText":"should return appropriate capabilities","State":"passed"},
      {"ContainerHierarchyTexts":["Controller Service [Controller Server]","CreateSnapshot"],"LeafNodeType":"It",
       "LeafNodeText":"should fail when no name is provided","State":"skipped",
       "Failure":{"Message":"CreateSnapshot not supported"}},
      {"ContainerHierarchyTexts":["Node Service"],"LeafNodeType":"It","LeafNodeText":"should work",
       "State":"failed","Failure":{"Message":"Expected\n    <codes.Code>: 3\nto equal 5"}}
    ]}]"#;

    #[test]
    fn specs_states_and_messages_come_from_the_ginkgo_report() {
        let r = Report::parse(SAMPLE.as_bytes()).expect("parse");
        assert_eq!(r.specs.len(), 3, "the passed BeforeSuite is not a spec");
        assert_eq!(r.count(SpecState::Passed), 1);
        assert_eq!(r.count(SpecState::Skipped), 1);
        assert_eq!(r.count(SpecState::Failed), 1);
        assert_eq!(
            r.specs[1].name,
            "Controller Service [Controller Server] CreateSnapshot should fail when no name is provided"
        );
        assert_eq!(r.specs[1].message, "CreateSnapshot not supported");
        assert!(!r.passed(), "a failed spec fails the run");
        assert!(r.render().contains("FAILED  Node Service should work"));
    }

    #[test]
    fn a_spec_skipped_in_one_pass_and_passed_in_another_passed_and_a_failure_anywhere_fails() {
        let mut r = Report::parse(SAMPLE.as_bytes()).expect("parse");
        let mut second = Report::parse(SAMPLE.as_bytes()).expect("parse");
        for s in &mut second.specs {
            s.state = match s.state {
                SpecState::Skipped => SpecState::Passed,
                SpecState::Failed => SpecState::Skipped,
                other => other,
            };
        }
        r.merge(second);
        assert_eq!(r.specs.len(), 3, "merged by name");
        assert_eq!(r.count(SpecState::Passed), 2);
        assert_eq!(
            r.count(SpecState::Failed),
            1,
            "a failure in one pass stands"
        );
        assert_eq!(r.count(SpecState::Skipped), 0);
    }

    #[test]
    fn a_run_passes_only_with_exit_zero_no_failure_and_every_skip_documented() {
        let mut r = Report::parse(SAMPLE.as_bytes()).expect("parse");
        r.specs.retain(|s| s.state != SpecState::Failed);
        assert!(!r.passed(), "no pass ran");
        r.passes.push(Pass {
            name: "one",
            exit: Some(0),
            tally: String::new(),
        });
        assert!(r.passed());
        r.undocumented_skips.push("x".into());
        assert!(!r.passed());
    }
}
