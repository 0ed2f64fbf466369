//! One node for the CSI Node tests: a real agent process whose sysfs and
//! /dev roots are a NodeTree over real loop devices, a kubelet directory,
//! and a CSI Node client on the agent's socket. Mounts made under the
//! test's temp dir are lazily unmounted when the lab is dropped, even when
//! the test failed half-way.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use csi_scsi_proto::csi::node_client::NodeClient;
use csi_scsi_proto::csi::volume_capability::access_mode::Mode;
use csi_scsi_proto::csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use csi_scsi_proto::csi::{
    NodeExpandVolumeRequest, NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse,
    NodePublishVolumeRequest, NodeStageVolumeRequest, NodeUnpublishVolumeRequest,
    NodeUnstageVolumeRequest, VolumeCapability,
};
use csi_scsi_tests::csi_client::csi_channel;
use csi_scsi_tests::loop_luns::LoopLun;
use csi_scsi_tests::node_tree::{DiskPath, NodeTree, PathTransport};
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::support::{Agent, Env};

/// 64 MiB: enough for ext4.
pub const SMALL: u64 = 64 << 20;
/// 320 MiB: mkfs.xfs refuses devices under 300 MB.
pub const XFS_SIZE: u64 = 320 << 20;

/// A node with an agent, a device tree and a kubelet directory.
pub struct Lab {
    // Field order is drop order: the kernel's part stops, unmount, then stop
    // the agent, detach the loop devices, and only then remove the temp dir.
    kernel: RescanKernel,
    _unmount: UnmountOnDrop,
    pub agent: Agent,
    pub luns: Vec<Lun>,
    pub tree: NodeTree,
    pub kubelet: PathBuf,
    pub client: NodeClient<Channel>,
    pub env: Env,
}

/// One LUN of the lab: a loop device seen through the tree as `sdX`.
pub struct Lun {
    pub backing: LoopLun,
    pub name: String,
    pub wwid: String,
    pub volume_id: String,
}

/// Lazily unmounts everything mounted under a directory when dropped.
pub struct UnmountOnDrop(PathBuf);

/// The kernel's part of `device/rescan` for the lab's LUNs: re-reads the
/// loop device's size into the tree, then clears the trigger (the agent
/// reads a trigger that stays written as a rescan still under way, and
/// refuses to go on). Stopped by [`Lab::stop_kernel`] or when dropped.
struct RescanKernel {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

// === impl Lab ===

impl Lab {
    /// A lab with one LUN per size in `sizes`, or `None` when not root
    /// (loop devices, mknod and mount need root; CI runs as root).
    pub async fn start(sizes: &[u64]) -> Option<Self> {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIPPED: the CSI Node tests need root (loop devices, mknod, mount)");
            return None;
        }
        let env = Env::new();
        let root = std::fs::canonicalize(env.dir.path()).expect("canonical temp dir");
        let unmount = UnmountOnDrop(root.clone());
        let tree = NodeTree::create(&root.join("node")).expect("node tree");
        tree.add_iscsi_session(
            2,
            1,
            "iqn.2026-01.io.csi-scsi:lab",
            "127.0.0.1:3260",
            "iqn.2026-01.io.csi-scsi:node-a",
        )
        .expect("session");
        let kubelet = root.join("kubelet");
        std::fs::create_dir_all(&kubelet).expect("kubelet dir");
        let mut luns = Vec::new();
        for &size in sizes {
            luns.push(add_lun(&tree, &root, size));
        }
        let tls = env.pki.issue_agent("node-a", "node-a-tls");
        let sys = tree.sys().display().to_string();
        let dev = tree.dev().display().to_string();
        let kubelet_arg = kubelet.display().to_string();
        let agent = env
            .start_agent_with(
                "node-a",
                &tls,
                &[
                    "--sysfs-root",
                    &sys,
                    "--dev-root",
                    &dev,
                    "--kubelet-dir",
                    &kubelet_arg,
                    "--max-volumes",
                    "16",
                ],
            )
            .await;
        let client = NodeClient::new(csi_channel(&agent.csi).await.expect("CSI socket"));
        let kernel = RescanKernel::start(
            tree.clone(),
            luns.iter()
                .map(|l| (l.name.clone(), l.backing.device.clone()))
                .collect(),
        );
        Some(Self {
            kernel,
            _unmount: unmount,
            agent,
            luns,
            tree,
            kubelet,
            client,
            env,
        })
    }

    /// Stops answering rescans, for a test that plays the kernel itself.
    pub fn stop_kernel(&mut self) {
        self.kernel.stop();
    }

    /// The `i`th LUN.
    pub fn lun(&self, i: usize) -> &Lun {
        &self.luns[i]
    }

    /// The array grows LUN `i` to `bytes` (its backing file and loop
    /// device) and the node's tree rescans it, as a kernel would.
    pub fn grow_lun(&self, i: usize, bytes: u64) {
        let lun = &self.luns[i];
        lun.backing.grow(bytes).expect("grow the LUN");
        self.tree
            .rescan_size(&lun.name, &lun.backing.device)
            .expect("rescan");
    }

    /// A staging path as kubelet makes it (the directory exists).
    pub fn staging(&self, pv: &str) -> PathBuf {
        let p = self.kubelet.join(format!(
            "plugins/kubernetes.io/csi/csi-scsi.io/{pv}/globalmount"
        ));
        std::fs::create_dir_all(&p).expect("staging dir");
        p
    }

    /// A raw block staging path as kubelet makes it (the directory exists).
    pub fn block_staging(&self, pv: &str) -> PathBuf {
        let p = self.kubelet.join(format!(
            "plugins/kubernetes.io/csi/volumeDevices/staging/{pv}"
        ));
        std::fs::create_dir_all(&p).expect("block staging dir");
        p
    }

    /// Mount points under the lab's root (none once everything is undone).
    pub fn mounts_left(&self) -> Vec<PathBuf> {
        mount_points()
            .into_iter()
            .filter(|p| p.starts_with(&self._unmount.0))
            .collect()
    }

    /// A filesystem target path as kubelet makes it (the parent exists).
    pub fn target(&self, pod: &str, pv: &str) -> PathBuf {
        let parent = self
            .kubelet
            .join(format!("pods/{pod}/volumes/kubernetes.io~csi/{pv}"));
        std::fs::create_dir_all(&parent).expect("target parent");
        parent.join("mount")
    }

    /// A raw block target path as kubelet makes it (the parent exists).
    pub fn block_target(&self, pod: &str, pv: &str) -> PathBuf {
        let parent = self.kubelet.join(format!(
            "plugins/kubernetes.io/csi/volumeDevices/publish/{pv}"
        ));
        std::fs::create_dir_all(&parent).expect("block target parent");
        parent.join(pod)
    }

    /// How many times the agent logged creating a filesystem.
    pub fn mkfs_count(&self) -> usize {
        self.agent
            .daemon
            .log()
            .matches("creating filesystem")
            .count()
    }

    pub async fn stage(
        &self,
        volume_id: &str,
        staging: &Path,
        cap: VolumeCapability,
    ) -> Result<(), Status> {
        self.stage_with(volume_id, staging, cap, HashMap::new())
            .await
    }

    pub async fn stage_with(
        &self,
        volume_id: &str,
        staging: &Path,
        cap: VolumeCapability,
        volume_context: HashMap<String, String>,
    ) -> Result<(), Status> {
        self.client
            .clone()
            .node_stage_volume(NodeStageVolumeRequest {
                volume_id: volume_id.to_owned(),
                publish_context: HashMap::new(),
                staging_target_path: staging.display().to_string(),
                volume_capability: Some(cap),
                secrets: HashMap::from([("password".to_owned(), "hunter2".to_owned())]),
                volume_context,
            })
            .await
            .map(drop)
    }

    pub async fn unstage(&self, volume_id: &str, staging: &Path) -> Result<(), Status> {
        self.client
            .clone()
            .node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: volume_id.to_owned(),
                staging_target_path: staging.display().to_string(),
            })
            .await
            .map(drop)
    }

    pub async fn publish(
        &self,
        volume_id: &str,
        staging: &Path,
        target: &Path,
        cap: VolumeCapability,
        readonly: bool,
    ) -> Result<(), Status> {
        self.client
            .clone()
            .node_publish_volume(NodePublishVolumeRequest {
                volume_id: volume_id.to_owned(),
                publish_context: HashMap::new(),
                staging_target_path: staging.display().to_string(),
                target_path: target.display().to_string(),
                volume_capability: Some(cap),
                readonly,
                secrets: HashMap::new(),
                volume_context: HashMap::new(),
            })
            .await
            .map(drop)
    }

    pub async fn unpublish(&self, volume_id: &str, target: &Path) -> Result<(), Status> {
        self.client
            .clone()
            .node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: volume_id.to_owned(),
                target_path: target.display().to_string(),
            })
            .await
            .map(drop)
    }

    pub async fn stats(
        &self,
        volume_id: &str,
        path: &Path,
    ) -> Result<NodeGetVolumeStatsResponse, Status> {
        self.client
            .clone()
            .node_get_volume_stats(NodeGetVolumeStatsRequest {
                volume_id: volume_id.to_owned(),
                volume_path: path.display().to_string(),
                staging_target_path: String::new(),
            })
            .await
            .map(tonic::Response::into_inner)
    }

    pub async fn expand(
        &self,
        volume_id: &str,
        path: &Path,
        staging: &Path,
        required: i64,
    ) -> Result<i64, Status> {
        self.client
            .clone()
            .node_expand_volume(NodeExpandVolumeRequest {
                volume_id: volume_id.to_owned(),
                volume_path: path.display().to_string(),
                capacity_range: Some(csi_scsi_proto::csi::CapacityRange {
                    required_bytes: required,
                    limit_bytes: 0,
                }),
                staging_target_path: staging.display().to_string(),
                volume_capability: None,
                secrets: HashMap::new(),
            })
            .await
            .map(|r| r.into_inner().capacity_bytes)
    }
}

// === impl RescanKernel ===

impl RescanKernel {
    fn start(tree: NodeTree, disks: Vec<(String, PathBuf)>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                for (name, device) in &disks {
                    let trigger = tree.sys().join("block").join(name).join("device/rescan");
                    let written = std::fs::read_to_string(&trigger).unwrap_or_default();
                    if written.trim().is_empty() {
                        continue;
                    }
                    // Cleared only once acted on, as a kernel returns from
                    // the write only then.
                    if let Err(e) = tree.rescan_size(name, device) {
                        eprintln!("node lab kernel: rescan of {name}: {e}");
                    }
                    let _ = std::fs::write(&trigger, "");
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }

    fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for RescanKernel {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Creates a loop-backed LUN and has the tree "discover" it.
fn add_lun(tree: &NodeTree, root: &Path, size: u64) -> Lun {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let file = root.join(format!("lun{n}.img"));
    let backing = LoopLun::create(&file, size).expect("loop LUN");
    // 32 hex digits: LIO's NAA prefix, the process and a counter keep WWIDs
    // unique across parallel tests.
    let id = format!("6001405{:016x}{:09x}", u64::from(std::process::id()), n);
    let wwid = format!("naa.{id}");
    let name = tree
        .add_disk(&DiskPath {
            transport: PathTransport::Iscsi {
                host: 2,
                session: 1,
                portal: "127.0.0.1:3260".into(),
                iqn: "iqn.2026-01.io.csi-scsi:lab".into(),
            },
            target: 0,
            lun: n,
            wwid: wwid.clone(),
            vendor: "LIO-ORG".into(),
            model: "csi-scsi-lab".into(),
            serial: id.clone(),
            backing: backing.device.clone(),
        })
        .expect("add disk");
    Lun {
        backing,
        name,
        volume_id: format!("{wwid}:binding-{n}"),
        wwid,
    }
}

/// A filesystem capability.
pub fn mount_cap(fs_type: &str, mode: Mode) -> VolumeCapability {
    mount_cap_with(fs_type, mode, &[])
}

/// A filesystem capability with mount flags.
pub fn mount_cap_with(fs_type: &str, mode: Mode, flags: &[&str]) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs_type.to_owned(),
            mount_flags: flags.iter().map(|f| (*f).to_owned()).collect(),
            volume_mount_group: String::new(),
        })),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

/// A raw block capability.
pub fn block_cap(mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

/// The code of a failed call, with its message on a mismatch.
#[track_caller]
pub fn assert_code(result: Result<impl std::fmt::Debug, Status>, want: Code) -> String {
    match result {
        Ok(v) => panic!("expected {want:?}, got OK {v:?}"),
        Err(s) => {
            assert_eq!(s.code(), want, "{}", s.message());
            s.message().to_owned()
        }
    }
}

/// Mount points of the calling process (this test shares the agent's
/// mount namespace), from mountinfo.
pub fn mount_points() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .collect()
}

/// Whether `path` is a mount point.
pub fn is_mounted(path: &Path) -> bool {
    mount_points().iter().any(|p| p == path)
}

/// `blkid -p -o export` of a device: its signature fields, empty when blank.
pub fn blkid(device: &Path) -> HashMap<String, String> {
    let out = Command::new("blkid")
        .args(["-p", "-o", "export"])
        .arg(device)
        .output()
        .expect("blkid");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| *k != "DEVNAME")
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Runs a command that must succeed (test set-up).
pub fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().expect(cmd);
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

// === impl UnmountOnDrop ===

impl Drop for UnmountOnDrop {
    fn drop(&mut self) {
        // Deepest (latest) first; lazily, so a busy mount cannot keep the
        // temp dir (and the data of a loop filesystem) from going away.
        let mut under: Vec<PathBuf> = mount_points()
            .into_iter()
            .filter(|p| p.starts_with(&self.0))
            .collect();
        under.reverse();
        for p in under {
            let _ = Command::new("umount").arg("-l").arg(&p).status();
        }
    }
}
