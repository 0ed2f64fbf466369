//! The lab side of the sweep: the two volumes kept published on node-a,
//! the paths malformed requests aim at, the digests of the LUN files, and
//! the channels to the lab's services.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use csi_scsi_certs::{MaterialPaths, MaterialStore, Role, TrustDomain};
use csi_scsi_proto::agent as api;
use csi_scsi_proto::csi::{DeleteVolumeRequest, Volume};
use md5::{Digest, Md5};
use tonic::transport::Channel;

use super::codes::OK;
use super::requests::iscsi;
use super::{HUGE, NODE, Sweep};
use crate::lab::scenario::{
    self, Clients, attach_and_mount, create, kubelet_paths, lun_file, unmount_and_detach,
};
use crate::lab::{CHAP_USER, Lab};

/// Bytes of each LUN file compared before and after.
pub(super) const HEAD: usize = 1 << 20;
/// array-a's IQN.
pub(super) const ARRAY_A: &str = "iqn.2026-11.io.csi-scsi.lab:array-a";

/// Waits until the proxy's inventory shows every LUN of the lab.
pub(super) async fn wait_for_discovery(lab: &Lab, cl: &mut Clients) -> anyhow::Result<()> {
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

/// A channel to node-a's agent API, with the proxy's certificate.
pub(super) fn agent_channel(lab: &Lab) -> anyhow::Result<Channel> {
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

/// The digest of the first MiB of `file`.
pub(super) fn head_digest(file: &Path) -> anyhow::Result<[u8; 16]> {
    let mut f = std::fs::File::open(file)?;
    let mut buf = vec![0u8; HEAD];
    f.read_exact(&mut buf)?;
    Ok(Md5::digest(&buf).into())
}

/// The LUN number at which `wwid` comes through target `iqn`, as the
/// agent's status shows it (`host:channel:target:lun`).
pub(super) fn lun_through(status: &api::StatusResponse, wwid: &str, iqn: &str) -> Option<u32> {
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

/// The volumes kept published on node-a while the sweep runs, and the
/// paths the malformed requests aim at.
pub(super) struct Fixture {
    /// A filesystem (xfs) volume, staged and published.
    pub(super) fs: Volume,
    pub(super) fs_staging: PathBuf,
    pub(super) fs_target: PathBuf,
    /// A raw block volume, staged and published.
    pub(super) raw: Volume,
    pub(super) raw_target: PathBuf,
    /// LUN names of both.
    pub(super) fs_lun: String,
    pub(super) raw_lun: String,
    /// Node-a's kubelet directory.
    kubelet: PathBuf,
    /// A directory outside it that must stay empty.
    pub(super) outside: PathBuf,
    /// Under the kubelet directory, a symlink to `outside`.
    link_out: PathBuf,
    /// Under the kubelet directory, a symlink to `/`.
    link_root: PathBuf,
    /// Paths outside anything that must not come to exist.
    pub(super) strays: Vec<PathBuf>,
    /// The pattern written at the start of the raw volume.
    pub(super) pattern: Vec<u8>,
    /// What the fs volume holds.
    pub(super) payload: Vec<u8>,
    /// array-a as the agent API describes it (CHAP included).
    pub(super) array_a: api::Target,
}

impl Fixture {
    /// Creates, publishes and fills both volumes, and lays out the paths
    /// around the kubelet directory.
    pub(super) async fn up(
        lab: &Lab,
        cl: &mut Clients,
        rng: &mut fastrand::Rng,
    ) -> anyhow::Result<Self> {
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
        let password =
            std::fs::read_to_string(lab.config.dir.join("secrets/chap-array-a/password"))?;
        let portal = format!("{}:3260", lab.net.host_ip());
        let array_a = iscsi("array-a", &[&portal], ARRAY_A, Some((CHAP_USER, &password)));
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
    pub(super) fn seed_luns(
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

    /// The fs fixture's volume ID.
    pub(super) fn fs_id(&self) -> String {
        self.fs.volume_id.clone()
    }

    /// The WWID in `v`'s volume context.
    pub(super) fn wwid(v: &Volume) -> String {
        v.volume_context.get("wwid").cloned().unwrap_or_default()
    }

    /// A staging path under node-a's kubelet directory nothing uses.
    pub(super) fn fresh_staging(&self, tag: &str) -> String {
        self.kubelet
            .join(format!(
                "plugins/kubernetes.io/csi/csi-scsi.io/sweep-{tag}/globalmount"
            ))
            .display()
            .to_string()
    }

    /// A target path under node-a's kubelet directory nothing uses.
    pub(super) fn fresh_target(&self, tag: &str) -> String {
        self.kubelet
            .join(format!(
                "pods/sweep-{tag}/volumes/kubernetes.io~csi/sweep/mount"
            ))
            .display()
            .to_string()
    }

    /// Paths kubelet would never send: (case, path).
    pub(super) fn bad_paths(&self) -> Vec<(String, String)> {
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
    pub(super) async fn down(&self, sw: &mut Sweep, lab: &Lab, cl: &mut Clients) {
        for (v, pod) in [(&self.fs, "sweep-pod-fs"), (&self.raw, "sweep-pod-raw")] {
            let r = unmount_and_detach(lab, cl, v, NODE, pod).await;
            sw.holds(r.is_ok(), || {
                format!("after the sweep, {} does not tear down: {r:?}", v.volume_id)
            });
            let req = DeleteVolumeRequest {
                volume_id: v.volume_id.clone(),
                secrets: HashMap::new(),
            };
            sw.send(&mut cl.controller, "a fixture after the sweep", req, OK)
                .await;
        }
    }
}
