//! An agent's `/status`: its node's iSCSI sessions, the LUNs it sees, the
//! volumes staged and published under the kubelet directory, its
//! registration with kubelet, and its last failed calls. Sessions are named
//! by target and portal only.

use serde::{Deserialize, Serialize};

use crate::ErrorRecord;

/// An agent's `/status` document (`"component": "agent"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Document {
    /// The document's schema ([`crate::SCHEMA`] when written).
    #[serde(default = "crate::unversioned")]
    pub schema: u32,
    /// The node the agent serves.
    pub node: String,
    /// The agent's release.
    pub version: String,
    /// When the process started (RFC 3339, UTC).
    pub started: String,
    /// Seconds since it started.
    pub uptime_seconds: u64,
    /// The node's iSCSI sessions.
    pub sessions: Vec<Session>,
    /// The LUNs the node sees, one per WWID.
    pub devices: Vec<Device>,
    /// The volumes mounted under the kubelet directory.
    pub volumes: Volumes,
    /// The last failed calls, newest first.
    pub recent_errors: Vec<ErrorRecord>,
    /// What could not be read (the rest of the document still stands).
    pub problems: Vec<String>,
    /// The agent's registration with kubelet's plugin watcher; absent when
    /// registration is off, and from agents that predate it (schema 1
    /// without it stays schema 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet_registration: Option<KubeletRegistration>,
    /// Whether storage addresses, names and error messages were left out
    /// for a reader off the machine ([`crate::Status::redacted`]); absent
    /// (false) in the full document.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub redacted: bool,
}

/// The agent's registration with kubelet's plugin watcher.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubeletRegistration {
    /// The registration socket kubelet's plugin watcher dials.
    pub socket: String,
    /// The CSI socket the agent hands kubelet (as kubelet sees it).
    pub endpoint: String,
    /// What kubelet last reported.
    pub state: RegistrationState,
    /// kubelet's reason when it refused the plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When kubelet last asked for the plugin's info (RFC 3339, UTC): it
    /// found the socket. `None`: kubelet has not dialled it yet.
    #[serde(default)]
    pub info_requested: Option<String>,
    /// When kubelet last reported the outcome (RFC 3339, UTC).
    #[serde(default)]
    pub reported: Option<String>,
}

/// What kubelet last reported about the registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RegistrationState {
    /// kubelet has reported nothing since the agent started.
    Pending,
    /// kubelet registered the driver.
    Registered,
    /// kubelet refused it (see `error`).
    Failed,
}

/// One iSCSI session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    /// The kernel's session number.
    pub sid: u32,
    /// The target IQN.
    pub target: String,
    /// `ip:port`, empty when the kernel does not say.
    pub portal: String,
    /// The kernel's state name (`LOGGED_IN`, `FAILED`, ...).
    pub state: String,
    /// Disk paths below this session.
    pub disks: u64,
}

/// One LUN the node sees.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    /// Canonical WWID.
    pub wwid: String,
    /// Size in bytes.
    pub size_bytes: u64,
    /// INQUIRY vendor (of the first path).
    pub vendor: String,
    /// INQUIRY model (of the first path).
    pub model: String,
    /// Unit serial number, empty when unknown.
    pub serial: String,
    /// The multipath map over the paths, when there is one.
    pub multipath: Option<String>,
    /// The SCSI disks that show it.
    pub paths: Vec<DevicePath>,
    /// Kernel names holding a path or the map open.
    pub holders: Vec<String>,
}

/// One SCSI disk showing a LUN.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DevicePath {
    /// Kernel name (`sda`).
    pub name: String,
    /// `host:channel:target:lun`.
    pub hctl: String,
    /// The kernel's device state (`running`, `offline`, `transport-offline`, ...).
    pub state: String,
    /// How the disk is reached.
    pub transport: Transport,
    /// The target IQN or port WWPN (`0x...`), empty when unknown.
    pub target: String,
    /// Its first `/dev/disk/by-path` name, if any.
    pub by_path: Option<String>,
}

/// How a disk is reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// iSCSI.
    Iscsi,
    /// Fibre Channel.
    Fc,
    /// Anything else (SAS, virtio-scsi, ...).
    Other,
}

/// The volumes mounted under the kubelet directory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Volumes {
    /// Staging mounts.
    pub staged: Vec<Volume>,
    /// Pods' publications (and raw block publications).
    pub published: Vec<Volume>,
}

/// One mount of a volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Volume {
    /// The PV (or kubelet's volume directory) name.
    pub volume: String,
    /// The mount point, with a pod's UID shown as `*` (the document is
    /// unauthenticated).
    pub path: String,
    /// The LUN it shows, when the device is one this node sees.
    pub wwid: Option<String>,
    /// The mounted device's `major:minor` (or the mount table's source).
    pub device: String,
    /// The filesystem type.
    pub fs_type: String,
    /// Mounted read-only.
    pub read_only: bool,
}
