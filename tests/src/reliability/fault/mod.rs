//! The fault suite. Against a lab:
//!
//! 1. **Link down.** A node's link is cut. Calls about it, sent with a
//!    client deadline, come back before that deadline with UNAVAILABLE
//!    naming the node (the proxy works to the caller's `grpc-timeout`), and
//!    a failed publish leaves no publish record. Calls about the other nodes
//!    go on meanwhile. Once the link is back, the same calls succeed within
//!    a bounded retry period.
//! 2. **Rotation under load.** While loops publish and unpublish volumes,
//!    ask for capacity and open fresh mTLS connections to every agent, the
//!    proxy's and every agent's certificate rotate (same CA, new key) the
//!    way a Kubernetes Secret volume rotates, several times. No call fails,
//!    a fresh handshake shows each agent's new certificate, and the proxy
//!    logs the new serial.
//! 3. **Store full, store read-only.** The proxy's store moves to a small
//!    tmpfs. Filled up, then made unwritable: CreateVolume and DeleteVolume
//!    fail with a clear error and the process lives on; reads keep working;
//!    once the fault clears, calls succeed again without a restart, every
//!    acknowledged volume is still there (a repeated CreateVolume answers
//!    the same ID) and `PRAGMA integrity_check` says ok.
//! 4. **Disks that fail.** EIO and stalls on a LUN during stage, detach and
//!    wipe (see [`io_errors`]): refused retryably, nothing written, and
//!    the data (a marker) is there once the disk heals. A LUN that reports
//!    no size, or its old size after the array grew it, during the wipe of
//!    a delete (see [`sizes`]): never Available while the fault stands,
//!    and once healed it reads back as zeroes over its whole recorded size,
//!    from its backing file and through every node that did not wipe it.
//! 5. **Discovery reports that lie** (see [`lies`]): a WWID of another
//!    array (flagged, never merged nor bound) and an oversized report
//!    (refused whole, nothing stored).
//! 6. **A frozen leader with a wipe in flight** (see [`frozen`]): fenced
//!    by a later leader's epoch while frozen, its wipe is refused once it
//!    thaws, and the LUN's new tenant keeps its data.
//!
//! A tmpfs cannot be remounted read-only while the proxy holds its store
//! open for writing (the kernel answers EBUSY), and an ext4 that turns
//! read-only on errors stays so until unmounted. So the suite tries the
//! remount, notes the refusal, and injects EROFS into the proxy's writes to
//! its store files with `strace` instead: the proxy sees what a read-only
//! file system would give it, and the fault can be lifted.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use csi_scsi_certs::{MaterialPaths, MaterialStore, Role, TrustDomain};
use csi_scsi_proto::agent::StatusRequest;
use csi_scsi_proto::agent::agent_client::AgentClient;
use csi_scsi_proto::csi::controller_client::ControllerClient;
use csi_scsi_proto::csi::volume_capability::access_mode::Mode;
use csi_scsi_proto::csi::*;
use fastrand::Rng;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::AsyncBufReadExt;
use tonic::transport::Channel;
use tonic::{Code, Request};

use super::{Scale, SuiteReport, store};
use crate::binaries::binary;
use crate::lab::net::{sh, sh_quiet};
use crate::lab::scenario::{Clients, NODE_KEY, capability, prefer};
use crate::lab::{Lab, LabConfig, POOL_LUN_BYTES, node_name};
use crate::pki::{as_secret_volume, rotate_secret_volume};

mod frozen;
mod io_errors;
mod lies;
mod sizes;

/// The client deadline of every call about a node whose link is cut.
const DEADLINE: Duration = Duration::from_secs(8);
/// The client deadline of a call queued behind another on its volume.
const QUEUED_DEADLINE: Duration = Duration::from_secs(3);
/// Calls about other nodes must finish within this while a link is cut:
/// well under the cut node's calls, which wait out most of [`DEADLINE`].
const OTHER_NODES_BOUND: Duration = Duration::from_secs(5);
/// How long work may take to resume once a fault is lifted.
const RESUME_BOUND: Duration = Duration::from_secs(60);
/// The proxy's own agent deadline in the lab (`--agent-timeout 30`).
const LAB_AGENT_TIMEOUT: Duration = Duration::from_secs(30);
/// The client deadline of calls that are not about a fault.
const PATIENT: Duration = Duration::from_secs(30);
/// How long a rotated certificate may take to show on a fresh handshake
/// (agents poll every 5 s besides watching their files).
const RELOAD_BOUND: Duration = Duration::from_secs(20);
/// Pool LUNs (array-c, 64 MiB each) the suite's volumes bind.
const POOL_LUNS: usize = 10;
/// Size asked for each volume.
const VOLUME_BYTES: i64 = (POOL_LUN_BYTES / 2) as i64;
/// Size of the tmpfs the store moves to.
const STORE_TMPFS: &str = "size=8m,mode=0755";
/// The lab's trust domain (csi-scsi-certs' default).
const TRUST_DOMAIN: &str = "csi-scsi.local";

/// Runs the suite in a lab under `dir`; every random choice comes from
/// `seed`.
pub async fn run(scale: Scale, seed: u64, dir: &Path) -> anyhow::Result<SuiteReport> {
    csi_scsi_certs::install_crypto_provider();
    let started = Instant::now();
    let mut config = LabConfig::for_test(dir);
    config.pool_luns = POOL_LUNS;
    config.faulty_disks = true;
    config.agent_args = vec![
        "--command-timeout".into(),
        io_errors::TOOL_TIMEOUT_SECS.into(),
    ];
    let lab = Lab::up(config, &mut |_| {}).await.context("lab up")?;
    let cl = Clients::connect(&lab).await?;
    let work = lab.config.dir.join("fault");
    std::fs::create_dir_all(&work)?;
    let mut suite = Suite {
        lab,
        cl,
        rng: Rng::with_seed(seed),
        report: SuiteReport::new("fault", seed),
        acked: BTreeMap::new(),
        aborts: 0,
        example: None,
        work,
        other_node_reads: Default::default(),
    };
    suite.discovered().await?;
    let result = async {
        suite
            .link_down(scale.pick(2, 6), scale == Scale::Full)
            .await?;
        suite.rotation(scale.pick(3, 10)).await?;
        suite.store(scale.pick(1, 3)).await?;
        suite.io_errors(scale.pick(1, 3)).await?;
        suite.lies().await?;
        // Last: it leaves every agent fencing this proxy out.
        suite.frozen_leader().await
    }
    .await;
    if let Err(e) = &result {
        eprintln!(
            "[fault] stopped: {e:#}\nproxy log (tail):\n{}",
            crate::tail::tail_file(&suite.lab.config.dir.join("proxy.log"), 40)
        );
    }
    result?;
    let others = suite.other_node_reads.clone();
    suite.report.check(others.reads > 0, || {
        format!(
            "no wiped LUN could be read back through a node that did not wipe it (paths not read: {:?})",
            others.skipped
        )
    });
    suite.report.note(others.summary("wiped LUNs"));
    if suite.aborts > 0 {
        suite.report.note(format!(
            "{} calls answered ABORTED \"changed concurrently\" (the proxy's compare-and-swap lost to another write of the device, a discovery pass) and were retried, as a sidecar would",
            suite.aborts
        ));
    }
    suite.report.elapsed = started.elapsed();
    Ok(suite.report)
}

/// A running suite: the lab, its clients, the random source, the figures,
/// and every volume acknowledged and not deleted.
struct Suite {
    lab: Lab,
    cl: Clients,
    rng: Rng,
    report: SuiteReport,
    acked: BTreeMap<String, Vol>,
    /// ABORTED answers of a lost compare-and-swap, retried.
    aborts: u64,
    /// One UNAVAILABLE answer about a cut node, for the report.
    example: Option<String>,
    work: PathBuf,
    /// Wiped LUNs read back through a node that did not wipe them, and
    /// the paths that could not be read.
    other_node_reads: store::OtherNodeReads,
}

/// A CreateVolume request, repeatable.
#[derive(Clone, Debug)]
struct Spec {
    name: String,
    cleanup: &'static str,
    node: String,
}

/// An acknowledged volume.
#[derive(Clone, Debug)]
struct Vol {
    spec: Spec,
    id: String,
}

/// One controller call.
#[derive(Clone, Debug)]
enum Op {
    Create(Spec),
    Delete(Vol),
    Publish(Vol, String),
    Unpublish(Vol, String),
    Capacity(Option<String>),
}

/// How a call ended.
#[derive(Clone, Debug)]
struct Outcome {
    code: Code,
    message: String,
    took: Duration,
    volume: Option<Volume>,
}

/// What one load loop did.
#[derive(Debug)]
struct Tally {
    what: String,
    ops: u64,
    /// ABORTED answers of a lost compare-and-swap, retried.
    aborts: u64,
    failures: Vec<String>,
}

/// How the store was made unwritable.
enum Unwritable {
    /// `mount -o remount,ro` was accepted.
    Remounted,
    /// strace injects EROFS into the proxy's writes to its store files.
    Injected(tokio::process::Child),
}

// === impl Spec ===

impl Spec {
    fn new(name: impl Into<String>, cleanup: &'static str, node: &str) -> Self {
        Self {
            name: name.into(),
            cleanup,
            node: node.to_owned(),
        }
    }

    fn request(&self) -> CreateVolumeRequest {
        CreateVolumeRequest {
            name: self.name.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: VOLUME_BYTES,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![capability(false, "ext4", Mode::SingleNodeWriter)],
            parameters: [("deviceSelector", "array=c"), ("cleanup", self.cleanup)]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            secrets: Default::default(),
            volume_content_source: None,
            accessibility_requirements: Some(prefer(&self.node)),
            mutable_parameters: Default::default(),
        }
    }
}

// === impl Op ===

impl Op {
    /// Sends the call with `deadline` as its `grpc-timeout`.
    async fn run(&self, c: &ControllerClient<Channel>, deadline: Duration) -> Outcome {
        fn timed<T>(msg: T, deadline: Duration) -> Request<T> {
            let mut r = Request::new(msg);
            r.set_timeout(deadline);
            r
        }
        let mut c = c.clone();
        let start = Instant::now();
        let result = match self {
            Self::Create(spec) => c
                .create_volume(timed(spec.request(), deadline))
                .await
                .map(|r| r.into_inner().volume),
            Self::Delete(v) => c
                .delete_volume(timed(
                    DeleteVolumeRequest {
                        volume_id: v.id.clone(),
                        secrets: Default::default(),
                    },
                    deadline,
                ))
                .await
                .map(|_| None),
            Self::Publish(v, node) => c
                .controller_publish_volume(timed(
                    ControllerPublishVolumeRequest {
                        volume_id: v.id.clone(),
                        node_id: node.clone(),
                        volume_capability: Some(capability(false, "ext4", Mode::SingleNodeWriter)),
                        readonly: false,
                        secrets: Default::default(),
                        volume_context: Default::default(),
                    },
                    deadline,
                ))
                .await
                .map(|_| None),
            Self::Unpublish(v, node) => c
                .controller_unpublish_volume(timed(
                    ControllerUnpublishVolumeRequest {
                        volume_id: v.id.clone(),
                        node_id: node.clone(),
                        secrets: Default::default(),
                    },
                    deadline,
                ))
                .await
                .map(|_| None),
            Self::Capacity(node) => c
                .get_capacity(timed(
                    GetCapacityRequest {
                        volume_capabilities: Vec::new(),
                        parameters: [("deviceSelector".to_owned(), "array=c".to_owned())].into(),
                        accessible_topology: node.as_ref().map(|n| Topology {
                            segments: [(NODE_KEY.to_owned(), n.clone())].into(),
                        }),
                    },
                    deadline,
                ))
                .await
                .map(|_| None),
        };
        let took = start.elapsed();
        match result {
            Ok(volume) => Outcome {
                code: Code::Ok,
                message: String::new(),
                took,
                volume,
            },
            Err(s) => Outcome {
                code: s.code(),
                message: s.message().to_owned(),
                took,
                volume: None,
            },
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Create(s) => write!(f, "CreateVolume {}", s.name),
            Self::Delete(v) => write!(f, "DeleteVolume {}", v.spec.name),
            Self::Publish(v, n) => write!(f, "ControllerPublishVolume {} on {n}", v.spec.name),
            Self::Unpublish(v, n) => {
                write!(f, "ControllerUnpublishVolume {} from {n}", v.spec.name)
            }
            Self::Capacity(Some(n)) => write!(f, "GetCapacity on {n}"),
            Self::Capacity(None) => write!(f, "GetCapacity"),
        }
    }
}

/// Runs `op`, retrying (up to 5 times) an ABORTED answer that a device
/// changed concurrently: the proxy's compare-and-swap lost to a discovery
/// pass that rewrote the device meanwhile, and a sidecar retries ABORTED.
/// Returns the last outcome (timed from the first try) and the retries.
async fn run_retrying_aborts(
    op: &Op,
    c: &ControllerClient<Channel>,
    deadline: Duration,
) -> (Outcome, u64) {
    let start = Instant::now();
    let mut retries = 0;
    loop {
        let mut o = op.run(c, deadline).await;
        if o.code == Code::Aborted && o.message.contains("changed concurrently") && retries < 5 {
            retries += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        o.took = start.elapsed();
        return (o, retries);
    }
}

// === impl Outcome ===

impl Outcome {
    fn ok(&self) -> bool {
        self.code == Code::Ok
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.ok() {
            write!(f, "OK after {} ms", self.took.as_millis())
        } else {
            write!(
                f,
                "{:?} after {} ms: {}",
                self.code,
                self.took.as_millis(),
                self.message
            )
        }
    }
}

// === impl Tally ===

impl Tally {
    fn new(what: String) -> Self {
        Self {
            what,
            ops: 0,
            aborts: 0,
            failures: Vec::new(),
        }
    }

    fn record(&mut self, what: impl fmt::Display, outcome: Result<(), String>) {
        self.ops += 1;
        if let Err(e) = outcome {
            self.failures.push(format!("{what}: {e}"));
        }
    }
}

// === impl Suite ===

impl Suite {
    /// Sends `op` and counts it.
    async fn call(&mut self, op: &Op, deadline: Duration) -> Outcome {
        self.report.op();
        op.run(&self.cl.controller, deadline).await
    }

    /// Sends `op` until it succeeds or `bound` has passed; returns the last
    /// outcome and the time it took.
    async fn until_ok(&mut self, op: &Op, bound: Duration) -> (Outcome, Duration) {
        let start = Instant::now();
        loop {
            let o = self.call(op, DEADLINE).await;
            if o.ok() || start.elapsed() >= bound {
                return (o, start.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Runs `op`, which must succeed (retried for a while, as a sidecar
    /// would); records a violation otherwise. Returns whether it succeeded.
    async fn must(&mut self, op: &Op, when: &str) -> bool {
        let (o, took) = self.until_ok(op, RESUME_BOUND).await;
        self.report.check(o.ok(), || {
            format!(
                "{when}: {op} did not succeed within {:.0}s: {o}",
                took.as_secs_f64()
            )
        })
    }

    /// Creates and acknowledges a volume (setup: failing is an error).
    async fn create(&mut self, spec: Spec) -> anyhow::Result<Vol> {
        let (o, _) = self.until_ok(&Op::Create(spec.clone()), RESUME_BOUND).await;
        let volume = o
            .volume
            .clone()
            .with_context(|| format!("CreateVolume {}: {o}", spec.name))?;
        let vol = Vol {
            id: volume.volume_id,
            spec,
        };
        self.acked.insert(vol.spec.name.clone(), vol.clone());
        Ok(vol)
    }

    /// Deletes `vol`, which must succeed.
    async fn delete(&mut self, vol: &Vol, when: &str) {
        if self.must(&Op::Delete(vol.clone()), when).await {
            self.acked.remove(&vol.spec.name);
        }
    }

    /// Waits until discovery has seen every LUN of the lab.
    async fn discovered(&mut self) -> anyhow::Result<()> {
        let want: i64 = self
            .lab
            .luns
            .values()
            .map(|p| std::fs::metadata(p).map(|m| m.len() as i64).unwrap_or(0))
            .sum();
        let start = Instant::now();
        let mut have = 0;
        while start.elapsed() < Duration::from_secs(120) {
            let mut c = self.cl.controller.clone();
            have = crate::lab::scenario::capacity(&mut c, None, "").await?;
            if have == want {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        bail!("discovery: {have} bytes available, {want} expected")
    }

    /// Whether the proxy process is still the one started last.
    fn proxy_alive(&mut self) -> Option<u32> {
        let proxy = self.lab.proxy.as_mut()?;
        proxy.try_exit().is_none().then(|| proxy.pid())
    }

    /// Every acknowledged volume still exists: CreateVolume with the same
    /// request answers the same ID.
    async fn verify_acked(&mut self, when: &str) {
        let acked: Vec<Vol> = self.acked.values().cloned().collect();
        for vol in acked {
            let (o, _) = self
                .until_ok(&Op::Create(vol.spec.clone()), RESUME_BOUND)
                .await;
            let got = o.volume.as_ref().map(|v| v.volume_id.clone());
            self.report
                .check(got.as_deref() == Some(vol.id.as_str()), || {
                    format!(
                        "{when}: acknowledged volume {} ({}) came back as {got:?}: {o}",
                        vol.spec.name, vol.id
                    )
                });
        }
    }

    /// `PRAGMA integrity_check` of the store says ok.
    fn integrity(&mut self, when: &str) {
        let db = self.lab.proxy_store();
        let said = store::integrity(&db);
        self.report
            .check(matches!(&said, Ok(s) if s.trim() == "ok"), || {
                format!("{when}: integrity_check of {}: {said:?}", db.display())
            });
    }

    // --- 1. link down ---

    /// `rounds` times: cut one node's link, check the calls about it and
    /// about the others, bring it back and check that work resumes. With
    /// `patient`, one more call in the first round carries a deadline
    /// longer than the proxy's own agent deadline, which must then apply.
    async fn link_down(&mut self, rounds: usize, patient: bool) -> anyhow::Result<()> {
        let n = self.lab.nodes.len();
        let mut order: Vec<usize> = (0..n).collect();
        self.rng.shuffle(&mut order);
        let mut cut_calls = Vec::new();
        let mut other_calls = Vec::new();
        let mut resumed = Vec::new();
        for round in 0..rounds {
            let x = order[round % n];
            let (cut, other, resume) = self
                .link_down_round(round, x, patient && round == 0)
                .await?;
            cut_calls.extend(cut);
            other_calls.extend(other);
            resumed.push(resume);
        }
        let mut cut_ms: Vec<u128> = cut_calls.iter().map(|d| d.as_millis()).collect();
        let mut other_ms: Vec<u128> = other_calls.iter().map(|d| d.as_millis()).collect();
        let mut resume_ms: Vec<u128> = resumed.iter().map(|d| d.as_millis()).collect();
        self.report.note(format!(
            "link down: {rounds} cut(s); {} calls about the cut node answered UNAVAILABLE in p50/max {}/{} ms (client deadline {} ms)",
            cut_ms.len(),
            p50(&mut cut_ms),
            max(&cut_ms),
            DEADLINE.as_millis()
        ));
        if let Some(e) = self.example.take() {
            self.report.note(format!("link down: e.g. {e}"));
        }
        self.report.note(format!(
            "link down: {} calls about other nodes meanwhile, p50/max {}/{} ms",
            other_ms.len(),
            p50(&mut other_ms),
            max(&other_ms)
        ));
        self.report.note(format!(
            "link down: work resumed after the link came back in p50/max {}/{} ms",
            p50(&mut resume_ms),
            max(&resume_ms)
        ));
        Ok(())
    }

    /// One cut of node `x`. Returns the times of the calls about `x`, of
    /// the calls about other nodes, and until work resumed.
    async fn link_down_round(
        &mut self,
        round: usize,
        x: usize,
        patient: bool,
    ) -> anyhow::Result<(Vec<Duration>, Vec<Duration>, Duration)> {
        let n = self.lab.nodes.len();
        let xname = node_name(x);
        let y = (x + 1 + self.rng.usize(..n - 1)) % n;
        let yname = node_name(y);
        // p: published on x before the cut; x: to publish on x during it;
        // y: published elsewhere during it; d: deleted during it.
        let vp = self
            .create(Spec::new(format!("ld{round}-p"), "none", &xname))
            .await?;
        let vx = self
            .create(Spec::new(format!("ld{round}-x"), "none", &xname))
            .await?;
        let vy = self
            .create(Spec::new(format!("ld{round}-y"), "none", &yname))
            .await?;
        let vd = self
            .create(Spec::new(format!("ld{round}-d"), "discard", &xname))
            .await?;
        let vq = match patient {
            true => Some(
                self.create(Spec::new(format!("ld{round}-q"), "none", &xname))
                    .await?,
            ),
            false => None,
        };
        let o = self
            .call(&Op::Publish(vp.clone(), xname.clone()), PATIENT)
            .await;
        ensure!(
            o.ok(),
            "publishing {} on {xname} before the cut: {o}",
            vp.spec.name
        );

        self.lab.net.set_node_link(x, false)?;
        self.report.fault();
        let mut about_x = vec![
            Op::Publish(vx.clone(), xname.clone()),
            Op::Unpublish(vp.clone(), xname.clone()),
            Op::Delete(vd.clone()),
        ];
        self.rng.shuffle(&mut about_x);
        let about_others = vec![
            Op::Publish(vy.clone(), yname.clone()),
            Op::Capacity(Some(yname.clone())),
            Op::Unpublish(vy.clone(), yname.clone()),
        ];
        let c = self.cl.controller.clone();
        let x_calls = futures::future::join_all(about_x.iter().map(|op| op.run(&c, DEADLINE)));
        // A second publish of the same volume waits for the first one's
        // lock, and must give up (ABORTED) by its own, shorter deadline.
        let queued = Op::Publish(vx.clone(), xname.clone());
        let queued_call = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            queued.run(&c, QUEUED_DEADLINE).await
        };
        // A caller that would wait longer than the proxy's own deadline.
        let long_call = async {
            match &vq {
                Some(vq) => {
                    let op = Op::Unpublish(vq.clone(), xname.clone());
                    Some(op.run(&c, 4 * LAB_AGENT_TIMEOUT).await)
                }
                None => None,
            }
        };
        let other_calls = async {
            let mut out = Vec::new();
            for op in &about_others {
                out.push(run_retrying_aborts(op, &c, DEADLINE).await);
            }
            out
        };
        let (x_outcomes, other_outcomes, queued_outcome, long_outcome) =
            tokio::join!(x_calls, other_calls, queued_call, long_call);
        self.report.operations += (about_x.len() + about_others.len() + 1) as u64;
        let o = queued_outcome;
        self.report.check(
            o.code == Code::Aborted && o.took < QUEUED_DEADLINE,
            || format!(
                "round {round}: {queued} behind another publish of it, with a {} ms deadline: {o} (want ABORTED in time)",
                QUEUED_DEADLINE.as_millis()
            ),
        );
        if let Some(o) = long_outcome {
            self.report.op();
            self.report.check(
                o.code == Code::Unavailable
                    && o.message.contains(&xname)
                    && o.took < LAB_AGENT_TIMEOUT + Duration::from_secs(5),
                || format!(
                    "round {round}: ControllerUnpublishVolume from {xname} with a {} s deadline and the link down: {o} (want UNAVAILABLE naming {xname} by the proxy's own {} s)",
                    (4 * LAB_AGENT_TIMEOUT).as_secs(),
                    LAB_AGENT_TIMEOUT.as_secs()
                ),
            );
        }

        let mut cut_times = Vec::new();
        let mut other_times = Vec::new();
        for (op, o) in about_x.iter().zip(&x_outcomes) {
            // A delete wipes through the nodes that see the LUN, one after
            // the other, until one has the device: it may get done without
            // the cut node, or wait on it.
            if matches!(op, Op::Delete(_)) && o.ok() {
                self.report.check(o.took < OTHER_NODES_BOUND, || {
                    format!("round {round}: {op} (through another node while {xname} is cut): {o}")
                });
                other_times.push(o.took);
                continue;
            }
            cut_times.push(o.took);
            if self.example.is_none() && o.code == Code::Unavailable {
                self.example = Some(format!("{op}: {}", o.message));
            }
            self.report.check(o.code == Code::Unavailable, || {
                format!("round {round}: {op} with {xname}'s link down: {o} (want UNAVAILABLE)")
            });
            self.report.check(o.message.contains(&xname), || {
                format!("round {round}: {op} with {xname}'s link down: the error does not name {xname}: {o}")
            });
            self.report.check(o.took < DEADLINE, || {
                format!("round {round}: {op} with {xname}'s link down took {} ms, past the client deadline", o.took.as_millis())
            });
        }
        for (op, (o, aborts)) in about_others.iter().zip(&other_outcomes) {
            self.report.operations += aborts;
            self.aborts += aborts;
            other_times.push(o.took);
            self.report.check(o.ok() && o.took < OTHER_NODES_BOUND, || {
                format!(
                    "round {round}: {op} while {xname}'s link is down: {o} (want OK within {} ms)",
                    OTHER_NODES_BOUND.as_millis()
                )
            });
        }
        // Both failed calls kept their records: an attach whose answer was
        // lost may have happened (doubt is not "not attached"), and a
        // detach that did not happen leaves the LUN attached.
        let published = |me: &mut Self, vol: &Vol| {
            let mut c = me.cl.controller.clone();
            let id = vol.id.clone();
            me.report.op();
            async move {
                c.controller_get_volume(ControllerGetVolumeRequest { volume_id: id })
                    .await
                    .map(|r| {
                        r.into_inner()
                            .status
                            .map(|s| s.published_node_ids)
                            .unwrap_or_default()
                    })
            }
        };
        let on_x = published(self, &vx).await;
        let log = self.lab.config.dir.join("proxy.log");
        self.report.check(
            matches!(&on_x, Ok(nodes) if nodes.contains(&xname)),
            || {
                let undo = std::fs::read_to_string(&log)
                    .unwrap_or_default()
                    .lines()
                    .rfind(|l| l.contains("could not undo the publish record"))
                    .map(|l| format!("; the proxy logged: {}", l.trim()))
                    .unwrap_or_default();
                format!(
                    "round {round}: after the publish whose answer was lost, {} is recorded as published on {on_x:?} (want {xname} kept: the attach may have happened){undo}",
                    vx.spec.name
                )
            },
        );
        let on_p = published(self, &vp).await;
        self.report.check(
            matches!(&on_p, Ok(nodes) if nodes.contains(&xname)),
            || format!("round {round}: after the failed unpublish, {} is recorded as published on {on_p:?}", vp.spec.name),
        );

        self.lab.net.set_node_link(x, true)?;
        let (o, resumed) = self
            .until_ok(&Op::Publish(vx.clone(), xname.clone()), RESUME_BOUND)
            .await;
        self.report.check(o.ok(), || {
            format!("round {round}: {xname}'s link is back, but publishing {} there still fails after {} ms: {o}", vx.spec.name, resumed.as_millis())
        });
        let when = format!("round {round}, {xname}'s link back");
        for op in [
            Op::Unpublish(vp.clone(), xname.clone()),
            Op::Unpublish(vx.clone(), xname.clone()),
        ] {
            self.must(&op, &when).await;
        }
        for v in [Some(&vd), Some(&vp), Some(&vx), Some(&vy), vq.as_ref()]
            .into_iter()
            .flatten()
        {
            self.delete(v, &when).await;
        }
        Ok((cut_times, other_times, resumed))
    }

    // --- 2. rotation under load ---

    /// Rotates the proxy's and every agent's certificate `rotations` times
    /// while the load loops run.
    async fn rotation(&mut self, rotations: usize) -> anyhow::Result<()> {
        let pki = self.lab.config.dir.join("pki");
        let ca = pki.join("ca/ca.crt");
        let proxy_tls = pki.join("proxy-tls");
        let nodes: Vec<(String, SocketAddr, PathBuf)> = self
            .lab
            .nodes
            .iter()
            .map(|n| (n.name.clone(), n.api, pki.join(format!("{}-tls", n.name))))
            .collect();
        // The lab writes plain directories: lay them out as Secret volumes
        // (same files, so nothing reloads) before rotating them that way.
        for dir in nodes.iter().map(|n| &n.2).chain([&proxy_tls]) {
            if !dir.join("..data").exists() {
                as_secret_volume(dir);
            }
        }
        for (node, api, dir) in &nodes {
            let leaf = served_leaf(*api, node, &ca, &proxy_tls).await?;
            ensure!(
                leaf == first_cert(&dir.join("tls.crt"))?,
                "{node} does not serve the certificate in {}",
                dir.display()
            );
        }

        // The load: publish loops (one volume each), capacity loops, and
        // fresh mTLS connections to every agent.
        let names: Vec<String> = nodes.iter().map(|n| n.0.clone()).collect();
        let mut vols = Vec::new();
        for i in 0..3 {
            let node = &names[self.rng.usize(..names.len())];
            vols.push(
                self.create(Spec::new(format!("rot-{i}"), "none", node))
                    .await?,
            );
        }
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for v in &vols {
            tasks.push(tokio::spawn(publish_loop(
                self.cl.controller.clone(),
                v.clone(),
                names.clone(),
                self.rng.u64(..),
                stop.clone(),
            )));
        }
        for _ in 0..2 {
            tasks.push(tokio::spawn(capacity_loop(
                self.cl.controller.clone(),
                names.clone(),
                self.rng.u64(..),
                stop.clone(),
            )));
        }
        let domain = TrustDomain::new(TRUST_DOMAIN)?;
        for (node, api, _) in &nodes {
            let store = MaterialStore::load(
                MaterialPaths::in_dir(&proxy_tls),
                Role::Proxy,
                domain.clone(),
            )?;
            store.watch(Duration::from_secs(1));
            tasks.push(tokio::spawn(status_loop(
                node.clone(),
                *api,
                store,
                self.rng.u64(..),
                stop.clone(),
            )));
        }

        let window = Instant::now();
        let mut reload_ms = Vec::new();
        let mut rotation_error = None;
        for r in 1..=rotations {
            tokio::time::sleep(Duration::from_millis(self.rng.u64(1500..3000))).await;
            if let Err(e) = self
                .rotate_once(r, &ca, &proxy_tls, &nodes, &mut reload_ms)
                .await
            {
                rotation_error = Some(e);
                break;
            }
        }
        // Load goes on a little after the last rotation.
        tokio::time::sleep(Duration::from_secs(2)).await;
        stop.store(true, Ordering::Relaxed);
        let mut tallies = Vec::new();
        for t in tasks {
            tallies.push(t.await.context("load loop")?);
        }
        let window = window.elapsed();
        if let Some(e) = rotation_error {
            return Err(e);
        }
        let mut by_kind = BTreeMap::<String, u64>::new();
        for t in &tallies {
            self.report.operations += t.ops;
            *by_kind
                .entry(t.what.split(' ').next().unwrap_or("").to_owned())
                .or_default() += t.ops;
            self.report.check(t.ops > 0, || {
                format!("rotation: the load loop {} never ran", t.what)
            });
            self.report.check(t.failures.is_empty(), || {
                format!(
                    "rotation: {} of {} calls of {} failed: {}",
                    t.failures.len(),
                    t.ops,
                    t.what,
                    t.failures
                        .iter()
                        .take(3)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(" | ")
                )
            });
        }
        self.aborts += tallies.iter().map(|t| t.aborts).sum::<u64>();
        let failed: usize = tallies.iter().map(|t| t.failures.len()).sum();
        let total: u64 = tallies.iter().map(|t| t.ops).sum();
        self.report.note(format!(
            "rotation: {rotations} rotations of {} certificates in {:.1}s; {total} calls during rotation ({}), {failed} failed",
            nodes.len() + 1,
            window.as_secs_f64(),
            by_kind
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        self.report.note(format!(
            "rotation: an agent's new certificate showed on a fresh handshake after p50/max {}/{} ms",
            p50(&mut reload_ms),
            max(&reload_ms)
        ));
        Ok(())
    }

    /// Rotation number `r`: new certificates from the same CA for every
    /// agent and the proxy, swapped in the way kubelet updates a Secret
    /// volume, in a random order; then every agent must present its new
    /// one and the proxy must have loaded its own.
    async fn rotate_once(
        &mut self,
        r: usize,
        ca: &Path,
        proxy_tls: &Path,
        nodes: &[(String, SocketAddr, PathBuf)],
        reload_ms: &mut Vec<u128>,
    ) -> anyhow::Result<()> {
        let pki = self.lab.config.dir.join("pki");
        let mut fresh = Vec::new();
        for (node, _, _) in nodes {
            fresh.push(issue(&pki, Some(node), &format!("{node}-r{r}")).await?);
        }
        let proxy_fresh = issue(&pki, None, &format!("proxy-r{r}")).await?;
        let proxy_serial = MaterialStore::load(
            MaterialPaths::in_dir(&proxy_fresh),
            Role::Proxy,
            TrustDomain::new(TRUST_DOMAIN)?,
        )?
        .current()
        .serial()
        .to_owned();
        let mut order: Vec<usize> = (0..=nodes.len()).collect();
        self.rng.shuffle(&mut order);
        let generation = u32::try_from(r)?;
        for &i in &order {
            match nodes.get(i) {
                Some((_, _, dir)) => rotate_secret_volume(dir, &fresh[i], generation),
                None => rotate_secret_volume(proxy_tls, &proxy_fresh, generation),
            }
            self.report.fault();
        }
        let rotated = Instant::now();
        for (i, (node, api, _)) in nodes.iter().enumerate() {
            let want = first_cert(&fresh[i].join("tls.crt"))?;
            let mut last = None;
            while rotated.elapsed() < RELOAD_BOUND {
                self.report.op();
                match served_leaf(*api, node, ca, proxy_tls).await {
                    Ok(leaf) if leaf == want => {
                        last = None;
                        break;
                    }
                    Ok(_) => last = Some("the old certificate".to_owned()),
                    Err(e) => last = Some(format!("{e:#}")),
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            reload_ms.push(rotated.elapsed().as_millis());
            self.report.check(last.is_none(), || {
                format!(
                    "rotation {r}: {node} still presents {} {} s after its files rotated",
                    last.clone().unwrap_or_default(),
                    RELOAD_BOUND.as_secs()
                )
            });
        }
        let log = self.lab.config.dir.join("proxy.log");
        let loaded = || {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .lines()
                .any(|l| l.contains("loaded rotated TLS material") && l.contains(&proxy_serial))
        };
        while !loaded() && rotated.elapsed() < RELOAD_BOUND {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.report.check(loaded(), || {
            format!(
                "rotation {r}: the proxy did not load its new certificate (serial {proxy_serial})"
            )
        });
        Ok(())
    }

    // --- 3. store full, store unwritable ---

    /// Moves the store to a small tmpfs, fills it and makes it unwritable
    /// `cycles` times, then moves it back.
    async fn store(&mut self, cycles: usize) -> anyhow::Result<()> {
        let proxy_dir = self.lab.config.dir.join("proxy");
        let aside = self.work.join("store-aside");
        self.set_store_aside(&proxy_dir, &aside)?;
        let dir = proxy_dir.display().to_string();
        sh(
            "mount",
            &["-t", "tmpfs", "-o", STORE_TMPFS, "csi-scsi-fault", &dir],
        )?;
        copy_files(&aside, &proxy_dir)?;
        self.restart_proxy().await?;
        for cycle in 0..cycles {
            self.store_full(cycle, &proxy_dir).await?;
            self.store_unwritable(cycle, &proxy_dir).await?;
        }
        // Back to the lab's own directory.
        self.set_store_aside(&proxy_dir, &aside)?;
        sh("umount", &[&dir])?;
        for e in std::fs::read_dir(&proxy_dir)?.flatten() {
            std::fs::remove_file(e.path())?;
        }
        copy_files(&aside, &proxy_dir)?;
        self.restart_proxy().await?;
        self.verify_acked("the store back on disk").await;
        self.integrity("the store back on disk");
        Ok(())
    }

    /// Stops the proxy, folds the WAL into the database and moves the
    /// store's files to `aside`, leaving the directory empty.
    fn set_store_aside(&mut self, proxy_dir: &Path, aside: &Path) -> anyhow::Result<()> {
        self.lab.kill_proxy();
        store::run(&self.lab.proxy_store(), "PRAGMA wal_checkpoint(TRUNCATE);")?;
        if aside.exists() {
            std::fs::remove_dir_all(aside)?;
        }
        std::fs::create_dir_all(aside)?;
        copy_files(proxy_dir, aside)?;
        for e in std::fs::read_dir(proxy_dir)?.flatten() {
            std::fs::remove_file(e.path())?;
        }
        Ok(())
    }

    async fn restart_proxy(&mut self) -> anyhow::Result<()> {
        self.lab.restart_proxy().await?;
        self.cl = Clients::connect(&self.lab).await?;
        Ok(())
    }

    /// Reads are served while writes are refused, and the proxy stays
    /// ready.
    async fn reads_go_on(&mut self, when: &str) {
        let op = Op::Capacity(None);
        let o = self.call(&op, DEADLINE).await;
        self.report
            .check(o.ok(), || format!("{when}: {op} (a read): {o}"));
        let ready = http_status(self.lab.proxy_status, "/readyz").await;
        self.report.check(matches!(ready, Ok(200)), || {
            format!("{when}: the proxy's /readyz answered {ready:?}")
        });
    }

    /// A refused CreateVolume of `name` left no binding in the store.
    fn no_binding(&mut self, when: &str, name: &str) {
        let bound = store::run(
            &self.lab.proxy_store(),
            &format!("SELECT count(*) FROM devices WHERE volume_name = '{name}';"),
        );
        self.report
            .check(matches!(&bound, Ok(n) if n.trim() == "0"), || {
                format!("{when}: the refused CreateVolume {name} left a binding: {bound:?}")
            });
    }

    /// Checks that `o` is a clear refusal from an unusable store.
    fn refused(&mut self, when: &str, op: &Op, o: &Outcome, says: &str) {
        self.report.check(
            matches!(o.code, Code::Unavailable | Code::ResourceExhausted),
            || format!("{when}: {op}: {o} (want UNAVAILABLE or RESOURCE_EXHAUSTED)"),
        );
        self.report.check(
            o.message.contains("inventory store") && o.message.contains(says),
            || format!("{when}: {op}: the error does not say the store {says}: {o}"),
        );
    }

    /// The store's file system fills up, then frees again.
    async fn store_full(&mut self, cycle: usize, proxy_dir: &Path) -> anyhow::Result<()> {
        let node = node_name(self.rng.usize(..self.lab.nodes.len()));
        self.create(Spec::new(format!("st{cycle}-a"), "none", &node))
            .await?;
        let victim = self
            .create(Spec::new(format!("st{cycle}-b"), "none", &node))
            .await?;
        let pid = self.proxy_alive().context("proxy")?;
        let junk = proxy_dir.join("junk");
        let filled = fill(&junk)?;
        self.report.fault();
        let when = format!("store full (cycle {cycle})");
        let refused = Spec::new(format!("st{cycle}-full"), "none", &node);
        self.writes_refused(&when, &refused, &victim, pid, "is full")
            .await;

        std::fs::remove_file(&junk)?;
        self.no_binding(&when, &refused.name);
        let when = format!("store freed (cycle {cycle})");
        self.create(refused.clone()).await?;
        self.recovered(&when, &refused, &victim, pid).await;
        if cycle == 0 {
            self.report.note(format!(
                "store full: {} KiB of junk filled the 8 MiB tmpfs; writes refused, reads served, no restart needed",
                filled >> 10
            ));
        }
        Ok(())
    }

    /// While the store is at fault: CreateVolume of `refused` and
    /// DeleteVolume of `victim` are refused saying `says`, reads go on, and
    /// the proxy (`pid`) lives.
    async fn writes_refused(
        &mut self,
        when: &str,
        refused: &Spec,
        victim: &Vol,
        pid: u32,
        says: &str,
    ) {
        for op in [Op::Create(refused.clone()), Op::Delete(victim.clone())] {
            let o = self.call(&op, DEADLINE).await;
            self.refused(when, &op, &o, says);
        }
        self.reads_go_on(when).await;
        let alive = self.proxy_alive() == Some(pid);
        self.report
            .check(alive, || format!("{when}: the proxy (pid {pid}) is gone"));
    }

    /// Once the fault is lifted: `victim` deletes, the same proxy (`pid`)
    /// still runs, every acknowledged volume is there, the store is
    /// intact; `refused`'s LUN is given back for the next cycles.
    async fn recovered(&mut self, when: &str, refused: &Spec, victim: &Vol, pid: u32) {
        self.delete(victim, when).await;
        let alive = self.proxy_alive() == Some(pid);
        self.report.check(alive, || {
            format!("{when}: the proxy restarted (pid {pid} is gone)")
        });
        self.verify_acked(when).await;
        self.integrity(when);
        if let Some(vol) = self.acked.get(&refused.name).cloned() {
            self.delete(&vol, when).await;
        }
    }

    /// The store's file system refuses writes, then takes them again.
    async fn store_unwritable(&mut self, cycle: usize, proxy_dir: &Path) -> anyhow::Result<()> {
        let node = node_name(self.rng.usize(..self.lab.nodes.len()));
        let victim = self
            .create(Spec::new(format!("st{cycle}-c"), "none", &node))
            .await?;
        let pid = self.proxy_alive().context("proxy")?;
        let Some(fault) = self.make_unwritable(cycle, proxy_dir, pid).await? else {
            return Ok(());
        };
        self.report.fault();
        let when = format!("store unwritable (cycle {cycle})");
        let refused = Spec::new(format!("st{cycle}-ro"), "none", &node);
        self.writes_refused(&when, &refused, &victim, pid, "cannot be written")
            .await;

        lift(fault, proxy_dir).await?;
        self.no_binding(&when, &refused.name);
        let when = format!("store writable again (cycle {cycle})");
        let (o, took) = self
            .until_ok(&Op::Create(refused.clone()), RESUME_BOUND)
            .await;
        self.report.check(o.ok(), || {
            format!(
                "{when}: CreateVolume {} still fails after {} ms: {o}",
                refused.name,
                took.as_millis()
            )
        });
        if o.ok() {
            self.create(refused.clone()).await?;
        }
        self.recovered(&when, &refused, &victim, pid).await;
        if cycle == 0 {
            self.report.note(format!(
                "store unwritable: writes refused, reads served; CreateVolume succeeded {} ms after the fault lifted, same process",
                took.as_millis()
            ));
        }
        Ok(())
    }

    /// Makes the store unwritable under the running proxy `pid`: a
    /// read-only remount if the kernel allows it, else EROFS injected into
    /// the proxy's writes to its store files. `None` when neither is
    /// possible (a violation).
    async fn make_unwritable(
        &mut self,
        cycle: usize,
        proxy_dir: &Path,
        pid: u32,
    ) -> anyhow::Result<Option<Unwritable>> {
        let dir = proxy_dir.display().to_string();
        match sh("mount", &["-o", "remount,ro", &dir]) {
            Ok(_) => {
                self.report
                    .note("store unwritable: the tmpfs was remounted read-only");
                return Ok(Some(Unwritable::Remounted));
            }
            Err(e) if cycle == 0 => self.report.note(format!(
                "store unwritable: `mount -o remount,ro` refused while the proxy holds its store open ({}); EROFS injected into the proxy's store writes with strace",
                e.to_string()
                    .lines()
                    .next()
                    .and_then(|l| l.rsplit(": ").next())
                    .unwrap_or_default()
                    .trim_end_matches('.')
            )),
            Err(_) => {}
        }
        let installed = sh("sh", &["-c", "command -v strace"]).is_ok();
        if !self.report.check(installed, || {
            "store unwritable: strace is not installed, so EROFS cannot be injected (install it: .ci/packages)".into()
        }) {
            return Ok(None);
        }
        let db = self.lab.proxy_store().display().to_string();
        let (wal, shm) = (format!("{db}-wal"), format!("{db}-shm"));
        let mut strace = tokio::process::Command::new("strace")
            .args([
                "-f",
                "-p",
                &pid.to_string(),
                "-o",
                "/dev/null",
                "-P",
                &db,
                "-P",
                &wal,
                "-P",
                &shm,
                "-e",
                "inject=write,pwrite64,pwritev,pwritev2,ftruncate,fallocate:error=EROFS",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting strace")?;
        let stderr = strace.stderr.take().context("strace stderr")?;
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        let attached = tokio::time::timeout(Duration::from_secs(10), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains("attached") {
                    return true;
                }
            }
            false
        })
        .await
        .unwrap_or(false);
        ensure!(attached, "strace did not attach to the proxy (pid {pid})");
        // Keep draining its messages (one per new thread).
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Some(Unwritable::Injected(strace)))
    }
}

/// Lifts `fault`: remounts read-write, or detaches strace.
async fn lift(fault: Unwritable, proxy_dir: &Path) -> anyhow::Result<()> {
    match fault {
        Unwritable::Remounted => {
            sh(
                "mount",
                &["-o", "remount,rw", &proxy_dir.display().to_string()],
            )?;
        }
        Unwritable::Injected(mut strace) => {
            // SIGINT: strace detaches from every thread and exits.
            if let Some(pid) = strace.id() {
                sh_quiet("kill", &["-INT", &pid.to_string()]);
            }
            if tokio::time::timeout(Duration::from_secs(10), strace.wait())
                .await
                .is_err()
            {
                strace.kill().await?;
                bail!("strace did not detach within 10 s");
            }
        }
    }
    Ok(())
}

/// Publishes `vol` on a random node and unpublishes it, until `stop`.
async fn publish_loop(
    c: ControllerClient<Channel>,
    vol: Vol,
    nodes: Vec<String>,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> Tally {
    let mut rng = Rng::with_seed(seed);
    let mut tally = Tally::new(format!("publish/unpublish {}", vol.spec.name));
    while !stop.load(Ordering::Relaxed) {
        let node = nodes[rng.usize(..nodes.len())].clone();
        for op in [
            Op::Publish(vol.clone(), node.clone()),
            Op::Unpublish(vol.clone(), node.clone()),
        ] {
            let (o, aborts) = run_retrying_aborts(&op, &c, PATIENT).await;
            tally.aborts += aborts;
            tally.ops += aborts;
            tally.record(&op, if o.ok() { Ok(()) } else { Err(o.to_string()) });
        }
    }
    tally
}

/// Asks for capacity (anywhere or on a random node), until `stop`.
async fn capacity_loop(
    c: ControllerClient<Channel>,
    nodes: Vec<String>,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> Tally {
    let mut rng = Rng::with_seed(seed);
    let mut tally = Tally::new("GetCapacity".into());
    while !stop.load(Ordering::Relaxed) {
        let node = rng.bool().then(|| nodes[rng.usize(..nodes.len())].clone());
        let op = Op::Capacity(node);
        let o = op.run(&c, PATIENT).await;
        tally.record(&op, if o.ok() { Ok(()) } else { Err(o.to_string()) });
        tokio::time::sleep(Duration::from_millis(rng.u64(20..80))).await;
    }
    tally
}

/// Opens a fresh mTLS connection to `node`'s agent with the proxy's
/// (reloading) certificate and calls Status, until `stop`.
async fn status_loop(
    node: String,
    api: SocketAddr,
    store: Arc<MaterialStore>,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> Tally {
    let mut rng = Rng::with_seed(seed);
    let mut tally = Tally::new(format!("Status on {node}'s agent, fresh connections"));
    while !stop.load(Ordering::Relaxed) {
        let outcome = async {
            let channel = csi_scsi_daemon::agent_channel(
                &api.to_string(),
                &node,
                store.clone(),
                Duration::from_secs(5),
            )
            .map_err(|e| e.to_string())?;
            let mut request = Request::new(StatusRequest {});
            request.set_timeout(Duration::from_secs(10));
            AgentClient::new(channel)
                .status(request)
                .await
                .map(|_| ())
                .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
        }
        .await;
        tally.record(format!("Status on {node}"), outcome);
        tokio::time::sleep(Duration::from_millis(rng.u64(30..120))).await;
    }
    tally
}

/// Issues a certificate from the lab's CA into `pki/<out>`: node `node`'s
/// agent certificate, or the proxy's.
async fn issue(pki: &Path, node: Option<&str>, out: &str) -> anyhow::Result<PathBuf> {
    let dir = pki.join(out);
    let ca = pki.join("ca").display().to_string();
    let target = dir.display().to_string();
    let mut args = match node {
        Some(node) => vec!["issue-agent", "--node", node],
        None => vec!["issue-proxy"],
    };
    args.extend(["--ca", &ca, "--out", &target]);
    let out = tokio::process::Command::new(binary("csi-scsi-certs"))
        .args(&args)
        .output()
        .await?;
    ensure!(
        out.status.success(),
        "csi-scsi-certs {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(dir)
}

/// The leaf certificate `node`'s agent presents on a fresh mutual TLS
/// handshake (no resumption), as the proxy whose files are in `client`.
async fn served_leaf(
    api: SocketAddr,
    node: &str,
    ca: &Path,
    client: &Path,
) -> anyhow::Result<Vec<u8>> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca)? {
        roots.add(c?)?;
    }
    let chain =
        CertificateDer::pem_file_iter(client.join("tls.crt"))?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(client.join("tls.key"))?;
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    config.resumption = rustls::client::Resumption::disabled();
    let name = ServerName::try_from(node.to_owned())?;
    let handshake = async {
        let tcp = tokio::net::TcpStream::connect(api).await?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await?;
        let leaf = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .context("no certificate presented")?
            .to_vec();
        anyhow::Ok(leaf)
    };
    tokio::time::timeout(Duration::from_secs(5), handshake)
        .await
        .context("handshake timed out")?
}

/// The HTTP status code of `GET path` on `addr`.
async fn http_status(addr: SocketAddr, path: &str) -> anyhow::Result<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).await?;
        let head = String::from_utf8_lossy(&answer);
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .with_context(|| format!("not HTTP: {head:.80}"))?;
        anyhow::Ok(code)
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .context("no answer within 5 s")?
}

/// The first certificate of a PEM file, DER-encoded.
fn first_cert(path: &Path) -> anyhow::Result<Vec<u8>> {
    Ok(CertificateDer::from_pem_file(path)
        .with_context(|| path.display().to_string())?
        .to_vec())
}

/// Copies every regular file of `from` into `to` (sockets stay behind).
fn copy_files(from: &Path, to: &Path) -> anyhow::Result<()> {
    for e in std::fs::read_dir(from)?.flatten() {
        if e.file_type()?.is_file() {
            std::fs::copy(e.path(), to.join(e.file_name()))
                .with_context(|| format!("copying {}", e.path().display()))?;
        }
    }
    Ok(())
}

/// Writes `path` until its file system is full; returns the bytes written.
fn fill(path: &Path) -> anyhow::Result<u64> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    let mut written = 0u64;
    // Ever smaller writes, down to one byte: the file system is full, not
    // merely short of one large block.
    for chunk in [1usize << 20, 64 << 10, 4 << 10, 512, 1] {
        let buf = vec![0xa5u8; chunk];
        loop {
            match f.write(&buf) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(written)
}

/// The median of `v` (sorted in place); 0 when empty.
fn p50(v: &mut [u128]) -> u128 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// The largest of `v`; 0 when empty.
fn max(v: &[u128]) -> u128 {
    v.iter().copied().max().unwrap_or(0)
}
