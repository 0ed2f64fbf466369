//! Kubernetes' own storage tests (`k8s.io/kubernetes/test/e2e/storage/external`,
//! built as `e2e.test` by `tools/build e2e.test`) against a kept Kubernetes
//! lab (`lab up --kubernetes --keep`): the suite's images are built here
//! (`tests/storage-e2e/images/`) and imported into every node's
//! containerd, named through `KUBE_TEST_REPO_LIST`; each driver definition
//! in `tests/storage-e2e/` runs as one pass; ginkgo's JSON report gives the
//! tally and every skip's reason. The VM-kube lab's last step runs a subset
//! on its real-kernel nodes through [`build_images`] and [`run_passes`]
//! (`lab/kube/vm_storage_e2e.rs`), its images imported its own way.

mod images;
mod report;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::lab::kube::KubeManifest;
use crate::lab::kube::array_admin::ArrayAdmin;

pub use images::SuiteImages;
pub use report::{Pass, Spec, render};

/// The suite's `KUBE_TEST_REPO_LIST`, in the workspace: every registry it
/// names mapped to ours.
const REPO_LIST: &str = "tests/storage-e2e/repo-list.yaml";

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

/// The kernel a lab's nodes (their disks, mounts and filesystems) run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// Debian's, in qemu guests (`lab up --kubernetes --vm`).
    Real,
    /// This machine's, with the kernel stand-in (the fast Kubernetes lab).
    StandIn,
}

/// Specs no pass runs unless `--skip` says otherwise: a regex each, why
/// (docs/conformance.md, "Not run"), and on which nodes' kernel (`None`:
/// on every lab). The last two fail in the fast lab for a reason of this
/// machine's kernel, not the driver's.
pub const NOT_RUN: &[(&str, &str, Option<Kernel>)] = &[
    (
        DISRUPTIVE,
        "stops and starts kubelets: the disruptive pass runs them (`--disruptive`), one at a time",
        None,
    ),
    (r"\[Serial\]", "needs the whole cluster to itself", None),
    (
        r"should remount stale subpath bind mount after network filesystem disruption",
        "new in 1.37: stops the Pod's container with crictl on the node, and the lab's nodes have no crictl yet",
        None,
    ),
    (r"\[Feature:Windows\]", "Windows nodes", None),
    (
        r"\((default fs|ext4)\)\(allowExpansion\)\] volume-expand (Verify if online PVC expansion works|should resize volume when PVC is edited while pod is using it)",
        "grows a mounted ext4, which this machine's kernel refuses (no CAP_SYS_RESOURCE for online resize2fs)",
        Some(Kernel::StandIn),
    ),
    (
        r"Generic Ephemeral-volume \(default fs\).*should support expansion of pvcs created for ephemeral pvcs",
        "grows a mounted ext4, which this machine's kernel refuses (no CAP_SYS_RESOURCE for online resize2fs)",
        Some(Kernel::StandIn),
    ),
];

/// [`NOT_RUN`] as one ginkgo skip regex for nodes on `kernel`; for the
/// disruptive pass, without its own specs.
pub fn default_skip(disruptive: bool, kernel: Kernel) -> String {
    NOT_RUN
        .iter()
        .filter(|(_, _, on)| on.is_none_or(|k| k == kernel))
        .map(|(regex, _, _)| *regex)
        .filter(|regex| !(disruptive && *regex == DISRUPTIVE))
        .collect::<Vec<_>>()
        .join("|")
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// The suite's binary.
    pub e2e: PathBuf,
    /// Driver definition files (`-storage.testdriver`), one pass each;
    /// empty: [`DEFAULT_PASSES`].
    pub drivers: Vec<PathBuf>,
    /// Specs to run (ginkgo focus), within `External Storage`.
    pub focus: Option<String>,
    /// Specs never to run (ginkgo skip); `None`: [`default_skip`] for
    /// `kernel`.
    pub skip: Option<String>,
    /// The kernel the lab's nodes run on: which of [`NOT_RUN`] apply.
    pub kernel: Kernel,
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

/// Builds the images and imports them into the nodes of the kept lab
/// whose `lab.json` is `lab_json`, then runs every pass.
pub fn run(
    lab_json: &Path,
    opts: &Options,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<Vec<Pass>> {
    let manifest: KubeManifest = serde_json::from_slice(
        &std::fs::read(lab_json)
            .with_context(|| format!("reading {} (a kept lab)", lab_json.display()))?,
    )
    .with_context(|| format!("parsing {}", lab_json.display()))?;
    let built = build_images(opts)?;
    images::import(&manifest, &built)?;
    progress(&format!(
        "{} images imported on {} nodes",
        built.built.len(),
        manifest.lab.nodes.len()
    ));
    run_passes(&manifest, opts, progress)
}

/// Builds the suite's images into `opts.out`, tagged as the suite in
/// `opts.e2e` names them (a lab whose nodes are not on this host imports
/// them its own way).
pub fn build_images(opts: &Options) -> anyhow::Result<SuiteImages> {
    let root = crate::images::workspace();
    std::fs::create_dir_all(&opts.out)?;
    let repo_list = root.join(REPO_LIST);
    let wanted = images::wanted(&opts.e2e, &repo_list)?;
    images::build(&root, &opts.out.join("images"), &wanted)
}

/// Runs every pass of `opts` against the lab in `manifest`, whose nodes
/// hold the suite's images already.
pub fn run_passes(
    manifest: &KubeManifest,
    opts: &Options,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<Vec<Pass>> {
    let root = crate::images::workspace();
    std::fs::create_dir_all(&opts.out)?;
    // The suite's expansion specs grow volumes beyond their LUNs: someone
    // must grow the LUNs, as the array's administrator would.
    let admin_log = opts.out.join("array-admin.log");
    let admin = ArrayAdmin::start(manifest, &admin_log)?;
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
        .unwrap_or_else(|| default_skip(opts.disruptive, opts.kernel));
    // The nodes' shells, which the disruptive specs reach over SSH.
    let ssh_key = match (&manifest.ssh_key, opts.disruptive) {
        (Some(key), _) => Some(key.clone()),
        (None, false) => None,
        (None, true) => bail!(
            "the kept lab's lab.json names no SSH key for its nodes' shells (a lab from before they had one: lab down, then lab up --kubernetes --keep)"
        ),
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
        // A group: a focus of alternatives stays within External Storage.
        let focus = match opts.focus.as_deref().unwrap_or(pass_focus) {
            "" => "External.Storage".to_owned(),
            f => format!("External.Storage.*(?:{f})"),
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
        command
            .current_dir(&root)
            .env("KUBE_TEST_REPO_LIST", root.join(REPO_LIST));
        if let Some(key) = &ssh_key {
            command
                .env("KUBE_SSH_KEY_PATH", key)
                .env("KUBE_SSH_USER", crate::lab::kube::node_shell::USER);
        }
        let status = command
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_kernel_nodes_run_the_online_ext4_grows_the_stand_in_refuses() {
        let stand_in = default_skip(false, Kernel::StandIn);
        let real = default_skip(false, Kernel::Real);
        assert!(stand_in.contains("volume-expand"), "{stand_in}");
        assert!(!real.contains("volume-expand"), "{real}");
        assert!(!real.contains("expansion of pvcs"), "{real}");
        for everywhere in [r"\[Serial\]", r"\[Feature:Windows\]", DISRUPTIVE] {
            assert!(real.contains(everywhere), "{real}");
            assert!(stand_in.contains(everywhere), "{stand_in}");
        }
        assert!(!default_skip(true, Kernel::Real).contains(DISRUPTIVE));
    }
}
