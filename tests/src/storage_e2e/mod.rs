//! Kubernetes' own storage tests (`k8s.io/kubernetes/test/e2e/storage/external`,
//! built as `e2e.test` by `tools/build e2e.test`) against a kept Kubernetes
//! lab (`lab up --kubernetes --keep`): the suite's images are built here
//! (`tests/storage-e2e/images/`) and imported into every node's
//! containerd, named through `KUBE_TEST_REPO_LIST`; each driver definition
//! in `tests/storage-e2e/` runs as one pass; ginkgo's JSON report gives the
//! tally and every skip's reason.

mod images;
mod report;

use std::path::PathBuf;
use std::process::Command;

use anyhow::Context;

use crate::lab::kube::KubeManifest;
use crate::lab::kube::array_admin::ArrayAdmin;

pub use report::{Pass, Spec, render};

/// The passes run when no definition is named: each definition file with
/// the specs it is for (a regex within `External Storage`). ext4 runs all
/// (it claims neither xfs nor topology, so those skip there); xfs and
/// topology run only their own patterns.
pub const DEFAULT_PASSES: &[(&str, &str)] = &[
    ("tests/storage-e2e/csi-scsi-ext4.yaml", ""),
    ("tests/storage-e2e/csi-scsi-xfs.yaml", r"\(xfs\)"),
    ("tests/storage-e2e/csi-scsi-topology.yaml", r"\] topology "),
];

/// The disruptive pass (`--disruptive`): the ext4 definition's specs that
/// stop and start a node's kubelet (over SSH to the node's shell,
/// `lab/kube/node_shell.rs`) with volumes mounted, one spec at a time.
pub const DISRUPTIVE_PASS: (&str, &str) = ("tests/storage-e2e/csi-scsi-ext4.yaml", DISRUPTIVE);

/// The specs of [`DISRUPTIVE_PASS`].
const DISRUPTIVE: &str = r"\[Disruptive\]";

/// Specs no pass runs unless `--skip` says otherwise: a regex each and
/// why (docs/conformance.md, "Not run"). The last two fail in the lab for
/// a reason of this machine's kernel, not the driver's.
pub const NOT_RUN: &[(&str, &str)] = &[
    (
        DISRUPTIVE,
        "stops and starts kubelets: the disruptive pass runs them (`--disruptive`), one at a time",
    ),
    (r"\[Serial\]", "needs the whole cluster to itself"),
    (
        r"should remount stale subpath bind mount after network filesystem disruption",
        "new in 1.37: stops the Pod's container with crictl on the node, and the lab's nodes have no crictl yet",
    ),
    (r"\[Feature:Windows\]", "Windows nodes"),
    (
        r"\((default fs|ext4)\)\(allowExpansion\)\] volume-expand (Verify if online PVC expansion works|should resize volume when PVC is edited while pod is using it)",
        "grows a mounted ext4, which this machine's kernel refuses (no CAP_SYS_RESOURCE for online resize2fs)",
    ),
    (
        r"Generic Ephemeral-volume \(default fs\).*should support expansion of pvcs created for ephemeral pvcs",
        "grows a mounted ext4, which this machine's kernel refuses (no CAP_SYS_RESOURCE for online resize2fs)",
    ),
];

/// [`NOT_RUN`] as one ginkgo skip regex; for the disruptive pass, without
/// its own specs.
pub fn default_skip(disruptive: bool) -> String {
    NOT_RUN
        .iter()
        .map(|(regex, _)| *regex)
        .filter(|regex| !(disruptive && *regex == DISRUPTIVE))
        .collect::<Vec<_>>()
        .join("|")
}

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
    /// Specs never to run (ginkgo skip); `None`: [`default_skip`].
    pub skip: Option<String>,
    /// The disruptive pass ([`DISRUPTIVE_PASS`]) instead of the others,
    /// one spec at a time.
    pub disruptive: bool,
    /// Where the images, reports and logs go.
    pub out: PathBuf,
    /// The ginkgo CLI, to run the specs in `procs` parallel processes.
    pub ginkgo: Option<PathBuf>,
    /// Parallel processes (with `ginkgo`); 1 runs `e2e.test` alone.
    pub procs: usize,
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
    let repo_list = root.join("tests/storage-e2e/repo-list.yaml");
    let wanted = images::wanted(&opts.e2e, &repo_list)?;
    let built = images::import(&manifest, &root, &opts.out.join("images"), &wanted)?;
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
    let planned: Vec<(PathBuf, &str)> = if opts.disruptive {
        let (driver, focus) = DISRUPTIVE_PASS;
        let drivers = match opts.drivers.as_slice() {
            [] => vec![PathBuf::from(driver)],
            named => named.to_vec(),
        };
        drivers.into_iter().map(|d| (d, focus)).collect()
    } else if opts.drivers.is_empty() {
        DEFAULT_PASSES
            .iter()
            .map(|&(d, f)| (PathBuf::from(d), f))
            .collect()
    } else {
        opts.drivers.iter().map(|d| (d.clone(), "")).collect()
    };
    let skip = opts
        .skip
        .clone()
        .unwrap_or_else(|| default_skip(opts.disruptive));
    // The nodes' shells, which the disruptive specs reach over SSH.
    let ssh_key = manifest.ssh_key.clone().context(
        "the kept lab's lab.json names no SSH key for its nodes' shells (a lab from before they had one: lab down, then lab up --kubernetes --keep)",
    )?;
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
        let mut suite_args = vec![
            format!("-kubeconfig={}", manifest.kubeconfig.display()),
            format!("-storage.testdriver={}", driver.display()),
            format!("-repo-root={}", root.display()),
        ];
        if opts.disruptive {
            // From 1.37 the kubelet-restart specs carry
            // [Provider:gce,aws,local,azure] (the providers whose nodes
            // have SSH) and skip under the default "skeleton": the lab's
            // nodes have SSH (lab/kube/node_shell.rs), which is all the
            // null provider "local" stands for here.
            suite_args.push("-provider=local".to_owned());
        }
        let ginkgo_args = [
            format!("focus={focus}"),
            format!("skip={skip}"),
            // Upstream's default; the parallel CLI's own is one hour.
            "timeout=3h".to_owned(),
            "no-color".to_owned(),
            "v".to_owned(),
        ];
        // Disruptive specs stop kubelets: never two at once.
        let procs = if opts.disruptive { 1 } else { opts.procs };
        let mut command = match (&opts.ginkgo, procs) {
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
            .env("KUBE_SSH_KEY_PATH", &ssh_key)
            .env("KUBE_SSH_USER", crate::lab::kube::node_shell::USER)
            .stdout(std::fs::File::create(&log)?)
            .stderr(std::fs::File::create(log.with_extension("err"))?)
            .status()
            .with_context(|| format!("running {}", opts.e2e.display()))?;
        progress(&format!(
            "{}: {status} after {:.0}s",
            driver.display(),
            started.elapsed().as_secs_f64()
        ));
        let specs = report::read(&report).with_context(|| {
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
