//! `AgentError`: what can go wrong on a node, with the context an operator
//! needs. Mapped to gRPC codes in exactly one place per service
//! (`csi/status.rs` for kubelet, `api/status.rs` for the proxy).

use std::path::PathBuf;

use crate::host::command::CommandError;
use csi_scsi_contract::{InvalidLeaderEpoch, InvalidVolumeId, InvalidWwid, LeaderEpoch, Wwid};

/// A failure on this node.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// A request field is missing or malformed.
    #[error("invalid {field}: {reason}")]
    InvalidArgument {
        /// The field, as named in the request.
        field: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// The volume ID is malformed.
    #[error(transparent)]
    InvalidVolumeId(#[from] InvalidVolumeId),
    /// A WWID is malformed.
    #[error(transparent)]
    InvalidWwid(#[from] InvalidWwid),
    /// No device with this WWID is present on this node.
    #[error("no device with WWID {0} on this node")]
    DeviceNotFound(Wwid),
    /// The device found under the WWID's name reports another WWID.
    #[error(
        "device {device} reports WWID {found}, not {expected}: another LUN took its place (an array reusing a LUN number?); it is not used"
    )]
    WwidMismatch {
        /// The device node.
        device: PathBuf,
        /// The WWID asked for.
        expected: Wwid,
        /// What the device reports.
        found: String,
    },
    /// The device (or one of its paths) is mounted or held open.
    #[error("device {wwid} is in use: {holder}")]
    DeviceInUse {
        /// The device.
        wwid: Wwid,
        /// Who holds it (a mount point, "opened exclusively elsewhere").
        holder: String,
    },
    /// Another operation on the same volume or device is in flight.
    #[error("an operation on {0} is already in progress")]
    Busy(String),
    /// A host tool failed.
    #[error(transparent)]
    Tool(#[from] CommandError),
    /// A host file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// NodePublishVolume without `staging_target_path`, which this plugin
    /// needs (it has STAGE_UNSTAGE_VOLUME).
    #[error(
        "staging_target_path is not set: this plugin stages volumes first (STAGE_UNSTAGE_VOLUME)"
    )]
    StagingPathMissing,
    /// The volume is not staged at the staging path given.
    #[error("volume {volume} is not staged at {path}: {reason}")]
    NotStaged {
        /// The volume ID.
        volume: String,
        /// The staging path.
        path: PathBuf,
        /// What was found instead.
        reason: String,
    },
    /// A staging or target path already holds another device or volume.
    #[error("{path} already holds {holder}")]
    PathTaken {
        /// The staging or target path.
        path: PathBuf,
        /// What is there.
        holder: String,
    },
    /// The volume is already staged or published at the path, but not as
    /// this request asks.
    #[error("volume {volume} is already at {path}, but {reason}")]
    Incompatible {
        /// The volume ID.
        volume: String,
        /// The staging or target path.
        path: PathBuf,
        /// How it differs.
        reason: String,
    },
    /// A path to unmount holds something that is not this volume.
    #[error("refusing to touch {path}: it holds {holder}, not volume {volume}")]
    ForeignMount {
        /// The volume ID.
        volume: String,
        /// The path.
        path: PathBuf,
        /// What is mounted there.
        holder: String,
    },
    /// NodeUnstageVolume while the volume is still published on this node.
    #[error("volume {volume} is still published at {}", targets.iter().map(|t| t.display().to_string()).collect::<Vec<_>>().join(", "))]
    StillPublished {
        /// The volume ID.
        volume: String,
        /// Where it is published.
        targets: Vec<PathBuf>,
    },
    /// A second publication of a volume whose access mode allows only one
    /// on a node.
    #[error(
        "volume {volume} is already published at {target}, and access mode {mode} allows one publication per node"
    )]
    PublishedElsewhere {
        /// The volume ID.
        volume: String,
        /// The existing publication.
        target: PathBuf,
        /// The access mode asked for.
        mode: &'static str,
    },
    /// The device carries a filesystem or other signature than the one
    /// asked for; it is never reformatted.
    #[error("device {device} carries {found}, not {wanted}; it is never reformatted")]
    ForeignFilesystem {
        /// The device node.
        device: PathBuf,
        /// What it carries.
        found: String,
        /// What was asked for.
        wanted: String,
    },
    /// The device is read-only but write access was asked for.
    #[error("device {device} is read-only: it can be neither written nor formatted")]
    DeviceReadOnly {
        /// The device node.
        device: PathBuf,
    },
    /// A volume published read-only carries no filesystem: it cannot be
    /// formatted, so it cannot be staged as a filesystem.
    #[error(
        "volume {volume} was published read-only and carries no filesystem: it cannot be formatted read-only"
    )]
    PublishedReadOnlyBlank {
        /// The volume.
        volume: String,
    },
    /// The device cannot be judged now: it cannot be read, reads short,
    /// or reports no size. Nothing was written.
    #[error("device {} is not ready: {reason}; nothing was written to it", device.display())]
    DeviceNotReady {
        /// The device node.
        device: PathBuf,
        /// What failed.
        reason: String,
    },
    /// A syscall on a device did not return in time (its I/O hangs).
    #[error("{op} of {} did not return within {after:?}: the device's I/O hangs; nothing more was done", path.display())]
    Stuck {
        /// What was called.
        op: &'static str,
        /// On what.
        path: PathBuf,
        /// How long it was given.
        after: std::time::Duration,
    },
    /// A record the agent keeps (attachments, a raw block staging record)
    /// could not be written durably; the call that needed it fails.
    #[error("cannot save {}: {source}", path.display())]
    RecordNotSaved {
        /// The record's path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A destructive call from a proxy replica whose leadership another
    /// has held since: refused before anything is done.
    #[error(
        "a call from a proxy that led in epoch {epoch}; epoch {highest} has led since: a stale leader's call, nothing was done"
    )]
    StaleLeader {
        /// The call's epoch.
        epoch: LeaderEpoch,
        /// The highest epoch this node has seen.
        highest: LeaderEpoch,
    },
    /// The leader-epoch header is malformed.
    #[error(transparent)]
    InvalidLeaderEpoch(#[from] InvalidLeaderEpoch),
    /// The highest leader epoch seen could not be read at start: a stale
    /// leader's destructive call cannot be told apart, so none is taken.
    #[error(
        "the highest leader epoch this node has seen, kept in {}, is unreadable ({reason}): a stale leader's call cannot be told apart, nothing was done (remove the file once every earlier proxy leader is surely gone)",
        path.display()
    )]
    LeaderEpochUnknown {
        /// The record's path.
        path: PathBuf,
        /// Why it is unreadable.
        reason: String,
    },
    /// The node has as many LUNs attached as its limit allows.
    #[error(
        "cannot attach {wwid}: this node already has {limit} volumes attached, its limit (--max-volumes)"
    )]
    AttachLimit {
        /// The LUN asked for.
        wwid: String,
        /// The limit.
        limit: u64,
    },
    /// The volume capability is valid but beyond what this volume supports.
    #[error("unsupported volume capability: {0}")]
    UnsupportedCapability(String),
    /// The kernel refused to grow a mounted filesystem.
    #[error("cannot grow the mounted {fs} filesystem on {device}: {detail}")]
    OnlineGrowRefused {
        /// The device node.
        device: PathBuf,
        /// The filesystem type.
        fs: &'static str,
        /// Why, for the operator.
        detail: String,
    },
    /// The requested capacity cannot be met by the device as it is.
    #[error("capacity {wanted} cannot be met: the device has {size} bytes")]
    CapacityOutOfRange {
        /// The device's size in bytes.
        size: u64,
        /// The range asked for, for people.
        wanted: String,
    },
    /// No such volume here: an ID this driver never issues, or a path no
    /// volume can be at.
    #[error("no volume {volume} on this node: {reason}")]
    NoSuchVolume {
        /// The volume ID (quoted when it does not parse).
        volume: String,
        /// Why.
        reason: String,
    },
    /// The volume is not staged or published at the path given.
    #[error("volume {volume} is not at {path}: {reason}")]
    VolumeNotAtPath {
        /// The volume ID.
        volume: String,
        /// The path.
        path: PathBuf,
        /// What was found instead.
        reason: String,
    },
    /// A mount(2) or umount(2) call failed.
    #[error("{op} {path}: {source}")]
    Mount {
        /// The operation (`mount`, `bind mount`, `unmount`).
        op: &'static str,
        /// The mount point.
        path: PathBuf,
        /// The errno.
        #[source]
        source: std::io::Error,
    },
    /// Something that cannot happen did; please file a bug.
    #[error("internal error, please report it: {0}")]
    Unreachable(&'static str),
    /// The target refused our login (CHAP or an initiator ACL).
    #[error("login to {target} refused: {reason}")]
    LoginRefused {
        /// The target.
        target: String,
        /// Why (never credentials).
        reason: String,
    },
    /// No portal of the target answered.
    #[error("no portal of {target} answered: {detail}")]
    NoPortalAnswered {
        /// The target.
        target: String,
        /// Per-portal failures.
        detail: String,
    },
    /// The device did not appear before the deadline.
    #[error("device {wwid} did not appear within {waited:?}")]
    AttachTimeout {
        /// The device.
        wwid: Wwid,
        /// How long we waited.
        waited: std::time::Duration,
    },
    /// An iSCSI session operation failed.
    #[error(transparent)]
    Iscsi(#[from] crate::host::iscsiadm::IscsiError),
    /// The device failed a read or write part-way through a wipe (a
    /// medium error, a path down): retryable, nothing reported wiped.
    #[error(
        "wiping {wwid} met an I/O error ({during}): {source}; it is not wiped, retry once the device answers"
    )]
    WipeIo {
        /// The device.
        wwid: Wwid,
        /// What the wipe was doing.
        during: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Erasing the device failed part-way.
    #[error("wiping {wwid} failed: {reason}")]
    WipeFailed {
        /// The device.
        wwid: Wwid,
        /// What failed.
        reason: String,
    },
}

impl AgentError {
    /// An [`AgentError::Io`] for `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}
