//! The bad-input sweep. Against a running lab, every RPC of CSI Identity
//! (proxy and agents), Controller (proxy) and Node (agents), and of the
//! agent API over mTLS, is sent a table of malformed requests: empty IDs,
//! missing or unknown capabilities, 1 MiB fields, unknown parameters,
//! paths outside the kubelet directory, `..` escapes, relative paths,
//! symlinks out, volumes and nodes that do not exist, random garbage IDs
//! and undecodable bytes. Each answer's code is checked against the code
//! the CSI spec's tables name (agent.proto's list for the agent API); every
//! refusal must carry a short, non-empty message that holds no secret.
//! Well-formed control requests prove the services still say yes. Two
//! volumes stay published on node-a throughout, and the LUN files read the
//! same after the sweep as before it: nothing malformed touched a device.
//! Garbage comes from one seeded source, so a failing run replays.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use csi_scsi_certs::{MaterialPaths, MaterialStore, Role, TrustDomain};
use csi_scsi_proto::agent::{self as api, agent_client::AgentClient};
use csi_scsi_proto::csi::identity_client::IdentityClient;
use csi_scsi_proto::csi::volume_capability::access_mode::Mode;
use csi_scsi_proto::csi::volume_capability::{AccessMode, AccessType, MountVolume};
use csi_scsi_proto::csi::*;
use md5::{Digest, Md5};
use prost::bytes::{Buf, BufMut};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::{Scale, SuiteReport};
use crate::csi_client::csi_channel;
use crate::lab::scenario::{
    self, Clients, NODE_KEY, attach_and_mount, capability, create, kubelet_paths, lun_file,
    unmount_and_detach,
};
use crate::lab::{CHAP_USER, Lab, LabConfig};

/// How long one call may take before the sweep calls it hung.
const CALL_LIMIT: Duration = Duration::from_secs(30);
/// A field far over any limit, yet under the 4 MiB gRPC message limit.
const HUGE: usize = 1 << 20;
/// A message over the servers' 4 MiB gRPC receive limit.
const OVERSIZED: usize = 5 << 20;
/// The longest status message accepted. Clients cap the trailer block that
/// carries it (hyper at 16 KiB, percent-encoded), so a message that echoes
/// a huge field whole reaches the caller as a transport error instead of
/// its code, and floods the sidecars' events and logs.
const MAX_MESSAGE: usize = 4096;
/// Bytes of each LUN file compared before and after.
const HEAD: usize = 1 << 20;
/// Node-a: the node the fixtures live on.
const NODE: &str = "node-a";

const OK: &[Code] = &[Code::Ok];
const INVALID: &[Code] = &[Code::InvalidArgument];
const NOT_FOUND: &[Code] = &[Code::NotFound];
const PRECONDITION: &[Code] = &[Code::FailedPrecondition];
const UNIMPLEMENTED: &[Code] = &[Code::Unimplemented];
/// Error Scheme, "Invalid or unsupported field" (3) vs. the per-RPC table's
/// "Volume does not exist" (5): a malformed or oversized ID is both, and
/// the spec does not rank them.
const INVALID_OR_NOT_FOUND: &[Code] = &[Code::InvalidArgument, Code::NotFound];
/// DeleteVolume: "If a volume corresponding to the specified volume_id does
/// not exist ... the Plugin MUST reply 0 OK"; a field over the spec's
/// 128-byte size limit may also be refused as invalid.
const DELETE_OVERSIZED: &[Code] = &[Code::Ok, Code::InvalidArgument];
/// ControllerUnpublishVolume: a volume or node that "cannot be found ...
/// and the volume can be safely regarded as ControllerUnpublished" SHOULD
/// be 0 OK; the table's NOT_FOUND rows are the alternative.
const UNPUBLISH_UNKNOWN: &[Code] = &[Code::Ok, Code::NotFound];
/// The same, for an ID that is also malformed.
const UNPUBLISH_GARBAGE: &[Code] = &[Code::Ok, Code::NotFound, Code::InvalidArgument];
/// NodeUnstage/NodeUnpublish of a volume that is not there: the table's
/// "Volume does not exist" (5), or 0 OK by the idempotency rule ("not staged
/// to the staging_target_path ... MUST reply 0 OK").
const NODE_UNDO_UNKNOWN: &[Code] = &[Code::Ok, Code::NotFound];
/// Bytes that do not decode as the request: tonic answers INTERNAL (as
/// grpc-go does for a request it cannot unmarshal); INVALID_ARGUMENT would
/// be as right. The spec says nothing about the wire.
const UNDECODABLE: &[Code] = &[Code::Internal, Code::InvalidArgument];
/// A message over the receive limit: gRPC's status-code doc names
/// RESOURCE_EXHAUSTED; tonic answers OUT_OF_RANGE.
const TOO_LARGE: &[Code] = &[Code::ResourceExhausted, Code::OutOfRange];
/// "Unsupported capacity_range" (11 OUT_OF_RANGE); a limit below the
/// requirement is also simply an invalid field (3).
const BAD_RANGE: &[Code] = &[Code::OutOfRange, Code::InvalidArgument];
/// NodeStage/NodePublish "Exceeds capabilities" (9), or an unsupported
/// field (3).
const EXCEEDS: &[Code] = &[Code::FailedPrecondition, Code::InvalidArgument];
/// ControllerPublish at the node the volume is already published on with
/// another capability: the table's "Volume published but is incompatible"
/// (6), or the Error Scheme's unsupported field (3).
const INCOMPATIBLE: &[Code] = &[Code::AlreadyExists, Code::InvalidArgument];
/// Agent Attach of a WWID that never appears: agent.proto, "waits (bounded
/// by the deadline) for a device with the WWID" and answers
/// DEADLINE_EXCEEDED; NOT_FOUND ("no such device on this node") and
/// FAILED_PRECONDITION ("WWID mismatch") say it sooner.
const ATTACH_NEVER: &[Code] = &[
    Code::DeadlineExceeded,
    Code::NotFound,
    Code::FailedPrecondition,
];

const IDENTITY: &str = "identity";
const CONTROLLER: &str = "controller";
const NODE_SVC: &str = "node";
const AGENT_API: &str = "agent-api";
const WIRE: &str = "wire";

/// Runs the sweep against a lab brought up in `dir`.
pub async fn run(scale: Scale, seed: u64, dir: &Path) -> anyhow::Result<SuiteReport> {
    csi_scsi_certs::install_crypto_provider();
    let started = Instant::now();
    let mut rng = fastrand::Rng::with_seed(seed);
    let lab = Lab::up(LabConfig::for_test(dir), &mut |_| {}).await?;
    let mut cl = Clients::connect(&lab).await?;
    wait_for_discovery(&lab, &mut cl).await?;
    let lab_up = started.elapsed();

    let chap = std::fs::read_to_string(lab.config.dir.join("secrets/chap-array-a/password"))
        .context("the lab's CHAP secret")?;
    let token = format!("sweep-secret-{:016x}", rng.u64(..));
    let mut sw = Sweep {
        report: SuiteReport::new("sweep", seed),
        sent: BTreeMap::new(),
        codes: BTreeMap::new(),
        secrets: vec![chap.trim().to_owned(), token],
        created: Vec::new(),
    };
    let fx = Fixture::up(&lab, &mut cl, &mut rng).await?;
    let heads = fx.seed_luns(&lab, &mut rng)?;
    let agent = AgentClient::new(agent_channel(&lab)?);
    let sweep_start = Instant::now();

    identity(&mut sw, &lab, &mut rng).await?;
    controller(&mut sw, &mut cl, &fx, &mut rng).await;
    node(&mut sw, &lab, &mut cl, &fx, &mut rng).await;
    agent_api(&mut sw, &lab, agent.clone(), &fx, &mut rng).await?;
    let wires = [
        (csi_channel(&lab.proxy_csi).await?, CONTROLLER_RPCS),
        (csi_channel(&lab.nodes[0].csi).await?, NODE_RPCS),
        (agent_channel(&lab)?, AGENT_RPCS),
    ];
    wire(&mut sw, &wires, &mut rng).await;
    for _ in 0..scale.pick(3, 200) {
        garbage_round(&mut sw, &mut cl, &fx, agent.clone(), &mut rng).await;
        // And garbage on the wire: every RPC of every service.
        for (channel, rpcs) in &wires {
            for r in *rpcs {
                wire_rpc(&mut sw, channel.clone(), r, &mut rng).await;
            }
        }
    }
    // Last: well-formed calls that would destroy the fixtures if the
    // drivers got them wrong.
    dangerous(&mut sw, &mut cl, &fx, agent.clone()).await;
    let swept = sweep_start.elapsed();

    invariants(&mut sw, &lab, &mut cl, &fx, &heads, agent).await?;
    for id in std::mem::take(&mut sw.created) {
        let _ = call(cl.controller.delete_volume(DeleteVolumeRequest {
            volume_id: id,
            secrets: HashMap::new(),
        }))
        .await;
    }
    fx.down(&mut sw, &lab, &mut cl).await;

    let mut report = sw.finish();
    report.note(format!(
        "lab up {:.1}s, sweep {:.1}s; {} LUN heads compared",
        lab_up.as_secs_f64(),
        swept.as_secs_f64(),
        heads.len()
    ));
    report.elapsed = started.elapsed();
    Ok(report)
}

/// The sweep's tally and its report.
struct Sweep {
    report: SuiteReport,
    /// Requests sent, per service.
    sent: BTreeMap<&'static str, u64>,
    /// Codes answered, per service.
    codes: BTreeMap<&'static str, BTreeMap<String, u64>>,
    /// Strings no answer may contain.
    secrets: Vec<String>,
    /// Volumes a malformed CreateVolume made anyway, to delete at the end.
    created: Vec<String>,
}

impl Sweep {
    /// Counts one answer of `service`'s `rpc` to the request `case`, and
    /// checks its code against `want` and its message. Returns whether the
    /// code was one of `want`.
    fn check<T>(
        &mut self,
        service: &'static str,
        rpc: &str,
        case: &str,
        result: &Result<T, Status>,
        want: &[Code],
    ) -> bool {
        self.report.op();
        *self.sent.entry(service).or_default() += 1;
        let code = match result {
            Ok(_) => Code::Ok,
            Err(s) => s.code(),
        };
        *self
            .codes
            .entry(service)
            .or_default()
            .entry(format!("{code:?}"))
            .or_default() += 1;
        let msg = result.as_ref().err().map(Status::message).unwrap_or("");
        let ok = self.report.check(want.contains(&code), || {
            format!(
                "{service} {rpc} with {case}: answered {code:?} ({}), the spec wants {want:?}",
                clip(msg)
            )
        });
        if let Err(s) = result {
            let m = s.message();
            // Error Scheme: "The status message MUST contain a human
            // readable description of error".
            self.report.check(!m.trim().is_empty(), || {
                format!("{service} {rpc} with {case}: {code:?} with an empty message")
            });
            self.report.check(m.len() <= MAX_MESSAGE, || {
                format!(
                    "{service} {rpc} with {case}: a {} byte message (echoes the input?): {}",
                    m.len(),
                    clip(m)
                )
            });
            // Error Scheme: "The status details MUST be empty."
            self.report.check(s.details().is_empty(), || {
                format!("{service} {rpc} with {case}: status details are not empty")
            });
            for secret in &self.secrets {
                self.report.check(!m.contains(secret.as_str()), || {
                    format!("{service} {rpc} with {case}: the message holds a secret")
                });
            }
        }
        ok
    }

    /// Checks a property of an answer beyond its code.
    fn holds(&mut self, holds: bool, what: impl FnOnce() -> String) -> bool {
        self.report.check(holds, what)
    }

    /// The secrets map every request that has one carries.
    fn secrets(&self) -> HashMap<String, String> {
        HashMap::from([
            ("password".to_owned(), self.secrets[0].clone()),
            ("sweepToken".to_owned(), self.secrets[1].clone()),
        ])
    }

    fn finish(mut self) -> SuiteReport {
        let sent: Vec<String> = self.sent.iter().map(|(s, n)| format!("{s} {n}")).collect();
        self.report
            .note(format!("requests per service: {}", sent.join(", ")));
        for (service, codes) in &self.codes {
            let c: Vec<String> = codes.iter().map(|(c, n)| format!("{c} {n}")).collect();
            self.report
                .note(format!("{service} codes: {}", c.join(", ")));
        }
        self.report
    }
}

/// The first 200 characters of `s`, for a violation's text.
fn clip(s: &str) -> String {
    let mut out: String = s.chars().take(200).collect();
    if out.len() < s.len() {
        out.push_str(&format!("... ({} bytes)", s.len()));
    }
    out
}

/// Awaits one call, bounded by [`CALL_LIMIT`].
async fn call<T>(
    fut: impl Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, Status> {
    match tokio::time::timeout(CALL_LIMIT, fut).await {
        Ok(r) => r.map(tonic::Response::into_inner),
        Err(_) => Err(Status::deadline_exceeded(format!(
            "sweep: no answer within {CALL_LIMIT:?}"
        ))),
    }
}

/// Waits until the proxy's inventory shows every LUN of the lab.
async fn wait_for_discovery(lab: &Lab, cl: &mut Clients) -> anyhow::Result<()> {
    // The multipath LUN is one file behind two targets, and one device.
    let want: i64 = lab
        .luns
        .values()
        .map(|p| std::fs::metadata(p).map(|m| m.len() as i64).unwrap_or(0))
        .sum();
    let start = Instant::now();
    loop {
        let have = scenario::capacity(&mut cl.controller, None, "").await?;
        if have == want {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(60) {
            bail!("discovery: {have} bytes available, expected {want}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The volumes kept published on node-a while the sweep runs, and the
/// paths the malformed requests aim at.
struct Fixture {
    /// A filesystem (xfs) volume, staged and published.
    fs: Volume,
    fs_staging: PathBuf,
    fs_target: PathBuf,
    /// A raw block volume, staged and published.
    raw: Volume,
    raw_target: PathBuf,
    /// LUN names of both.
    fs_lun: String,
    raw_lun: String,
    /// Node-a's kubelet directory.
    kubelet: PathBuf,
    /// A directory outside it that must stay empty.
    outside: PathBuf,
    /// Under the kubelet directory, a symlink to `outside`.
    link_out: PathBuf,
    /// Under the kubelet directory, a symlink to `/`.
    link_root: PathBuf,
    /// Paths outside anything that must not come to exist.
    strays: Vec<PathBuf>,
    /// The pattern written at the start of the raw volume.
    pattern: Vec<u8>,
    /// What the fs volume holds.
    payload: Vec<u8>,
    /// array-a as the agent API describes it (CHAP included).
    array_a: api::Target,
}

impl Fixture {
    async fn up(lab: &Lab, cl: &mut Clients, rng: &mut fastrand::Rng) -> anyhow::Result<Self> {
        let params = [("deviceSelector", "array=a"), ("cleanup", "discard")];
        let fs = create(cl, "sweep-fs", 64 << 20, false, &params, NODE).await?;
        let fs_target = attach_and_mount(lab, cl, &fs, NODE, false, "sweep-pod-fs").await?;
        let payload: Vec<u8> = (0..64 << 10).map(|_| rng.u8(..)).collect();
        std::fs::write(fs_target.join("sweep.bin"), &payload)?;
        let raw = create(cl, "sweep-raw", 64 << 20, true, &params, NODE).await?;
        let raw_target = attach_and_mount(lab, cl, &raw, NODE, true, "sweep-pod-raw").await?;
        let pattern: Vec<u8> = (0..HEAD).map(|_| rng.u8(..)).collect();
        let mut dev = std::fs::OpenOptions::new().write(true).open(&raw_target)?;
        dev.write_all(&pattern)?;
        dev.sync_all()?;
        let kubelet = lab.nodes[0].kubelet.clone();
        let (fs_staging, _) = kubelet_paths(&kubelet, &fs.volume_id.replace(':', "-"), "x");
        let lun = |v: &Volume| {
            let wwid = v.volume_context.get("wwid").map_or("", String::as_str);
            lun_file(lab, wwid)
                .map(|(name, _)| name)
                .with_context(|| format!("the LUN behind {wwid}"))
        };
        let outside = lab.config.dir.join("sweep-outside");
        std::fs::create_dir_all(&outside)?;
        let pods = kubelet.join("pods");
        std::fs::create_dir_all(&pods)?;
        let link_out = pods.join("sweep-link-out");
        let link_root = pods.join("sweep-link-root");
        std::os::unix::fs::symlink(&outside, &link_out)?;
        std::os::unix::fs::symlink("/", &link_root)?;
        let strays = vec![
            PathBuf::from(format!("/tmp/csi-sweep-{}", lab.config.prefix)),
            PathBuf::from(format!("/etc/csi-sweep-{}", lab.config.prefix)),
        ];
        for s in &strays {
            if s.exists() {
                bail!("{} exists before the sweep", s.display());
            }
        }
        let array_a = api::Target {
            name: "array-a".into(),
            transport: Some(api::target::Transport::Iscsi(api::IscsiTarget {
                portals: vec![format!("{}:3260", lab.net.host_ip())],
                iqn: ARRAY_A.into(),
                chap: Some(api::ChapCredentials {
                    username: CHAP_USER.into(),
                    password: std::fs::read_to_string(
                        lab.config.dir.join("secrets/chap-array-a/password"),
                    )?,
                    mutual_username: String::new(),
                    mutual_password: String::new(),
                }),
            })),
        };
        Ok(Self {
            fs_lun: lun(&fs)?,
            raw_lun: lun(&raw)?,
            fs,
            fs_staging,
            fs_target,
            raw,
            raw_target,
            kubelet,
            outside,
            link_out,
            link_root,
            strays,
            pattern,
            payload,
            array_a,
        })
    }

    /// Writes a seeded pattern at the start of every LUN no fixture uses
    /// (a wipe of a zero LUN would leave no trace), and returns the digest
    /// of the first MiB of every LUN file but the mounted filesystem's
    /// (its journal may move on its own).
    fn seed_luns(
        &self,
        lab: &Lab,
        rng: &mut fastrand::Rng,
    ) -> anyhow::Result<BTreeMap<String, [u8; 16]>> {
        let mut heads = BTreeMap::new();
        for (name, file) in &lab.luns {
            if *name == self.fs_lun {
                continue;
            }
            if *name != self.raw_lun {
                let pattern: Vec<u8> = (0..HEAD).map(|_| rng.u8(..)).collect();
                let mut f = std::fs::OpenOptions::new().write(true).open(file)?;
                f.write_all(&pattern)?;
                f.sync_all()?;
            }
            heads.insert(name.clone(), head_digest(file)?);
        }
        let raw = &heads[&self.raw_lun];
        if *raw != <[u8; 16]>::from(Md5::digest(&self.pattern)) {
            bail!("the raw volume's pattern did not reach its LUN file");
        }
        Ok(heads)
    }

    fn fs_id(&self) -> String {
        self.fs.volume_id.clone()
    }

    fn wwid(v: &Volume) -> String {
        v.volume_context.get("wwid").cloned().unwrap_or_default()
    }

    /// A staging path under node-a's kubelet directory nothing uses.
    fn fresh_staging(&self, tag: &str) -> String {
        self.kubelet
            .join(format!(
                "plugins/kubernetes.io/csi/csi-scsi.io/sweep-{tag}/globalmount"
            ))
            .display()
            .to_string()
    }

    /// A target path under node-a's kubelet directory nothing uses.
    fn fresh_target(&self, tag: &str) -> String {
        self.kubelet
            .join(format!(
                "pods/sweep-{tag}/volumes/kubernetes.io~csi/sweep/mount"
            ))
            .display()
            .to_string()
    }

    /// Paths kubelet would never send: (case, path).
    fn bad_paths(&self) -> Vec<(String, String)> {
        let k = self.kubelet.display().to_string();
        let cases: Vec<(&str, String)> = vec![
            ("the root directory", "/".into()),
            ("a path under /etc", self.strays[1].display().to_string()),
            (
                "a path under /tmp",
                format!("{}/mount", self.strays[0].display()),
            ),
            (
                "a directory outside the kubelet directory",
                format!("{}/mount", self.outside.display()),
            ),
            (
                "a `..` escape",
                format!("{k}/pods/../../../../../../../../etc/csi-sweep"),
            ),
            ("the kubelet directory's parent via `..`", format!("{k}/..")),
            ("the kubelet directory itself", k.clone()),
            ("the kubelet directory with a trailing /", format!("{k}/")),
            ("the kubelet directory via pods/..", format!("{k}/pods/..")),
            (
                "a relative path",
                "pods/sweep/volumes/kubernetes.io~csi/v/mount".into(),
            ),
            ("a ./ relative path", "./mount".into()),
            (
                "a symlink out of the kubelet directory",
                format!("{}/v/mount", self.link_out.display()),
            ),
            (
                "the symlink out itself",
                self.link_out.display().to_string(),
            ),
            (
                "a symlink to /",
                format!("{}/etc/csi-sweep", self.link_root.display()),
            ),
            ("a NUL byte", format!("{k}/pods/sweep\0/mount")),
            (
                "a newline and `..`",
                format!("{k}/pods/sweep\n/../../../../.."),
            ),
            ("a 1 MiB component", format!("{k}/{}", "a".repeat(HUGE))),
            (
                "6000 bytes of components",
                format!("{k}/{}", "d/".repeat(3000)),
            ),
        ];
        cases.into_iter().map(|(c, p)| (c.to_owned(), p)).collect()
    }

    /// Unpublishes, unstages, detaches and deletes both volumes: the
    /// drivers still work after the sweep.
    async fn down(&self, sw: &mut Sweep, lab: &Lab, cl: &mut Clients) {
        for (v, pod) in [(&self.fs, "sweep-pod-fs"), (&self.raw, "sweep-pod-raw")] {
            let r = unmount_and_detach(lab, cl, v, NODE, pod).await;
            sw.holds(r.is_ok(), || {
                format!("after the sweep, {} does not tear down: {r:?}", v.volume_id)
            });
            let r = call(cl.controller.delete_volume(DeleteVolumeRequest {
                volume_id: v.volume_id.clone(),
                secrets: HashMap::new(),
            }))
            .await;
            sw.check(
                CONTROLLER,
                "DeleteVolume",
                "a fixture after the sweep",
                &r,
                OK,
            );
        }
    }
}

/// The digest of the first MiB of `file`.
fn head_digest(file: &Path) -> anyhow::Result<[u8; 16]> {
    let mut f = std::fs::File::open(file)?;
    let mut buf = vec![0u8; HEAD];
    f.read_exact(&mut buf)?;
    Ok(Md5::digest(&buf).into())
}

/// A mount or block capability with a raw access-mode value.
fn cap_mode(block: bool, mode: i32) -> VolumeCapability {
    let mut c = capability(
        block,
        if block { "" } else { "xfs" },
        Mode::SingleNodeWriter,
    );
    c.access_mode = Some(AccessMode { mode });
    c
}

/// The fs fixture's capability.
fn fs_cap() -> VolumeCapability {
    capability(false, "xfs", Mode::SingleNodeWriter)
}

/// A mount capability with `fs`, `flags` and `group`.
fn mount_cap(fs: &str, flags: &[&str], group: &str) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs.to_owned(),
            mount_flags: flags.iter().map(|s| s.to_string()).collect(),
            volume_mount_group: group.to_owned(),
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

/// Capabilities every service must refuse as invalid: (case, capability).
fn bad_capabilities() -> Vec<(String, VolumeCapability)> {
    let mut no_mode = fs_cap();
    no_mode.access_mode = None;
    let mut no_type = fs_cap();
    no_type.access_type = None;
    vec![
        ("a capability without access mode".into(), no_mode),
        ("access mode UNKNOWN".into(), cap_mode(false, 0)),
        (
            "access mode 99 (not in the enum)".into(),
            cap_mode(false, 99),
        ),
        ("access mode -1".into(), cap_mode(true, -1)),
        ("a capability without access type".into(), no_type),
        ("fs_type zfs".into(), mount_cap("zfs", &[], "")),
        (
            "fs_type ../../bin/sh".into(),
            mount_cap("../../bin/sh", &[], ""),
        ),
        (
            "a 1 MiB fs_type".into(),
            mount_cap(&"x".repeat(HUGE), &[], ""),
        ),
    ]
}

/// A volume ID of the right shape that names no volume.
fn unknown_volume(rng: &mut fastrand::Rng) -> String {
    format!("naa.6{}:{}", hex(rng, 31), uuid(rng))
}

/// A WWID of the right shape that names no LUN.
fn unknown_wwid(rng: &mut fastrand::Rng) -> String {
    format!("naa.6{}", hex(rng, 31))
}

fn hex(rng: &mut fastrand::Rng, n: usize) -> String {
    (0..n)
        .map(|_| char::from_digit(rng.u32(..16), 16).unwrap_or('0'))
        .collect()
}

fn uuid(rng: &mut fastrand::Rng) -> String {
    format!(
        "{}-{}-4{}-a{}-{}",
        hex(rng, 8),
        hex(rng, 4),
        hex(rng, 3),
        hex(rng, 3),
        hex(rng, 12)
    )
}

/// A random string no service could take for an ID: printable noise,
/// arbitrary Unicode with control characters, an almost-volume-ID, a path,
/// escapes, or a long run.
fn garbage(rng: &mut fastrand::Rng) -> String {
    match rng.u8(..7) {
        0 => (0..rng.usize(1..200))
            .map(|_| rng.char(' '..='~'))
            .collect(),
        1 => (0..rng.usize(1..100)).map(|_| rng.char(..)).collect(),
        // An invalid binding UID ('/' is never in one).
        2 => format!("naa.6{}:{}/{}", hex(rng, 31), hex(rng, 8), hex(rng, 4)),
        3 => format!("{}etc/passwd", "../".repeat(rng.usize(1..20))),
        4 => format!("vol\0{}\n%00{}", hex(rng, 8), rng.char(..)),
        5 => rng
            .char('\u{80}'..='\u{10ffff}')
            .to_string()
            .repeat(rng.usize(200..2000)),
        _ => format!(
            "{}:{}",
            (0..rng.usize(1..40))
                .map(|_| rng.char(' '..='~'))
                .collect::<String>(),
            uuid(rng)
        ),
    }
}

/// Identity (proxy and every agent): control calls, and requests carrying
/// unknown fields, which proto3 skips.
async fn identity(sw: &mut Sweep, lab: &Lab, rng: &mut fastrand::Rng) -> anyhow::Result<()> {
    let mut sockets = vec![("proxy".to_owned(), lab.proxy_csi.clone())];
    sockets.extend(lab.nodes.iter().map(|n| (n.name.clone(), n.csi.clone())));
    for (who, socket) in sockets {
        let channel = csi_channel(&socket).await?;
        let mut c = IdentityClient::new(channel.clone());
        let r = call(c.get_plugin_info(GetPluginInfoRequest {})).await;
        if sw.check(
            IDENTITY,
            "GetPluginInfo",
            &format!("{who}: control"),
            &r,
            OK,
        ) && let Ok(info) = &r
        {
            // GetPluginInfo: name and vendor_version are REQUIRED.
            sw.holds(
                !info.name.is_empty() && !info.vendor_version.is_empty(),
                || format!("{who}: GetPluginInfo without name or version: {info:?}"),
            );
        }
        let r = call(c.get_plugin_capabilities(GetPluginCapabilitiesRequest {})).await;
        sw.check(
            IDENTITY,
            "GetPluginCapabilities",
            &format!("{who}: control"),
            &r,
            OK,
        );
        let r = call(c.probe(ProbeRequest {})).await;
        sw.check(IDENTITY, "Probe", &format!("{who}: control"), &r, OK);
        for rpc in ["GetPluginInfo", "GetPluginCapabilities", "Probe"] {
            let path = format!("/csi.v1.Identity/{rpc}");
            let r = raw(channel.clone(), &path, unknown_fields(rng), false).await;
            sw.check(IDENTITY, rpc, &format!("{who}: unknown fields"), &r, OK);
        }
    }
    Ok(())
}

/// The Controller service's tables.
async fn controller(sw: &mut Sweep, cl: &mut Clients, fx: &Fixture, rng: &mut fastrand::Rng) {
    let c = &mut cl.controller;
    let fs_id = fx.fs_id();
    let secrets = sw.secrets();
    let stale = format!("{}:{}", Fixture::wwid(&fx.fs), uuid(rng));

    // CreateVolume. A base that would succeed, and one fault per case.
    let base = CreateVolumeRequest {
        name: format!("sweep-create-{}", hex(rng, 8)),
        capacity_range: Some(CapacityRange {
            required_bytes: 16 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![fs_cap()],
        parameters: HashMap::from([("deviceSelector".into(), "array=a".into())]),
        secrets: secrets.clone(),
        volume_content_source: None,
        accessibility_requirements: Some(scenario::prefer(NODE)),
        mutable_parameters: HashMap::new(),
    };
    let with = |f: &dyn Fn(&mut CreateVolumeRequest)| {
        let mut r = base.clone();
        f(&mut r);
        r
    };
    let mut cases: Vec<(String, CreateVolumeRequest, &[Code])> = vec![
        ("an empty name".into(), with(&|r| r.name.clear()), INVALID),
        // The spec's general size limit for strings is 128 bytes.
        (
            "a 1 MiB name".into(),
            with(&|r| r.name = "n".repeat(HUGE)),
            INVALID,
        ),
        (
            "no capabilities".into(),
            with(&|r| r.volume_capabilities.clear()),
            INVALID,
        ),
        (
            "a filesystem for MULTI_NODE_MULTI_WRITER".into(),
            with(&|r| {
                r.volume_capabilities = vec![capability(false, "xfs", Mode::MultiNodeMultiWriter)]
            }),
            INVALID,
        ),
        (
            "an unknown parameter".into(),
            with(&|r| {
                r.parameters.insert("sweepUnknown".into(), "1".into());
            }),
            INVALID,
        ),
        (
            "deviceSelector (((".into(),
            with(&|r| {
                r.parameters.insert("deviceSelector".into(), "(((".into());
            }),
            INVALID,
        ),
        (
            "cleanup shred".into(),
            with(&|r| {
                r.parameters.insert("cleanup".into(), "shred".into());
            }),
            INVALID,
        ),
        (
            "fsType ntfs".into(),
            with(&|r| {
                r.parameters.insert("fsType".into(), "ntfs".into());
            }),
            INVALID,
        ),
        (
            "a 1 MiB deviceSelector".into(),
            with(&|r| {
                r.parameters
                    .insert("deviceSelector".into(), "a".repeat(HUGE));
            }),
            INVALID,
        ),
        (
            "a negative required_bytes".into(),
            with(&|r| {
                r.capacity_range = Some(CapacityRange {
                    required_bytes: -1,
                    limit_bytes: 0,
                })
            }),
            INVALID,
        ),
        (
            "limit_bytes below required_bytes".into(),
            with(&|r| {
                r.capacity_range = Some(CapacityRange {
                    required_bytes: 32 << 20,
                    limit_bytes: 16 << 20,
                })
            }),
            BAD_RANGE,
        ),
        (
            "a snapshot source".into(),
            with(&|r| {
                r.volume_content_source = Some(VolumeContentSource {
                    r#type: Some(volume_content_source::Type::Snapshot(
                        volume_content_source::SnapshotSource {
                            snapshot_id: "sweep-snap".into(),
                        },
                    )),
                })
            }),
            INVALID,
        ),
        (
            "mutable parameters".into(),
            with(&|r| {
                r.mutable_parameters.insert("iops".into(), "1000".into());
            }),
            INVALID,
        ),
        (
            "an unknown topology key".into(),
            with(&|r| {
                r.accessibility_requirements = Some(TopologyRequirement {
                    requisite: vec![Topology {
                        segments: HashMap::from([("sweep/zone".into(), "z".into())]),
                    }],
                    preferred: Vec::new(),
                })
            }),
            INVALID,
        ),
        (
            // "Unable to provision in accessible_topology" (8).
            "a requisite node that does not exist".into(),
            with(&|r| {
                let t = Topology {
                    segments: HashMap::from([(NODE_KEY.into(), "node-zz".into())]),
                };
                r.accessibility_requirements = Some(TopologyRequirement {
                    requisite: vec![t.clone()],
                    preferred: vec![t],
                })
            }),
            &[Code::ResourceExhausted],
        ),
        (
            // "Volume already exists but is incompatible" (6).
            "the fixture's name with another size".into(),
            with(&|r| {
                r.name = "sweep-fs".into();
                r.capacity_range = Some(CapacityRange {
                    required_bytes: 1 << 30,
                    limit_bytes: 0,
                });
            }),
            &[Code::AlreadyExists],
        ),
    ];
    let key = garbage(rng);
    cases.push((
        format!("a garbage parameter key {:?}", clip(&key)),
        with(&|r| {
            r.parameters.insert(key.clone(), "1".into());
        }),
        INVALID,
    ));
    for (case, cap) in bad_capabilities() {
        cases.push((
            case,
            with(&|r| r.volume_capabilities = vec![cap.clone()]),
            INVALID,
        ));
    }
    for (case, req, want) in cases {
        let r = call(c.create_volume(req)).await;
        if let Ok(v) = &r
            && let Some(v) = &v.volume
            && v.volume_id != fs_id
        {
            sw.created.push(v.volume_id.clone());
        }
        sw.check(CONTROLLER, "CreateVolume", &case, &r, want);
    }
    // Control: the fixture's own request again is the same volume.
    let r = call(c.create_volume(CreateVolumeRequest {
        name: "sweep-fs".into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 64 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![fs_cap()],
        parameters: HashMap::from([
            ("deviceSelector".into(), "array=a".into()),
            ("cleanup".into(), "discard".into()),
        ]),
        secrets: secrets.clone(),
        volume_content_source: None,
        accessibility_requirements: Some(scenario::prefer(NODE)),
        mutable_parameters: HashMap::new(),
    }))
    .await;
    if sw.check(
        CONTROLLER,
        "CreateVolume",
        "control: the fixture's request again",
        &r,
        OK,
    ) && let Ok(v) = &r
    {
        let id = v.volume.as_ref().map(|v| v.volume_id.as_str());
        sw.holds(id == Some(fs_id.as_str()), || {
            format!("CreateVolume retried by name answered {id:?}, not {fs_id}")
        });
    }

    // DeleteVolume.
    let del = |id: &str| DeleteVolumeRequest {
        volume_id: id.to_owned(),
        secrets: secrets.clone(),
    };
    let cases: Vec<(String, DeleteVolumeRequest, &[Code])> = vec![
        ("an empty volume_id".into(), del(""), INVALID),
        (
            "a volume that does not exist".into(),
            del(&unknown_volume(rng)),
            OK,
        ),
        // docs/parameters.md: an old binding's ID succeeds and does nothing.
        (
            "a stale binding of the fixture's LUN".into(),
            del(&stale),
            OK,
        ),
        (
            "a 1 MiB volume_id".into(),
            del(&"v".repeat(HUGE)),
            DELETE_OVERSIZED,
        ),
        // "Volume in use" (9): the fixtures are published.
        ("the published fs fixture".into(), del(&fs_id), PRECONDITION),
        (
            "the published raw fixture".into(),
            del(&fx.raw.volume_id),
            PRECONDITION,
        ),
    ];
    for (case, req, want) in cases {
        let r = call(c.delete_volume(req)).await;
        sw.check(CONTROLLER, "DeleteVolume", &case, &r, want);
    }

    // ControllerPublishVolume.
    let publish =
        |id: &str, node: &str, cap: Option<VolumeCapability>| ControllerPublishVolumeRequest {
            volume_id: id.to_owned(),
            node_id: node.to_owned(),
            volume_capability: cap,
            readonly: false,
            secrets: secrets.clone(),
            volume_context: HashMap::new(),
        };
    let mut cases: Vec<(String, ControllerPublishVolumeRequest, &[Code])> = vec![
        (
            "an empty volume_id".into(),
            publish("", NODE, Some(fs_cap())),
            INVALID,
        ),
        (
            "an empty node_id".into(),
            publish(&fs_id, "", Some(fs_cap())),
            INVALID,
        ),
        ("no capability".into(), publish(&fs_id, NODE, None), INVALID),
        (
            "a volume that does not exist".into(),
            publish(&unknown_volume(rng), NODE, Some(fs_cap())),
            NOT_FOUND,
        ),
        (
            "a stale binding of the fixture's LUN".into(),
            publish(&stale, NODE, Some(fs_cap())),
            NOT_FOUND,
        ),
        (
            "a 1 MiB volume_id".into(),
            publish(&"v".repeat(HUGE), NODE, Some(fs_cap())),
            INVALID_OR_NOT_FOUND,
        ),
        (
            "a node that does not exist".into(),
            publish(&fs_id, "node-zz", Some(fs_cap())),
            NOT_FOUND,
        ),
        (
            "a 1 MiB node_id".into(),
            publish(&fs_id, &"n".repeat(HUGE), Some(fs_cap())),
            INVALID_OR_NOT_FOUND,
        ),
        (
            // "Volume published to another node" (9).
            "a single-node volume to a second node".into(),
            publish(&fs_id, "node-b", Some(fs_cap())),
            PRECONDITION,
        ),
        (
            "raw block for the filesystem fixture".into(),
            publish(
                &fs_id,
                NODE,
                Some(capability(true, "", Mode::SingleNodeWriter)),
            ),
            INCOMPATIBLE,
        ),
    ];
    for (case, cap) in bad_capabilities() {
        cases.push((case, publish(&fs_id, NODE, Some(cap)), INVALID));
    }
    for (case, req, want) in cases {
        let r = call(c.controller_publish_volume(req)).await;
        sw.check(CONTROLLER, "ControllerPublishVolume", &case, &r, want);
    }
    let r = call(c.controller_publish_volume(publish(&fs_id, NODE, Some(fs_cap())))).await;
    sw.check(
        CONTROLLER,
        "ControllerPublishVolume",
        "control: the fixture again where it is published",
        &r,
        OK,
    );

    // ControllerUnpublishVolume.
    let unpublish = |id: &str, node: &str| ControllerUnpublishVolumeRequest {
        volume_id: id.to_owned(),
        node_id: node.to_owned(),
        secrets: secrets.clone(),
    };
    let cases: Vec<(String, ControllerUnpublishVolumeRequest, &[Code])> = vec![
        ("an empty volume_id".into(), unpublish("", NODE), INVALID),
        (
            "a volume that does not exist".into(),
            unpublish(&unknown_volume(rng), NODE),
            UNPUBLISH_UNKNOWN,
        ),
        (
            "a stale binding of the fixture's LUN".into(),
            unpublish(&stale, NODE),
            UNPUBLISH_UNKNOWN,
        ),
        (
            "a 1 MiB volume_id".into(),
            unpublish(&"v".repeat(HUGE), NODE),
            UNPUBLISH_GARBAGE,
        ),
        (
            "a node that does not exist".into(),
            unpublish(&fs_id, "node-zz"),
            UNPUBLISH_UNKNOWN,
        ),
        (
            "a 1 MiB node_id".into(),
            unpublish(&fs_id, &"n".repeat(HUGE)),
            UNPUBLISH_GARBAGE,
        ),
        // "If the volume ... is not attached to the node ..., the Plugin
        // MUST reply 0 OK."
        (
            "control: a node it is not published to".into(),
            unpublish(&fs_id, "node-b"),
            OK,
        ),
    ];
    for (case, req, want) in cases {
        let r = call(c.controller_unpublish_volume(req)).await;
        sw.check(CONTROLLER, "ControllerUnpublishVolume", &case, &r, want);
    }

    // ValidateVolumeCapabilities.
    let validate = |id: &str, caps: Vec<VolumeCapability>, params: &[(&str, &str)]| {
        ValidateVolumeCapabilitiesRequest {
            volume_id: id.to_owned(),
            volume_context: HashMap::new(),
            volume_capabilities: caps,
            parameters: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            secrets: secrets.clone(),
            mutable_parameters: HashMap::new(),
        }
    };
    let cases: Vec<(String, ValidateVolumeCapabilitiesRequest, &[Code])> = vec![
        (
            "an empty volume_id".into(),
            validate("", vec![fs_cap()], &[]),
            INVALID,
        ),
        (
            "no capabilities".into(),
            validate(&fs_id, vec![], &[]),
            INVALID,
        ),
        (
            "a volume that does not exist".into(),
            validate(&unknown_volume(rng), vec![fs_cap()], &[]),
            NOT_FOUND,
        ),
        (
            "a 1 MiB volume_id".into(),
            validate(&"v".repeat(HUGE), vec![fs_cap()], &[]),
            INVALID_OR_NOT_FOUND,
        ),
    ];
    for (case, req, want) in cases {
        let r = call(c.validate_volume_capabilities(req)).await;
        sw.check(CONTROLLER, "ValidateVolumeCapabilities", &case, &r, want);
    }
    let r = call(c.validate_volume_capabilities(validate(&fs_id, vec![fs_cap()], &[]))).await;
    if sw.check(
        CONTROLLER,
        "ValidateVolumeCapabilities",
        "control: its own capability",
        &r,
        OK,
    ) && let Ok(v) = &r
    {
        sw.holds(v.confirmed.is_some(), || {
            format!(
                "ValidateVolumeCapabilities did not confirm the fixture's own capability: {v:?}"
            )
        });
    }
    // Unsupported capabilities or parameters: OK with nothing confirmed
    // ("confirmed ... MUST be empty if the capabilities are not
    // supported"), or the Error Scheme's INVALID_ARGUMENT.
    let mut unsupported: Vec<(String, ValidateVolumeCapabilitiesRequest)> = vec![
        (
            "raw block for the filesystem fixture".into(),
            validate(
                &fs_id,
                vec![capability(true, "", Mode::SingleNodeWriter)],
                &[],
            ),
        ),
        (
            "an unknown parameter".into(),
            validate(&fs_id, vec![fs_cap()], &[("sweepUnknown", "1")]),
        ),
    ];
    for (case, cap) in bad_capabilities() {
        unsupported.push((case, validate(&fs_id, vec![cap], &[])));
    }
    for (case, req) in unsupported {
        let r = call(c.validate_volume_capabilities(req)).await;
        if sw.check(
            CONTROLLER,
            "ValidateVolumeCapabilities",
            &case,
            &r,
            &[Code::Ok, Code::InvalidArgument],
        ) && let Ok(v) = &r
        {
            sw.holds(v.confirmed.is_none() && !v.message.is_empty(), || {
                format!("ValidateVolumeCapabilities with {case} confirmed it: {v:?}")
            });
        }
    }

    // ListVolumes.
    let list = |max: i32, token: &str| ListVolumesRequest {
        max_entries: max,
        starting_token: token.to_owned(),
    };
    let cases: Vec<(String, ListVolumesRequest, &[Code])> = vec![
        // "Invalid starting_token" (10).
        (
            "a starting_token never issued".into(),
            list(0, "sweep-token"),
            &[Code::Aborted],
        ),
        (
            "a 1 MiB starting_token".into(),
            list(0, &"t".repeat(HUGE)),
            &[Code::Aborted, Code::InvalidArgument],
        ),
        ("a negative max_entries".into(), list(-1, ""), INVALID),
    ];
    for (case, req, want) in cases {
        let r = call(c.list_volumes(req)).await;
        sw.check(CONTROLLER, "ListVolumes", &case, &r, want);
    }
    let r = call(c.list_volumes(list(0, ""))).await;
    if sw.check(CONTROLLER, "ListVolumes", "control", &r, OK)
        && let Ok(l) = &r
    {
        let ids: Vec<&str> = l
            .entries
            .iter()
            .filter_map(|e| e.volume.as_ref().map(|v| v.volume_id.as_str()))
            .collect();
        sw.holds(
            ids.contains(&fs_id.as_str()) && ids.contains(&fx.raw.volume_id.as_str()),
            || format!("ListVolumes does not list the fixtures: {ids:?}"),
        );
    }

    // GetCapacity.
    let capacity =
        |caps: Vec<VolumeCapability>, params: &[(&str, &str)], topo: Option<(&str, &str)>| {
            GetCapacityRequest {
                volume_capabilities: caps,
                parameters: params
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                accessible_topology: topo.map(|(k, v)| Topology {
                    segments: HashMap::from([(k.to_owned(), v.to_owned())]),
                }),
            }
        };
    let mut cases: Vec<(String, GetCapacityRequest, &[Code])> = vec![
        (
            "an unknown parameter".into(),
            capacity(vec![], &[("sweepUnknown", "1")], None),
            INVALID,
        ),
        (
            "deviceSelector (((".into(),
            capacity(vec![], &[("deviceSelector", "(((")], None),
            INVALID,
        ),
        (
            "an unknown topology key".into(),
            capacity(vec![], &[], Some(("sweep/zone", "z"))),
            INVALID,
        ),
    ];
    for (case, cap) in bad_capabilities() {
        cases.push((case, capacity(vec![cap], &[], None), INVALID));
    }
    for (case, req, want) in cases {
        let r = call(c.get_capacity(req)).await;
        sw.check(CONTROLLER, "GetCapacity", &case, &r, want);
    }
    let r = call(c.get_capacity(capacity(vec![], &[], Some((NODE_KEY, "node-zz"))))).await;
    if sw.check(
        CONTROLLER,
        "GetCapacity",
        "a node that does not exist",
        &r,
        OK,
    ) && let Ok(g) = &r
    {
        sw.holds(g.available_capacity == 0, || {
            format!("GetCapacity on a node that does not exist: {g:?}")
        });
    }
    let r = call(c.get_capacity(capacity(vec![fs_cap()], &[], None))).await;
    if sw.check(CONTROLLER, "GetCapacity", "control", &r, OK)
        && let Ok(g) = &r
    {
        sw.holds(g.available_capacity > 0, || {
            format!("GetCapacity control: {g:?}")
        });
    }

    // ControllerGetCapabilities.
    let r = call(c.controller_get_capabilities(ControllerGetCapabilitiesRequest {})).await;
    sw.check(CONTROLLER, "ControllerGetCapabilities", "control", &r, OK);

    // Snapshots and modification are not offered: "Call not implemented".
    let r = call(c.create_snapshot(CreateSnapshotRequest {
        source_volume_id: fs_id.clone(),
        name: String::new(),
        secrets: secrets.clone(),
        parameters: HashMap::new(),
    }))
    .await;
    sw.check(
        CONTROLLER,
        "CreateSnapshot",
        "an empty name",
        &r,
        UNIMPLEMENTED,
    );
    let r = call(c.delete_snapshot(DeleteSnapshotRequest {
        snapshot_id: garbage(rng),
        secrets: secrets.clone(),
    }))
    .await;
    sw.check(
        CONTROLLER,
        "DeleteSnapshot",
        "a garbage snapshot_id",
        &r,
        UNIMPLEMENTED,
    );
    let r = call(c.list_snapshots(ListSnapshotsRequest {
        max_entries: -1,
        starting_token: garbage(rng),
        source_volume_id: String::new(),
        snapshot_id: String::new(),
        secrets: secrets.clone(),
    }))
    .await;
    sw.check(
        CONTROLLER,
        "ListSnapshots",
        "a garbage token",
        &r,
        UNIMPLEMENTED,
    );
    let r = call(c.get_snapshot(GetSnapshotRequest {
        snapshot_id: String::new(),
        secrets: secrets.clone(),
    }))
    .await;
    sw.check(
        CONTROLLER,
        "GetSnapshot",
        "an empty snapshot_id",
        &r,
        UNIMPLEMENTED,
    );
    let r = call(c.controller_modify_volume(ControllerModifyVolumeRequest {
        volume_id: fs_id.clone(),
        secrets: secrets.clone(),
        mutable_parameters: HashMap::from([("sweepUnknown".into(), "1".into())]),
    }))
    .await;
    sw.check(
        CONTROLLER,
        "ControllerModifyVolume",
        "an unknown mutable parameter",
        &r,
        UNIMPLEMENTED,
    );

    // ControllerExpandVolume.
    let expand = |id: &str, required: Option<(i64, i64)>, cap: Option<VolumeCapability>| {
        ControllerExpandVolumeRequest {
            volume_id: id.to_owned(),
            capacity_range: required.map(|(r, l)| CapacityRange {
                required_bytes: r,
                limit_bytes: l,
            }),
            secrets: secrets.clone(),
            volume_capability: cap,
        }
    };
    let size = fx.fs.capacity_bytes;
    let mut cases: Vec<(String, ControllerExpandVolumeRequest, &[Code])> = vec![
        (
            "an empty volume_id".into(),
            expand("", Some((size, 0)), Some(fs_cap())),
            INVALID,
        ),
        (
            "no capacity_range".into(),
            expand(&fs_id, None, Some(fs_cap())),
            INVALID,
        ),
        (
            "a negative required_bytes".into(),
            expand(&fs_id, Some((-1, 0)), Some(fs_cap())),
            INVALID,
        ),
        (
            "limit_bytes below required_bytes".into(),
            expand(&fs_id, Some((size, size / 2)), Some(fs_cap())),
            BAD_RANGE,
        ),
        (
            "a volume that does not exist".into(),
            expand(&unknown_volume(rng), Some((size, 0)), Some(fs_cap())),
            NOT_FOUND,
        ),
        (
            "a stale binding of the fixture's LUN".into(),
            expand(&stale, Some((size, 0)), Some(fs_cap())),
            NOT_FOUND,
        ),
        (
            "a 1 MiB volume_id".into(),
            expand(&"v".repeat(HUGE), Some((size, 0)), Some(fs_cap())),
            INVALID_OR_NOT_FOUND,
        ),
        (
            // "Exceeds capabilities" (3).
            "raw block for the filesystem fixture".into(),
            expand(
                &fs_id,
                Some((size, 0)),
                Some(capability(true, "", Mode::SingleNodeWriter)),
            ),
            INVALID,
        ),
    ];
    for (case, cap) in bad_capabilities() {
        cases.push((case, expand(&fs_id, Some((size, 0)), Some(cap)), INVALID));
    }
    for (case, req, want) in cases {
        let r = call(c.controller_expand_volume(req)).await;
        sw.check(CONTROLLER, "ControllerExpandVolume", &case, &r, want);
    }
    let r = call(c.controller_expand_volume(expand(&fs_id, Some((size, 0)), Some(fs_cap())))).await;
    sw.check(
        CONTROLLER,
        "ControllerExpandVolume",
        "control: the size it has",
        &r,
        OK,
    );

    // ControllerGetVolume.
    let get = |id: &str| ControllerGetVolumeRequest {
        volume_id: id.to_owned(),
    };
    let cases: Vec<(String, ControllerGetVolumeRequest, &[Code])> = vec![
        ("an empty volume_id".into(), get(""), INVALID),
        (
            "a volume that does not exist".into(),
            get(&unknown_volume(rng)),
            NOT_FOUND,
        ),
        (
            "a stale binding of the fixture's LUN".into(),
            get(&stale),
            NOT_FOUND,
        ),
        (
            "a 1 MiB volume_id".into(),
            get(&"v".repeat(HUGE)),
            INVALID_OR_NOT_FOUND,
        ),
    ];
    for (case, req, want) in cases {
        let r = call(c.controller_get_volume(req)).await;
        sw.check(CONTROLLER, "ControllerGetVolume", &case, &r, want);
    }
}

/// The Node service's tables, on node-a.
async fn node(sw: &mut Sweep, lab: &Lab, cl: &mut Clients, fx: &Fixture, rng: &mut fastrand::Rng) {
    let mut n = cl.node(NODE);
    let fs_id = fx.fs_id();
    let staging = fx.fs_staging.display().to_string();
    let target = fx.fs_target.display().to_string();
    let secrets = sw.secrets();
    let unknown = unknown_volume(rng);

    // NodeStageVolume: the fixture is staged; a request that passed its
    // checks would meet the device in use (or succeed, at the real path),
    // so INVALID_ARGUMENT can only come from the check under test.
    let stage = |id: &str, path: &str, cap: Option<VolumeCapability>| NodeStageVolumeRequest {
        volume_id: id.to_owned(),
        publish_context: HashMap::new(),
        staging_target_path: path.to_owned(),
        volume_capability: cap,
        secrets: secrets.clone(),
        volume_context: fx.fs.volume_context.clone(),
    };
    let mut cases: Vec<(String, NodeStageVolumeRequest, &[Code])> = vec![
        (
            "an empty volume_id".into(),
            stage("", &staging, Some(fs_cap())),
            INVALID,
        ),
        (
            "a 1 MiB volume_id".into(),
            stage(&"v".repeat(HUGE), &staging, Some(fs_cap())),
            INVALID_OR_NOT_FOUND,
        ),
        (
            "a volume that does not exist".into(),
            stage(&unknown, &fx.fresh_staging("unknown"), Some(fs_cap())),
            NOT_FOUND,
        ),
        (
            "an empty staging_target_path".into(),
            stage(&fs_id, "", Some(fs_cap())),
            INVALID,
        ),
        (
            "no capability".into(),
            stage(&fs_id, &staging, None),
            INVALID,
        ),
        (
            "mount flags that remount".into(),
            stage(&fs_id, &staging, Some(mount_cap("xfs", &["remount"], ""))),
            INVALID,
        ),
        (
            "a 1 MiB mount flag".into(),
            stage(
                &fs_id,
                &staging,
                Some(mount_cap("xfs", &[&"o".repeat(HUGE)], "")),
            ),
            INVALID,
        ),
        (
            "a mount flag with a newline".into(),
            stage(&fs_id, &staging, Some(mount_cap("xfs", &["ro\nexec"], ""))),
            INVALID,
        ),
        (
            "a volume_mount_group".into(),
            stage(&fs_id, &staging, Some(mount_cap("xfs", &[], "1000"))),
            INVALID,
        ),
        (
            "a filesystem for MULTI_NODE_MULTI_WRITER".into(),
            stage(
                &fs_id,
                &staging,
                Some(capability(false, "xfs", Mode::MultiNodeMultiWriter)),
            ),
            EXCEEDS,
        ),
        (
            // "Volume published but is incompatible" (6).
            "ext4 where it is staged as xfs".into(),
            stage(
                &fs_id,
                &staging,
                Some(capability(false, "ext4", Mode::SingleNodeWriter)),
            ),
            &[Code::AlreadyExists],
        ),
    ];
    let mut mkfs = stage(&fs_id, &staging, Some(fs_cap()));
    mkfs.volume_context
        .insert("mkfsOptions".into(), "-f; rm -rf / #".into());
    cases.push(("mkfsOptions with a shell command".into(), mkfs, INVALID));
    let mut mkfs = stage(&fs_id, &staging, Some(fs_cap()));
    mkfs.volume_context
        .insert("mkfsOptions".into(), "-K ".repeat(HUGE / 3));
    cases.push(("1 MiB of mkfsOptions".into(), mkfs, INVALID));
    for (case, cap) in bad_capabilities() {
        cases.push((case, stage(&fs_id, &staging, Some(cap)), INVALID));
    }
    for (case, path) in fx.bad_paths() {
        cases.push((
            format!("a staging path: {case}"),
            stage(&fs_id, &path, Some(fs_cap())),
            INVALID,
        ));
    }
    for (case, req, want) in cases {
        let r = call(n.node_stage_volume(req)).await;
        sw.check(NODE_SVC, "NodeStageVolume", &case, &r, want);
    }
    let r = call(n.node_stage_volume(stage(&fs_id, &staging, Some(fs_cap())))).await;
    sw.check(
        NODE_SVC,
        "NodeStageVolume",
        "control: the fixture where it is staged",
        &r,
        OK,
    );

    // NodeUnstageVolume: only what cannot unstage the fixture.
    let unstage = |id: &str, path: &str| NodeUnstageVolumeRequest {
        volume_id: id.to_owned(),
        staging_target_path: path.to_owned(),
    };
    let mut cases: Vec<(String, NodeUnstageVolumeRequest, &[Code])> = vec![
        ("an empty volume_id".into(), unstage("", &staging), INVALID),
        (
            "an empty staging_target_path".into(),
            unstage(&fs_id, ""),
            INVALID,
        ),
        (
            "a 1 MiB volume_id".into(),
            unstage(&"v".repeat(HUGE), &staging),
            INVALID_OR_NOT_FOUND,
        ),
        (
            "a volume that does not exist".into(),
            unstage(&unknown, &fx.fresh_staging("unknown")),
            NODE_UNDO_UNKNOWN,
        ),
        // "If the volume ... is not staged to the staging_target_path, the
        // Plugin MUST reply 0 OK."
        (
            "control: a path it is not staged at".into(),
            unstage(&fs_id, &fx.fresh_staging("none")),
            OK,
        ),
    ];
    for (case, path) in fx.bad_paths() {
        cases.push((
            format!("a staging path: {case}"),
            unstage(&fs_id, &path),
            INVALID,
        ));
    }
    for (case, req, want) in cases {
        let r = call(n.node_unstage_volume(req)).await;
        sw.check(NODE_SVC, "NodeUnstageVolume", &case, &r, want);
    }

    // NodePublishVolume.
    let fresh = fx.fresh_target("publish");
    let publish =
        |id: &str, staging: &str, target: &str, cap: Option<VolumeCapability>, ro: bool| {
            NodePublishVolumeRequest {
                volume_id: id.to_owned(),
                publish_context: HashMap::new(),
                staging_target_path: staging.to_owned(),
                target_path: target.to_owned(),
                volume_capability: cap,
                readonly: ro,
                secrets: secrets.clone(),
                volume_context: fx.fs.volume_context.clone(),
            }
        };
    let mut cases: Vec<(String, NodePublishVolumeRequest, &[Code])> = vec![
        (
            "an empty volume_id".into(),
            publish("", &staging, &target, Some(fs_cap()), false),
            INVALID,
        ),
        (
            "a 1 MiB volume_id".into(),
            publish(&"v".repeat(HUGE), &staging, &target, Some(fs_cap()), false),
            INVALID_OR_NOT_FOUND,
        ),
        (
            "a volume that does not exist".into(),
            publish(&unknown, &staging, &fresh, Some(fs_cap()), false),
            NOT_FOUND,
        ),
        (
            "an empty target_path".into(),
            publish(&fs_id, &staging, "", Some(fs_cap()), false),
            INVALID,
        ),
        (
            // "Staging target path not set" (9).
            "an empty staging_target_path".into(),
            publish(&fs_id, "", &fresh, Some(fs_cap()), false),
            PRECONDITION,
        ),
        (
            "no capability".into(),
            publish(&fs_id, &staging, &fresh, None, false),
            INVALID,
        ),
        (
            "the staging path as target".into(),
            publish(&fs_id, &staging, &staging, Some(fs_cap()), false),
            INVALID,
        ),
        (
            // "Volume published but is incompatible" (6): published rw.
            "readonly where it is published read-write".into(),
            publish(&fs_id, &staging, &target, Some(fs_cap()), true),
            &[Code::AlreadyExists],
        ),
        (
            // The second-publish table: SINGLE_NODE_WRITER at a second
            // target path with SINGLE_NODE_MULTI_WRITER support is
            // FAILED_PRECONDITION.
            "a second target for SINGLE_NODE_WRITER".into(),
            publish(&fs_id, &staging, &fresh, Some(fs_cap()), false),
            PRECONDITION,
        ),
    ];
    for (case, cap) in bad_capabilities() {
        cases.push((
            case,
            publish(&fs_id, &staging, &fresh, Some(cap), false),
            INVALID,
        ));
    }
    for (case, path) in fx.bad_paths() {
        cases.push((
            format!("a target path: {case}"),
            publish(&fs_id, &staging, &path, Some(fs_cap()), false),
            INVALID,
        ));
        if !path.is_empty() {
            cases.push((
                format!("a staging path: {case}"),
                publish(&fs_id, &path, &fresh, Some(fs_cap()), false),
                INVALID,
            ));
        }
    }
    for (case, req, want) in cases {
        let r = call(n.node_publish_volume(req)).await;
        sw.check(NODE_SVC, "NodePublishVolume", &case, &r, want);
    }
    let r = call(n.node_publish_volume(publish(&fs_id, &staging, &target, Some(fs_cap()), false)))
        .await;
    sw.check(
        NODE_SVC,
        "NodePublishVolume",
        "control: the fixture where it is published",
        &r,
        OK,
    );

    // NodeUnpublishVolume: only what cannot unpublish the fixture.
    let unpublish = |id: &str, path: &str| NodeUnpublishVolumeRequest {
        volume_id: id.to_owned(),
        target_path: path.to_owned(),
    };
    let mut cases: Vec<(String, NodeUnpublishVolumeRequest, &[Code])> = vec![
        ("an empty volume_id".into(), unpublish("", &target), INVALID),
        (
            "an empty target_path".into(),
            unpublish(&fs_id, ""),
            INVALID,
        ),
        (
            "a 1 MiB volume_id".into(),
            unpublish(&"v".repeat(HUGE), &target),
            INVALID_OR_NOT_FOUND,
        ),
        (
            "a volume that does not exist".into(),
            unpublish(&unknown, &fx.fresh_target("unknown")),
            NODE_UNDO_UNKNOWN,
        ),
        (
            "control: a path it is not published at".into(),
            unpublish(&fs_id, &fx.fresh_target("none")),
            OK,
        ),
    ];
    for (case, path) in fx.bad_paths() {
        cases.push((
            format!("a target path: {case}"),
            unpublish(&fs_id, &path),
            INVALID,
        ));
    }
    for (case, req, want) in cases {
        let r = call(n.node_unpublish_volume(req)).await;
        sw.check(NODE_SVC, "NodeUnpublishVolume", &case, &r, want);
    }

    // NodeGetVolumeStats.
    let stats = |id: &str, path: &str| NodeGetVolumeStatsRequest {
        volume_id: id.to_owned(),
        volume_path: path.to_owned(),
        staging_target_path: String::new(),
    };
    let mut cases: Vec<(String, NodeGetVolumeStatsRequest, &[Code])> = vec![
        ("an empty volume_id".into(), stats("", &target), INVALID),
        ("an empty volume_path".into(), stats(&fs_id, ""), INVALID),
        (
            "a 1 MiB volume_id".into(),
            stats(&"v".repeat(HUGE), &target),
            INVALID_OR_NOT_FOUND,
        ),
        // "Volume does not exist" on the specified volume_path (5).
        (
            "a volume that is not at the path".into(),
            stats(&unknown, &target),
            NOT_FOUND,
        ),
        (
            "a path that does not exist".into(),
            stats(&fs_id, &fx.fresh_target("none")),
            NOT_FOUND,
        ),
    ];
    for (case, path) in fx.bad_paths() {
        // A path outside the kubelet directory is invalid, and the volume
        // is not there either.
        cases.push((
            format!("a volume path: {case}"),
            stats(&fs_id, &path),
            INVALID_OR_NOT_FOUND,
        ));
    }
    for (case, req, want) in cases {
        let r = call(n.node_get_volume_stats(req)).await;
        sw.check(NODE_SVC, "NodeGetVolumeStats", &case, &r, want);
    }
    let r = call(n.node_get_volume_stats(stats(&fs_id, &target))).await;
    if sw.check(
        NODE_SVC,
        "NodeGetVolumeStats",
        "control: the fixture",
        &r,
        OK,
    ) && let Ok(s) = &r
    {
        let abnormal = s.volume_condition.as_ref().is_some_and(|c| c.abnormal);
        sw.holds(!s.usage.is_empty() && !abnormal, || {
            format!("NodeGetVolumeStats of the fixture: {s:?}")
        });
    }

    // NodeExpandVolume.
    let expand =
        |id: &str, path: &str, range: Option<(i64, i64)>, cap: Option<VolumeCapability>| {
            NodeExpandVolumeRequest {
                volume_id: id.to_owned(),
                volume_path: path.to_owned(),
                capacity_range: range.map(|(r, l)| CapacityRange {
                    required_bytes: r,
                    limit_bytes: l,
                }),
                staging_target_path: staging.clone(),
                volume_capability: cap,
                secrets: secrets.clone(),
            }
        };
    let mut cases: Vec<(String, NodeExpandVolumeRequest, &[Code])> = vec![
        (
            "an empty volume_id".into(),
            expand("", &target, None, Some(fs_cap())),
            INVALID,
        ),
        (
            "an empty volume_path".into(),
            expand(&fs_id, "", None, Some(fs_cap())),
            INVALID,
        ),
        (
            "a 1 MiB volume_id".into(),
            expand(&"v".repeat(HUGE), &target, None, Some(fs_cap())),
            INVALID_OR_NOT_FOUND,
        ),
        (
            "a volume that is not at the path".into(),
            expand(&unknown, &target, None, Some(fs_cap())),
            NOT_FOUND,
        ),
        (
            "a negative required_bytes".into(),
            expand(&fs_id, &target, Some((-1, 0)), Some(fs_cap())),
            INVALID,
        ),
        (
            "limit_bytes below required_bytes".into(),
            expand(&fs_id, &target, Some((2 << 20, 1 << 20)), Some(fs_cap())),
            BAD_RANGE,
        ),
        (
            // "Unsupported capacity_range" (11): more than the LUN has.
            "1 PiB required".into(),
            expand(&fs_id, &target, Some((1 << 50, 0)), Some(fs_cap())),
            &[Code::OutOfRange],
        ),
        (
            // "Exceeds capabilities" (3).
            "raw block for the filesystem fixture".into(),
            expand(
                &fs_id,
                &target,
                None,
                Some(capability(true, "", Mode::SingleNodeWriter)),
            ),
            INVALID,
        ),
    ];
    for (case, cap) in bad_capabilities() {
        cases.push((case, expand(&fs_id, &target, None, Some(cap)), INVALID));
    }
    for (case, path) in fx.bad_paths() {
        cases.push((
            format!("a volume path: {case}"),
            expand(&fs_id, &path, None, Some(fs_cap())),
            INVALID,
        ));
    }
    for (case, req, want) in cases {
        let r = call(n.node_expand_volume(req)).await;
        sw.check(NODE_SVC, "NodeExpandVolume", &case, &r, want);
    }
    let r = call(n.node_expand_volume(expand(&fs_id, &target, None, Some(fs_cap())))).await;
    sw.check(
        NODE_SVC,
        "NodeExpandVolume",
        "control: to the size it has",
        &r,
        OK,
    );

    // NodeGetCapabilities and NodeGetInfo, on every node.
    for ln in &lab.nodes {
        let mut n = cl.node(&ln.name);
        let r = call(n.node_get_capabilities(NodeGetCapabilitiesRequest {})).await;
        sw.check(
            NODE_SVC,
            "NodeGetCapabilities",
            &format!("{}: control", ln.name),
            &r,
            OK,
        );
        let r = call(n.node_get_info(NodeGetInfoRequest {})).await;
        if sw.check(
            NODE_SVC,
            "NodeGetInfo",
            &format!("{}: control", ln.name),
            &r,
            OK,
        ) && let Ok(i) = &r
        {
            sw.holds(i.node_id == ln.name, || {
                format!("{} says it is {:?}", ln.name, i.node_id)
            });
        }
    }
}

/// array-a's IQN.
const ARRAY_A: &str = "iqn.2026-11.io.csi-scsi.lab:array-a";

/// The LUN number at which `wwid` comes through target `iqn`, as the
/// agent's status shows it (`host:channel:target:lun`).
fn lun_through(status: &api::StatusResponse, wwid: &str, iqn: &str) -> Option<u32> {
    status
        .devices
        .iter()
        .find(|d| d.wwid == wwid)?
        .paths
        .iter()
        .find(|p| p.target == iqn)?
        .hctl
        .rsplit(':')
        .next()?
        .parse()
        .ok()
}

/// An iSCSI target for the agent API with `portals` and `iqn`.
fn iscsi(name: &str, portals: &[&str], iqn: &str, chap: Option<(&str, &str)>) -> api::Target {
    api::Target {
        name: name.to_owned(),
        transport: Some(api::target::Transport::Iscsi(api::IscsiTarget {
            portals: portals.iter().map(|s| s.to_string()).collect(),
            iqn: iqn.to_owned(),
            chap: chap.map(|(u, p)| api::ChapCredentials {
                username: u.to_owned(),
                password: p.to_owned(),
                mutual_username: String::new(),
                mutual_password: String::new(),
            }),
        })),
    }
}

/// Targets the agent must refuse before it logs in anywhere: (case, target).
fn bad_targets(lab: &Lab, token: &str) -> Vec<(String, api::Target)> {
    let portal = format!("{}:3260", lab.net.host_ip());
    let iqn = ARRAY_A;
    let chap = Some((CHAP_USER, token));
    vec![
        (
            "a target without transport".into(),
            api::Target {
                name: "array-a".into(),
                transport: None,
            },
        ),
        ("no portals".into(), iscsi("array-a", &[], iqn, chap)),
        (
            "a portal that is no address".into(),
            iscsi("array-a", &["not a portal"], iqn, chap),
        ),
        (
            "port 99999".into(),
            iscsi("array-a", &["198.18.0.1:99999"], iqn, chap),
        ),
        (
            "a portal that looks like an option".into(),
            iscsi("array-a", &["--op=delete"], iqn, chap),
        ),
        (
            "an empty IQN".into(),
            iscsi("array-a", &[&portal], "", chap),
        ),
        (
            "an IQN that looks like an option".into(),
            iscsi("array-a", &[&portal], "--op=delete", chap),
        ),
        (
            "an IQN with a blank".into(),
            iscsi("array-a", &[&portal], "iqn.x:a b", chap),
        ),
        (
            "a 1 MiB IQN".into(),
            iscsi("array-a", &[&portal], &"i".repeat(HUGE), chap),
        ),
        (
            "a CHAP user with a newline".into(),
            iscsi(
                "array-a",
                &[&portal],
                iqn,
                Some(("user\nnode.session.auth.authmethod = None", token)),
            ),
        ),
        (
            "a 1 MiB CHAP secret".into(),
            iscsi(
                "array-a",
                &[&portal],
                iqn,
                Some((CHAP_USER, &token.repeat(HUGE / token.len()))),
            ),
        ),
        (
            "an FC WWPN that is no WWPN".into(),
            api::Target {
                name: "fc-1".into(),
                transport: Some(api::target::Transport::FibreChannel(
                    api::FibreChannelTarget {
                        wwpns: vec!["zz:zz".into()],
                    },
                )),
            },
        ),
    ]
}

/// WWIDs the agent must refuse as malformed: (case, wwid).
fn bad_wwids(rng: &mut fastrand::Rng) -> Vec<(String, String)> {
    let g = garbage(rng);
    vec![
        ("an empty WWID".into(), String::new()),
        ("the WWID `sda`".into(), "sda".into()),
        ("naa. with non-hex digits".into(), "naa.zz01".into()),
        (
            "a WWID with a NUL".into(),
            format!("naa.6{}\0", hex(rng, 31)),
        ),
        ("a /dev path".into(), "/dev/sda".into()),
        ("a 1 MiB WWID".into(), format!("naa.{}", "6".repeat(HUGE))),
        (format!("garbage {:?}", clip(&g)), g),
    ]
}

/// What one Wipe answered: the stream's first error, or its end.
async fn wipe(c: &mut AgentClient<Channel>, wwid: &str, mode: i32) -> Result<bool, Status> {
    let fut = async {
        let mut s = c
            .wipe(api::WipeRequest {
                wwid: wwid.to_owned(),
                mode,
            })
            .await?
            .into_inner();
        let mut done = false;
        while let Some(p) = s.message().await? {
            done |= p.done;
        }
        Ok(done)
    };
    match tokio::time::timeout(CALL_LIMIT, fut).await {
        Ok(r) => r,
        Err(_) => Err(Status::deadline_exceeded("sweep: wipe did not end")),
    }
}

/// The agent API of node-a: malformed Discover, Attach, Detach, Wipe and
/// Rescan requests.
async fn agent_api(
    sw: &mut Sweep,
    lab: &Lab,
    mut a: AgentClient<Channel>,
    fx: &Fixture,
    rng: &mut fastrand::Rng,
) -> anyhow::Result<()> {
    let token = sw.secrets[1].clone();
    let status = call(a.status(api::StatusRequest {})).await;
    sw.check(AGENT_API, "Status", "control", &status, OK);
    let status = status.context("agent status")?;
    let lun_of = |name: &str| -> anyhow::Result<(String, u32)> {
        let file = &lab.luns[name];
        let wwid = status
            .devices
            .iter()
            .map(|d| d.wwid.clone())
            .find(|w| lun_file(lab, w).is_some_and(|(_, f)| f == *file))
            .with_context(|| format!("node-a does not see LUN {name}"))?;
        let lun = lun_through(&status, &wwid, ARRAY_A)
            .with_context(|| format!("node-a sees LUN {name} through no path of array-a"))?;
        Ok((wwid, lun))
    };
    // A LUN of array-a no fixture uses.
    let spare = ["a1", "a2", "mp"]
        .into_iter()
        .find(|n| *n != fx.fs_lun && *n != fx.raw_lun)
        .context("a spare LUN")?;
    let (spare_wwid, spare_lun) = lun_of(spare)?;

    // Discover.
    let mut cases: Vec<(String, api::DiscoverRequest, &[Code])> = vec![(
        "no target".into(),
        api::DiscoverRequest { target: None },
        INVALID,
    )];
    for (case, t) in bad_targets(lab, &token) {
        cases.push((case, api::DiscoverRequest { target: Some(t) }, INVALID));
    }
    // agent.proto: UNAVAILABLE when no portal answered.
    cases.push((
        "a portal nobody listens on".into(),
        api::DiscoverRequest {
            target: Some(iscsi(
                "sweep-closed",
                &[&format!("{}:3261", lab.net.host_ip())],
                ARRAY_A,
                Some((CHAP_USER, &token)),
            )),
        },
        &[Code::Unavailable],
    ));
    for (case, req, want) in cases {
        let r = call(a.discover(req)).await;
        sw.check(AGENT_API, "Discover", &case, &r, want);
    }
    let r = call(a.discover(api::DiscoverRequest {
        target: Some(fx.array_a.clone()),
    }))
    .await;
    if sw.check(AGENT_API, "Discover", "control: array-a", &r, OK)
        && let Ok(d) = &r
    {
        sw.holds(d.luns.iter().any(|l| l.wwid == spare_wwid), || {
            format!("Discover of array-a does not report {spare_wwid}")
        });
    }

    // Attach.
    let attach = |wwid: &str, targets: Vec<api::Target>, lun: u32| api::AttachRequest {
        wwid: wwid.to_owned(),
        targets,
        lun,
    };
    let mut cases: Vec<(String, api::AttachRequest, &[Code])> = Vec::new();
    for (case, w) in bad_wwids(rng) {
        cases.push((
            case,
            attach(&w, vec![fx.array_a.clone()], spare_lun),
            INVALID,
        ));
    }
    cases.push((
        "no targets".into(),
        attach(&unknown_wwid(rng), vec![], 1),
        INVALID,
    ));
    for (case, t) in bad_targets(lab, &token) {
        cases.push((case, attach(&spare_wwid, vec![t], spare_lun), INVALID));
    }
    for (case, req, want) in cases {
        let r = call(a.attach(req)).await;
        sw.check(AGENT_API, "Attach", &case, &r, want);
    }
    // Control first: what follows may take the spare LUN's path away for
    // a moment.
    // The lab's kernel stand-in rewrites a disk's sysfs `size` in place on
    // every discovery scan, so a read racing it can miss the disk for a
    // moment (the kernel's sysfs never does): a control asks again briefly.
    let mut r = Err(Status::unknown("not sent"));
    for _ in 0..10 {
        r = call(a.rescan(api::RescanRequest {
            wwid: spare_wwid.clone(),
        }))
        .await;
        if !matches!(&r, Err(s) if s.code() == Code::NotFound) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if sw.check(AGENT_API, "Rescan", "control: the spare LUN", &r, OK)
        && let Ok(s) = &r
    {
        let size = std::fs::metadata(&lab.luns[spare]).map_or(0, |m| m.len());
        sw.holds(s.size_bytes == size, || {
            format!(
                "Rescan of {spare} says {} bytes, its file has {size}",
                s.size_bytes
            )
        });
    }
    // A WWID that never appears, and one at the address of a real LUN
    // (which is left in place): bounded by a short deadline.
    for (case, lun) in [
        ("a WWID no LUN has", 77),
        ("a wrong WWID at a spare LUN's address", spare_lun),
    ] {
        let mut req =
            tonic::Request::new(attach(&unknown_wwid(rng), vec![fx.array_a.clone()], lun));
        req.set_timeout(Duration::from_secs(3));
        let r = call(a.attach(req)).await;
        sw.check(AGENT_API, "Attach", case, &r, ATTACH_NEVER);
    }

    // Detach.
    let detach = |wwid: &str, targets: Vec<api::Target>| api::DetachRequest {
        wwid: wwid.to_owned(),
        targets,
    };
    let mut cases: Vec<(String, api::DetachRequest, &[Code])> = Vec::new();
    for (case, w) in bad_wwids(rng) {
        cases.push((case, detach(&w, vec![]), INVALID));
    }
    for (case, t) in bad_targets(lab, &token) {
        cases.push((case, detach(&spare_wwid, vec![t]), INVALID));
    }
    for (case, req, want) in cases {
        let r = call(a.detach(req)).await;
        sw.check(AGENT_API, "Detach", &case, &r, want);
    }
    // agent.proto: "A device that is already gone is success."
    let r = call(a.detach(detach(&unknown_wwid(rng), vec![fx.array_a.clone()]))).await;
    if sw.check(
        AGENT_API,
        "Detach",
        "control: a WWID that is not here",
        &r,
        OK,
    ) && let Ok(d) = &r
    {
        sw.holds(!d.removed, || {
            "Detach of an absent WWID removed something".into()
        });
    }

    // Wipe: nothing here may erase; the spare LUN's head is compared later.
    let mut cases: Vec<(String, String, i32, &[Code])> = Vec::new();
    for (case, w) in bad_wwids(rng) {
        cases.push((case, w, api::WipeMode::Zero as i32, INVALID));
    }
    cases.push((
        "mode UNSPECIFIED".into(),
        spare_wwid.clone(),
        api::WipeMode::Unspecified as i32,
        INVALID,
    ));
    cases.push(("mode 99".into(), spare_wwid.clone(), 99, INVALID));
    cases.push(("mode -1".into(), spare_wwid.clone(), -1, INVALID));
    cases.push((
        "a WWID that is not here".into(),
        unknown_wwid(rng),
        api::WipeMode::Zero as i32,
        NOT_FOUND,
    ));
    for (case, wwid, mode, want) in cases {
        let r = wipe(&mut a, &wwid, mode).await;
        sw.check(AGENT_API, "Wipe", &case, &r, want);
    }

    // Rescan.
    let mut cases: Vec<(String, String, &[Code])> = bad_wwids(rng)
        .into_iter()
        .map(|(c, w)| (c, w, INVALID))
        .collect();
    cases.push((
        "a WWID that is not here".into(),
        unknown_wwid(rng),
        NOT_FOUND,
    ));
    for (case, wwid, want) in cases {
        let r = call(a.rescan(api::RescanRequest { wwid })).await;
        sw.check(AGENT_API, "Rescan", &case, &r, want);
    }
    Ok(())
}

/// Well-formed requests that would destroy a fixture if a driver got them
/// wrong; sent last, so that a failure does not cascade.
async fn dangerous(sw: &mut Sweep, cl: &mut Clients, fx: &Fixture, mut a: AgentClient<Channel>) {
    let raw_wwid = Fixture::wwid(&fx.raw);
    let fs_wwid = Fixture::wwid(&fx.fs);
    // agent.proto: Wipe and Detach refuse (FAILED_PRECONDITION) a device
    // mounted or open anywhere on the node; a raw block publication is a
    // bind of the device node, and a filesystem's a mount.
    for (case, wwid) in [
        ("the mounted filesystem fixture's LUN", &fs_wwid),
        ("the published raw block fixture's LUN", &raw_wwid),
    ] {
        let r = wipe(&mut a, wwid, api::WipeMode::Discard as i32).await;
        sw.check(AGENT_API, "Wipe", case, &r, PRECONDITION);
        let r = call(a.detach(api::DetachRequest {
            wwid: wwid.clone(),
            targets: vec![],
        }))
        .await;
        sw.check(AGENT_API, "Detach", case, &r, PRECONDITION);
    }
    // An Attach of another WWID at the address of a LUN in use must leave
    // that LUN alone.
    let status = call(a.status(api::StatusRequest {})).await;
    let raw_lun = status
        .ok()
        .and_then(|s| lun_through(&s, &raw_wwid, ARRAY_A));
    if sw.holds(raw_lun.is_some(), || {
        "node-a no longer sees the raw fixture's LUN through array-a".into()
    }) {
        let mut req = tonic::Request::new(api::AttachRequest {
            wwid: format!("naa.6{}", "e".repeat(31)),
            targets: vec![fx.array_a.clone()],
            lun: raw_lun.unwrap_or_default(),
        });
        req.set_timeout(Duration::from_secs(3));
        let r = call(a.attach(req)).await;
        sw.check(
            AGENT_API,
            "Attach",
            "a wrong WWID at the address of the published raw block fixture",
            &r,
            ATTACH_NEVER,
        );
    }
    // CSI Node: a volume that does not exist, at the fixtures' real paths.
    // "Volume does not exist" (5); a driver that cannot tell may refuse to
    // touch a path that holds another volume (9); never 0 OK after
    // unmounting someone else's volume.
    let unknown = format!("naa.6{}:{}", "d".repeat(31), "0123-4567");
    let mut n = cl.node(NODE);
    let r = call(n.node_unpublish_volume(NodeUnpublishVolumeRequest {
        volume_id: unknown.clone(),
        target_path: fx.fs_target.display().to_string(),
    }))
    .await;
    sw.check(
        NODE_SVC,
        "NodeUnpublishVolume",
        "a volume that does not exist, at the fixture's target",
        &r,
        &[Code::NotFound, Code::FailedPrecondition],
    );
    let r = call(n.node_unstage_volume(NodeUnstageVolumeRequest {
        volume_id: unknown,
        staging_target_path: fx.fs_staging.display().to_string(),
    }))
    .await;
    sw.check(
        NODE_SVC,
        "NodeUnstageVolume",
        "a volume that does not exist, at the fixture's staging path",
        &r,
        &[Code::NotFound, Code::FailedPrecondition],
    );
}

/// One round of seeded garbage: random IDs in every ID field of every RPC.
async fn garbage_round(
    sw: &mut Sweep,
    cl: &mut Clients,
    fx: &Fixture,
    mut a: AgentClient<Channel>,
    rng: &mut fastrand::Rng,
) {
    let c = &mut cl.controller;
    let g = garbage(rng);
    let case = format!("garbage {:?}", clip(&g));
    let fs_id = fx.fs_id();
    let secrets = sw.secrets();
    let staging = fx.fs_staging.display().to_string();
    let target = fx.fs_target.display().to_string();

    let r = call(c.create_volume(CreateVolumeRequest {
        name: garbage(rng),
        capacity_range: None,
        volume_capabilities: vec![fs_cap()],
        parameters: HashMap::from([(g.clone(), garbage(rng))]),
        secrets: secrets.clone(),
        volume_content_source: None,
        accessibility_requirements: None,
        mutable_parameters: HashMap::new(),
    }))
    .await;
    if let Ok(v) = &r
        && let Some(v) = &v.volume
    {
        sw.created.push(v.volume_id.clone());
    }
    sw.check(
        CONTROLLER,
        "CreateVolume",
        &format!("a parameter named {case}"),
        &r,
        INVALID,
    );
    let r = call(c.delete_volume(DeleteVolumeRequest {
        volume_id: g.clone(),
        secrets: secrets.clone(),
    }))
    .await;
    // A volume that cannot exist does not exist: "MUST reply 0 OK".
    sw.check(CONTROLLER, "DeleteVolume", &case, &r, DELETE_OVERSIZED);
    let r = call(c.controller_publish_volume(ControllerPublishVolumeRequest {
        volume_id: g.clone(),
        node_id: NODE.into(),
        volume_capability: Some(fs_cap()),
        readonly: false,
        secrets: secrets.clone(),
        volume_context: HashMap::new(),
    }))
    .await;
    sw.check(
        CONTROLLER,
        "ControllerPublishVolume",
        &case,
        &r,
        INVALID_OR_NOT_FOUND,
    );
    let r = call(c.controller_publish_volume(ControllerPublishVolumeRequest {
        volume_id: fs_id.clone(),
        node_id: g.clone(),
        volume_capability: Some(fs_cap()),
        readonly: false,
        secrets: secrets.clone(),
        volume_context: HashMap::new(),
    }))
    .await;
    sw.check(
        CONTROLLER,
        "ControllerPublishVolume",
        &format!("node {case}"),
        &r,
        INVALID_OR_NOT_FOUND,
    );
    let r = call(
        c.controller_unpublish_volume(ControllerUnpublishVolumeRequest {
            volume_id: g.clone(),
            node_id: NODE.into(),
            secrets: secrets.clone(),
        }),
    )
    .await;
    sw.check(
        CONTROLLER,
        "ControllerUnpublishVolume",
        &case,
        &r,
        UNPUBLISH_GARBAGE,
    );
    let r = call(
        c.validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
            volume_id: g.clone(),
            volume_capabilities: vec![fs_cap()],
            secrets: secrets.clone(),
            ..Default::default()
        }),
    )
    .await;
    sw.check(
        CONTROLLER,
        "ValidateVolumeCapabilities",
        &case,
        &r,
        INVALID_OR_NOT_FOUND,
    );
    let r = call(c.list_volumes(ListVolumesRequest {
        max_entries: 0,
        starting_token: g.clone(),
    }))
    .await;
    sw.check(
        CONTROLLER,
        "ListVolumes",
        &format!("token {case}"),
        &r,
        &[Code::Aborted],
    );
    let r = call(c.controller_expand_volume(ControllerExpandVolumeRequest {
        volume_id: g.clone(),
        capacity_range: Some(CapacityRange {
            required_bytes: 1 << 20,
            limit_bytes: 0,
        }),
        secrets: secrets.clone(),
        volume_capability: None,
    }))
    .await;
    sw.check(
        CONTROLLER,
        "ControllerExpandVolume",
        &case,
        &r,
        INVALID_OR_NOT_FOUND,
    );
    let r = call(c.controller_get_volume(ControllerGetVolumeRequest {
        volume_id: g.clone(),
    }))
    .await;
    sw.check(
        CONTROLLER,
        "ControllerGetVolume",
        &case,
        &r,
        INVALID_OR_NOT_FOUND,
    );

    // Node: a garbage volume ID at the fixture's real paths.
    let mut n = cl.node(NODE);
    let r = call(n.node_stage_volume(NodeStageVolumeRequest {
        volume_id: g.clone(),
        staging_target_path: staging.clone(),
        volume_capability: Some(fs_cap()),
        secrets: secrets.clone(),
        ..Default::default()
    }))
    .await;
    sw.check(NODE_SVC, "NodeStageVolume", &case, &r, INVALID_OR_NOT_FOUND);
    let r = call(n.node_unstage_volume(NodeUnstageVolumeRequest {
        volume_id: g.clone(),
        staging_target_path: staging.clone(),
    }))
    .await;
    sw.check(
        NODE_SVC,
        "NodeUnstageVolume",
        &case,
        &r,
        INVALID_OR_NOT_FOUND,
    );
    let r = call(n.node_publish_volume(NodePublishVolumeRequest {
        volume_id: g.clone(),
        staging_target_path: staging.clone(),
        target_path: target.clone(),
        volume_capability: Some(fs_cap()),
        secrets: secrets.clone(),
        ..Default::default()
    }))
    .await;
    sw.check(
        NODE_SVC,
        "NodePublishVolume",
        &case,
        &r,
        INVALID_OR_NOT_FOUND,
    );
    let r = call(n.node_unpublish_volume(NodeUnpublishVolumeRequest {
        volume_id: g.clone(),
        target_path: target.clone(),
    }))
    .await;
    sw.check(
        NODE_SVC,
        "NodeUnpublishVolume",
        &case,
        &r,
        INVALID_OR_NOT_FOUND,
    );
    let r = call(n.node_get_volume_stats(NodeGetVolumeStatsRequest {
        volume_id: g.clone(),
        volume_path: target.clone(),
        staging_target_path: String::new(),
    }))
    .await;
    sw.check(
        NODE_SVC,
        "NodeGetVolumeStats",
        &case,
        &r,
        INVALID_OR_NOT_FOUND,
    );
    let r = call(n.node_expand_volume(NodeExpandVolumeRequest {
        volume_id: g.clone(),
        volume_path: target.clone(),
        secrets: secrets.clone(),
        ..Default::default()
    }))
    .await;
    sw.check(
        NODE_SVC,
        "NodeExpandVolume",
        &case,
        &r,
        INVALID_OR_NOT_FOUND,
    );
    // A garbage path with the fixture's volume.
    let p = garbage(rng);
    let pcase = format!("path {:?}", clip(&p));
    let r = call(n.node_unpublish_volume(NodeUnpublishVolumeRequest {
        volume_id: fs_id.clone(),
        target_path: p.clone(),
    }))
    .await;
    sw.check(NODE_SVC, "NodeUnpublishVolume", &pcase, &r, INVALID);
    let r = call(n.node_unstage_volume(NodeUnstageVolumeRequest {
        volume_id: fs_id.clone(),
        staging_target_path: p,
    }))
    .await;
    sw.check(NODE_SVC, "NodeUnstageVolume", &pcase, &r, INVALID);

    // Agent API: a garbage WWID everywhere.
    let w = garbage(rng);
    let wcase = format!("WWID {:?}", clip(&w));
    let r = call(a.attach(api::AttachRequest {
        wwid: w.clone(),
        targets: vec![fx.array_a.clone()],
        lun: 1,
    }))
    .await;
    sw.check(AGENT_API, "Attach", &wcase, &r, INVALID);
    let r = call(a.detach(api::DetachRequest {
        wwid: w.clone(),
        targets: vec![],
    }))
    .await;
    sw.check(AGENT_API, "Detach", &wcase, &r, INVALID);
    let r = wipe(&mut a, &w, api::WipeMode::Zero as i32).await;
    sw.check(AGENT_API, "Wipe", &wcase, &r, INVALID);
    let r = call(a.rescan(api::RescanRequest { wwid: w })).await;
    sw.check(AGENT_API, "Rescan", &wcase, &r, INVALID);
    let r = call(a.discover(api::DiscoverRequest {
        target: Some(iscsi(&garbage(rng), &[&garbage(rng)], &garbage(rng), None)),
    }))
    .await;
    sw.check(
        AGENT_API,
        "Discover",
        "a garbage portal and IQN",
        &r,
        INVALID,
    );
}

/// Every RPC's path, the code an empty request gets, and whether it
/// streams its answer.
struct Rpc {
    path: &'static str,
    empty: &'static [Code],
    streaming: bool,
}

const fn rpc(path: &'static str, empty: &'static [Code]) -> Rpc {
    Rpc {
        path,
        empty,
        streaming: false,
    }
}

/// Controller RPCs: an empty request misses a required field (3), asks
/// for a page or the capacity (0), or is not implemented (12).
const CONTROLLER_RPCS: &[Rpc] = &[
    rpc("/csi.v1.Controller/CreateVolume", INVALID),
    rpc("/csi.v1.Controller/DeleteVolume", INVALID),
    rpc("/csi.v1.Controller/ControllerPublishVolume", INVALID),
    rpc("/csi.v1.Controller/ControllerUnpublishVolume", INVALID),
    rpc("/csi.v1.Controller/ValidateVolumeCapabilities", INVALID),
    rpc("/csi.v1.Controller/ListVolumes", OK),
    rpc("/csi.v1.Controller/GetCapacity", OK),
    rpc("/csi.v1.Controller/ControllerGetCapabilities", OK),
    rpc("/csi.v1.Controller/CreateSnapshot", UNIMPLEMENTED),
    rpc("/csi.v1.Controller/DeleteSnapshot", UNIMPLEMENTED),
    rpc("/csi.v1.Controller/ListSnapshots", UNIMPLEMENTED),
    rpc("/csi.v1.Controller/GetSnapshot", UNIMPLEMENTED),
    rpc("/csi.v1.Controller/ControllerExpandVolume", INVALID),
    rpc("/csi.v1.Controller/ControllerGetVolume", INVALID),
    rpc("/csi.v1.Controller/ControllerModifyVolume", UNIMPLEMENTED),
];

/// Node RPCs.
const NODE_RPCS: &[Rpc] = &[
    rpc("/csi.v1.Node/NodeStageVolume", INVALID),
    rpc("/csi.v1.Node/NodeUnstageVolume", INVALID),
    rpc("/csi.v1.Node/NodePublishVolume", INVALID),
    rpc("/csi.v1.Node/NodeUnpublishVolume", INVALID),
    rpc("/csi.v1.Node/NodeGetVolumeStats", INVALID),
    rpc("/csi.v1.Node/NodeExpandVolume", INVALID),
    rpc("/csi.v1.Node/NodeGetCapabilities", OK),
    rpc("/csi.v1.Node/NodeGetInfo", OK),
];

/// Agent API RPCs: agent.proto, INVALID_ARGUMENT for a malformed WWID or
/// target (an empty one included).
const AGENT_RPCS: &[Rpc] = &[
    rpc("/csi.agent.v1.Agent/Discover", INVALID),
    rpc("/csi.agent.v1.Agent/Attach", INVALID),
    rpc("/csi.agent.v1.Agent/Detach", INVALID),
    Rpc {
        path: "/csi.agent.v1.Agent/Wipe",
        empty: INVALID,
        streaming: true,
    },
    rpc("/csi.agent.v1.Agent/Rescan", INVALID),
    rpc("/csi.agent.v1.Agent/Status", OK),
];

/// Services a socket does not serve: "Call not implemented" (12).
const UNSERVED: &[(&str, &[&str])] = &[
    (
        "proxy",
        &[
            "/csi.v1.Node/NodeStageVolume",
            "/csi.v1.Node/NodeGetInfo",
            "/csi.v1.GroupController/GroupControllerGetCapabilities",
            "/csi.v1.GroupController/CreateVolumeGroupSnapshot",
            "/csi.v1.GroupController/DeleteVolumeGroupSnapshot",
            "/csi.v1.GroupController/GetVolumeGroupSnapshot",
        ],
    ),
    (
        "node",
        &[
            "/csi.v1.Controller/CreateVolume",
            "/csi.v1.Controller/DeleteVolume",
            "/csi.v1.Controller/ControllerPublishVolume",
        ],
    ),
];

/// Raw bytes on the wire to every RPC: unknown fields (skipped: the answer
/// is the empty request's), undecodable bytes, a message over the size
/// limit, and services a socket does not serve.
async fn wire(sw: &mut Sweep, wires: &[(Channel, &[Rpc])], rng: &mut fastrand::Rng) {
    let proxy = &wires[0].0;
    let node = &wires[1].0;
    for (channel, rpcs) in wires {
        for r in *rpcs {
            wire_rpc(sw, channel.clone(), r, rng).await;
        }
        // One message over the receive limit per service.
        let big = oversized(rng);
        let res = raw(channel.clone(), rpcs[0].path, big, rpcs[0].streaming).await;
        sw.check(WIRE, rpcs[0].path, "a 5 MiB message", &res, TOO_LARGE);
    }
    for (who, paths) in UNSERVED {
        let channel = if *who == "proxy" { proxy } else { node };
        for path in *paths {
            let res = raw(channel.clone(), path, Vec::new(), false).await;
            sw.check(
                WIRE,
                path,
                &format!("sent to the {who} socket"),
                &res,
                UNIMPLEMENTED,
            );
        }
    }
}

/// Sends `rpc` one request of unknown fields and one of undecodable bytes.
async fn wire_rpc(sw: &mut Sweep, channel: Channel, rpc: &Rpc, rng: &mut fastrand::Rng) {
    let res = raw(
        channel.clone(),
        rpc.path,
        unknown_fields(rng),
        rpc.streaming,
    )
    .await;
    sw.check(WIRE, rpc.path, "only unknown fields", &res, rpc.empty);
    let bytes = undecodable(rng);
    let res = raw(channel, rpc.path, bytes, rpc.streaming).await;
    sw.check(WIRE, rpc.path, "undecodable bytes", &res, UNDECODABLE);
}

/// A channel to node-a's agent API, with the proxy's certificate.
fn agent_channel(lab: &Lab) -> anyhow::Result<Channel> {
    let store = MaterialStore::load(
        MaterialPaths::in_dir(&lab.config.dir.join("pki/proxy-tls")),
        Role::Proxy,
        TrustDomain::new("csi-scsi.local")?,
    )?;
    let n = &lab.nodes[0];
    Ok(csi_scsi_daemon::agent_channel(
        &n.api.to_string(),
        &n.name,
        store,
        Duration::from_secs(5),
    )?)
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Fields no message of either API defines (numbers from 10000), in every
/// valid wire type: a decoder must skip them.
fn unknown_fields(rng: &mut fastrand::Rng) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rng.usize(1..6) {
        let field = rng.u64(10_000..500_000);
        match rng.u8(..4) {
            0 => {
                varint(field << 3, &mut out);
                varint(rng.u64(..), &mut out);
            }
            1 => {
                varint((field << 3) | 1, &mut out);
                out.extend(rng.u64(..).to_le_bytes());
            }
            2 => {
                let n = rng.usize(..64);
                varint((field << 3) | 2, &mut out);
                varint(n as u64, &mut out);
                out.extend((0..n).map(|_| rng.u8(..)));
            }
            _ => {
                varint((field << 3) | 5, &mut out);
                out.extend(rng.u32(..).to_le_bytes());
            }
        }
    }
    out
}

/// Bytes no protobuf decoder accepts: a tag for field 0, an invalid wire
/// type, or a length running past the end.
fn undecodable(rng: &mut fastrand::Rng) -> Vec<u8> {
    let tail: Vec<u8> = (0..rng.usize(..64)).map(|_| rng.u8(..)).collect();
    let mut out = Vec::new();
    match rng.u8(..3) {
        0 => out.push(0),
        1 => out.push((1 << 3) | 7),
        _ => {
            out.push((1 << 3) | 2);
            varint(tail.len() as u64 + 1 + rng.u64(..1000), &mut out);
        }
    }
    out.extend(tail);
    out
}

/// A message of unknown fields over the 4 MiB receive limit.
fn oversized(rng: &mut fastrand::Rng) -> Vec<u8> {
    let mut out = Vec::with_capacity(OVERSIZED + 16);
    varint((12_345 << 3) | 2, &mut out);
    varint(OVERSIZED as u64, &mut out);
    out.extend((0..OVERSIZED).map(|_| rng.u8(..)));
    out
}

/// Bytes in, bytes out: a codec that sends whatever it is given.
#[derive(Clone, Copy, Debug, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let mut v = vec![0u8; src.remaining()];
        src.copy_to_slice(&mut v);
        Ok(Some(v))
    }
}

/// Calls `path` with `body` as the request message.
async fn raw(channel: Channel, path: &str, body: Vec<u8>, streaming: bool) -> Result<(), Status> {
    let path = PathAndQuery::try_from(path.to_owned())
        .map_err(|e| Status::internal(format!("sweep: bad path: {e}")))?;
    let fut = async {
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready()
            .await
            .map_err(|e| Status::unavailable(format!("sweep: channel not ready: {e}")))?;
        if streaming {
            let mut s = grpc
                .server_streaming(tonic::Request::new(body), path, RawCodec)
                .await?
                .into_inner();
            while s.message().await?.is_some() {}
        } else {
            grpc.unary(tonic::Request::new(body), path, RawCodec)
                .await?;
        }
        Ok(())
    };
    match tokio::time::timeout(CALL_LIMIT, fut).await {
        Ok(r) => r,
        Err(_) => Err(Status::deadline_exceeded("sweep: no answer")),
    }
}

/// After the sweep: nothing it sent touched a device, a path outside the
/// kubelet directory, or a published volume; nothing leaked a secret.
async fn invariants(
    sw: &mut Sweep,
    lab: &Lab,
    cl: &mut Clients,
    fx: &Fixture,
    heads: &BTreeMap<String, [u8; 16]>,
    mut a: AgentClient<Channel>,
) -> anyhow::Result<()> {
    for (name, before) in heads {
        let after = head_digest(&lab.luns[name])?;
        sw.holds(after == *before, || {
            format!("LUN {name}: its first MiB changed during the sweep")
        });
    }
    let back = std::fs::read(fx.fs_target.join("sweep.bin")).unwrap_or_default();
    sw.holds(back == fx.payload, || {
        "the fs fixture's file no longer reads back".into()
    });
    let mut head = vec![0u8; HEAD];
    let read = std::fs::File::open(&fx.raw_target).and_then(|mut f| {
        f.seek(SeekFrom::Start(0))
            .and_then(|_| f.read_exact(&mut head))
    });
    sw.holds(read.is_ok() && head == fx.pattern, || {
        format!("the raw fixture no longer reads back through its target: {read:?}")
    });
    let empty = std::fs::read_dir(&fx.outside).map(|mut d| d.next().is_none());
    sw.holds(matches!(empty, Ok(true)), || {
        format!("{} is no longer empty", fx.outside.display())
    });
    for s in &fx.strays {
        sw.holds(!s.exists(), || format!("{} was created", s.display()));
    }
    for v in [&fx.fs, &fx.raw] {
        let r = call(
            cl.controller
                .controller_get_volume(ControllerGetVolumeRequest {
                    volume_id: v.volume_id.clone(),
                }),
        )
        .await;
        if sw.check(
            CONTROLLER,
            "ControllerGetVolume",
            "control: a fixture after the sweep",
            &r,
            OK,
        ) && let Ok(g) = &r
        {
            let nodes = g
                .status
                .as_ref()
                .map(|s| s.published_node_ids.clone())
                .unwrap_or_default();
            sw.holds(nodes == [NODE], || {
                format!("{} is published on {nodes:?} after the sweep", v.volume_id)
            });
        }
    }
    // Every LUN node-a saw is still there (a wrong-WWID attach at a LUN's
    // address removes a stale path, then the rescan must bring it back).
    let want: Vec<String> = lab
        .luns
        .keys()
        .filter(|n| ["a1", "a2", "mp", "b1"].contains(&n.as_str()))
        .cloned()
        .collect();
    let start = Instant::now();
    let missing = loop {
        let seen: Vec<String> = call(a.status(api::StatusRequest {}))
            .await
            .map(|s| {
                s.devices
                    .iter()
                    .filter_map(|d| lun_file(lab, &d.wwid).map(|(n, _)| n))
                    .collect()
            })
            .unwrap_or_default();
        let missing: Vec<String> = want.iter().filter(|n| !seen.contains(n)).cloned().collect();
        if missing.is_empty() || start.elapsed() > Duration::from_secs(10) {
            break missing;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    sw.holds(missing.is_empty(), || {
        format!("node-a no longer sees LUNs {missing:?}")
    });
    // Secrets never reach a log (proto: "never logged").
    for log in std::iter::once(lab.config.dir.join("proxy.log")).chain(
        lab.nodes
            .iter()
            .map(|n| lab.config.dir.join(format!("{}.agent.log", n.name))),
    ) {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        for s in &sw.secrets.clone() {
            sw.holds(!text.contains(s.as_str()), || {
                format!("{} holds a secret", log.display())
            });
        }
    }
    // Still serving: Probe answers everywhere.
    let mut sockets = vec![lab.proxy_csi.clone()];
    sockets.extend(lab.nodes.iter().map(|n| n.csi.clone()));
    for s in sockets {
        let r = match csi_channel(&s).await {
            Ok(ch) => call(IdentityClient::new(ch).probe(ProbeRequest {})).await,
            Err(e) => Err(Status::unavailable(e.to_string())),
        };
        sw.check(
            IDENTITY,
            "Probe",
            &format!("{} after the sweep", s.display()),
            &r,
            OK,
        );
    }
    Ok(())
}
