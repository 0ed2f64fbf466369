//! NodeStageVolume and NodeUnstageVolume. A filesystem volume is staged by
//! mounting its device at the staging path (formatting it first only if it
//! carries no signature at all); a raw block volume has nothing to mount,
//! so its staging path holds a small record of the device instead.

use super::device::{self, Device};
use super::{check_supported, mount_table};
use crate::csi::request::{AccessType, StageRequest, UnstageRequest};
use crate::error::AgentError;
use crate::host::Host;
use crate::host::block::{self, DeviceNumber, Holder};
use crate::host::filesystem::{self, FsType, Signature};
use crate::host::mount::{self, BlockRecord, MountOptions};
use crate::host::mountinfo::MountTable;

/// Stages the volume at the staging path.
pub async fn stage(host: &Host, req: &StageRequest) -> Result<(), AgentError> {
    check_supported(&req.capability)?;
    let device = device::require(host, req.volume.wwid())?;
    // The typed probe only reads, so it starts before the mount table is
    // read and the checks run: a thread wakes for it meanwhile (on a VM
    // that wake costs more than the read). Not for a staging path that
    // may be mounted already: that answer needs no probe, and a stalled
    // disk would hold a thread for nothing. Nothing is written before
    // every check has passed.
    let early = match &req.capability.access {
        AccessType::Mount { fs, .. } if !mount::may_be_mount_point(req.staging.as_path()) => {
            Some(filesystem::carries(&device.node, *fs))
        }
        _ => None,
    };
    let table = mount_table(host)?;
    match &req.capability.access {
        AccessType::Mount { fs, options } => {
            stage_filesystem(host, req, &device, &table, *fs, options, early).await
        }
        AccessType::Block => stage_block(host, req, &device, &table),
    }
}

async fn stage_filesystem(
    host: &Host,
    req: &StageRequest,
    device: &Device,
    table: &MountTable,
    fs: FsType,
    options: &MountOptions,
    early: Option<filesystem::TypedProbe>,
) -> Result<(), AgentError> {
    let staging = req.staging.as_path();
    if let Some(m) = table.mount_at(staging) {
        if !device.is(m.device) {
            return Err(AgentError::PathTaken {
                path: staging.to_owned(),
                holder: device::describe(m),
            });
        }
        if m.fs_type != fs.name() {
            return Err(incompatible(
                req,
                format!(
                    "it is staged as {} and the request asks for {fs}",
                    m.fs_type
                ),
            ));
        }
        // Spec: "If the volume corresponding to the volume_id is already
        // staged to the staging_target_path, and is identical to the
        // specified volume_capability the Plugin MUST reply 0 OK."
        return Ok(());
    }
    if BlockRecord::read(staging)?.is_some() {
        return Err(incompatible(
            req,
            format!("it is staged as a raw block device and the request asks for {fs}"),
        ));
    }
    ensure_unused(req, device, table)?;
    let read_only = read_only(host, req, device)?;
    // A volume that already carries the asked filesystem (a Pod restarting
    // or moving) needs one superblock read; the whole safe probe runs only
    // when it does not, and decides alone whether the device is blank.
    let typed = early.unwrap_or_else(|| filesystem::carries(&device.node, fs));
    if !typed.answer().await? {
        format_if_blank(host, req, device, fs, read_only).await?;
    }
    mount::create_dir(staging)?;
    let options = options.clone().with_read_only(read_only);
    mount::mount_filesystem(&device.node, staging, fs, &options).await?;
    tracing::info!(volume_id = %req.volume, device = %device.node.display(), staging = %staging.display(), %fs, "staged");
    Ok(())
}

/// Formats the device with `fs` when the whole safe probe finds it blank;
/// refuses one that carries anything else.
async fn format_if_blank(
    host: &Host,
    req: &StageRequest,
    device: &Device,
    fs: FsType,
    read_only: bool,
) -> Result<(), AgentError> {
    match filesystem::probe(&device.node).await? {
        Signature::Filesystem(found) if found == fs.name() => {}
        Signature::Blank if req.published_read_only => {
            return Err(AgentError::PublishedReadOnlyBlank {
                volume: req.volume.to_string(),
            });
        }
        Signature::Blank if read_only => {
            return Err(AgentError::DeviceReadOnly {
                device: device.node.clone(),
            });
        }
        Signature::Blank => {
            // The last look before the only write that destroys data.
            device::reverify(host, req.volume.wwid(), &device.node, &device.kernel_name).await?;
            filesystem::format(host, &device.node, fs, &req.mkfs).await?;
            // Trust, but verify: mount only what is now really there.
            let made = filesystem::probe(&device.node).await?;
            if made != Signature::Filesystem(fs.name().to_owned()) {
                return Err(foreign(device, fs, &made));
            }
        }
        other => return Err(foreign(device, fs, &other)),
    }
    Ok(())
}

fn stage_block(
    host: &Host,
    req: &StageRequest,
    device: &Device,
    table: &MountTable,
) -> Result<(), AgentError> {
    let staging = req.staging.as_path();
    if let Some(m) = table.mount_at(staging) {
        if device.is(m.device) {
            return Err(incompatible(
                req,
                "it is staged as a filesystem and the request asks for raw block".to_owned(),
            ));
        }
        return Err(AgentError::PathTaken {
            path: staging.to_owned(),
            holder: device::describe(m),
        });
    }
    let volume_id = req.volume.to_string();
    if let Some(record) = BlockRecord::read(staging)? {
        if record.volume_id == volume_id && record.wwid == req.volume.wwid().as_str() {
            // Spec: already staged with an identical capability: 0 OK.
            return Ok(());
        }
        return Err(AgentError::PathTaken {
            path: staging.to_owned(),
            holder: format!("raw block volume {}", record.volume_id),
        });
    }
    ensure_unused(req, device, table)?;
    read_only(host, req, device)?;
    BlockRecord {
        volume_id,
        wwid: req.volume.wwid().to_string(),
        major: device.number.major,
        minor: device.number.minor,
    }
    .write(staging)?;
    tracing::info!(volume_id = %req.volume, device = %device.node.display(), staging = %staging.display(), "staged raw block");
    Ok(())
}

/// Refuses a device that is mounted (anywhere we can see) or held
/// exclusively (a mount in another namespace, a running mkfs).
fn ensure_unused(
    req: &StageRequest,
    device: &Device,
    table: &MountTable,
) -> Result<(), AgentError> {
    if let Some(m) = device.numbers().find_map(|n| table.mounts_of(n).next()) {
        return Err(AgentError::DeviceInUse {
            wwid: req.volume.wwid().clone(),
            holder: format!("mounted at {}", m.mount_point.display()),
        });
    }
    match block::holder(&device.node).map_err(|e| AgentError::io(&device.node, e))? {
        Holder::Free => Ok(()),
        Holder::Busy => Err(AgentError::DeviceInUse {
            wwid: req.volume.wwid().clone(),
            holder: format!(
                "{} is held exclusively (mounted in another mount namespace, or open by another program)",
                device.node.display()
            ),
        }),
    }
}

/// Whether the volume is to be staged read-only: published read-only, or
/// a device the kernel marks read-only (refused unless the capability or
/// the publication is read-only).
fn read_only(host: &Host, req: &StageRequest, device: &Device) -> Result<bool, AgentError> {
    let device_read_only = device_read_only(host, device)?;
    if device_read_only && !req.capability.mode.read_only() && !req.published_read_only {
        return Err(AgentError::DeviceReadOnly {
            device: device.node.clone(),
        });
    }
    Ok(device_read_only || req.published_read_only)
}

/// Whether the kernel marks the device read-only.
fn device_read_only(host: &Host, device: &Device) -> Result<bool, AgentError> {
    block::read_only(host, &device.kernel_name)
        .map_err(|e| AgentError::io(host.sys("block").join(&device.kernel_name), e))
}

fn incompatible(req: &StageRequest, reason: String) -> AgentError {
    AgentError::Incompatible {
        volume: req.volume.to_string(),
        path: req.staging.as_path().to_owned(),
        reason,
    }
}

fn foreign(device: &Device, fs: FsType, found: &Signature) -> AgentError {
    AgentError::ForeignFilesystem {
        device: device.node.clone(),
        found: found.describe(),
        wanted: format!("a filesystem of type {fs}"),
    }
}

/// Unstages the volume: unmounts the staging mount (or removes the raw
/// block record) once nothing on this node publishes it any more. The
/// staging directory itself belongs to the CO and stays.
pub async fn unstage(host: &Host, req: &UnstageRequest) -> Result<(), AgentError> {
    let staging = req.staging.as_path();
    // Spec: "If the volume corresponding to the volume_id is not staged to
    // the staging_target_path, the Plugin MUST reply 0 OK."
    if !mount::exists(staging)? {
        return Ok(());
    }
    let table = mount_table(host)?;
    if let Some(m) = table.mount_at(staging) {
        let number = m.device;
        device::ensure_ours(host, &req.volume, staging, number, &device::describe(m))?;
        refuse_if_published(host, req, &table, number)?;
        device::unmount_ours(host, staging, number).await?;
        tracing::info!(volume_id = %req.volume, staging = %staging.display(), "unstaged");
        return Ok(());
    }
    let Some(record) = BlockRecord::read(staging)? else {
        return Ok(());
    };
    if record.volume_id != req.volume.to_string() {
        return Err(AgentError::ForeignMount {
            volume: req.volume.to_string(),
            path: staging.to_owned(),
            holder: format!(
                "the raw block staging record of volume {}",
                record.volume_id
            ),
        });
    }
    refuse_if_published(host, req, &table, record.device())?;
    BlockRecord::remove(staging)?;
    tracing::info!(volume_id = %req.volume, staging = %staging.display(), "unstaged raw block");
    Ok(())
}

/// Spec: "All NodeUnpublishVolume MUST be called and return success for a
/// volume before NodeUnstageVolume MAY be called for the volume."
fn refuse_if_published(
    host: &Host,
    req: &UnstageRequest,
    table: &MountTable,
    number: DeviceNumber,
) -> Result<(), AgentError> {
    let targets = device::publications(host, table, number, &[req.staging.as_path()]);
    if targets.is_empty() {
        Ok(())
    } else {
        Err(AgentError::StillPublished {
            volume: req.volume.to_string(),
            targets,
        })
    }
}
