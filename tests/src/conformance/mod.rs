//! Conformance: the real csi-sanity (kubernetes-csi/csi-test, built by
//! `tools/build csi-sanity`) against a fresh lab. The controller side is
//! the proxy, the node side one agent, both behind [`router`] (see there
//! for why). Volumes come from the lab's pool of small LUNs (array-c), in
//! two passes of different test-volume sizes (see [`PASSES`]). Every skip
//! must be listed in `docs/conformance.md` with its reason.

pub mod report;
pub mod router;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use csi_scsi_proto::csi::controller_client::ControllerClient;

use self::report::{Pass, Report, SpecState};
use crate::csi_client::csi_channel;
use crate::lab::scenario::capacity;
use crate::lab::{Lab, LabConfig, POOL_LUN_BYTES};

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// The csi-sanity binary.
    pub sanity: PathBuf,
    /// Where the reports (csi-sanity's log and JSON report) and, under
    /// `lab/`, the lab live.
    pub dir: PathBuf,
    /// Pool LUNs for the suite's volumes.
    pub pool: usize,
    /// Only specs matching this regular expression (ginkgo focus; the
    /// first pass only).
    pub focus: Option<String>,
    /// `docs/conformance.md`, whose skip table every skip must appear in.
    pub documented: Option<PathBuf>,
    /// Leave the lab running afterwards.
    pub keep: bool,
}

/// The StorageClass parameters csi-sanity passes to CreateVolume, as a
/// StorageClass for the pool would (plus the keys the external-provisioner
/// adds itself with `--extra-create-metadata`).
const VOLUME_PARAMETERS: &str = "\
deviceSelector: tier=pool
cleanup: discard
csi.storage.k8s.io/fstype: ext4
csi.storage.k8s.io/pvc/name: csi-sanity
csi.storage.k8s.io/pvc/namespace: conformance
csi.storage.k8s.io/pv/name: pvc-csi-sanity
";

/// The agents' attach limit (`--max-volumes`, reported by NodeGetInfo):
/// set, so csi-sanity's attach-limit spec runs; above what any other spec
/// publishes at once.
const MAX_VOLUMES: u64 = 4;

/// The pool's LUNs: the lab labels array-c's devices `tier=pool`.
const POOL_SELECTOR: &str = "tier=pool";

/// One run of csi-sanity over the same lab, with its own sizes.
struct SanityPass {
    name: &'static str,
    /// `--csi.testvolumesize`.
    volume_bytes: u64,
    /// `--csi.testvolumeexpandsize`.
    expand_bytes: u64,
    focus: Option<&'static str>,
    skip: Option<&'static str>,
}

/// The one spec that needs a volume of exactly the requested size.
const EXACT_SIZE_SPEC: &str = "already existing name and different capacity";

/// A volume is a whole LUN, so no one size of test volume serves every
/// spec: the expansion specs need a volume smaller than its LUN (grown
/// within the LUN, at once, with no resize request: the expanded size is
/// the LUN's), and one CreateVolume spec asks for `limit_bytes` equal to
/// the size and expects exactly that capacity back (only a LUN of exactly
/// that size may be bound). The first pass runs everything but that spec
/// with half-LUN volumes; the second runs the CreateVolume specs again
/// with volumes of exactly a pool LUN's size.
const PASSES: [SanityPass; 2] = [
    SanityPass {
        name: "half-lun",
        volume_bytes: POOL_LUN_BYTES / 2,
        expand_bytes: POOL_LUN_BYTES,
        focus: None,
        skip: Some(EXACT_SIZE_SPEC),
    },
    SanityPass {
        name: "whole-lun",
        volume_bytes: POOL_LUN_BYTES,
        expand_bytes: POOL_LUN_BYTES,
        focus: Some("CreateVolume"),
        skip: None,
    },
];

/// Runs csi-sanity against a fresh lab; the report of every spec.
pub async fn run(opts: &Options, progress: &mut dyn FnMut(&str)) -> anyhow::Result<Report> {
    if !opts.sanity.is_file() {
        bail!(
            "{} is not a csi-sanity binary (build it with tools/build csi-sanity)",
            opts.sanity.display()
        );
    }
    let start = Instant::now();
    let config = LabConfig {
        pool_luns: opts.pool,
        agent_args: vec!["--max-volumes".into(), MAX_VOLUMES.to_string()],
        ..LabConfig::for_test(&opts.dir.join("lab"))
    };
    progress(&format!(
        "lab: {} nodes, {} pool LUNs of {} MiB, agents attach at most {MAX_VOLUMES} volumes",
        config.nodes,
        config.pool_luns,
        POOL_LUN_BYTES >> 20
    ));
    let lab = Lab::up(config, &mut |s: &str| progress(&format!("  {s}"))).await?;
    let dir = lab.config.dir.clone();
    let reports = std::fs::canonicalize(&opts.dir)?;
    let node = &lab.nodes[0];
    progress(&format!(
        "lab up in {:.1}s; node endpoint: {} (through the router)",
        start.elapsed().as_secs_f64(),
        node.name
    ));

    wait_for_pool(&lab, &node.name, opts.pool).await?;
    progress(&format!(
        "discovery found the {} pool LUNs ({:.1}s)",
        opts.pool,
        start.elapsed().as_secs_f64()
    ));

    let router_socket = dir.join("csi-router.sock");
    let router = {
        let (socket, proxy, agent) = (
            router_socket.clone(),
            lab.proxy_csi.clone(),
            node.csi.clone(),
        );
        tokio::spawn(async move { router::serve(&socket, &proxy, &agent).await })
    };
    wait_for_socket(&router_socket).await?;

    // Paths where kubelet would put them: csi-sanity creates the last
    // component itself (mkdir, not -p) and removes it afterwards.
    let pods = node
        .kubelet
        .join("pods/csi-sanity/volumes/kubernetes.io~csi");
    let plugins = node
        .kubelet
        .join("plugins/kubernetes.io/csi/csi-scsi.io/csi-sanity");
    std::fs::create_dir_all(&pods)?;
    std::fs::create_dir_all(&plugins)?;
    let params = reports.join("csi-sanity-parameters.yaml");
    std::fs::write(&params, VOLUME_PARAMETERS)?;
    let endpoint = format!("unix://{}", router_socket.display());

    let mut report = Report::default();
    // Ginkgo ORs repeated focus flags: a user's focus cannot narrow the
    // whole-LUN pass's own, so with one only the first pass runs.
    let passes = if opts.focus.is_some() {
        &PASSES[..1]
    } else {
        &PASSES[..]
    };
    for pass in passes {
        let json = reports.join(format!("csi-sanity-{}.json", pass.name));
        let log = reports.join(format!("csi-sanity-{}.log", pass.name));
        let mut args: Vec<String> = vec![
            format!("--csi.endpoint={endpoint}"),
            format!("--csi.controllerendpoint={endpoint}"),
            format!("--csi.mountdir={}", pods.join("mount").display()),
            format!("--csi.stagingdir={}", plugins.join("globalmount").display()),
            format!("--csi.testvolumeparameters={}", params.display()),
            format!("--csi.testvolumesize={}", pass.volume_bytes),
            format!("--csi.testvolumeexpandsize={}", pass.expand_bytes),
            "--csi.testvolumeaccesstype=mount".into(),
            "--csi.testnodevolumeattachlimit".into(),
            format!("--ginkgo.json-report={}", json.display()),
            "--ginkgo.no-color".into(),
            "--ginkgo.v".into(),
        ];
        args.extend(
            opts.focus
                .as_deref()
                .or(pass.focus)
                .map(|f| format!("--ginkgo.focus={f}")),
        );
        args.extend(pass.skip.map(|s| format!("--ginkgo.skip={s}")));
        progress(&format!(
            "csi-sanity pass {:?}: test volumes of {} MiB, expanded to {} MiB{} (log: {})",
            pass.name,
            pass.volume_bytes >> 20,
            pass.expand_bytes >> 20,
            pass.focus
                .map(|f| format!(", only {f:?}"))
                .unwrap_or_default(),
            log.display()
        ));
        let out = std::fs::File::create(&log)?;
        let status = tokio::process::Command::new(&opts.sanity)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .status()
            .await
            .context("running csi-sanity")?;
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let mut this = Report::parse(&std::fs::read(&json).with_context(|| {
            format!(
                "csi-sanity (exit {status}) wrote no report; its output:\n{}",
                crate::tail::tail(&text, 60)
            )
        })?)?;
        this.passes.push(Pass {
            name: pass.name,
            exit: status.code(),
            tally: tally_line(&text),
        });
        report.merge(this);
    }
    router.abort();

    // With a focus, ginkgo reports every spec outside it as skipped: the
    // documented list covers the whole run only.
    if let (Some(doc), None) = (&opts.documented, &opts.focus) {
        let listed =
            std::fs::read_to_string(doc).with_context(|| format!("reading {}", doc.display()))?;
        report.undocumented_skips = report
            .specs
            .iter()
            .filter(|s| s.state == SpecState::Skipped && !listed.contains(&format!("`{}`", s.name)))
            .map(|s| s.name.clone())
            .collect();
    }
    if opts.keep {
        let _ = lab.keep();
        progress(&format!("lab kept in {}", dir.display()));
    } else {
        drop(lab);
    }
    Ok(report)
}

/// csi-sanity's own closing lines (`Ran N of M Specs ...` and the
/// `SUCCESS!`/`FAIL!` tally).
fn tally_line(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let Some(i) = lines.iter().rposition(|l| l.starts_with("Ran ")) else {
        return String::from("(csi-sanity printed no tally)");
    };
    lines[i..]
        .iter()
        .take(2)
        .map(|l| l.trim())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits (bounded) until the proxy offers every pool LUN on `node`.
async fn wait_for_pool(lab: &Lab, node: &str, pool: usize) -> anyhow::Result<()> {
    let mut controller = ControllerClient::new(csi_channel(&lab.proxy_csi).await?);
    let want = i64::try_from(pool as u64 * POOL_LUN_BYTES)?;
    let start = Instant::now();
    loop {
        let have = capacity(&mut controller, Some(node), POOL_SELECTOR).await?;
        if have == want {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(60) {
            bail!("discovery offers {have} bytes of the pool on {node}, not {want}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn wait_for_socket(path: &Path) -> anyhow::Result<()> {
    for _ in 0..100 {
        if csi_channel(path).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("the csi router did not come up on {}", path.display())
}
