//! One node for the bench: a real agent process whose sysfs and /dev roots
//! are a [`NodeTree`] over real loop devices seen as FC disks, and a CSI
//! Node client on its socket. Needs root (loop devices, mknod, mounts).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use csi_scsi_proto::agent::{FibreChannelTarget, Target, target};
use csi_scsi_proto::csi::node_client::NodeClient;
use csi_scsi_proto::csi::volume_capability::access_mode::Mode;
use csi_scsi_proto::csi::{
    NodePublishVolumeRequest, NodeStageVolumeRequest, NodeUnpublishVolumeRequest,
    NodeUnstageVolumeRequest, VolumeCapability,
};
use tonic::transport::Channel;

use super::proc::{Proc, UnmountOnDrop, wait_until};
use crate::binaries::binary;
use crate::csi_client::csi_channel;
use crate::daemon::free_port;
use crate::lab::scenario::capability;
use crate::loop_luns::LoopLun;
use crate::node_tree::{DiskPath, NodeTree, PathTransport};
use crate::pki::Pki;

/// The FC target port every fixture LUN comes through.
pub const WWPN: &str = "500a0981891b8dc5";
/// The FC target (as the agent API and the targets file name it).
pub const TARGET: &str = "fc-1";

/// Acts on a write to a disk's `device/rescan` in `tree` as the kernel
/// does: the identity is re-read (it is unchanged here) and the write-only
/// trigger is clear again at once. Without it, the agent's check before a
/// first format waits its full second for the trigger to be consumed.
fn act_on_rescans(tree: &NodeTree) -> anyhow::Result<notify::RecommendedWatcher> {
    use notify::{EventKind, RecursiveMode, Watcher};
    let mut watcher = notify::recommended_watcher(|e: notify::Result<notify::Event>| {
        let Ok(event) = e else { return };
        if !matches!(event.kind, EventKind::Modify(_) | EventKind::Access(_)) {
            return;
        }
        for path in event.paths {
            if path.file_name().is_some_and(|n| n == "rescan")
                && std::fs::read(&path).is_ok_and(|b| !b.trim_ascii().is_empty())
            {
                let _ = std::fs::write(&path, "");
            }
        }
    })?;
    watcher.watch(&tree.sys().join("devices"), RecursiveMode::Recursive)?;
    Ok(watcher)
}

/// A node with a running agent.
pub struct NodeFixture {
    /// CSI Node on the agent's socket.
    pub node: NodeClient<Channel>,
    // Field order is drop order: close the client (the agent drains open
    // connections before it exits), unmount, stop the agent, then detach
    // the loop devices.
    _unmount: UnmountOnDrop,
    /// The agent process.
    pub agent: Proc,
    /// The LUNs, seen as `sdX` in the tree.
    pub luns: Vec<FixtureLun>,
    /// The node's sysfs and /dev.
    pub tree: NodeTree,
    /// kubelet's directory.
    pub kubelet: PathBuf,
    /// The agent API address.
    pub api: SocketAddr,
    /// The agent's certificate directory.
    pub tls: PathBuf,
    /// Acts on the agent's `device/rescan` writes (see [`act_on_rescans`]).
    _rescans: notify::RecommendedWatcher,
}

/// One LUN of the fixture.
pub struct FixtureLun {
    /// The loop device backing it.
    pub backing: LoopLun,
    /// Its node in the tree's /dev (`<dev>/sdX`).
    pub dev_node: PathBuf,
    /// `naa.…`
    pub wwid: String,
    /// A volume ID naming it.
    pub volume_id: String,
}

impl NodeFixture {
    /// Creates `luns` loop LUNs of `size` bytes under `dir`, shows them to
    /// node `node` as FC disks, and starts its agent.
    pub async fn start(
        dir: &Path,
        pki: &Pki,
        node: &str,
        luns: usize,
        size: u64,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let dir = std::fs::canonicalize(dir)?;
        let unmount = UnmountOnDrop(dir.clone());
        let tree = NodeTree::create(&dir.join("tree"))?;
        tree.add_fc_host(1, "10000000c9a00001")?;
        let mut made = Vec::with_capacity(luns);
        for i in 0..luns {
            let backing = LoopLun::create(&dir.join(format!("lun{i}.img")), size)
                .with_context(|| format!("loop LUN {i}"))?;
            let lun = u32::try_from(i)?;
            let id = format!("600a0980{:024x}", i + 1);
            let wwid = format!("naa.{id}");
            let name = tree.add_disk(&DiskPath {
                transport: PathTransport::Fc {
                    host: 1,
                    wwpn: WWPN.into(),
                },
                target: 0,
                lun,
                wwid: wwid.clone(),
                vendor: "NETAPP".into(),
                model: "LUN C-Mode".into(),
                serial: id[8..].to_owned(),
                backing: backing.device.clone(),
            })?;
            made.push(FixtureLun {
                backing,
                dev_node: tree.dev().join(name),
                volume_id: format!("{wwid}:bench-{i}"),
                wwid,
            });
        }
        // Watched once every disk is in place: each directory is then watched.
        let rescans = act_on_rescans(&tree)?;
        let kubelet = dir.join("kubelet");
        std::fs::create_dir_all(&kubelet)?;
        let tls = pki.issue_agent(node, &format!("{node}-tls"));
        let csi = dir.join("agent/csi.sock");
        let port = free_port();
        let api: SocketAddr = format!("127.0.0.1:{port}").parse()?;
        let args: Vec<String> = [
            "--node-name",
            node,
            "--csi-endpoint",
            &format!("unix://{}", csi.display()),
            "--agent-listen",
            &api.to_string(),
            "--status-listen",
            "127.0.0.1:0",
            "--tls-dir",
            &tls.display().to_string(),
            "--sysfs-root",
            &tree.sys().display().to_string(),
            "--dev-root",
            &tree.dev().display().to_string(),
            "--kubelet-dir",
            &kubelet.display().to_string(),
            "--state-dir",
            &dir.join("agent-state").display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut agent = Proc::spawn(&binary("csi-scsi-agent"), &args, &dir.join("agent.log"))?;
        let mut up = false;
        for _ in 0..500 {
            agent.check_alive()?;
            if tokio::net::UnixStream::connect(&csi).await.is_ok()
                && tokio::net::TcpStream::connect(api).await.is_ok()
            {
                up = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        anyhow::ensure!(up, "the agent did not come up:\n{}", agent.log_tail());
        let node = wait_until(
            "the agent's CSI socket",
            Duration::from_secs(10),
            || async { csi_channel(&csi).await.ok() },
        )
        .await?;
        Ok(Self {
            node: NodeClient::new(node),
            _unmount: unmount,
            agent,
            luns: made,
            tree,
            kubelet,
            api,
            tls,
            _rescans: rescans,
        })
    }

    /// kubelet's staging path for `pv` (created, as kubelet does).
    pub fn staging(&self, pv: &str) -> anyhow::Result<PathBuf> {
        let p = self.kubelet.join(format!(
            "plugins/kubernetes.io/csi/csi-scsi.io/{pv}/globalmount"
        ));
        std::fs::create_dir_all(&p)?;
        Ok(p)
    }

    /// kubelet's target path for `pv` in `pod` (its parent created).
    pub fn target(&self, pod: &str, pv: &str) -> anyhow::Result<PathBuf> {
        let parent = self
            .kubelet
            .join(format!("pods/{pod}/volumes/kubernetes.io~csi/{pv}"));
        std::fs::create_dir_all(&parent)?;
        Ok(parent.join("mount"))
    }
}

/// The fixture's FC target as the agent API describes it.
pub fn fc_target() -> Target {
    Target {
        name: TARGET.into(),
        transport: Some(target::Transport::FibreChannel(FibreChannelTarget {
            wwpns: vec![format!("0x{}", WWPN.to_uppercase())],
        })),
    }
}

/// An ext4 single-writer mount capability.
pub fn ext4() -> VolumeCapability {
    capability(false, "ext4", Mode::SingleNodeWriter)
}

/// NodeStageVolume of `volume_id` at `staging`.
pub async fn stage(
    c: &mut NodeClient<Channel>,
    volume_id: &str,
    staging: &Path,
) -> Result<(), tonic::Status> {
    c.node_stage_volume(NodeStageVolumeRequest {
        volume_id: volume_id.to_owned(),
        publish_context: HashMap::new(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(ext4()),
        secrets: HashMap::new(),
        volume_context: HashMap::new(),
    })
    .await
    .map(drop)
}

/// NodePublishVolume of `volume_id` from `staging` to `target`.
pub async fn publish(
    c: &mut NodeClient<Channel>,
    volume_id: &str,
    staging: &Path,
    target: &Path,
) -> Result<(), tonic::Status> {
    c.node_publish_volume(NodePublishVolumeRequest {
        volume_id: volume_id.to_owned(),
        publish_context: HashMap::new(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(ext4()),
        readonly: false,
        secrets: HashMap::new(),
        volume_context: HashMap::new(),
    })
    .await
    .map(drop)
}

/// NodeUnpublishVolume.
pub async fn unpublish(
    c: &mut NodeClient<Channel>,
    volume_id: &str,
    target: &Path,
) -> Result<(), tonic::Status> {
    c.node_unpublish_volume(NodeUnpublishVolumeRequest {
        volume_id: volume_id.to_owned(),
        target_path: target.display().to_string(),
    })
    .await
    .map(drop)
}

/// NodeUnstageVolume.
pub async fn unstage(
    c: &mut NodeClient<Channel>,
    volume_id: &str,
    staging: &Path,
) -> Result<(), tonic::Status> {
    c.node_unstage_volume(NodeUnstageVolumeRequest {
        volume_id: volume_id.to_owned(),
        staging_target_path: staging.display().to_string(),
    })
    .await
    .map(drop)
}

/// A running proxy and a Controller client on its socket.
pub struct ProxyFixture {
    /// CSI Controller (dropped first: the proxy drains open connections
    /// before it exits).
    pub controller: csi_scsi_proto::csi::controller_client::ControllerClient<Channel>,
    /// Its CSI socket.
    pub csi: PathBuf,
    /// The proxy process.
    pub proc: Proc,
}

/// Starts the proxy binary in `dir` (its store `dir/inventory.db`, its
/// agents file `dir/agents.txt`, which must exist) with certificate `tls`.
/// Periodic discovery and agent probes are slowed to once an hour so
/// they do not run inside a measurement; discovery still runs once at
/// start.
pub async fn start_proxy(
    dir: &Path,
    tls: &Path,
    targets: Option<&Path>,
) -> anyhow::Result<ProxyFixture> {
    let csi = dir.join("csi.sock");
    let mut args: Vec<String> = [
        "--csi-endpoint",
        &csi.display().to_string(),
        "--tls-dir",
        &tls.display().to_string(),
        "--store",
        &dir.join("inventory.db").display().to_string(),
        "--agents-file",
        &dir.join("agents.txt").display().to_string(),
        "--status-listen",
        "127.0.0.1:0",
        "--discovery-interval",
        "3600",
        "--agent-probe-interval",
        "3600",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Some(t) = targets {
        args.extend(["--targets-file".to_owned(), t.display().to_string()]);
    }
    let mut proc = Proc::spawn(&binary("csi-scsi-proxy"), &args, &dir.join("proxy.log"))?;
    let mut channel = None;
    for _ in 0..1500 {
        proc.check_alive()?;
        if let Ok(c) = csi_channel(&csi).await {
            channel = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let channel =
        channel.with_context(|| format!("the proxy did not come up:\n{}", proc.log_tail()))?;
    Ok(ProxyFixture {
        proc,
        csi,
        controller: csi_scsi_proto::csi::controller_client::ControllerClient::new(channel),
    })
}

/// A CreateVolume for `name` on `node`: 1 MiB or more, devices labelled
/// `tier=fast`, cleanup `none` (after a delete, a release worker makes the
/// device Available at once: no wipe).
pub fn create_request(name: &str, node: &str) -> csi_scsi_proto::csi::CreateVolumeRequest {
    csi_scsi_proto::csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(csi_scsi_proto::csi::CapacityRange {
            required_bytes: 1 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![ext4()],
        parameters: HashMap::from([
            ("deviceSelector".into(), "tier=fast".into()),
            ("cleanup".into(), "none".into()),
        ]),
        secrets: HashMap::new(),
        volume_content_source: None,
        accessibility_requirements: Some(crate::lab::scenario::prefer(node)),
        mutable_parameters: HashMap::new(),
    }
}
