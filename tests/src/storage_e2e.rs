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
use crate::lab::kube::array_admin::ArrayAdmin;
use crate::lab::net::sh;

/// Images the suite names that one of ours serves as is, tagged with the
/// other name on every node: the multi-volume specs start their Pods from
/// `jessie-dnsutils` but run in them only the shell checks they run in
/// `busybox` (`test/e2e/storage/testsuites/multivolume.go`).
const ALIASES: &[(&str, &str)] = &[(
    "docker.io/local/e2e/jessie-dnsutils:1.7",
    "docker.io/local/e2e/busybox:1.36.1-1",
)];

/// The passes run when no definition is named: each definition file with
/// the specs it is for (a regex within `External Storage`). ext4 runs all
/// (it claims neither xfs nor topology, so those skip there); xfs and
/// topology run only their own patterns.
pub const DEFAULT_PASSES: &[(&str, &str)] = &[
    ("tests/storage-e2e/csi-scsi-ext4.yaml", ""),
    ("tests/storage-e2e/csi-scsi-xfs.yaml", r"\(xfs\)"),
    ("tests/storage-e2e/csi-scsi-topology.yaml", r"\] topology "),
];

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// The suite's binary.
    pub e2e: PathBuf,
    /// The kept lab's `lab.json`.
    pub lab_json: PathBuf,
    /// Driver definition files (`-storage.testdriver`), one pass each;
    /// empty: [`DEFAULT_PASSES`].
    pub drivers: Vec<PathBuf>,
    /// Specs to run (ginkgo focus), within `External Storage`.
    pub focus: Option<String>,
    /// Specs never to run (ginkgo skip).
    pub skip: String,
    /// Where the images, reports and logs go.
    pub out: PathBuf,
    /// The ginkgo CLI, to run the specs in `procs` parallel processes.
    pub ginkgo: Option<PathBuf>,
    /// Parallel processes (with `ginkgo`); 1 runs `e2e.test` alone.
    pub procs: usize,
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
    /// How the suite exited (ginkgo exits non-zero when a spec failed,
    /// and when a process died before it reported).
    pub exit: std::process::ExitStatus,
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

    /// Per test pattern and suite (`Dynamic PV (block volmode) volumes`):
    /// passed, failed, skipped at run time; specs not selected left out.
    pub fn by_pattern(&self) -> BTreeMap<String, [usize; 3]> {
        let mut t: BTreeMap<String, [usize; 3]> = BTreeMap::new();
        for s in &self.specs {
            let column = match s.state.as_str() {
                "passed" => 0,
                "skipped" if s.message.is_empty() => continue,
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
            && self.specs.iter().any(|s| s.state == "passed")
            && self
                .specs
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
        for (alias, image) in ALIASES {
            let address = sock.display().to_string();
            // `tag` refuses an existing name: a rerun on the same lab.
            let _ = sh(
                "ctr",
                &["--address", &address, "-n", "k8s.io", "images", "rm", alias],
            );
            sh(
                "ctr",
                &[
                    "--address",
                    &address,
                    "-n",
                    "k8s.io",
                    "images",
                    "tag",
                    image,
                    alias,
                ],
            )
            .with_context(|| format!("tagging {image} as {alias} on {}", node.name))?;
        }
    }
    progress(&format!(
        "{} images imported on {} nodes",
        built.len(),
        manifest.lab.nodes.len()
    ));
    // The suite's expansion specs grow volumes beyond their LUNs: someone
    // must grow the LUNs, as the array's administrator would.
    let admin_log = opts.out.join("array-admin.log");
    let admin = ArrayAdmin::start(&manifest, &admin_log)?;
    let mut passes = Vec::new();
    // A focus of the user's replaces each default pass's own.
    let planned: Vec<(PathBuf, &str)> = if opts.drivers.is_empty() {
        DEFAULT_PASSES
            .iter()
            .map(|&(d, f)| (PathBuf::from(d), f))
            .collect()
    } else {
        opts.drivers.iter().map(|d| (d.clone(), "")).collect()
    };
    for (driver, pass_focus) in &planned {
        let name = driver
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "driver".into());
        let out = std::path::absolute(&opts.out)?;
        let report_name = format!("{name}.json");
        let report = out.join(&report_name);
        // The ginkgo CLI runs the suite in the binary's directory: every
        // path it is given is absolute.
        let driver = root.join(driver);
        let log = opts.out.join(format!("{name}.log"));
        let _ = std::fs::remove_file(&report);
        let focus = match opts.focus.as_deref().unwrap_or(pass_focus) {
            "" => "External.Storage".to_owned(),
            f => format!("External.Storage.*{f}"),
        };
        progress(&format!(
            "{}: running (log {})",
            driver.display(),
            log.display()
        ));
        // The suite's own flags; ginkgo's go to the CLI when it runs the
        // processes, else to e2e.test with its `ginkgo.` prefix.
        let suite_args = [
            format!("-kubeconfig={}", manifest.kubeconfig.display()),
            format!("-storage.testdriver={}", driver.display()),
            format!("-repo-root={}", root.display()),
        ];
        let ginkgo_args = [
            format!("focus={focus}"),
            format!("skip={}", opts.skip),
            // Upstream's default; the parallel CLI's own is one hour.
            "timeout=3h".to_owned(),
            "no-color".to_owned(),
            "v".to_owned(),
        ];
        let mut command = match (&opts.ginkgo, opts.procs) {
            (Some(ginkgo), procs) if procs > 1 => {
                let mut c = Command::new(ginkgo);
                // The CLI writes the report relative to its output dir.
                c.arg(format!("--procs={procs}"))
                    .arg(format!("--output-dir={}", out.display()))
                    .arg(format!("--json-report={report_name}"))
                    .args(ginkgo_args.iter().map(|a| format!("--{a}")))
                    .arg(&opts.e2e)
                    .arg("--")
                    .args(&suite_args);
                c
            }
            _ => {
                let mut c = Command::new(&opts.e2e);
                c.args(&suite_args)
                    .arg(format!("-ginkgo.json-report={}", report.display()))
                    .args(ginkgo_args.iter().map(|a| format!("-ginkgo.{a}")));
                c
            }
        };
        let started = std::time::Instant::now();
        let status = command
            .current_dir(&root)
            .env(
                "KUBE_TEST_REPO_LIST",
                root.join("tests/storage-e2e/repo-list.yaml"),
            )
            .stdout(std::fs::File::create(&log)?)
            .stderr(std::fs::File::create(log.with_extension("err"))?)
            .status()
            .with_context(|| format!("running {}", opts.e2e.display()))?;
        progress(&format!(
            "{}: {status} after {:.0}s",
            driver.display(),
            started.elapsed().as_secs_f64()
        ));
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
            exit: status,
        });
    }
    progress(&format!(
        "the array administrator grew {} LUNs (log {})",
        admin.stop(),
        admin_log.display()
    ));
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
