//! CSI Node requests parsed into typed requests at the edge, so the domain
//! code in [`crate::volume`] never sees a prost message. Every failure is
//! INVALID_ARGUMENT naming the field (except a missing staging path on
//! publish, which the spec makes FAILED_PRECONDITION). Staging and target
//! paths must resolve, after `..` and symlinks, strictly under the kubelet
//! directory.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};

use csi_scsi_proto::csi::volume_capability::{AccessType as ProtoAccessType, access_mode::Mode};
use csi_scsi_proto::csi::{
    CapacityRange, NodeExpandVolumeRequest, NodeGetVolumeStatsRequest, NodePublishVolumeRequest,
    NodeStageVolumeRequest, NodeUnpublishVolumeRequest, NodeUnstageVolumeRequest, VolumeCapability,
};
use csi_scsi_proto::publish_context;
use csi_scsi_textfs::text;

use crate::error::AgentError;
use crate::host::Host;
use crate::host::filesystem::{FsType, MkfsOptions};
use crate::host::mount::{self, MountOptions};
pub use csi_scsi_contract::AccessMode;
use csi_scsi_contract::VolumeId;

/// The `volume_context` key whose value holds extra `mkfs` arguments
/// (checked against the allow-list of the filesystem type).
pub const MKFS_OPTIONS_KEY: &str = "mkfsOptions";

/// Linux's longest path (with its NUL) and longest name.
const PATH_MAX: usize = 4096;
const NAME_MAX: usize = 255;

/// The longest `mkfsOptions` value and the most bytes of mount flags: the
/// spec limits a whole map to 4 KiB, and the kernel takes mount options in
/// one 4 KiB page.
const MAX_OPTIONS: usize = 4096;

/// The longest filesystem type name worth quoting back.
const MAX_FS_TYPE: usize = 64;

/// A path that resolved (symlinks and `..` included) strictly under the
/// kubelet directory. Holds the resolved path, which is what mountinfo shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletPath(PathBuf);

/// How the volume is accessed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessType {
    /// As a raw block device.
    Block,
    /// As a mounted filesystem.
    Mount {
        /// The filesystem type (ext4 when unspecified).
        fs: FsType,
        /// Checked mount flags.
        options: MountOptions,
    },
}

/// A parsed `VolumeCapability`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capability {
    /// Block or mount.
    pub access: AccessType,
    /// The access mode.
    pub mode: AccessMode,
}

/// NodeStageVolume, parsed.
#[derive(Debug, Clone)]
pub struct StageRequest {
    /// The volume.
    pub volume: VolumeId,
    /// Where to stage it.
    pub staging: KubeletPath,
    /// How it will be used.
    pub capability: Capability,
    /// Extra mkfs arguments for a blank device (mount access only).
    pub mkfs: MkfsOptions,
    /// ControllerPublishVolume published it read-only (publish context):
    /// stage it read-only, never format it.
    pub published_read_only: bool,
}

/// NodeUnstageVolume, parsed.
#[derive(Debug, Clone)]
pub struct UnstageRequest {
    /// The volume.
    pub volume: VolumeId,
    /// Where it was staged.
    pub staging: KubeletPath,
}

/// NodePublishVolume, parsed.
#[derive(Debug, Clone)]
pub struct PublishRequest {
    /// The volume.
    pub volume: VolumeId,
    /// Where it was staged.
    pub staging: KubeletPath,
    /// Where to publish it.
    pub target: KubeletPath,
    /// How it will be used.
    pub capability: Capability,
    /// Whether the CO asked for a read-only publication, or the volume
    /// was published read-only to the node (publish context).
    pub read_only: bool,
}

/// NodeUnpublishVolume, parsed.
#[derive(Debug, Clone)]
pub struct UnpublishRequest {
    /// The volume.
    pub volume: VolumeId,
    /// Where it was published.
    pub target: KubeletPath,
}

/// NodeGetVolumeStats, parsed.
#[derive(Debug, Clone)]
pub struct StatsRequest {
    /// The volume.
    pub volume: VolumeId,
    /// Where it is staged or published.
    pub path: KubeletPath,
}

/// NodeExpandVolume, parsed.
#[derive(Debug, Clone)]
pub struct ExpandRequest {
    /// The volume.
    pub volume: VolumeId,
    /// Where it is staged or published.
    pub path: KubeletPath,
    /// The least size the volume must have, if given.
    pub required_bytes: Option<u64>,
    /// The most size the volume may have, if given.
    pub limit_bytes: Option<u64>,
    /// Block or mount, when the CO said.
    pub access: Option<AccessType>,
}

// === impl KubeletPath ===

impl KubeletPath {
    /// Resolves `raw` (request field `field`): it must be absolute and land
    /// strictly under the kubelet directory once every existing component
    /// is resolved (symlinks followed, `..` taken from what they resolved
    /// to) and the missing ones lexically (a component that does not exist
    /// yet cannot be a symlink; `..` out of one brings the walk back to the
    /// disk, see [`resolve`]).
    pub fn parse(host: &Host, field: &'static str, raw: &str) -> Result<Self, AgentError> {
        let bad = |reason: String| AgentError::InvalidArgument { field, reason };
        if raw.is_empty() {
            return Err(bad("is required".to_owned()));
        }
        if raw.contains('\0') {
            return Err(bad("contains a NUL byte".to_owned()));
        }
        // Beyond the kernel's limits no call on the path can succeed, and
        // resolving stops at the first missing component, so a path that
        // long would pass the checks below and fail later as INTERNAL.
        if raw.len() >= PATH_MAX {
            return Err(bad(format!(
                "{} is {} bytes long; paths are shorter than {PATH_MAX}",
                text::quote(raw, text::INPUT_MAX),
                raw.len()
            )));
        }
        if let Some(c) = Path::new(raw)
            .components()
            .find(|c| c.as_os_str().len() > NAME_MAX)
        {
            return Err(bad(format!(
                "{} has a {} byte component; names are at most {NAME_MAX}",
                text::quote(raw, text::INPUT_MAX),
                c.as_os_str().len()
            )));
        }
        let path = Path::new(raw);
        if !path.is_absolute() {
            return Err(bad(format!(
                "{} is not an absolute path",
                text::quote(raw, text::INPUT_MAX)
            )));
        }
        let kubelet = mount::kubelet_root(host);
        let resolved = resolve(path).map_err(|e| {
            bad(format!(
                "{} cannot be resolved: {e}",
                text::quote(raw, text::INPUT_MAX)
            ))
        })?;
        if resolved == kubelet || !resolved.starts_with(&kubelet) {
            return Err(bad(format!(
                "{} resolves to {}, which is not under the kubelet directory {}",
                text::quote(raw, text::INPUT_MAX),
                text::quote(&resolved.display().to_string(), text::INPUT_MAX),
                kubelet.display()
            )));
        }
        Ok(Self(resolved))
    }

    /// The resolved path.
    pub fn as_path(&self) -> &Path {
        &self.0
    }
}

/// The most symlinks one resolution follows (the kernel's MAXSYMLINKS).
const MAX_SYMLINKS: usize = 40;

/// One step of a walk: the root, `..`, or a name.
enum Step {
    Root,
    Parent,
    Name(OsString),
}

/// `path` resolved the way the kernel walks it, one component at a time:
/// every component that exists is looked at, and a symlink is replaced by
/// its target (relative to the directory holding it); `..` goes to the
/// parent of what was resolved so far. A component that does not exist
/// (or sits under a non-directory) is kept as written, and so is everything
/// below it; a `..` there drops it, and the walk looks at the disk again,
/// so `missing/../escape` follows `escape` if it is a symlink. What comes
/// back has every existing component resolved, so the kernel, creating or
/// mounting it, follows no symlink out of it.
fn resolve(path: &Path) -> std::io::Result<PathBuf> {
    let mut pending: Vec<Step> = steps(path);
    let mut resolved = PathBuf::from("/");
    // How many trailing components of `resolved` do not exist.
    let mut missing = 0usize;
    let mut links = 0usize;
    while let Some(step) = pending.pop() {
        match step {
            Step::Root => {
                resolved = PathBuf::from("/");
                missing = 0;
            }
            Step::Parent => {
                resolved.pop();
                missing = missing.saturating_sub(1);
            }
            Step::Name(name) => {
                resolved.push(&name);
                if missing > 0 {
                    // Under a missing component: nothing here exists.
                    missing += 1;
                    continue;
                }
                match std::fs::symlink_metadata(&resolved) {
                    Ok(m) if m.file_type().is_symlink() => {
                        links += 1;
                        if links > MAX_SYMLINKS {
                            return Err(std::io::Error::from_raw_os_error(libc::ELOOP));
                        }
                        let target = std::fs::read_link(&resolved)?;
                        resolved.pop();
                        pending.extend(steps(&target));
                    }
                    Ok(_) => {}
                    Err(e)
                        if e.kind() == ErrorKind::NotFound
                            || e.raw_os_error() == Some(libc::ENOTDIR) =>
                    {
                        missing = 1;
                    }
                    // The root of a filesystem whose device fails (every path
                    // to its LUN lost): nothing below can be read, so nothing
                    // below is followed; the rest is taken as written. The
                    // call then reports the failing volume, not "no volume".
                    Err(e) if e.raw_os_error() == Some(libc::EIO) => {
                        missing = 1;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(resolved)
}

/// The steps of `path`, last first (a stack: a symlink's target is pushed
/// on top of what remains of the path it was found in).
fn steps(path: &Path) -> Vec<Step> {
    let mut out: Vec<Step> = path
        .components()
        .filter_map(|c| match c {
            Component::RootDir | Component::Prefix(_) => Some(Step::Root),
            Component::ParentDir => Some(Step::Parent),
            Component::Normal(name) => Some(Step::Name(name.to_owned())),
            Component::CurDir => None,
        })
        .collect();
    out.reverse();
    out
}

/// Parses NodeStageVolume.
pub fn stage(host: &Host, r: &NodeStageVolumeRequest) -> Result<StageRequest, AgentError> {
    let volume = volume_id(&r.volume_id)?;
    let capability = capability(r.volume_capability.as_ref())?;
    let staging = KubeletPath::parse(host, "staging_target_path", &r.staging_target_path)?;
    let mkfs = match (&capability.access, r.volume_context.get(MKFS_OPTIONS_KEY)) {
        (AccessType::Mount { .. }, Some(text)) if text.len() > MAX_OPTIONS => {
            return Err(AgentError::InvalidArgument {
                field: "volume_context.mkfsOptions",
                reason: format!("is {} bytes long; at most {MAX_OPTIONS}", text.len()),
            });
        }
        (AccessType::Mount { fs, .. }, Some(text)) => {
            MkfsOptions::parse(*fs, text).map_err(|reason| AgentError::InvalidArgument {
                field: "volume_context.mkfsOptions",
                reason,
            })?
        }
        _ => MkfsOptions::default(),
    };
    Ok(StageRequest {
        volume,
        staging,
        capability,
        mkfs,
        published_read_only: published_read_only(&r.publish_context)?,
    })
}

/// Parses NodeUnstageVolume.
pub fn unstage(host: &Host, r: &NodeUnstageVolumeRequest) -> Result<UnstageRequest, AgentError> {
    Ok(UnstageRequest {
        volume: volume_id(&r.volume_id)?,
        staging: KubeletPath::parse(host, "staging_target_path", &r.staging_target_path)?,
    })
}

/// Parses NodePublishVolume.
pub fn publish(host: &Host, r: &NodePublishVolumeRequest) -> Result<PublishRequest, AgentError> {
    let volume = volume_id(&r.volume_id)?;
    let capability = capability(r.volume_capability.as_ref())?;
    let target = KubeletPath::parse(host, "target_path", &r.target_path)?;
    // The spec's "Staging target path not set" row: FAILED_PRECONDITION.
    if r.staging_target_path.is_empty() {
        return Err(AgentError::StagingPathMissing);
    }
    let staging = KubeletPath::parse(host, "staging_target_path", &r.staging_target_path)?;
    if staging == target {
        return Err(AgentError::InvalidArgument {
            field: "target_path",
            reason: "is the staging path".to_owned(),
        });
    }
    Ok(PublishRequest {
        volume,
        staging,
        target,
        capability,
        read_only: r.readonly || published_read_only(&r.publish_context)?,
    })
}

/// Parses NodeUnpublishVolume.
pub fn unpublish(
    host: &Host,
    r: &NodeUnpublishVolumeRequest,
) -> Result<UnpublishRequest, AgentError> {
    Ok(UnpublishRequest {
        volume: volume_id(&r.volume_id)?,
        target: KubeletPath::parse(host, "target_path", &r.target_path)?,
    })
}

/// Parses NodeGetVolumeStats.
pub fn stats(host: &Host, r: &NodeGetVolumeStatsRequest) -> Result<StatsRequest, AgentError> {
    let (volume, path) = volume_at_path(host, &r.volume_id, &r.volume_path)?;
    Ok(StatsRequest { volume, path })
}

/// Parses NodeExpandVolume.
pub fn expand(host: &Host, r: &NodeExpandVolumeRequest) -> Result<ExpandRequest, AgentError> {
    let (volume, path) = volume_at_path(host, &r.volume_id, &r.volume_path)?;
    let (required_bytes, limit_bytes) = capacity_range(r.capacity_range.as_ref())?;
    let access = match r.volume_capability.as_ref() {
        Some(c) => Some(capability(Some(c))?.access),
        None => None,
    };
    Ok(ExpandRequest {
        volume,
        path,
        required_bytes,
        limit_bytes,
        access,
    })
}

/// Whether the controller published the volume read-only, from the
/// publish context it returned (`readonly`: `true` or `false`; absent:
/// not read-only).
fn published_read_only(context: &HashMap<String, String>) -> Result<bool, AgentError> {
    match context.get(publish_context::READONLY).map(String::as_str) {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(AgentError::InvalidArgument {
            field: "publish_context.readonly",
            reason: format!("is {}; true or false", text::quote(other, text::INPUT_MAX)),
        }),
    }
}

/// The volume and path of a call that looks a volume up where it already
/// is (NodeGetVolumeStats, NodeExpandVolume). Missing fields are
/// INVALID_ARGUMENT; an ID this driver never issues, or a path where
/// kubelet never puts a volume (relative, outside its directory), names a
/// volume that does not exist there: NOT_FOUND, as the spec's tables say.
fn volume_at_path(
    host: &Host,
    raw_id: &str,
    raw_path: &str,
) -> Result<(VolumeId, KubeletPath), AgentError> {
    for (field, raw) in [("volume_id", raw_id), ("volume_path", raw_path)] {
        if raw.is_empty() {
            return Err(AgentError::InvalidArgument {
                field,
                reason: "is required".to_owned(),
            });
        }
    }
    let volume = VolumeId::parse(raw_id).map_err(|e| AgentError::NoSuchVolume {
        volume: text::quote(raw_id, text::INPUT_MAX),
        reason: e.to_string(),
    })?;
    let path = KubeletPath::parse(host, "volume_path", raw_path).map_err(|e| {
        AgentError::NoSuchVolume {
            volume: volume.to_string(),
            reason: format!("no volume can be at that path: {e}"),
        }
    })?;
    Ok((volume, path))
}

fn volume_id(raw: &str) -> Result<VolumeId, AgentError> {
    if raw.is_empty() {
        return Err(AgentError::InvalidArgument {
            field: "volume_id",
            reason: "is required".to_owned(),
        });
    }
    Ok(VolumeId::parse(raw)?)
}

fn capability(c: Option<&VolumeCapability>) -> Result<Capability, AgentError> {
    let bad = |field, reason: String| AgentError::InvalidArgument { field, reason };
    let c = c.ok_or_else(|| bad("volume_capability", "is required".to_owned()))?;
    let mode_value = c.access_mode.as_ref().map(|m| m.mode).unwrap_or_default();
    // The spec's names are the contract's: UNKNOWN and unknown numbers are
    // no mode.
    let mode = Mode::try_from(mode_value)
        .ok()
        .and_then(|m| AccessMode::parse(m.as_str_name()).ok())
        .ok_or_else(|| {
            bad(
                "volume_capability.access_mode",
                format!(
                    "{mode_value} is not a known access mode (UNKNOWN or unset is not allowed)"
                ),
            )
        })?;
    let access = match &c.access_type {
        None => {
            return Err(bad(
                "volume_capability.access_type",
                "must be block or mount".to_owned(),
            ));
        }
        Some(ProtoAccessType::Block(_)) => AccessType::Block,
        Some(ProtoAccessType::Mount(m)) => {
            let fs = if m.fs_type.is_empty() {
                FsType::Ext4
            } else if m.fs_type.len() > MAX_FS_TYPE {
                let known: Vec<&str> = FsType::ALL.iter().map(|f| f.name()).collect();
                return Err(bad(
                    "volume_capability.mount.fs_type",
                    format!(
                        "is {} bytes long and not supported (supported: {})",
                        m.fs_type.len(),
                        known.join(", ")
                    ),
                ));
            } else {
                FsType::from_name(&m.fs_type).ok_or_else(|| {
                    let known: Vec<&str> = FsType::ALL.iter().map(|f| f.name()).collect();
                    bad(
                        "volume_capability.mount.fs_type",
                        format!(
                            "{:?} is not supported (supported: {})",
                            m.fs_type,
                            known.join(", ")
                        ),
                    )
                })?
            };
            if !m.volume_mount_group.is_empty() {
                return Err(bad(
                    "volume_capability.mount.volume_mount_group",
                    "is not supported (no VOLUME_MOUNT_GROUP capability)".to_owned(),
                ));
            }
            let flag_bytes: usize = m.mount_flags.iter().map(String::len).sum();
            if flag_bytes > MAX_OPTIONS {
                return Err(bad(
                    "volume_capability.mount.mount_flags",
                    format!("are {flag_bytes} bytes long; at most {MAX_OPTIONS}"),
                ));
            }
            let options = MountOptions::parse(fs, &m.mount_flags)
                .map_err(|reason| bad("volume_capability.mount.mount_flags", reason))?;
            AccessType::Mount { fs, options }
        }
    };
    Ok(Capability { access, mode })
}

fn capacity_range(r: Option<&CapacityRange>) -> Result<(Option<u64>, Option<u64>), AgentError> {
    let Some(r) = r else { return Ok((None, None)) };
    let bytes = |field, v: i64| -> Result<Option<u64>, AgentError> {
        match u64::try_from(v) {
            Ok(0) => Ok(None),
            Ok(n) => Ok(Some(n)),
            Err(_) => Err(AgentError::InvalidArgument {
                field,
                reason: format!("{v} is negative"),
            }),
        }
    };
    let required = bytes("capacity_range.required_bytes", r.required_bytes)?;
    let limit = bytes("capacity_range.limit_bytes", r.limit_bytes)?;
    if let (Some(req), Some(lim)) = (required, limit)
        && req > lim
    {
        return Err(AgentError::InvalidArgument {
            field: "capacity_range",
            reason: format!("required_bytes {req} exceeds limit_bytes {lim}"),
        });
    }
    Ok((required, limit))
}

#[cfg(test)]
mod tests;
