//! The crash suite. Workers run whole volume life cycles (create, publish,
//! stage, publish, write, unpublish, unstage, unpublish, delete) against a
//! lab while a chaos task SIGKILLs the proxy and the agents at seeded
//! random moments and restarts them. Every step is retried, as the
//! sidecars and kubelet retry, until it converges. Then targeted strikes
//! kill an agent in the middle of an Attach, a Detach and a Wipe.
//!
//! Invariants, checked while the proxy is dead (the store cannot move) and
//! at the end:
//! - no LUN is answered for two live volumes;
//! - every acknowledged CreateVolume is in the store, bound by name and
//!   binding UID, and a repeated CreateVolume answers the same ID;
//! - every Available LUN reads as zeroes end to end, over at least the
//!   size the store records (each class here asks for `zero` or
//!   `discard`);
//! - every step converges within its window, and in the end every LUN is
//!   Available again, no mount is left and the store passes
//!   `PRAGMA integrity_check`;
//! - no volume with data was formatted: every volume is staged a second
//!   time after its marker was written, often while its disk fails for a
//!   moment (EIO on reads of its head; see [`crate::disks`]), and the
//!   marker must read back. Its wipe sometimes meets EIO on every write
//!   for a moment too, and must still converge. (Stalls are the fault
//!   suite's: in this lab a stalled loop device holds the loop driver's
//!   configuration lock, so every node's attaches would wait behind it,
//!   which a real SCSI layer does not do.)

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use csi_scsi_proto::csi::controller_client::ControllerClient;
use csi_scsi_proto::csi::node_client::NodeClient;
use csi_scsi_proto::csi::volume_capability::access_mode::Mode;
use csi_scsi_proto::csi::*;
use fastrand::Rng;
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::ledger::Ledger;
use super::{Scale, SuiteReport, store};
use crate::csi_client::csi_channel;
use crate::disks::{DiskControl, Fault};
use crate::lab::scenario::{capability, kubelet_paths, prefer};
use crate::lab::{Lab, LabConfig, POOL_LUN_BYTES};
use crate::tgt::LunIdentity;

/// The target whose LUNs the workload uses.
const POOL_TARGET: &str = "array-c";
/// How long one step may take to converge, retries included.
const CONVERGE: Duration = Duration::from_secs(90);
/// The client deadline of one attempt: a hang shows up as a retry.
const ATTEMPT: Duration = Duration::from_secs(30);
/// A LUN's head, where the probe reads first and filesystems keep their
/// superblocks.
const HEAD: u64 = 1 << 20;

/// What to run.
#[derive(Clone, Debug)]
pub struct CrashOptions {
    /// Quick (CI) or full.
    pub scale: Scale,
    /// Seed of every random choice.
    pub seed: u64,
    /// Where the lab lives.
    pub dir: PathBuf,
    /// Extra environment of the proxy (`CSI_SCSI_FAULT=skip-cas` proves
    /// the suite catches a broken compare-and-swap).
    pub proxy_env: Vec<(String, String)>,
    /// Kill processes (false: the same workload, no faults).
    pub chaos: bool,
    /// Stop the workload at the first violation.
    pub stop_on_violation: bool,
}

impl CrashOptions {
    /// The suite as CI and the full run use it.
    pub fn new(scale: Scale, seed: u64, dir: &Path) -> Self {
        Self {
            scale,
            seed,
            dir: dir.to_owned(),
            proxy_env: Vec::new(),
            chaos: true,
            stop_on_violation: false,
        }
    }
}

/// Runs the crash suite with its defaults.
pub async fn run(scale: Scale, seed: u64, dir: &Path) -> anyhow::Result<SuiteReport> {
    run_with(CrashOptions::new(scale, seed, dir)).await
}

/// Runs the crash suite.
pub async fn run_with(opts: CrashOptions) -> anyhow::Result<SuiteReport> {
    let started = Instant::now();
    let workers = opts.scale.pick(4, 8);
    let ops = opts.scale.pick(300, 2000);
    let pool = opts.scale.pick(8, 16);
    let strikes = opts.scale.pick(2, 6);

    let mut config = LabConfig::for_test(&opts.dir);
    config.pool_luns = pool;
    config.proxy_env = opts.proxy_env.clone();
    config.faulty_disks = true;
    config.agent_args = vec!["--command-timeout".into(), "10".into()];
    let lab = Lab::up(config, &mut |_| {}).await.context("lab up")?;
    let suite = Arc::new(Suite::new(lab, &opts, ops).await);
    suite.wait_for_pool(pool).await?;

    // Phase 1: the workload under random kills of every process.
    let mut handles = Vec::new();
    for w in 0..workers {
        let s = suite.clone();
        let mut rng =
            Rng::with_seed(opts.seed ^ (w as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        handles.push(tokio::spawn(async move { s.worker(w, &mut rng).await }));
    }
    let chaos = opts.chaos.then(|| {
        let s = suite.clone();
        let mut rng = Rng::with_seed(opts.seed);
        tokio::spawn(async move { s.chaos(&mut rng).await })
    });
    for h in handles {
        h.await.context("worker panicked")?;
    }
    suite.workers_done.store(true, Ordering::SeqCst);
    if let Some(c) = chaos {
        c.await.context("chaos task panicked")??;
    }

    // Phase 2: kills in the middle of an Attach, a Detach and a Wipe.
    if opts.chaos && !suite.stopped() {
        let mut rng = Rng::with_seed(opts.seed.rotate_left(17));
        for round in 0..strikes {
            for step in [StrikeAt::Attach, StrikeAt::Detach, StrikeAt::Wipe] {
                if suite.stopped() {
                    break;
                }
                let node = rng.usize(..suite.nodes.len());
                let name = format!("strike-{round}-{}", step.name());
                suite.cycle(&name, node, &mut rng, Some(step)).await;
            }
        }
    }

    // Phase 3: convergence and the final invariants.
    suite.finish(pool).await?;
    let mut report = std::mem::take(&mut *locked(&suite.report));
    report.elapsed = started.elapsed();
    let retries = suite.retries.load(Ordering::Relaxed);
    let hangs = suite.hangs.load(Ordering::Relaxed);
    report.note(format!(
        "workers {workers}, pool LUNs {pool}, volumes created {} and deleted {}, attempts retried {retries}, attempts that hit the {}s client deadline {hangs}",
        suite.created.load(Ordering::Relaxed),
        locked(&suite.ledger).deleted,
        ATTEMPT.as_secs(),
    ));
    let kills = locked(&suite.kills).clone();
    report.note(format!(
        "kills: proxy {}, agents {}; with a call in flight: CreateVolume {}, ControllerPublish {}, ControllerUnpublish {}, DeleteVolume {}, Node* {}",
        kills.proxy, kills.agent, kills.during[0], kills.during[1], kills.during[2], kills.during[3], kills.during[4]
    ));
    let others = locked(&suite.other_node_reads).clone();
    report.check(others.reads > 0, || {
        format!(
            "no Available LUN could be read back through a node that did not wipe it (paths not read: {:?})",
            others.skipped
        )
    });
    report.note(others.summary("Available LUNs"));
    let io = locked(&suite.io).clone();
    report.note(format!(
        "failing disks: re-stages of a volume with data {} (with EIO on its head {}), markers intact {}; wipes meeting write EIO {}",
        io.restages, io.head_eio, io.intact, io.wipe_eio
    ));
    report.note(format!(
        "targeted strikes landing mid-call (agent killed before the call returned): Attach {}/{}, Detach {}/{}, Wipe {}/{}",
        kills.mid[0].0, kills.mid[0].1, kills.mid[1].0, kills.mid[1].1, kills.mid[2].0, kills.mid[2].1,
    ));
    Ok(report)
}

/// Where a targeted strike lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StrikeAt {
    /// ControllerPublishVolume: the agent's Attach.
    Attach,
    /// ControllerUnpublishVolume: the agent's Detach.
    Detach,
    /// DeleteVolume: the agent's Wipe (every agent is killed: any may wipe).
    Wipe,
}

impl StrikeAt {
    fn name(self) -> &'static str {
        match self {
            Self::Attach => "attach",
            Self::Detach => "detach",
            Self::Wipe => "wipe",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Kill counts for the report.
#[derive(Clone, Debug, Default)]
struct Kills {
    proxy: u64,
    agent: u64,
    /// Kills with a call of each kind in flight (see `Kind::slot`).
    during: [u64; 5],
    /// Targeted strikes: (landed mid-call, total) per `StrikeAt`.
    mid: [(u64, u64); 3],
}

/// The calls of a life cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Create,
    Publish,
    Stage,
    NodePublish,
    NodeUnpublish,
    Unstage,
    Unpublish,
    Delete,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::Create => "CreateVolume",
            Self::Publish => "ControllerPublishVolume",
            Self::Stage => "NodeStageVolume",
            Self::NodePublish => "NodePublishVolume",
            Self::NodeUnpublish => "NodeUnpublishVolume",
            Self::Unstage => "NodeUnstageVolume",
            Self::Unpublish => "ControllerUnpublishVolume",
            Self::Delete => "DeleteVolume",
        }
    }

    /// Slot in `Kills::during` and `Suite::inflight`.
    fn slot(self) -> usize {
        match self {
            Self::Create => 0,
            Self::Publish => 1,
            Self::Unpublish => 2,
            Self::Delete => 3,
            _ => 4,
        }
    }
}

/// One volume as the workload drives it.
#[derive(Debug)]
struct Vol<'a> {
    name: String,
    node: usize,
    block: bool,
    cleanup: &'static str,
    id: String,
    context: HashMap<String, String>,
    publish: HashMap<String, String>,
    staging: PathBuf,
    target: PathBuf,
    /// Attempts made for this volume (the workload's operation budget).
    attempts: &'a AtomicU64,
}

impl Vol<'_> {
    fn capability(&self) -> VolumeCapability {
        capability(
            self.block,
            if self.block { "" } else { "ext4" },
            Mode::SingleNodeWriter,
        )
    }
}

/// What one attempt answered.
enum Answer {
    Created(Volume),
    Published(HashMap<String, String>),
    Done,
}

/// What the failing-disk leg did, for the report.
#[derive(Clone, Debug, Default)]
struct IoFaults {
    restages: u64,
    head_eio: u64,
    intact: u64,
    wipe_eio: u64,
}

struct Suite {
    lab: tokio::sync::Mutex<Lab>,
    /// The lab's failing disks, and each pool LUN's disk name by WWID.
    disks: Option<DiskControl>,
    disk_names: HashMap<String, String>,
    io: Mutex<IoFaults>,
    proxy_csi: PathBuf,
    nodes: Vec<NodePaths>,
    report: Mutex<SuiteReport>,
    ledger: Mutex<Ledger>,
    kills: Mutex<Kills>,
    inflight: [AtomicU64; 5],
    ops_left: AtomicU64,
    workers_done: AtomicBool,
    stop: AtomicBool,
    stop_on_violation: bool,
    retries: AtomicU64,
    hangs: AtomicU64,
    created: AtomicU64,
    durations: Mutex<HashMap<&'static str, Duration>>,
    /// The seed, and how many store checks ran (each reads at offsets of
    /// its own).
    seed: u64,
    checks: AtomicU64,
    /// Available LUNs read back through a node that did not wipe them,
    /// and the paths that could not be read.
    other_node_reads: Mutex<store::OtherNodeReads>,
}

struct NodePaths {
    name: String,
    csi: PathBuf,
    kubelet: PathBuf,
}

impl Suite {
    async fn new(lab: Lab, opts: &CrashOptions, ops: u64) -> Self {
        let nodes = lab
            .nodes
            .iter()
            .map(|n| NodePaths {
                name: n.name.clone(),
                csi: n.csi.clone(),
                kubelet: n.kubelet.clone(),
            })
            .collect();
        let disks = lab.disks.as_ref().map(|d| DiskControl::clone(d));
        let disk_names = (1..=lab.config.pool_luns as u64)
            .map(|n| {
                (
                    format!("naa.{}", LunIdentity::lab(3, n).scsi_id),
                    format!("c{n}"),
                )
            })
            .collect();
        Self {
            proxy_csi: lab.proxy_csi.clone(),
            lab: tokio::sync::Mutex::new(lab),
            disks,
            disk_names,
            io: Mutex::new(IoFaults::default()),
            nodes,
            report: Mutex::new(SuiteReport::new("crash", opts.seed)),
            ledger: Mutex::new(Ledger::default()),
            kills: Mutex::new(Kills::default()),
            inflight: Default::default(),
            ops_left: AtomicU64::new(ops),
            workers_done: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            stop_on_violation: opts.stop_on_violation,
            retries: AtomicU64::new(0),
            hangs: AtomicU64::new(0),
            created: AtomicU64::new(0),
            durations: Mutex::new(HashMap::new()),
            seed: opts.seed,
            checks: AtomicU64::new(0),
            other_node_reads: Mutex::default(),
        }
    }

    fn report(&self) -> std::sync::MutexGuard<'_, SuiteReport> {
        locked(&self.report)
    }

    fn check(&self, holds: bool, what: impl FnOnce() -> String) -> bool {
        let ok = self.report().check(holds, what);
        if !ok && self.stop_on_violation {
            self.stop.store(true, Ordering::SeqCst);
        }
        ok
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Waits until discovery has found every pool LUN.
    async fn wait_for_pool(&self, pool: usize) -> anyhow::Result<()> {
        let db = self.lab.lock().await.proxy_store();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let rows = store::devices(&db, POOL_TARGET).unwrap_or_default();
            let seen = rows.iter().filter(|r| r.phase == "Available").count();
            if seen == pool {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "discovery found {seen} of {pool} pool LUNs"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn controller(&self) -> Result<ControllerClient<Channel>, Status> {
        csi_channel(&self.proxy_csi)
            .await
            .map(ControllerClient::new)
            .map_err(|e| Status::unavailable(format!("proxy socket: {e}")))
    }

    async fn node(&self, i: usize) -> Result<NodeClient<Channel>, Status> {
        csi_channel(&self.nodes[i].csi)
            .await
            .map(NodeClient::new)
            .map_err(|e| Status::unavailable(format!("agent socket: {e}")))
    }

    /// One attempt of `kind` on `vol`.
    async fn attempt(&self, kind: Kind, vol: &Vol<'_>) -> Result<Answer, Status> {
        fn req<T>(m: T) -> tonic::Request<T> {
            let mut r = tonic::Request::new(m);
            r.set_timeout(ATTEMPT);
            r
        }
        let node_id = self.nodes[vol.node].name.clone();
        match kind {
            Kind::Create => {
                let mut c = self.controller().await?;
                let r = c
                    .create_volume(req(create_request(vol, &node_id)))
                    .await?
                    .into_inner();
                r.volume
                    .map(Answer::Created)
                    .ok_or_else(|| Status::internal("CreateVolume answered no volume"))
            }
            Kind::Publish => {
                let mut c = self.controller().await?;
                let r = c
                    .controller_publish_volume(req(ControllerPublishVolumeRequest {
                        volume_id: vol.id.clone(),
                        node_id,
                        volume_capability: Some(vol.capability()),
                        readonly: false,
                        secrets: HashMap::new(),
                        volume_context: vol.context.clone(),
                    }))
                    .await?;
                Ok(Answer::Published(r.into_inner().publish_context))
            }
            Kind::Unpublish => {
                let mut c = self.controller().await?;
                c.controller_unpublish_volume(req(ControllerUnpublishVolumeRequest {
                    volume_id: vol.id.clone(),
                    node_id,
                    secrets: HashMap::new(),
                }))
                .await?;
                Ok(Answer::Done)
            }
            Kind::Delete => {
                let mut c = self.controller().await?;
                c.delete_volume(req(DeleteVolumeRequest {
                    volume_id: vol.id.clone(),
                    secrets: HashMap::new(),
                }))
                .await?;
                Ok(Answer::Done)
            }
            Kind::Stage => {
                let mut n = self.node(vol.node).await?;
                n.node_stage_volume(req(NodeStageVolumeRequest {
                    volume_id: vol.id.clone(),
                    publish_context: vol.publish.clone(),
                    staging_target_path: vol.staging.display().to_string(),
                    volume_capability: Some(vol.capability()),
                    secrets: HashMap::new(),
                    volume_context: vol.context.clone(),
                }))
                .await?;
                Ok(Answer::Done)
            }
            Kind::NodePublish => {
                let mut n = self.node(vol.node).await?;
                n.node_publish_volume(req(NodePublishVolumeRequest {
                    volume_id: vol.id.clone(),
                    publish_context: vol.publish.clone(),
                    staging_target_path: vol.staging.display().to_string(),
                    target_path: vol.target.display().to_string(),
                    volume_capability: Some(vol.capability()),
                    readonly: false,
                    secrets: HashMap::new(),
                    volume_context: vol.context.clone(),
                }))
                .await?;
                Ok(Answer::Done)
            }
            Kind::NodeUnpublish => {
                let mut n = self.node(vol.node).await?;
                n.node_unpublish_volume(req(NodeUnpublishVolumeRequest {
                    volume_id: vol.id.clone(),
                    target_path: vol.target.display().to_string(),
                }))
                .await?;
                Ok(Answer::Done)
            }
            Kind::Unstage => {
                let mut n = self.node(vol.node).await?;
                n.node_unstage_volume(req(NodeUnstageVolumeRequest {
                    volume_id: vol.id.clone(),
                    staging_target_path: vol.staging.display().to_string(),
                }))
                .await?;
                Ok(Answer::Done)
            }
        }
    }

    /// Retries `kind` until it succeeds, as a sidecar or kubelet would;
    /// `None` (and a violation) when it does not converge.
    async fn converge(&self, kind: Kind, vol: &Vol<'_>, rng: &mut Rng) -> Option<Answer> {
        let start = Instant::now();
        self.inflight[kind.slot()].fetch_add(1, Ordering::SeqCst);
        let out = loop {
            self.report().op();
            vol.attempts.fetch_add(1, Ordering::Relaxed);
            let t = Instant::now();
            let r = self.attempt(kind, vol).await;
            let code = r.as_ref().err().map(Status::code).unwrap_or(Code::Ok);
            if code == Code::Ok {
                locked(&self.durations).insert(kind.name(), t.elapsed());
                break r.ok();
            }
            let err = r.err().unwrap_or_else(|| Status::unknown(""));
            if code == Code::DeadlineExceeded && t.elapsed() >= ATTEMPT {
                self.hangs.fetch_add(1, Ordering::Relaxed);
            }
            if retryable(kind, code) && start.elapsed() < CONVERGE && !self.stopped() {
                self.retries.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(rng.u64(50..250))).await;
                continue;
            }
            if !self.stopped() {
                self.check(false, || {
                    format!(
                        "{} of {} ({}) did not converge after {:.1}s: {:?} {}",
                        kind.name(),
                        vol.name,
                        vol.id,
                        start.elapsed().as_secs_f64(),
                        code,
                        err.message()
                    )
                });
            }
            break None;
        };
        self.inflight[kind.slot()].fetch_sub(1, Ordering::SeqCst);
        out
    }

    /// A worker: life cycles until the operation budget is spent.
    async fn worker(&self, w: usize, rng: &mut Rng) {
        let mut k = 0;
        while !self.stopped() && self.ops_left.load(Ordering::SeqCst) > 0 {
            let node = rng.usize(..self.nodes.len());
            let name = format!("crash-{w}-{k}");
            let (ok, spent) = self.cycle(&name, node, rng, None).await;
            let _ = self
                .ops_left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| {
                    Some(l.saturating_sub(spent))
                });
            if !ok {
                break;
            }
            k += 1;
        }
    }

    /// One life cycle of volume `name` on node `node`; with `strike`, the
    /// agent is killed in the middle of that step. False when a step did
    /// not converge.
    async fn cycle(
        &self,
        name: &str,
        node: usize,
        rng: &mut Rng,
        strike: Option<StrikeAt>,
    ) -> (bool, u64) {
        let attempts = AtomicU64::new(0);
        let ok = self.steps(name, node, rng, strike, &attempts).await;
        (ok, attempts.load(Ordering::Relaxed))
    }

    async fn steps(
        &self,
        name: &str,
        node: usize,
        rng: &mut Rng,
        strike: Option<StrikeAt>,
        attempts: &AtomicU64,
    ) -> bool {
        let block = rng.u8(..4) == 0;
        let mut vol = Vol {
            name: name.to_owned(),
            node,
            block,
            cleanup: if rng.bool() { "zero" } else { "discard" },
            id: String::new(),
            context: HashMap::new(),
            publish: HashMap::new(),
            staging: PathBuf::new(),
            target: PathBuf::new(),
            attempts,
        };
        // CreateVolume, retried while the pool is exhausted by the others.
        let Some(Answer::Created(v)) = self.converge(Kind::Create, &vol, rng).await else {
            return false;
        };
        self.created.fetch_add(1, Ordering::Relaxed);
        vol.id = v.volume_id.clone();
        vol.context = v.volume_context.clone();
        let conflicts = locked(&self.ledger).acknowledge(name, &vol.id);
        self.check(conflicts.is_empty(), || {
            format!(
                "CreateVolume({name}) answered {} whose LUN is also answered for live volume(s) {}",
                vol.id,
                conflicts.join(", ")
            )
        });
        let (staging, target) = kubelet_paths(
            &self.nodes[node].kubelet,
            &vol.id.replace(':', "-"),
            &format!("pod-{name}"),
        );
        vol.staging = staging;
        vol.target = target;
        if std::fs::create_dir_all(&vol.staging)
            .and_then(|()| std::fs::create_dir_all(vol.target.parent().unwrap_or(Path::new("/"))))
            .is_err()
        {
            self.check(false, || format!("cannot create kubelet paths of {name}"));
            return false;
        }

        let publish = if strike == Some(StrikeAt::Attach) {
            self.strike(StrikeAt::Attach, Kind::Publish, &vol, rng)
                .await
        } else {
            self.converge(Kind::Publish, &vol, rng).await
        };
        let Some(Answer::Published(ctx)) = publish else {
            return false;
        };
        vol.publish = ctx;
        for kind in [Kind::Stage, Kind::NodePublish] {
            if self.converge(kind, &vol, rng).await.is_none() {
                return false;
            }
        }
        // Idempotency: kubelet repeats calls after its own restarts.
        if rng.bool()
            && (self.converge(Kind::Stage, &vol, rng).await.is_none()
                || self.converge(Kind::NodePublish, &vol, rng).await.is_none())
        {
            return false;
        }
        let wrote = write_marker(&vol, rng);
        let marker = wrote.as_ref().ok().cloned();
        self.check(wrote.is_ok(), || {
            format!(
                "writing through {} of {name} failed: {:#}",
                vol.target.display(),
                wrote
                    .as_ref()
                    .err()
                    .map(|e| format!("{e:#}"))
                    .unwrap_or_default()
            )
        });
        for kind in [Kind::NodeUnpublish, Kind::Unstage] {
            if self.converge(kind, &vol, rng).await.is_none() {
                return false;
            }
        }
        if let Some(marker) = marker
            && !self.restage(&vol, &marker, rng).await
        {
            return false;
        }
        let unpublished = if strike == Some(StrikeAt::Detach) {
            self.strike(StrikeAt::Detach, Kind::Unpublish, &vol, rng)
                .await
        } else {
            self.converge(Kind::Unpublish, &vol, rng).await
        };
        if unpublished.is_none() {
            return false;
        }

        // Every acknowledged CreateVolume exists: the same name answers
        // the same ID.
        if let Some(Answer::Created(again)) = self.converge(Kind::Create, &vol, rng).await {
            self.check(again.volume_id == vol.id, || {
                format!(
                    "CreateVolume({name}) repeated answered {}, first answered {}",
                    again.volume_id, vol.id
                )
            });
        } else {
            return false;
        }

        locked(&self.ledger).dying(name);
        if strike.is_none() && rng.u8(..3) == 0 {
            self.fail_for(&vol, Fault::WriteError(0..u64::MAX), rng);
            locked(&self.io).wipe_eio += 1;
        }
        let deleted = if strike == Some(StrikeAt::Wipe) {
            self.strike(StrikeAt::Wipe, Kind::Delete, &vol, rng).await
        } else {
            self.converge(Kind::Delete, &vol, rng).await
        };
        if deleted.is_none() {
            return false;
        }
        locked(&self.ledger).deleted(name);
        true
    }

    /// Stages `vol` again (its disk failing for a moment, often) and reads
    /// its marker back: a volume with data must never be formatted. False
    /// when a step did not converge.
    async fn restage(&self, vol: &Vol<'_>, marker: &[u8], rng: &mut Rng) -> bool {
        if rng.bool() {
            self.fail_for(vol, Fault::ReadError(0..HEAD), rng);
            locked(&self.io).head_eio += 1;
        }
        locked(&self.io).restages += 1;
        for kind in [Kind::Stage, Kind::NodePublish] {
            if self.converge(kind, vol, rng).await.is_none() {
                return false;
            }
        }
        let read = read_marker(vol, marker.len());
        let intact = read.as_ref().is_ok_and(|r| r == marker);
        if intact {
            locked(&self.io).intact += 1;
        }
        self.check(intact, || {
            format!(
                "{}: staged again, its marker {}: a volume with data was formatted",
                vol.name,
                match &read {
                    Ok(_) => "differs".to_owned(),
                    Err(e) => format!("cannot be read ({e:#})"),
                }
            )
        });
        for kind in [Kind::NodeUnpublish, Kind::Unstage] {
            if self.converge(kind, vol, rng).await.is_none() {
                return false;
            }
        }
        true
    }

    /// Gives `vol`'s disk `fault` for a moment (healed by a task of its
    /// own, so the calls meet it and then converge).
    fn fail_for(&self, vol: &Vol<'_>, fault: Fault, rng: &mut Rng) {
        let (Some(disks), Some(name)) = (
            &self.disks,
            vol.context.get("wwid").and_then(|w| self.disk_names.get(w)),
        ) else {
            return;
        };
        if disks.inject(name, fault).is_err() {
            return;
        }
        self.report().fault();
        let (disks, name) = (disks.clone(), name.clone());
        // Healed from a thread of its own, never a runtime task: a worker
        // blocked reaping a killed agent must not hold up the heal.
        let hold = Duration::from_millis(rng.u64(200..800));
        std::thread::spawn(move || {
            std::thread::sleep(hold);
            let _ = disks.heal(&name);
        });
    }

    /// Starts one attempt of `kind`, kills the agent(s) that serve it at a
    /// random point of its expected duration, restarts them, then retries
    /// the step to convergence.
    async fn strike(
        &self,
        at: StrikeAt,
        kind: Kind,
        vol: &Vol<'_>,
        rng: &mut Rng,
    ) -> Option<Answer> {
        let expected = locked(&self.durations)
            .get(kind.name())
            .copied()
            .unwrap_or(Duration::from_millis(20));
        let delay = expected.mul_f64(rng.f64());
        let victims: Vec<usize> = match at {
            StrikeAt::Wipe => (0..self.nodes.len()).collect(),
            _ => vec![vol.node],
        };
        self.report().op();
        vol.attempts.fetch_add(1, Ordering::Relaxed);
        let first = self.attempt(kind, vol);
        tokio::pin!(first);
        let finished_first = tokio::select! {
            r = &mut first => Some(r),
            () = tokio::time::sleep(delay) => None,
        };
        let mid_call = finished_first.is_none();
        {
            let mut lab = self.lab.lock().await;
            for &v in &victims {
                lab.kill_agent(v);
            }
        }
        self.report().fault();
        {
            let mut k = locked(&self.kills);
            k.agent += victims.len() as u64;
            k.mid[at.index()].1 += 1;
            if mid_call {
                k.mid[at.index()].0 += 1;
            }
        }
        // The interrupted call ends now, one way or the other.
        if finished_first.is_none() {
            let _ = first.await;
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(100..600))).await;
        {
            let mut lab = self.lab.lock().await;
            for &v in &victims {
                if let Err(e) = lab.restart_agent(v).await {
                    self.check(false, || format!("agent {v} did not restart: {e:#}"));
                }
            }
        }
        let out = self.converge(kind, vol, rng).await;
        if at == StrikeAt::Wipe {
            // The wipe resumed (or the LUN is Failed): never Available unwiped.
            self.check_pool_store("after a mid-wipe strike").await;
        }
        out
    }

    /// Kills the proxy or an agent at random moments until the workers
    /// are done; while the proxy is down, checks the store.
    async fn chaos(&self, rng: &mut Rng) -> anyhow::Result<()> {
        while !self.workers_done.load(Ordering::SeqCst) && !self.stopped() {
            tokio::time::sleep(Duration::from_millis(rng.u64(200..1000))).await;
            if self.workers_done.load(Ordering::SeqCst) {
                break;
            }
            let proxy = rng.bool();
            let victim = rng.usize(..self.nodes.len());
            // Most kills aim at a call in flight (the proxy's calls for the
            // proxy, any for an agent); the rest land wherever they land.
            if rng.u8(..4) != 0 {
                let aim = if proxy { 0..4 } else { 1..5 };
                let until = Instant::now() + Duration::from_secs(2);
                while Instant::now() < until
                    && !self.inflight[aim.clone()]
                        .iter()
                        .any(|a| a.load(Ordering::SeqCst) > 0)
                {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            let in_flight: Vec<u64> = self
                .inflight
                .iter()
                .map(|a| a.load(Ordering::SeqCst))
                .collect();
            {
                let mut k = locked(&self.kills);
                if proxy {
                    k.proxy += 1;
                } else {
                    k.agent += 1;
                }
                for (slot, n) in in_flight.iter().enumerate() {
                    if *n > 0 {
                        k.during[slot] += 1;
                    }
                }
            }
            self.report().fault();
            if proxy {
                {
                    let mut lab = self.lab.lock().await;
                    lab.kill_proxy();
                }
                // The store cannot move while the proxy is down.
                self.check_pool_store("with the proxy killed").await;
                tokio::time::sleep(Duration::from_millis(rng.u64(0..500))).await;
                let mut lab = self.lab.lock().await;
                lab.restart_proxy().await.context("restarting the proxy")?;
            } else {
                {
                    let mut lab = self.lab.lock().await;
                    lab.kill_agent(victim);
                }
                tokio::time::sleep(Duration::from_millis(rng.u64(100..800))).await;
                let mut lab = self.lab.lock().await;
                lab.restart_agent(victim)
                    .await
                    .with_context(|| format!("restarting agent {victim}"))?;
            }
        }
        Ok(())
    }

    /// The store invariants: every live acknowledged volume is bound by
    /// name and UID; every Available pool LUN reads as zeroes; the
    /// database is intact.
    async fn check_pool_store(&self, when: &str) {
        let live: Vec<(String, String, String)> = locked(&self.ledger)
            .live()
            .map(|(n, v)| (n.clone(), v.wwid.clone(), v.uid.clone()))
            .collect();
        let lab = self.lab.lock().await;
        let db = lab.proxy_store();
        let rows = match store::devices(&db, POOL_TARGET) {
            Ok(r) => r,
            Err(e) => {
                self.check(false, || format!("{when}: cannot read the store: {e:#}"));
                return;
            }
        };
        for (name, wwid, uid) in &live {
            let row = rows.iter().find(|r| &r.wwid == wwid);
            self.check(
                row.is_some_and(|r| &r.volume_name == name && &r.binding_uid == uid),
                || {
                    format!(
                        "{when}: acknowledged volume {name} ({wwid}:{uid}) is not bound in the store: {row:?}"
                    )
                },
            );
        }
        // The proxy's log names the node that wiped each LUN (the one
        // its own witness read after).
        let log = std::fs::read_to_string(lab.config.dir.join("proxy.log")).unwrap_or_default();
        let mut rng = Rng::with_seed(self.seed ^ self.checks.fetch_add(1, Ordering::Relaxed));
        for r in rows.iter().filter(|r| r.phase == "Available") {
            // Over the size the store records (the size the next tenant
            // is promised), not merely the file as it is.
            let back = store::lun_read_back(&lab, &r.wwid, r.size_bytes);
            self.check(matches!(back, Ok(Some(store::Readback::Zeroes))), || {
                format!(
                    "{when}: LUN {} is Available but does not read back as zeroes over its recorded {} bytes ({back:?})",
                    r.wwid, r.size_bytes
                )
            });
            // And through the block device of every node that did not
            // wipe it, past its page cache.
            let wiper = store::wiper(&log, &r.wwid);
            let (offsets, len) = store::checked_offsets(r.size_bytes, &mut rng);
            let (reads, skipped) = store::node_read_back(
                &lab,
                &r.wwid,
                r.size_bytes,
                wiper.as_deref(),
                (&offsets, len),
            );
            for n in &reads {
                self.check(n.found == store::Readback::Zeroes, || {
                    format!(
                        "{when}: LUN {} is Available but node {} ({}) reads {:?} through {} over its recorded {} bytes",
                        r.wwid, n.node, store::wiped_by(wiper.as_deref()), n.found, n.disk, r.size_bytes
                    )
                });
            }
            locked(&self.other_node_reads).add(wiper.as_deref(), reads.len(), skipped);
        }
        let integrity = store::integrity(&db);
        self.check(matches!(&integrity, Ok(s) if s == "ok"), || {
            format!("{when}: integrity_check: {integrity:?}")
        });
    }

    /// Waits for every pool LUN to be Available again, then checks the
    /// store, the LUNs and the nodes' mounts.
    async fn finish(&self, pool: usize) -> anyhow::Result<()> {
        let db = self.lab.lock().await.proxy_store();
        // Releases interrupted for good resume on the release scans (5 s).
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut rows;
        loop {
            rows = store::devices(&db, POOL_TARGET)?;
            let settled = rows
                .iter()
                .all(|r| r.phase == "Available" || r.phase == "Failed");
            if (settled && rows.len() == pool) || Instant::now() > deadline || self.stopped() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let live = locked(&self.ledger).len();
        if !self.stopped() {
            self.check(live == 0, || {
                format!("{live} volume(s) were never deleted (a step did not converge)")
            });
            for r in &rows {
                self.check(r.phase == "Available" || r.phase == "Failed", || {
                    format!(
                        "LUN {} is {} (bound to {:?}) after the workload ended: {}",
                        r.wwid, r.phase, r.volume_name, r.reason
                    )
                });
                if r.phase == "Failed" {
                    self.report()
                        .note(format!("LUN {} Failed: {}", r.wwid, r.reason));
                }
            }
        }
        // Proxy down: a stable store for the last look.
        {
            let mut lab = self.lab.lock().await;
            lab.kill_proxy();
        }
        self.check_pool_store("at the end").await;
        let leftover: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")?
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| {
                self.nodes
                    .iter()
                    .any(|n| Path::new(m).starts_with(&n.kubelet) && Path::new(m) != n.kubelet)
            })
            .map(str::to_owned)
            .collect();
        if !self.stopped() {
            self.check(leftover.is_empty(), || {
                format!("mounts left under kubelet directories: {leftover:?}")
            });
        }
        Ok(())
    }
}

/// Codes a sidecar or kubelet retries: the process is down or restarting,
/// another call holds the volume, or (CreateVolume) the pool is busy.
fn retryable(kind: Kind, code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable
            | Code::Aborted
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Unknown
    ) || (kind == Kind::Create && code == Code::ResourceExhausted)
}

fn create_request(vol: &Vol<'_>, node: &str) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: vol.name.clone(),
        capacity_range: Some(CapacityRange {
            required_bytes: (POOL_LUN_BYTES / 2) as i64,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![vol.capability()],
        parameters: HashMap::from([
            ("deviceSelector".to_owned(), "array=c".to_owned()),
            ("cleanup".to_owned(), vol.cleanup.to_owned()),
        ]),
        secrets: HashMap::new(),
        volume_content_source: None,
        accessibility_requirements: Some(prefer(node)),
        mutable_parameters: HashMap::new(),
    }
}

/// Writes 4 KiB of random data through the published volume and reads it
/// back (a file on a mount; an offset on a raw block device).
fn write_marker(vol: &Vol<'_>, rng: &mut Rng) -> anyhow::Result<Vec<u8>> {
    let data: Vec<u8> = (0..4096).map(|_| rng.u8(1..)).collect();
    let (path, offset) = marker_at(vol);
    let mut f = std::fs::OpenOptions::new()
        .create(!vol.block)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| path.display().to_string())?;
    f.seek(SeekFrom::Start(offset))?;
    f.write_all(&data)?;
    f.sync_all()?;
    let mut back = vec![0u8; data.len()];
    f.seek(SeekFrom::Start(offset))?;
    f.read_exact(&mut back)?;
    anyhow::ensure!(back == data, "read back differs");
    Ok(data)
}

/// Reads `len` bytes of the marker [`write_marker`] wrote.
fn read_marker(vol: &Vol<'_>, len: usize) -> anyhow::Result<Vec<u8>> {
    let (path, offset) = marker_at(vol);
    let mut f = std::fs::File::open(&path).with_context(|| path.display().to_string())?;
    f.seek(SeekFrom::Start(offset))?;
    let mut back = vec![0u8; len];
    f.read_exact(&mut back)?;
    Ok(back)
}

/// Where a volume's marker lives: a file, or 1 MiB into a raw device.
fn marker_at(vol: &Vol<'_>) -> (PathBuf, u64) {
    if vol.block {
        (vol.target.clone(), 1u64 << 20)
    } else {
        (vol.target.join("marker"), 0)
    }
}

/// `m` locked; a panic elsewhere while it was held leaves plain counters
/// and records, still usable.
fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
