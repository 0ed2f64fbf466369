//! The storage e2e step of `lab up --kubernetes --vm`: Kubernetes' own
//! storage tests (the suite `conformance --kubernetes` runs against the
//! fast lab, [`crate::storage_e2e`]) on nodes whose kubelet, mounts and
//! disks sit on Debian's real kernel, so the suite's test Pods that enter
//! "the node" enter a guest. Under TCG a spec takes minutes, so the step
//! runs a focused subset ([`SPECS`]), chosen for what the real kernel
//! changes (docs/conformance.md, "On the real kernel"). The suite's
//! images reach each guest's containerd through the lab's guest helper.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use csi_scsi_proxy::device::Phase;
use csi_scsi_proxy::resources::SCSIDevice;

use super::KubeLab;
use super::api::Typed;
use super::node::{IMPORT_ARGS, tag_args};
use super::scenario::phase;
use super::targets::{POOL_TARGET, create_pool_target};
use super::vm_node::GUEST_IMAGES_DIR;
use crate::kube::GoTools;
use crate::storage_e2e::{self, Kernel, Options, SuiteImages};
use crate::vm::guest::Guest;

/// Small LUNs (64 MiB) in the step's pool: two parallel specs of two
/// volumes each, with room for LUNs still being wiped.
pub const POOL_LUNS: usize = 6;
/// Large LUNs (1 GiB) in it: the online expansion spec starts at 1 GiB.
pub const LARGE_POOL_LUNS: usize = 2;

/// The definition the step runs: the fast lab's ext4 one (the pool's
/// StorageClass, every capability claimed there).
const DRIVER: &str = "tests/storage-e2e/csi-scsi-ext4.yaml";

/// The specs run (ginkgo focus alternatives, within External Storage;
/// names as at Kubernetes 1.37): data through a filesystem and through a
/// raw map, two volumes moved to the other node, the mounts and maps the
/// suite checks on the node itself, a subPath, one writer only, capacity,
/// and the online ext4 grow that the fast lab's kernel refuses. Each
/// selects exactly one spec: a suite that passes fewer (a spec renamed by
/// a Kubernetes release) fails the step rather than passing on less.
pub const SPECS: &[&str] = &[
    r"\[Testpattern: Dynamic PV \(default fs\)\] volumes should store data",
    r"\[Testpattern: Dynamic PV \(block volmode\)\] volumes should store data",
    r"\[Testpattern: Dynamic PV \(filesystem volmode\)\] multiVolume should access to two volumes with the same volume mode and retain data across pod recreation on different node",
    r"\[Testpattern: Dynamic PV \(block volmode\)\] volumeMode should not mount / map unused volumes in a pod",
    r"\[Testpattern: Dynamic PV \(default fs\)\(allowExpansion\)\] volume-expand should resize volume when PVC is edited while pod is using it",
    r"\[Testpattern: Dynamic PV \(default fs\)\] subPath should support existing directory",
    r"\[Testpattern: Dynamic PV \(default fs\)\] capacity provides storage capacity information",
    r"\[Testpattern: Dynamic PV \(default fs\)\] read-write-once-pod should block a second pod from using an in-use ReadWriteOncePod volume on the same node",
];

/// [`SPECS`] as one ginkgo focus.
fn focus() -> String {
    SPECS.join("|")
}

/// Parallel specs: one per guest.
const PROCS: usize = 2;

/// How long the guests may take to log in to the pool and map its LUNs.
const POOL_WAIT: Duration = Duration::from_secs(600);

/// Where a guest keeps an archive while its containerd imports it: beside
/// the images its init imports.
fn guest_archive() -> PathBuf {
    Path::new("/").join(GUEST_IMAGES_DIR).join("e2e.tar")
}

/// A guest helper write at most this large: the helper holds a write in
/// memory.
const CHUNK: usize = 16 << 20;

/// The step: the pool declared, the suite's images into every guest, the
/// subset run; the suite's tally, or the failures.
pub async fn storage_e2e(lab: &mut KubeLab) -> anyhow::Result<String> {
    let started = Instant::now();
    let minor = lab.plane.tools.kubernetes();
    let tools = tokio::task::spawn_blocking(move || {
        GoTools::build_at(Some(minor), &["e2e.test", "ginkgo"])
    })
    .await??;
    let pool = pool_ready(lab).await?;
    let opts = Options {
        e2e: tools.path("e2e.test").to_owned(),
        drivers: vec![PathBuf::from(DRIVER)],
        focus: Some(focus()),
        skip: None,
        kernel: Kernel::Real,
        disruptive: false,
        out: lab.lab.config.dir.join("storage-e2e"),
        ginkgo: Some(tools.path("ginkgo").to_owned()),
        procs: PROCS,
    };
    let built = {
        let opts = opts.clone();
        tokio::task::spawn_blocking(move || storage_e2e::build_images(&opts)).await??
    };
    let imported_at = Instant::now();
    for n in &lab.lab.nodes {
        let vm = n.vm.as_ref().context("a VM node")?;
        import_into_guest(&vm.guest, &built)
            .await
            .with_context(|| format!("the suite's images into {}", n.name))?;
    }
    let imported = imported_at.elapsed();
    let manifest = lab.manifest();
    let passes = {
        let opts = opts.clone();
        tokio::task::spawn_blocking(move || {
            storage_e2e::run_passes(&manifest, &opts, &mut |s: &str| println!("      {s}"))
        })
        .await??
    };
    let report = storage_e2e::render(&passes);
    anyhow::ensure!(
        passes.iter().all(storage_e2e::Pass::passed),
        "the suite failed on the real-kernel nodes (logs in {}):\n{report}",
        opts.out.display()
    );
    let passed: usize = passes
        .iter()
        .map(|p| p.specs.iter().filter(|s| s.passed()).count())
        .sum();
    anyhow::ensure!(
        passed == SPECS.len(),
        "{passed} of the {} specs the step names passed (one renamed by a Kubernetes release, or skipped at run time?):\n{report}",
        SPECS.len()
    );
    Ok(format!(
        "{pool}; {} images into {} guests in {:.0}s; {:.0}s in all\n{}",
        built.built.len(),
        lab.lab.nodes.len(),
        imported.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        indent(&report)
    ))
}

/// Declares the pool's target and waits until every guest sees each of
/// its LUNs and each is Available.
async fn pool_ready(lab: &KubeLab) -> anyhow::Result<String> {
    let guests = lab.lab.nodes.len();
    let luns = lab.lab.config.pool_luns + lab.lab.config.large_pool_luns;
    create_pool_target(lab)?;
    let started = Instant::now();
    lab.kubectl
        .wait_for(
            &format!("{luns} pool LUNs Available, each seen by {guests} guests"),
            POOL_WAIT,
            |k| {
                let ready = k
                    .objects::<SCSIDevice>(&[])?
                    .iter()
                    .filter(|d| d.spec.target == POOL_TARGET)
                    .filter(|d| phase(d) == Some(Phase::Available))
                    .filter(|d| seen_by(d) == guests)
                    .count();
                Ok((ready == luns).then_some(()))
            },
        )
        .await?;
    Ok(format!(
        "{luns} pool LUNs on {POOL_TARGET} seen by {guests} guests after {:.0}s",
        started.elapsed().as_secs_f64()
    ))
}

/// How many nodes see `device`.
fn seen_by(device: &SCSIDevice) -> usize {
    device.status.as_ref().map_or(0, |s| {
        s.nodes
            .iter()
            .map(|v| v.node.as_str())
            .collect::<BTreeSet<_>>()
            .len()
    })
}

/// Copies each image's archive into the guest, has its containerd import
/// it (the namespace kubelet uses), and tags the aliases the suite names.
async fn import_into_guest(guest: &Guest, images: &SuiteImages) -> anyhow::Result<()> {
    let to = guest_archive();
    let archive = to.display().to_string();
    for image in &images.built {
        copy_into(guest, &image.archive, &to).await?;
        let mut import = in_cri_namespace(&IMPORT_ARGS);
        import.push(&archive);
        guest
            .run(&import)
            .await
            .with_context(|| format!("importing {}", image.reference))?;
        // The guest's root is memory: the archive goes once imported.
        guest.run(&["rm", "-f", archive.as_str()]).await?;
    }
    for (alias, image) in &images.aliases {
        guest
            .run(&in_cri_namespace(&tag_args(image, alias)))
            .await
            .with_context(|| format!("tagging {image} as {alias}"))?;
    }
    Ok(())
}

/// The guest's `ctr` with `args`, in the namespace kubelet uses.
fn in_cri_namespace<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec!["ctr", "-n", "k8s.io"];
    all.extend_from_slice(args);
    all
}

/// Writes the host's file `from` to `to` in the guest, a chunk read at a
/// time (off the runtime's workers: the archives are tens of MiB).
async fn copy_into(guest: &Guest, from: &Path, to: &Path) -> anyhow::Result<()> {
    use tokio::io::AsyncReadExt;
    let mut file = tokio::fs::File::open(from)
        .await
        .with_context(|| format!("opening {}", from.display()))?;
    let mut chunk = vec![0u8; CHUNK];
    let mut offset = None;
    loop {
        let mut filled = 0;
        while filled < CHUNK {
            let n = file
                .read(&mut chunk[filled..])
                .await
                .with_context(|| format!("reading {}", from.display()))?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        if filled == 0 {
            break;
        }
        guest.write(to, offset, &chunk[..filled]).await?;
        offset = Some(offset.unwrap_or(0) + filled as u64);
        if filled < CHUNK {
            break;
        }
    }
    Ok(())
}

/// `text` indented to sit under a step's line.
fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("      {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}
