//! `lab`: the local multi-node lab (the README's main job).
//!
//! `lab up [--kubernetes [--version MINOR] [--via kustomize|helm]] [--vm] [--keep] [--dir DIR]
//! [--nodes N] [--pool N]`: build a cluster of this driver on this machine
//! (as root) and play a whole volume life cycle through it; with `--keep`,
//! leave it running and write `lab.json`.
//! `lab down [--dir DIR]`: remove everything a lab made (safe to repeat).
//! `lab node-systemctl NODE_DIR ARGS`: `systemctl` on a Kubernetes lab
//! node's shell (SSH), for its kubelet; not for direct use.
//! `lab images [--out DIR] [--tag TAG] [--profile PROFILE] [--write-digests]`:
//! build every container image deploy/ uses (recipes in deploy/images/) as
//! image archives, without Docker or a registry, and check the sidecars'
//! digests against the pins in deploy/ (`--write-digests` rewrites them);
//! for a release, `cargo build --release -p csi-scsi-proxy -p csi-scsi-agent`
//! first, then `--profile release`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use csi_scsi_testbed::kube::KubeMinor;
use csi_scsi_tests::images::{ImageOptions, Pins};
use csi_scsi_tests::lab::kube::KubeLab;
use csi_scsi_tests::lab::kube::install::Via;
use csi_scsi_tests::lab::kube::node_shell;
use csi_scsi_tests::lab::{Lab, LabConfig, down, scenario};

/// Guests of `--kubernetes --vm` by default: a third one-vCPU TCG guest
/// beside the host's control plane starves two cores (readiness probes and
/// the API server's calls to kubelets time out).
const VM_KUBE_NODES: usize = 2;

const USAGE: &str = "usage: lab up [--kubernetes [--version MINOR] [--via kustomize|helm]] [--vm] [--keep] [--dir DIR] [--nodes N] [--pool N]
              [--pool-large N]
       lab down [--dir DIR]
       lab images [--out DIR] [--tag TAG] [--profile PROFILE] [--write-digests] [--recipes DIR]
  --kubernetes  a real Kubernetes control plane, containerd and kubelet on
            every node, the driver installed from deploy/; the life cycle is
            driven through PVCs and Pods (docs/kubernetes-lab.md)
    --version MINOR  the Kubernetes minor (control plane, kubelet, kubectl),
                     one of the support matrix (`tools/build
                     --kubernetes-minors`); default: the newest
    --via kustomize  install, upgrade and reinstall with kubectl and
                     deploy/overlays/lab (the default)
    --via helm       the same with helm and deploy/chart/csi-scsi
                     (ci/lab-values.yaml, equal to the overlay)
  --vm      every node a qemu guest booting Debian's kernel: the real iSCSI
            initiator, udev and dm-multipath (two portals, two paths per LUN),
            the agent with its production defaults (docs/lab.md, VM nodes)
  --kubernetes --vm  both: every guest is also a Kubernetes node (containerd,
            runc, CNI, kubelet inside), the driver installed from
            deploy/overlays/lab-vm, the agent as the DaemonSet's Pod on the
            guest's real kernel, the controller on a host-side control-plane
            node (docs/kubernetes-lab.md, VM nodes)
  --nodes N N nodes, 3 to 8 (default 3); with --kubernetes --vm 2 to 8
            (default 2: three TCG guests and the control plane starve this
            machine's two cores, docs/kubernetes-lab.md)
  --pool N  N small LUNs (64 MiB, c1..cN, N from 1 to 64) on array-c, which
            every node sees (label tier=pool): devices for suites that create
            many volumes
  --pool-large N  N more on array-c after those, of 1 GiB each (sparse; N up
            to 16): for volumes a 64 MiB LUN cannot hold (the storage e2e
            suite's expansion specs start at 1 GiB, xfs needs 300 MiB)
  images    build every image deploy/ uses (recipes: deploy/images/) as
            image archives (OCI layout with docker's manifest.json) for
            `ctr -n k8s.io images import` or `docker load -i`; no Docker, no
            registry. Fails when a sidecar's digest differs from the one
            deploy/ pins (name:tag@sha256:...)
    --out DIR       where they go (default $CSI_SCSI_CACHE/images,
                    CSI_SCSI_CACHE defaulting to /var/cache/csi-scsi)
    --tag TAG       the tag of csi-scsi/proxy and csi-scsi/agent (default dev);
                    the sidecars keep the tags deploy/ gives them
    --profile NAME  the binaries' cargo profile, target/NAME/ (default debug);
                    for release images run
                    cargo build --release -p csi-scsi-proxy -p csi-scsi-agent
                    first, then --profile release
    --write-digests write the sidecars' digests built here into
                    deploy/base/controller.yaml and the chart's values.yaml
                    (after an intended change: Go, tools/external-*, a recipe)
    --recipes DIR   build the recipes in DIR instead (the storage e2e
                    suite's images: tests/storage-e2e/images)";

/// A flag's count, refused (not clamped or defaulted) when missing, not a
/// number, or out of `range`: a typo must not run a different lab.
fn count(
    flag: &str,
    value: Option<&String>,
    range: std::ops::RangeInclusive<usize>,
) -> Result<usize, String> {
    let value = value.ok_or_else(|| format!("{flag} needs a number (try --help)"))?;
    let n: usize = value
        .parse()
        .map_err(|_| format!("{flag} {value:?}: not a number"))?;
    if !range.contains(&n) {
        return Err(format!(
            "{flag} {n}: must be {} to {}",
            range.start(),
            range.end()
        ));
    }
    Ok(n)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [cmd, node_dir, rest @ ..] = args.as_slice()
        && cmd == "node-systemctl"
    {
        return node_systemctl(node_dir, rest);
    }
    let mut config = LabConfig::standard();
    let mut keep = false;
    let mut kubernetes = false;
    let mut via = Via::default();
    let mut minor = None;
    let mut cmd = None;
    let mut nodes = None;
    let mut images = ImageOptions::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "up" | "down" | "images" => cmd = Some(a.clone()),
            "--keep" => keep = true,
            "--write-digests" => images.pins = Pins::Write,
            "--kubernetes" => kubernetes = true,
            "--vm" => config.vm = true,
            "--dir" => config.dir = it.next().map(PathBuf::from).unwrap_or(config.dir),
            "--nodes" => match count(a, it.next(), 2..=8) {
                Ok(n) => nodes = Some(n),
                Err(e) => {
                    eprintln!("lab: {e}");
                    return ExitCode::from(64);
                }
            },
            "--version" => match it.next().map(|v| v.parse::<KubeMinor>()) {
                Some(Ok(m)) => minor = Some(m),
                Some(Err(e)) => {
                    eprintln!("lab: --version: {e:#}");
                    return ExitCode::from(64);
                }
                None => {
                    eprintln!("lab: --version needs a Kubernetes minor such as 1.35");
                    return ExitCode::from(64);
                }
            },
            "--via" => match it.next().map(|v| v.parse::<Via>()) {
                Some(Ok(v)) => via = v,
                Some(Err(e)) => {
                    eprintln!("lab: {e}");
                    return ExitCode::from(64);
                }
                None => {
                    eprintln!("lab: --via needs kustomize or helm");
                    return ExitCode::from(64);
                }
            },
            "--out" | "--tag" | "--profile" | "--recipes" => {
                let Some(value) = it.next() else {
                    eprintln!("lab: {a} needs a value (try --help)");
                    return ExitCode::from(64);
                };
                match a.as_str() {
                    "--out" => images.out = PathBuf::from(value),
                    "--tag" => images.tag = value.clone(),
                    "--recipes" => images.recipes = Some(PathBuf::from(value)),
                    _ => images.profile = value.clone(),
                }
            }
            "--pool" => match count(a, it.next(), 1..=64) {
                Ok(n) => config.pool_luns = n,
                Err(e) => {
                    eprintln!("lab: {e}");
                    return ExitCode::from(64);
                }
            },
            "--pool-large" => match count(a, it.next(), 1..=16) {
                Ok(n) => config.large_pool_luns = n,
                Err(e) => {
                    eprintln!("lab: {e}");
                    return ExitCode::from(64);
                }
            },
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("lab: unknown argument {other:?} (try --help)");
                return ExitCode::from(64);
            }
        }
    }
    match (nodes, kubernetes && config.vm) {
        (Some(2), false) => {
            eprintln!("lab: --nodes 2: must be 3 to 8 (2 only with --kubernetes --vm)");
            return ExitCode::from(64);
        }
        (Some(n), _) => config.nodes = n,
        (None, true) => config.nodes = VM_KUBE_NODES,
        (None, false) => {}
    }
    if minor.is_some() && !kubernetes {
        eprintln!("lab: --version is a Kubernetes minor: it goes with --kubernetes");
        return ExitCode::from(64);
    }
    csi_scsi_certs::install_crypto_provider();
    match cmd.as_deref() {
        Some("images") => match build_images(&images) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("\nlab images: {e:#}");
                ExitCode::FAILURE
            }
        },
        Some("down") => {
            down(&config.dir);
            println!("lab in {} removed", config.dir.display());
            ExitCode::SUCCESS
        }
        Some("up") => {
            let Ok(rt) = tokio::runtime::Runtime::new() else {
                return ExitCode::FAILURE;
            };
            let run = match kubernetes {
                true => rt.block_on(up_kubernetes(config, via, minor, keep)),
                false => rt.block_on(up(config, keep)),
            };
            match run {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("\nlab: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(64)
        }
    }
}

/// `lab node-systemctl <node dir> ARGS`: `systemctl` on a Kubernetes lab
/// node's shell (tests/src/lab/kube/node_shell.rs).
fn node_systemctl(node_dir: &str, args: &[String]) -> ExitCode {
    let run = tokio::runtime::Runtime::new()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(node_shell::systemctl(Path::new(node_dir), args)));
    match run {
        Ok((out, code)) => {
            print!("{out}");
            ExitCode::from(code)
        }
        Err(e) => {
            eprintln!("systemctl: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `lab images`: builds every recipe and prints what it wrote.
fn build_images(opts: &ImageOptions) -> anyhow::Result<()> {
    println!(
        "csi-scsi images: deploy/images/ -> {} (binaries from target/{}/; the Go sidecars \
         from tools/build, about 13 minutes the first time)",
        opts.out.display(),
        opts.profile
    );
    let start = Instant::now();
    let built = csi_scsi_tests::images::build(opts)?;
    let width = |f: fn(&csi_scsi_tests::images::BuiltImage) -> usize, title: &str| {
        built.iter().map(f).chain([title.len()]).max().unwrap_or(0)
    };
    let rw = width(|b| b.reference.len(), "reference");
    let aw = width(|b| b.archive.display().to_string().len(), "archive");
    println!(
        "\n{:<rw$}  {:<aw$}  {:>8}  digest",
        "reference", "archive", "MiB"
    );
    for b in &built {
        println!(
            "{:<rw$}  {:<aw$}  {:>8.1}  {}",
            b.reference,
            b.archive.display(),
            b.bytes as f64 / (1024.0 * 1024.0),
            b.digest
        );
    }
    if opts.pins == Pins::Write {
        println!(
            "\nthe sidecars' digests are written into deploy/base/controller.yaml and \
             deploy/chart/csi-scsi/values.yaml: review and commit them"
        );
    } else {
        println!("\nthe sidecars' digests are the ones deploy/ pins");
    }
    println!(
        "\n{} images in {:.1}s (MiB: the uncompressed layer). Load: \
         ctr -n k8s.io images import FILE, or docker load -i FILE",
        built.len(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

async fn up(config: LabConfig, keep: bool) -> anyhow::Result<()> {
    let start = Instant::now();
    println!(
        "csi-scsi lab: {} nodes in {}",
        config.nodes,
        config.dir.display()
    );
    let dir = config.dir.clone();
    let mut lab = Lab::up(config, &mut |s: &str| println!("  - {s}")).await?;
    println!(
        "  - up in {:.1}s; the volume life cycle, as the sidecars and kubelet drive it:",
        start.elapsed().as_secs_f64()
    );
    let vm = lab.config.vm;
    let report = match scenario::run(&mut lab).await {
        // On VM nodes: what only a real kernel can show, after the life cycle.
        Ok(mut r) if lab.config.vm => csi_scsi_tests::vm::checks::run(&mut lab, &mut r)
            .await
            .map(|()| r),
        other => other,
    };
    let outcome = Outcome {
        dir: &dir,
        logs: "*.log",
        failed_logs: match vm {
            true => "proxy.log, nodes/*/agent.log, nodes/*/console.log",
            false => "proxy.log, node-*.agent.log, nodes/*/kernel.log",
        },
        kept: "describes it",
    };
    outcome.finish(report, keep, move || lab.keep())
}

async fn up_kubernetes(
    config: LabConfig,
    via: Via,
    minor: Option<KubeMinor>,
    keep: bool,
) -> anyhow::Result<()> {
    let start = Instant::now();
    println!(
        "csi-scsi Kubernetes lab: {} nodes in {}",
        config.nodes,
        config.dir.display()
    );
    let dir = config.dir.clone();
    // The failing disks (the agent-crash step stalls them) are served by
    // this process: a kept lab has plain loop devices instead.
    // VM nodes read the LUNs through tgtd, not through the stand-in's
    // loop devices: nothing for the failing disks to serve.
    let vm = config.vm;
    let config = LabConfig {
        faulty_disks: !keep && !vm,
        ..config
    };
    let mut lab = KubeLab::up(config, via, minor, &mut |s: &str| println!("  - {s}")).await?;
    println!(
        "  - up in {:.1}s; the volume life cycle, driven through the Kubernetes API:",
        start.elapsed().as_secs_f64()
    );
    let report = match vm {
        true => csi_scsi_tests::lab::kube::vm_scenario::run(&mut lab).await,
        false => csi_scsi_tests::lab::kube::scenario::run(&mut lab).await,
    };
    let outcome = Outcome {
        dir: &dir,
        logs: "*.log, kube/*.log, nodes/*/kubelet.log, the driver's containers in nodes/*/host/var/log/pods",
        failed_logs: "kube/*.log, nodes/*/kubelet.log, nodes/*/kernel.log, nodes/*/host/var/log/pods/csi-scsi_*/*/*.log",
        kept: "names its kubeconfig",
    };
    outcome.finish(report, keep, move || lab.keep())
}

/// How a lab run ends: what it prints, and `lab.json` when kept.
struct Outcome<'a> {
    dir: &'a std::path::Path,
    logs: &'a str,
    failed_logs: &'a str,
    kept: &'a str,
}

impl Outcome<'_> {
    /// Prints SUCCESS or FAILED; keeps the lab on failure (for its logs)
    /// and, with `--keep`, on success too, writing what `keep` returns.
    fn finish<M: serde::Serialize>(
        &self,
        report: anyhow::Result<scenario::Report>,
        keep: bool,
        keep_lab: impl FnOnce() -> M,
    ) -> anyhow::Result<()> {
        let r = match report {
            Ok(r) => r,
            Err(e) => {
                println!(
                    "\nFAILED (logs kept in {}: {})",
                    self.dir.display(),
                    self.failed_logs
                );
                keep_lab();
                return Err(e);
            }
        };
        println!(
            "\nSUCCESS: {} steps in {:.1}s (logs in {}: {})",
            r.steps.len(),
            r.total().as_secs_f64(),
            self.dir.display(),
            self.logs
        );
        if keep {
            let path = PathBuf::from("lab.json");
            std::fs::write(&path, serde_json::to_vec_pretty(&keep_lab())?)?;
            println!(
                "lab kept running; {} {}; `lab down` removes it",
                path.display(),
                self.kept
            );
        }
        Ok(())
    }
}
