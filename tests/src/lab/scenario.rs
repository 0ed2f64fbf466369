//! The volume life cycle, played as the sidecars and kubelet play it, over
//! the real CSI sockets of a running [`Lab`]. Each step is timed and
//! reported; the end-to-end tests call the same steps.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use csi_scsi_proto::csi::controller_client::ControllerClient;
use csi_scsi_proto::csi::node_client::NodeClient;
use csi_scsi_proto::csi::volume_capability::access_mode::Mode;
use csi_scsi_proto::csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use csi_scsi_proto::csi::*;
use tonic::transport::Channel;

use super::Lab;
use crate::csi_client::csi_channel;

/// The topology key nodes report.
pub const NODE_KEY: &str = "topology.csi-scsi.io/node";

/// A step's outcome, for the report.
pub struct Step {
    /// What was done.
    pub name: String,
    /// How long it took.
    pub took: Duration,
    /// A detail line.
    pub detail: String,
}

/// Collects and prints steps as they finish.
#[derive(Default)]
pub struct Report {
    /// Finished steps.
    pub steps: Vec<Step>,
    start: Option<Instant>,
}

impl Report {
    /// Runs `f` as step `name`, printing a progress line first and the
    /// result after.
    pub async fn step<T, F>(&mut self, name: &str, f: F) -> anyhow::Result<T>
    where
        F: std::future::Future<Output = anyhow::Result<(T, String)>>,
    {
        self.start.get_or_insert_with(Instant::now);
        let n = self.steps.len() + 1;
        print!("  {n:>2}. {name} ... ");
        let _ = std::io::stdout().flush();
        let t = Instant::now();
        match f.await {
            Ok((v, detail)) => {
                let took = t.elapsed();
                println!(
                    "ok ({:.2}s){}",
                    took.as_secs_f64(),
                    if detail.is_empty() {
                        String::new()
                    } else {
                        format!("\n      {detail}")
                    }
                );
                self.steps.push(Step {
                    name: name.to_owned(),
                    took,
                    detail,
                });
                Ok(v)
            }
            Err(e) => {
                println!("FAILED ({:.2}s)\n      {e:#}", t.elapsed().as_secs_f64());
                Err(e.context(format!("step {n}: {name}")))
            }
        }
    }

    /// Total time since the first step.
    pub fn total(&self) -> Duration {
        self.start.map(|s| s.elapsed()).unwrap_or_default()
    }
}

/// CSI clients of a lab: the proxy's Controller and every node's Node.
/// A clone shares the connections.
#[derive(Clone)]
pub struct Clients {
    /// The proxy's Controller service.
    pub controller: ControllerClient<Channel>,
    /// Node services by node name.
    pub nodes: HashMap<String, NodeClient<Channel>>,
}

impl Clients {
    /// Connects to every socket of `lab`.
    pub async fn connect(lab: &Lab) -> anyhow::Result<Self> {
        let controller = ControllerClient::new(csi_channel(&lab.proxy_csi).await?);
        let mut nodes = HashMap::new();
        for n in &lab.nodes {
            nodes.insert(n.name.clone(), NodeClient::new(csi_channel(&n.csi).await?));
        }
        Ok(Self { controller, nodes })
    }

    /// The Node client of `node`.
    pub fn node(&self, node: &str) -> NodeClient<Channel> {
        self.nodes[node].clone()
    }
}

/// A mount (fs) or block capability with `mode`.
pub fn capability(block: bool, fs: &str, mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(if block {
            AccessType::Block(BlockVolume {})
        } else {
            AccessType::Mount(MountVolume {
                fs_type: fs.to_owned(),
                mount_flags: Vec::new(),
                volume_mount_group: String::new(),
            })
        }),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

/// Topology preferring `node`.
pub fn prefer(node: &str) -> TopologyRequirement {
    let t = Topology {
        segments: HashMap::from([(NODE_KEY.to_owned(), node.to_owned())]),
    };
    TopologyRequirement {
        requisite: vec![t.clone()],
        preferred: vec![t],
    }
}

/// Where kubelet would stage and publish `volume` on `kubelet`.
pub fn kubelet_paths(kubelet: &Path, volume: &str, pod: &str) -> (PathBuf, PathBuf) {
    let staging = kubelet.join(format!(
        "plugins/kubernetes.io/csi/csi-scsi.io/{volume}/globalmount"
    ));
    let target = kubelet.join(format!(
        "pods/{pod}/volumes/kubernetes.io~csi/{volume}/mount"
    ));
    (staging, target)
}

/// Available bytes the proxy reports (optionally from one node, with a
/// selector).
pub async fn capacity(
    c: &mut ControllerClient<Channel>,
    node: Option<&str>,
    selector: &str,
) -> anyhow::Result<i64> {
    let mut params = HashMap::new();
    if !selector.is_empty() {
        params.insert("deviceSelector".to_owned(), selector.to_owned());
    }
    let r = c
        .get_capacity(GetCapacityRequest {
            volume_capabilities: Vec::new(),
            parameters: params,
            accessible_topology: node.map(|n| Topology {
                segments: HashMap::from([(NODE_KEY.to_owned(), n.to_owned())]),
            }),
        })
        .await?
        .into_inner();
    Ok(r.available_capacity)
}

/// Publishes (controller + stage + publish) `vol` on `node`; returns the
/// target path.
pub async fn attach_and_mount(
    lab: &Lab,
    cl: &mut Clients,
    vol: &Volume,
    node: &str,
    block: bool,
    pod: &str,
) -> anyhow::Result<PathBuf> {
    attach_and_mount_as(lab, cl, vol, node, block, pod, false).await
}

/// [`attach_and_mount`] with NodePublishVolume's `readonly` flag (kubelet
/// sets it for a read-only PV or Pod volume). ControllerPublishVolume is
/// always read-write: the proxy does not advertise PUBLISH_READONLY, so the
/// external-attacher sends `readonly: false`.
pub async fn attach_and_mount_as(
    lab: &Lab,
    cl: &mut Clients,
    vol: &Volume,
    node: &str,
    block: bool,
    pod: &str,
    readonly: bool,
) -> anyhow::Result<PathBuf> {
    let fs = if block { "" } else { "xfs" };
    attach_and_mount_fs(lab, cl, vol, node, block, fs, pod, readonly).await
}

/// [`attach_and_mount_as`] with filesystem `fs` (`""` for raw block).
#[allow(clippy::too_many_arguments)]
pub async fn attach_and_mount_fs(
    lab: &Lab,
    cl: &mut Clients,
    vol: &Volume,
    node: &str,
    block: bool,
    fs: &str,
    pod: &str,
    readonly: bool,
) -> anyhow::Result<PathBuf> {
    let cap = capability(block, fs, Mode::SingleNodeWriter);
    let ctx = cl
        .controller
        .controller_publish_volume(ControllerPublishVolumeRequest {
            volume_id: vol.volume_id.clone(),
            node_id: node.to_owned(),
            volume_capability: Some(cap.clone()),
            readonly: false,
            secrets: HashMap::new(),
            volume_context: vol.volume_context.clone(),
        })
        .await
        .context("ControllerPublishVolume")?
        .into_inner()
        .publish_context;
    let lab_node = lab.nodes.iter().find(|n| n.name == node).context("node")?;
    let (staging, target) = volume_paths(lab, vol, node, pod)?;
    lab_node.mkdir(&staging).await?;
    let mut nc = cl.node(node);
    nc.node_stage_volume(NodeStageVolumeRequest {
        volume_id: vol.volume_id.clone(),
        publish_context: ctx.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(cap.clone()),
        secrets: HashMap::new(),
        volume_context: vol.volume_context.clone(),
    })
    .await
    .context("NodeStageVolume")?;
    lab_node.mkdir(target.parent().context("parent")?).await?;
    nc.node_publish_volume(NodePublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        publish_context: ctx,
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(cap),
        readonly,
        secrets: HashMap::new(),
        volume_context: vol.volume_context.clone(),
    })
    .await
    .context("NodePublishVolume")?;
    Ok(target)
}

/// Unpublishes, unstages and controller-unpublishes `vol` from `node`.
pub async fn unmount_and_detach(
    lab: &Lab,
    cl: &mut Clients,
    vol: &Volume,
    node: &str,
    pod: &str,
) -> anyhow::Result<()> {
    unmount(lab, cl, vol, node, pod).await?;
    controller_unpublish(cl, vol, node).await
}

/// ControllerUnpublishVolume of `vol` from `node` (the attacher's detach).
pub async fn controller_unpublish(
    cl: &mut Clients,
    vol: &Volume,
    node: &str,
) -> anyhow::Result<()> {
    cl.controller
        .controller_unpublish_volume(ControllerUnpublishVolumeRequest {
            volume_id: vol.volume_id.clone(),
            node_id: node.to_owned(),
            secrets: HashMap::new(),
        })
        .await
        .context("ControllerUnpublishVolume")?;
    Ok(())
}

/// DeleteVolume of `vol` (the provisioner's delete).
pub async fn delete(cl: &mut Clients, vol: &Volume) -> anyhow::Result<()> {
    cl.controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: vol.volume_id.clone(),
            secrets: HashMap::new(),
        })
        .await
        .context("DeleteVolume")?;
    Ok(())
}

/// The staging and target paths kubelet gives `vol` for `pod` on `node`.
pub fn volume_paths(
    lab: &Lab,
    vol: &Volume,
    node: &str,
    pod: &str,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let kubelet = &lab
        .nodes
        .iter()
        .find(|n| n.name == node)
        .context("node")?
        .kubelet;
    Ok(kubelet_paths(
        kubelet,
        &vol.volume_id.replace(':', "-"),
        pod,
    ))
}

/// NodeGetVolumeStats of `vol` as published for `pod` on `node`.
pub async fn volume_stats(
    lab: &Lab,
    cl: &Clients,
    vol: &Volume,
    node: &str,
    pod: &str,
) -> anyhow::Result<NodeGetVolumeStatsResponse> {
    let (staging, target) = volume_paths(lab, vol, node, pod)?;
    Ok(cl
        .node(node)
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: vol.volume_id.clone(),
            volume_path: target.display().to_string(),
            staging_target_path: staging.display().to_string(),
        })
        .await
        .context("NodeGetVolumeStats")?
        .into_inner())
}

/// Grows `vol` (a filesystem of `fs`, published for `pod` on `node`) to
/// `bytes` as the resizer and kubelet do: ControllerExpandVolume, which
/// must ask for node expansion, then NodeExpandVolume. Returns the
/// capacity the node reports.
pub async fn expand(
    lab: &Lab,
    cl: &mut Clients,
    vol: &Volume,
    node: &str,
    pod: &str,
    fs: &str,
    bytes: u64,
) -> anyhow::Result<i64> {
    let range = || {
        Some(CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        })
    };
    let resp = cl
        .controller
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: vol.volume_id.clone(),
            capacity_range: range(),
            secrets: HashMap::new(),
            volume_capability: Some(capability(false, fs, Mode::SingleNodeWriter)),
        })
        .await
        .context("ControllerExpandVolume")?
        .into_inner();
    ensure!(
        resp.node_expansion_required,
        "a {fs} filesystem needs node expansion"
    );
    let (staging, target) = volume_paths(lab, vol, node, pod)?;
    let grown = cl
        .node(node)
        .node_expand_volume(NodeExpandVolumeRequest {
            volume_id: vol.volume_id.clone(),
            volume_path: target.display().to_string(),
            capacity_range: range(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(capability(false, fs, Mode::SingleNodeWriter)),
            secrets: HashMap::new(),
        })
        .await
        .context("NodeExpandVolume")?
        .into_inner();
    Ok(grown.capacity_bytes)
}

/// Unpublishes and unstages `vol` on `node` (the node's side only).
pub async fn unmount(
    lab: &Lab,
    cl: &mut Clients,
    vol: &Volume,
    node: &str,
    pod: &str,
) -> anyhow::Result<()> {
    let (staging, target) = volume_paths(lab, vol, node, pod)?;
    let mut nc = cl.node(node);
    nc.node_unpublish_volume(NodeUnpublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        target_path: target.display().to_string(),
    })
    .await
    .context("NodeUnpublishVolume")?;
    nc.node_unstage_volume(NodeUnstageVolumeRequest {
        volume_id: vol.volume_id.clone(),
        staging_target_path: staging.display().to_string(),
    })
    .await
    .context("NodeUnstageVolume")?;
    Ok(())
}

/// Creates a volume: raw block, or a filesystem of the `fsType` in
/// `params` (xfs when none is given).
pub async fn create(
    cl: &mut Clients,
    name: &str,
    bytes: i64,
    block: bool,
    params: &[(&str, &str)],
    node: &str,
) -> anyhow::Result<Volume> {
    let fs = match block {
        true => "",
        false => params
            .iter()
            .find(|(k, _)| *k == "fsType")
            .map_or("xfs", |(_, v)| *v),
    };
    let r = cl
        .controller
        .create_volume(CreateVolumeRequest {
            name: name.to_owned(),
            capacity_range: Some(CapacityRange {
                required_bytes: bytes,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![capability(block, fs, Mode::SingleNodeWriter)],
            parameters: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            secrets: HashMap::new(),
            volume_content_source: None,
            accessibility_requirements: Some(prefer(node)),
            mutable_parameters: HashMap::new(),
        })
        .await
        .context("CreateVolume")?
        .into_inner();
    r.volume.context("no volume in the response")
}

/// The LUN file behind `wwid` (the lab knows its arrays' identities).
pub fn lun_file(lab: &Lab, wwid: &str) -> Option<(String, PathBuf)> {
    use crate::tgt::LunIdentity;
    let known = [
        ("a1", LunIdentity::lab(1, 1)),
        ("a2", LunIdentity::lab(1, 2)),
        ("mp", LunIdentity::lab(9, 1)),
        ("b1", LunIdentity::lab(2, 1)),
    ];
    for (name, id) in known {
        if wwid == format!("naa.{}", id.scsi_id) {
            return Some((name.to_owned(), lab.luns[name].clone()));
        }
    }
    for n in 1..=lab.config.pool_luns as u64 {
        if wwid == format!("naa.{}", LunIdentity::lab(3, n).scsi_id) {
            let name = format!("c{n}");
            return Some((name.clone(), lab.luns[&name].clone()));
        }
    }
    (wwid == "naa.600a098038303053453f463045727031")
        .then(|| ("fc1".to_owned(), lab.luns["fc1"].clone()))
}

/// Waits until a deleted volume's LUN is offered again (the capacity grows
/// past `before`): DeleteVolume answers before the proxy's release worker
/// has wiped it.
async fn released(c: &mut ControllerClient<Channel>, before: i64) -> anyhow::Result<()> {
    let until = Instant::now() + Duration::from_secs(600);
    while capacity(c, None, "").await? <= before {
        ensure!(
            Instant::now() < until,
            "the LUN is not Available again after 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// Whether every byte of `file` reads as zero.
pub fn all_zero(file: &Path) -> anyhow::Result<bool> {
    let mut f = std::fs::File::open(file)?;
    let mut buf = vec![0u8; 4 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(true);
        }
        if buf[..n].iter().any(|&b| b != 0) {
            return Ok(false);
        }
    }
}

/// The whole life cycle. Returns the report.
pub async fn run(lab: &mut Lab) -> anyhow::Result<Report> {
    let mut r = Report::default();
    let mut cl = Clients::connect(lab).await?;
    let total: i64 = lab
        .luns
        .values()
        .map(|p| std::fs::metadata(p).map(|m| m.len() as i64).unwrap_or(0))
        .sum();
    // One file per LUN: the multipath LUN is one file seen through two
    // targets, and one device.
    let want = total;
    let luns = lab.luns.len();
    let vm = lab.config.vm;
    let c = &mut cl.controller;
    r.step(
        "discovery: the proxy fans Discover out and merges reports by WWID",
        async {
            let start = Instant::now();
            loop {
                let have = capacity(c, None, "").await?;
                if have == want {
                    break;
                }
                // Under TCG a guest's first login and scan can outlast the
                // proxy's 30 s Discover deadline (docs/lab.md, VM nodes):
                // the next passes find the sessions up.
                let within = Duration::from_secs(if vm { 180 } else { 60 });
                if start.elapsed() > within {
                    bail!("available {have} bytes, expected {want} (after {within:?})");
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            let mut views = Vec::new();
            for n in ["node-a", "node-b", "node-c"] {
                views.push(format!(
                    "{n} sees {} MiB",
                    capacity(c, Some(n), "").await? >> 20
                ));
            }
            let refused = capacity(c, Some("node-c"), "array=b").await?;
            ensure!(
                refused == 0,
                "node-c must not see array-b (its ACL excludes node-c)"
            );
            Ok((
                (),
                format!(
                    "{} LUNs ({} MiB) on {}; {}; array-b's ACL refuses node-c",
                    luns,
                    want >> 20,
                    match vm {
                        true => "2 iSCSI targets, 2 portals each",
                        false => "3 targets",
                    },
                    views.join(", ")
                ),
            ))
        },
    )
    .await?;

    let vol = r
        .step(
            "CreateVolume pvc-lab-1: 400 MiB, tier=fast, xfs, cleanup=zero, prefer node-a",
            async {
                let v = create(
                    &mut cl,
                    "pvc-lab-1",
                    400 << 20,
                    false,
                    &[
                        ("deviceSelector", "tier=fast"),
                        ("cleanup", "zero"),
                        ("fsType", "xfs"),
                    ],
                    "node-a",
                )
                .await?;
                let nodes: Vec<_> = v
                    .accessible_topology
                    .iter()
                    .filter_map(|t| t.segments.get(NODE_KEY).cloned())
                    .collect();
                let d = format!(
                    "bound {} ({} MiB), accessible from {}",
                    v.volume_id,
                    v.capacity_bytes >> 20,
                    nodes.join(",")
                );
                Ok((v, d))
            },
        )
        .await?;
    let payload: Vec<u8> = (0..(1u32 << 20))
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let target = r
        .step(
            "node-a: ControllerPublish, NodeStage (mkfs.xfs, mount), NodePublish",
            async {
                let t = attach_and_mount(lab, &mut cl, &vol, "node-a", false, "pod-1").await?;
                Ok((t.clone(), format!("published at {}", t.display())))
            },
        )
        .await?;
    r.step("node-a: the pod writes 1 MiB of data", async {
        let node = &lab.nodes[0];
        node.write_file(&target.join("data.bin"), &payload).await?;
        node.write_file(&target.join("hello.txt"), b"written on node-a\n")
            .await?;
        Ok(((), String::new()))
    })
    .await?;
    r.step(
        "node-a: NodeUnpublish, NodeUnstage, ControllerUnpublish (detach)",
        async {
            unmount_and_detach(lab, &mut cl, &vol, "node-a", "pod-1").await?;
            Ok(((), String::new()))
        },
    )
    .await?;
    let target = r
        .step("node-b: the volume moves: publish, stage, mount", async {
            let t = attach_and_mount(lab, &mut cl, &vol, "node-b", false, "pod-2").await?;
            Ok((t, String::new()))
        })
        .await?;
    r.step(
        "node-b: the data written on node-a reads back intact",
        async {
            let node = &lab.nodes[1];
            let back = node.read_file(&target.join("data.bin")).await?;
            ensure!(back == payload, "data differs");
            let hello = String::from_utf8(node.read_file(&target.join("hello.txt")).await?)?;
            Ok(((), format!("1 MiB identical; hello.txt: {}", hello.trim())))
        },
    )
    .await?;
    let (lun_name, lun_path) = lun_file(
        lab,
        vol.volume_context
            .get("wwid")
            .map(String::as_str)
            .unwrap_or(""),
    )
    .context("LUN of the volume")?;
    r.step("expand: the array grows the LUN by 256 MiB; ControllerExpand + NodeExpand (xfs_growfs online)", async {
        let (old, new) = lab.grow_lun(&lun_name, 256 << 20).await?;
        let grown = expand(lab, &mut cl, &vol, "node-b", "pod-2", "xfs", new).await?;
        let stats = volume_stats(lab, &cl, &vol, "node-b", "pod-2").await?;
        let total = stats.usage.iter().find(|u| u.unit == 1).map(|u| u.total).unwrap_or(0);
        ensure!(total as u64 > old - (64 << 20), "filesystem did not grow: {total}");
        Ok(((), format!("LUN {} -> {} MiB; filesystem now {} MiB", old >> 20, grown >> 20, total >> 20)))
    })
    .await?;
    r.step("node-b: unpublish, unstage, detach", async {
        unmount_and_detach(lab, &mut cl, &vol, "node-b", "pod-2").await?;
        Ok(((), String::new()))
    })
    .await?;
    r.step(
        "DeleteVolume: the agent zeroes the LUN; it reads back as zeroes and is Available again",
        async {
            let before = capacity(&mut cl.controller, None, "").await?;
            delete(&mut cl, &vol).await?;
            released(&mut cl.controller, before).await?;
            ensure!(
                all_zero(&lun_path)?,
                "{} still holds data",
                lun_path.display()
            );
            Ok((
                (),
                format!(
                    "{} ({} MiB) zeroed and back in the pool",
                    lun_name,
                    std::fs::metadata(&lun_path)?.len() >> 20
                ),
            ))
        },
    )
    .await?;

    // The raw block volume: on the Fibre Channel LUN with the stand-in;
    // on array-a's iSCSI LUNs on VM nodes, which have no FC HBA.
    let (raw_name, selector, attach_name) = match lab.config.vm {
        false => (
            "raw block volume on the Fibre Channel LUN: CreateVolume array=fc on node-c",
            "array=fc",
            "node-c: FC attach (host rescan), NodeStage, NodePublish of the block device",
        ),
        true => (
            "raw block volume on array-a (iSCSI, two paths): CreateVolume array=a on node-c",
            "array=a",
            "node-c: iSCSI attach, dm-multipath map, NodeStage, NodePublish of the block device",
        ),
    };
    let raw = r
        .step(raw_name, async {
            let v = create(
                &mut cl,
                "pvc-lab-block",
                256 << 20,
                true,
                &[("deviceSelector", selector), ("cleanup", "discard")],
                "node-c",
            )
            .await?;
            let d = format!("bound {}", v.volume_id);
            Ok((v, d))
        })
        .await?;
    let (raw_lun, raw_file) = lun_file(
        lab,
        raw.volume_context
            .get("wwid")
            .map(String::as_str)
            .unwrap_or(""),
    )
    .context("LUN of the raw volume")?;
    let dev = r
        .step(attach_name, async {
            let t = attach_and_mount(lab, &mut cl, &raw, "node-c", true, "pod-3").await?;
            Ok((t, String::new()))
        })
        .await?;
    r.step(
        "node-c: write and read back through the raw device",
        async {
            let node = &lab.nodes[2];
            let pattern = b"raw block through csi-scsi\n".repeat(1000);
            node.write_at(&dev, 1 << 20, &pattern).await?;
            let back = node.read_at(&dev, 1 << 20, pattern.len() as u64).await?;
            ensure!(back == pattern, "raw data differs");
            Ok(((), format!("{} bytes at offset 1 MiB", pattern.len())))
        },
    )
    .await?;
    r.step(
        "node-c: unpublish, detach; DeleteVolume with discard cleanup",
        async {
            unmount_and_detach(lab, &mut cl, &raw, "node-c", "pod-3").await?;
            let before = capacity(&mut cl.controller, None, "").await?;
            delete(&mut cl, &raw).await?;
            released(&mut cl.controller, before).await?;
            ensure!(all_zero(&raw_file)?, "{raw_lun} still holds data");
            Ok(((), format!("{raw_lun} discarded (reads back as zeroes)")))
        },
    )
    .await?;
    Ok(r)
}
