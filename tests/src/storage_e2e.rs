//! Kubernetes' own storage tests (`k8s.io/kubernetes/test/e2e/storage/external`,
//! built as `e2e.test` by `tools/build e2e.test`) against a kept Kubernetes
//! lab (`lab up --kubernetes --keep`): the suite's images are built here
//! (`tests/storage-e2e/images/`) and imported into every node's
//! containerd, named through `KUBE_TEST_REPO_LIST`; each driver definition
//! in `tests/storage-e2e/` runs as one pass; ginkgo's JSON report gives the
//! tally and every skip's reason.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use serde::Deserialize;

use crate::images::{ImageOptions, Pins};
use crate::lab::kube::KubeManifest;
use crate::lab::net::sh;

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// The suite's binary.
    pub e2e: PathBuf,
    /// The kept lab's `lab.json`.
    pub lab_json: PathBuf,
    /// Driver definition files (`-storage.testdriver`), one pass each.
    pub drivers: Vec<PathBuf>,
    /// Specs to run (ginkgo focus), within `External Storage`.
    pub focus: Option<String>,
    /// Specs never to run (ginkgo skip).
    pub skip: String,
    /// Where the images, reports and logs go.
    pub out: PathBuf,
}

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

/// The outcome of one pass.
#[derive(Clone, Debug)]
pub struct Pass {
    /// The definition file.
    pub driver: PathBuf,
    /// Every spec that ran or was skipped at run time.
    pub specs: Vec<Spec>,
}

impl Pass {
    /// Specs by state (`not selected`: left out by the focus or skip).
    pub fn tally(&self) -> BTreeMap<&str, usize> {
        let mut t = BTreeMap::new();
        for s in &self.specs {
            let state = if s.state == "skipped" && s.message.is_empty() {
                "not selected"
            } else {
                s.state.as_str()
            };
            *t.entry(state).or_default() += 1;
        }
        t
    }

    /// Whether no spec failed.
    pub fn passed(&self) -> bool {
        self.specs
            .iter()
            .all(|s| s.state == "passed" || s.state == "skipped")
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

/// Builds and imports the images, then runs every pass.
pub fn run(opts: &Options, progress: &mut dyn FnMut(&str)) -> anyhow::Result<Vec<Pass>> {
    let manifest: KubeManifest = serde_json::from_slice(
        &std::fs::read(&opts.lab_json)
            .with_context(|| format!("reading {} (a kept lab)", opts.lab_json.display()))?,
    )
    .with_context(|| format!("parsing {}", opts.lab_json.display()))?;
    let root = crate::images::workspace();
    std::fs::create_dir_all(&opts.out)?;
    let built = crate::images::build(&ImageOptions {
        out: opts.out.join("images"),
        pins: Pins::Check,
        recipes: Some(root.join("tests/storage-e2e/images")),
        ..ImageOptions::default()
    })?;
    for node in &manifest.lab.nodes {
        let sock = containerd_socket(&manifest.lab.dir, &node.name);
        for image in &built {
            sh(
                "ctr",
                &[
                    "--address",
                    &sock.display().to_string(),
                    "-n",
                    "k8s.io",
                    "images",
                    "import",
                    "--no-unpack",
                    &image.archive.display().to_string(),
                ],
            )
            .with_context(|| format!("importing {} on {}", image.reference, node.name))?;
        }
    }
    progress(&format!(
        "{} images imported on {} nodes",
        built.len(),
        manifest.lab.nodes.len()
    ));
    let mut passes = Vec::new();
    for driver in &opts.drivers {
        let name = driver
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "driver".into());
        let report = opts.out.join(format!("{name}.json"));
        let log = opts.out.join(format!("{name}.log"));
        let _ = std::fs::remove_file(&report);
        let focus = match &opts.focus {
            Some(f) => format!("External.Storage.*{f}"),
            None => "External.Storage".to_owned(),
        };
        progress(&format!(
            "{}: running (log {})",
            driver.display(),
            log.display()
        ));
        let status = Command::new(&opts.e2e)
            .current_dir(&root)
            .env(
                "KUBE_TEST_REPO_LIST",
                root.join("tests/storage-e2e/repo-list.yaml"),
            )
            .arg(format!("-kubeconfig={}", manifest.kubeconfig.display()))
            .arg(format!("-storage.testdriver={}", driver.display()))
            .arg(format!("-repo-root={}", root.display()))
            .arg(format!("-ginkgo.focus={focus}"))
            .arg(format!("-ginkgo.skip={}", opts.skip))
            .arg(format!("-ginkgo.json-report={}", report.display()))
            .arg("-ginkgo.no-color")
            .arg("-ginkgo.v")
            .stdout(std::fs::File::create(&log)?)
            .stderr(std::fs::File::create(log.with_extension("err"))?)
            .status()
            .with_context(|| format!("running {}", opts.e2e.display()))?;
        let specs = read_report(&report).with_context(|| {
            format!(
                "{} exited {status} without a report (log: {})",
                opts.e2e.display(),
                log.display()
            )
        })?;
        passes.push(Pass {
            driver: driver.clone(),
            specs,
        });
    }
    Ok(passes)
}

/// The containerd socket of lab node `node` (as the lab's node makes it).
fn containerd_socket(lab_dir: &Path, node: &str) -> PathBuf {
    lab_dir.join(format!("nodes/{node}/runtime/containerd/containerd.sock"))
}

/// The specs of a ginkgo JSON report (suite setup nodes left out).
fn read_report(path: &Path) -> anyhow::Result<Vec<Spec>> {
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

/// The tally, every failure and every skip with its reason.
pub fn render(passes: &[Pass]) -> String {
    let mut out = String::new();
    for p in passes {
        let tally: Vec<String> = p.tally().iter().map(|(k, v)| format!("{v} {k}")).collect();
        out.push_str(&format!("{}: {}\n", p.driver.display(), tally.join(", ")));
        // A spec the focus or skip left out is "skipped" without a message;
        // one the suite skipped at run time says why.
        for s in p
            .specs
            .iter()
            .filter(|s| s.state != "passed" && !(s.state == "skipped" && s.message.is_empty()))
        {
            let first = s.message.lines().next().unwrap_or_default();
            out.push_str(&format!(
                "  {} [{:.0}s] {}\n    {first}\n",
                s.state, s.seconds, s.name
            ));
        }
    }
    out
}
