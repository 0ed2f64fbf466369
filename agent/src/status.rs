//! The agent's `/status` document and the gauges read from the node's
//! state: its iSCSI sessions, the LUNs it sees (WWID, paths, size,
//! holders), the volumes staged and published under the kubelet directory
//! (from the mount table), and the last failed calls with their request
//! IDs. Read-only: nothing here changes the node. No credential is ever
//! part of it (sessions are named by target and portal only, and those
//! too are left out for a reader off the machine: `Status::redacted`). The
//! document's types are `csi_scsi_status::agent`'s, which the CLI reads.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use csi_scsi_daemon::{Metrics, StatusSource, rfc3339, set_gauge, set_gauges};
use csi_scsi_status::{SCHEMA, Status, agent as doc};
use futures::future::BoxFuture;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::device::Devices;
use crate::host::Host;
use crate::host::mount::kubelet_root;
use crate::host::mountinfo::{Mount, MountTable};
use crate::host::sysfs::{self, DeviceState, Lun, Transport};
use crate::registration::KubeletRegistration;

/// The agent's status source.
pub(crate) struct AgentStatus {
    node: String,
    devices: Arc<Devices>,
    metrics: Metrics,
    gauges: Gauges,
    started: SystemTime,
    registration: Option<KubeletRegistration>,
}

/// The gauges read from the node's state (at each scrape and `/status`).
#[derive(Debug)]
struct Gauges {
    luns: Gauge,
    sessions: Family<StateLabels, Gauge>,
    volumes: Family<StateLabels, Gauge>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

/// What the node looks like now.
#[derive(Debug, Default)]
struct Snapshot {
    sessions: Vec<doc::Session>,
    devices: Vec<doc::Device>,
    staged: Vec<doc::Volume>,
    published: Vec<doc::Volume>,
    /// What could not be read (the rest of the document still stands).
    problems: Vec<String>,
}

// === impl AgentStatus ===

impl AgentStatus {
    /// The status of `node`, over `devices`, with errors from `metrics`
    /// (where it registers its gauges: one per process).
    pub(crate) fn new(node: &str, devices: Arc<Devices>, metrics: Metrics) -> Self {
        Self {
            node: node.to_owned(),
            devices,
            gauges: Gauges::new(&metrics),
            metrics,
            started: SystemTime::now(),
            registration: None,
        }
    }

    /// Also shows the registration with kubelet.
    pub(crate) fn with_registration(mut self, registration: KubeletRegistration) -> Self {
        self.registration = Some(registration);
        self
    }

    /// Reads sysfs and the mount table off the async threads.
    async fn snapshot(&self) -> Snapshot {
        let devices = self.devices.clone();
        tokio::task::spawn_blocking(move || snapshot(&devices))
            .await
            .unwrap_or_else(|e| Snapshot {
                problems: vec![format!("status scan failed: {e}")],
                ..Snapshot::default()
            })
    }
}

impl StatusSource for AgentStatus {
    fn status(&self) -> BoxFuture<'_, Status> {
        Box::pin(async move {
            let snap = self.snapshot().await;
            self.gauges.update(&snap);
            Status::Agent(doc::Document {
                schema: SCHEMA,
                node: self.node.clone(),
                version: env!("CARGO_PKG_VERSION").to_owned(),
                started: rfc3339(self.started),
                uptime_seconds: self.started.elapsed().map(|d| d.as_secs()).unwrap_or(0),
                sessions: snap.sessions,
                devices: snap.devices,
                volumes: doc::Volumes {
                    staged: snap.staged,
                    published: snap.published,
                },
                recent_errors: self.metrics.recent_errors(),
                problems: snap.problems,
                kubelet_registration: self.registration.as_ref().map(|r| r.report()),
                redacted: false,
            })
        })
    }

    fn refresh_metrics(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let snap = self.snapshot().await;
            self.gauges.update(&snap);
        })
    }
}

// === impl Gauges ===

impl Gauges {
    /// Registers the gauges in `metrics`.
    fn new(metrics: &Metrics) -> Self {
        let gauges = Self {
            luns: Gauge::default(),
            sessions: Family::default(),
            volumes: Family::default(),
        };
        metrics.register(
            "node_luns",
            "LUNs this node sees (one per WWID, whatever the number of paths)",
            gauges.luns.clone(),
        );
        metrics.register(
            "iscsi_sessions",
            "iSCSI sessions on this node, by session state",
            gauges.sessions.clone(),
        );
        metrics.register(
            "volumes",
            "Volumes on this node, by state (staged, published)",
            gauges.volumes.clone(),
        );
        gauges
    }

    /// Sessions by state (states no session is in drop out), LUNs, and
    /// staged and published volumes, as `snap` saw them.
    fn update(&self, snap: &Snapshot) {
        let mut by_state: BTreeMap<&str, u64> = BTreeMap::new();
        for s in &snap.sessions {
            *by_state.entry(s.state.as_str()).or_default() += 1;
        }
        set_gauges(&self.sessions, by_state, |state| StateLabels { state });
        set_gauge(&self.luns, snap.devices.len() as u64);
        set_gauges(
            &self.volumes,
            [
                ("staged", snap.staged.len() as u64),
                ("published", snap.published.len() as u64),
            ],
            |state| StateLabels { state },
        );
    }
}

fn snapshot(devices: &Devices) -> Snapshot {
    let host = devices.host();
    let mut snap = Snapshot::default();
    let luns = match devices.luns() {
        Ok(l) => l,
        Err(e) => {
            snap.problems.push(format!("devices: {e}"));
            Vec::new()
        }
    };
    match sysfs::iscsi_sessions(host) {
        Ok(sessions) => {
            snap.sessions = sessions
                .into_iter()
                .map(|s| doc::Session {
                    disks: luns
                        .iter()
                        .flat_map(|l| &l.paths)
                        .filter(|p| {
                            matches!(&p.transport, Transport::Iscsi { session: Some(n), .. } if *n == s.sid)
                        })
                        .count() as u64,
                    sid: s.sid,
                    target: s.target,
                    portal: s.portal.map(|p| p.to_string()).unwrap_or_default(),
                    state: s.state,
                })
                .collect();
        }
        // No iSCSI class at all: a node without iSCSI.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => snap.problems.push(format!("iSCSI sessions: {e}")),
    }
    // Device numbers of every path and map, to tell which LUN a mount shows.
    let mut numbers: BTreeMap<String, String> = BTreeMap::new();
    for lun in &luns {
        let names = lun
            .paths
            .iter()
            .map(|p| p.kernel_name.as_str())
            .chain(lun.map.as_ref().map(|m| m.kernel_name.as_str()));
        for name in names {
            if let Some(n) = device_number(host, name) {
                numbers.insert(n, lun.wwid.to_string());
            }
        }
    }
    snap.devices = luns.iter().map(device_view).collect();
    match MountTable::read(host) {
        Ok(table) => {
            let kubelet = kubelet_root(host);
            for m in table.mounts_under(&kubelet) {
                let Some(view) = volume_view(&kubelet, m, &numbers) else {
                    continue;
                };
                let rel = m
                    .mount_point
                    .strip_prefix(&kubelet)
                    .unwrap_or(&m.mount_point);
                if is_publication(rel) {
                    snap.published.push(view);
                } else {
                    snap.staged.push(view);
                }
            }
        }
        Err(e) => snap
            .problems
            .push(format!("mount table {}: {e}", host.mountinfo.display())),
    }
    snap
}

/// `major:minor` of a block device, from sysfs.
fn device_number(host: &Host, kernel_name: &str) -> Option<String> {
    std::fs::read_to_string(host.sys("block").join(kernel_name).join("dev"))
        .ok()
        .map(|s| s.trim().to_owned())
}

fn device_view(lun: &Lun) -> doc::Device {
    let first = lun.paths.first();
    let mut holders: Vec<String> = lun
        .paths
        .iter()
        .flat_map(|p| p.holders.iter().cloned())
        .collect();
    holders.sort();
    holders.dedup();
    doc::Device {
        wwid: lun.wwid.to_string(),
        size_bytes: lun.size_bytes(),
        vendor: first.map(|p| p.vendor.clone()).unwrap_or_default(),
        model: first.map(|p| p.model.clone()).unwrap_or_default(),
        serial: first.and_then(|p| p.serial.clone()).unwrap_or_default(),
        multipath: lun.map.as_ref().map(|m| m.kernel_name.clone()),
        paths: lun
            .paths
            .iter()
            .map(|p| doc::DevicePath {
                name: p.kernel_name.clone(),
                hctl: format!(
                    "{}:{}:{}:{}",
                    p.hctl.host, p.hctl.channel, p.hctl.target, p.hctl.lun
                ),
                state: state_name(&p.state),
                transport: match &p.transport {
                    Transport::Iscsi { .. } => doc::Transport::Iscsi,
                    Transport::Fc { .. } => doc::Transport::Fc,
                    Transport::Other => doc::Transport::Other,
                },
                target: match &p.transport {
                    Transport::Iscsi { target, .. } => target.clone().unwrap_or_default(),
                    Transport::Fc { target_wwpn } => {
                        target_wwpn.map(|w| w.to_0x()).unwrap_or_default()
                    }
                    Transport::Other => String::new(),
                },
                by_path: p.by_path.first().cloned(),
            })
            .collect(),
        holders,
    }
}

fn state_name(s: &DeviceState) -> String {
    match s {
        DeviceState::Running => "running".into(),
        DeviceState::Offline => "offline".into(),
        DeviceState::TransportOffline => "transport-offline".into(),
        DeviceState::Blocked => "blocked".into(),
        DeviceState::Created => "created".into(),
        DeviceState::Quiesce => "quiesce".into(),
        DeviceState::Deleted => "deleted".into(),
        DeviceState::Unknown(other) => other.clone(),
    }
}

/// `parts` (a path under the kubelet directory) with the pod's UID, in
/// `pods/<uid>/...` or a raw block `.../volumeDevices/publish/<pv>/<uid>`,
/// replaced by `*`.
fn without_pod_uid(parts: &[String]) -> PathBuf {
    let publish = parts.iter().position(|p| p == "publish");
    parts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let uid = (i == 1 && parts[0] == "pods")
                || publish
                    .is_some_and(|at| at > 0 && i == at + 2 && parts[at - 1] == "volumeDevices");
            if uid { "*" } else { p.as_str() }
        })
        .collect()
}

/// A pod's publication (`pods/<uid>/...`, or a raw block
/// `plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<uid>`), as
/// opposed to a staging mount.
fn is_publication(rel: &Path) -> bool {
    rel.starts_with("pods") || rel.to_string_lossy().contains("/volumeDevices/publish/")
}

/// A mount under the kubelet directory that shows one of this node's LUNs,
/// or that sits in this driver's own staging directory.
fn volume_view(
    kubelet: &Path,
    m: &Mount,
    numbers: &BTreeMap<String, String>,
) -> Option<doc::Volume> {
    let number = crate::volume::device::mounted_device(m)
        .map(|n| n.to_string())
        .unwrap_or_else(|_| m.device.to_string());
    let wwid = numbers.get(&number).cloned();
    let rel = m.mount_point.strip_prefix(kubelet).ok()?;
    let ours = rel.starts_with(format!(
        "plugins/kubernetes.io/csi/{}",
        csi_scsi_daemon::PLUGIN_NAME
    ));
    if wwid.is_none() && !ours {
        return None;
    }
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let volume = volume_name(&parts);
    Some(doc::Volume {
        volume,
        path: kubelet
            .join(without_pod_uid(&parts))
            .to_string_lossy()
            .into_owned(),
        wwid,
        device: number,
        fs_type: m.fs_type.clone(),
        read_only: m.read_only(),
    })
}

/// The volume's name in kubelet's path layout.
fn volume_name(parts: &[String]) -> String {
    if let Some(i) = parts.iter().position(|p| p == "kubernetes.io~csi") {
        return parts.get(i + 1).cloned().unwrap_or_default();
    }
    if let Some(i) = parts
        .iter()
        .position(|p| p == "publish" || p == "staging")
        .filter(|i| *i > 0 && parts[i - 1] == "volumeDevices")
    {
        return parts.get(i + 1).cloned().unwrap_or_default();
    }
    match parts.last().map(String::as_str) {
        Some("globalmount") | Some("mount") if parts.len() >= 2 => parts[parts.len() - 2].clone(),
        _ => parts.last().cloned().unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::time::Duration;

    use csi_scsi_daemon::KeyedLocks;
    use tonic::Code;

    use super::*;
    use crate::device::Attachments;
    use crate::host::command::CommandRunner;

    fn parts(p: &str) -> Vec<String> {
        p.split('/').map(str::to_owned).collect()
    }

    #[test]
    fn volume_names_follow_kubelets_layout() {
        assert_eq!(
            volume_name(&parts(
                "plugins/kubernetes.io/csi/csi-scsi.io/pv-1/globalmount"
            )),
            "pv-1"
        );
        assert_eq!(
            volume_name(&parts("pods/uid-1/volumes/kubernetes.io~csi/pv-2/mount")),
            "pv-2"
        );
        assert_eq!(
            volume_name(&parts(
                "plugins/kubernetes.io/csi/volumeDevices/publish/pv-3/uid-1"
            )),
            "pv-3"
        );
        assert_eq!(
            without_pod_uid(&parts("pods/uid-1/volumes/kubernetes.io~csi/pv-2/mount")),
            Path::new("pods/*/volumes/kubernetes.io~csi/pv-2/mount")
        );
        assert_eq!(
            without_pod_uid(&parts(
                "plugins/kubernetes.io/csi/volumeDevices/publish/pv-3/uid-1"
            )),
            Path::new("plugins/kubernetes.io/csi/volumeDevices/publish/pv-3/*")
        );
        assert_eq!(
            without_pod_uid(&parts(
                "plugins/kubernetes.io/csi/csi-scsi.io/pv-1/globalmount"
            )),
            Path::new("plugins/kubernetes.io/csi/csi-scsi.io/pv-1/globalmount")
        );
        assert!(is_publication(Path::new("pods/uid-1/volumes/x")));
        assert!(is_publication(Path::new(
            "plugins/kubernetes.io/csi/volumeDevices/publish/pv-3/uid-1"
        )));
        assert!(!is_publication(Path::new(
            "plugins/kubernetes.io/csi/csi-scsi.io/pv-1/globalmount"
        )));
    }

    /// The document the agent serves over a captured node (one iSCSI LUN,
    /// staged and published) is one the CLI's types read, whole.
    #[tokio::test]
    async fn the_document_reads_back_in_the_clis_types() {
        let scratch = tempfile::tempdir().expect("tempdir");
        let kubelet = scratch.path().join("kubelet");
        let mountinfo = scratch.path().join("mountinfo");
        std::fs::write(
            &mountinfo,
            format!(
                "40 30 8:160 / {k}/plugins/kubernetes.io/csi/csi-scsi.io/pv-1/globalmount rw - xfs /dev/sdk rw\n\
                 41 30 8:160 / {k}/pods/uid-1/volumes/kubernetes.io~csi/pv-1/mount ro - xfs /dev/sdk ro\n",
                k = kubelet.display()
            ),
        )
        .expect("mountinfo");
        let host = Host {
            sysfs: Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/sysfs/iscsi-lio-single-path/sys"),
            dev: scratch.path().join("dev"),
            mountinfo,
            kubelet_dir: kubelet,
            iscsi_nodes: scratch.path().join("nodes"),
            tools: BTreeMap::new(),
            runner: CommandRunner::new(Duration::from_secs(5)),
        };
        let attachments = Attachments::load(scratch.path(), Ok(BTreeSet::new()));
        let devices = Devices::new(
            host,
            Arc::new(attachments),
            Duration::from_secs(1),
            KeyedLocks::new(),
        );
        let metrics = Metrics::new("agent", "test", None);
        metrics.note_error(
            "csi.v1.Node",
            "NodeStageVolume",
            Code::InvalidArgument,
            "bad",
            "rid-1",
        );
        let source = AgentStatus::new("node-a", Arc::new(devices), metrics.clone());

        let served = serde_json::to_value(source.status().await).expect("write");
        let doc: Status = serde_json::from_value(served.clone()).expect("the CLI reads it");
        assert_eq!(
            serde_json::to_value(&doc).expect("write"),
            served,
            "lossless"
        );
        let Status::Agent(a) = doc else {
            panic!("not an agent's document: {served}")
        };
        assert_eq!((a.schema, a.node.as_str()), (SCHEMA, "node-a"));
        assert_eq!(a.problems, Vec::<String>::new(), "{served}");
        let wwid = "naa.6001405d27e5d898829468b90ce4ef8c";
        assert_eq!(a.devices.len(), 1, "{served}");
        assert_eq!(a.devices[0].wwid, wwid);
        assert_eq!(a.devices[0].paths[0].transport, doc::Transport::Iscsi);
        assert_eq!(a.sessions.len(), 1, "{served}");
        assert_eq!(a.sessions[0].disks, 1);
        let (staged, published) = (&a.volumes.staged, &a.volumes.published);
        assert_eq!((staged.len(), published.len()), (1, 1), "{served}");
        assert_eq!(staged[0].wwid.as_deref(), Some(wwid));
        assert!(
            published[0].path.contains("/pods/*/") && published[0].read_only,
            "{served}"
        );
        assert_eq!(a.recent_errors[0].request_id, "rid-1");

        // The gauges follow the same reading.
        let text = metrics.encode();
        for series in [
            "csi_scsi_node_luns 1",
            &format!(
                "csi_scsi_iscsi_sessions{{state=\"{}\"}} 1",
                a.sessions[0].state
            ),
            "csi_scsi_volumes{state=\"staged\"} 1",
            "csi_scsi_volumes{state=\"published\"} 1",
        ] {
            assert!(text.contains(series), "{series} in {text}");
        }
    }
}
