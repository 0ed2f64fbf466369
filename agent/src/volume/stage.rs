//! NodeStageVolume and NodeUnstageVolume. A filesystem volume is staged by
//! mounting its device at the staging path (formatting it first only if it
//! carries no signature at all); a raw block volume has nothing to mount,
//! so its staging path holds a small record of the device instead.

use super::decide::stage::{self as decide, OnProbe};
use super::decide::{Found, Step};
use super::device::{self, Device};
use super::{check_supported, look_at, mount_table};
use crate::csi::request::{AccessType, StageRequest, UnstageRequest};
use crate::error::AgentError;
use crate::host::Host;
use crate::host::block::{self, DeviceNumber, Holder};
use crate::host::filesystem::{self, FsType};
use crate::host::mount::{self, BlockRecord, MountOptions};
use crate::host::mountinfo::MountTable;

/// Stages the volume at the staging path.
pub(crate) async fn stage(host: &Host, req: &StageRequest) -> Result<(), AgentError> {
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
    let seen = look_at(staging, device, table)?;
    let at = Found::new(&req.volume, staging, &seen);
    if decide::filesystem_path(at, fs)? == Step::AlreadyDone {
        return Ok(());
    }
    ensure_unused(req, device, table)?;
    let read_only = read_only(host, req, device)?;
    // A volume that already carries the asked filesystem (a Pod restarting
    // or moving) needs one superblock read; the whole safe probe runs only
    // when it does not, and decides alone whether the device is blank.
    let typed = early.unwrap_or_else(|| filesystem::carries(&device.node, fs));
    if !typed.answer().await? {
        format_if_blank(host, req, device, fs, read_only).await?;
    } else if decide::grows_unmounted(fs, read_only) {
        grow_if_outgrown(host, req, device).await?;
    }
    mount::create_dir(staging)?;
    let options = options.clone().with_read_only(read_only);
    mount::mount_filesystem(&device.node, staging, fs, &options).await?;
    tracing::info!(volume_id = %req.volume, device = %device.node.display(), staging = %staging.display(), %fs, "staged");
    Ok(())
}

/// Grows the unmounted ext4 on the device when its LUN outgrew it (the
/// array grew the LUN while the volume was not staged): offline, so a Pod
/// that comes back after an offline expansion needs no online grow.
async fn grow_if_outgrown(
    host: &Host,
    req: &StageRequest,
    device: &Device,
) -> Result<(), AgentError> {
    let fs_bytes = filesystem::ext4_size(&device.node).await?;
    let device_bytes = block::size(&device.node).map_err(|e| AgentError::io(&device.node, e))?;
    if !decide::outgrown(fs_bytes, device_bytes) {
        return Ok(());
    }
    // The last look before writing to the device.
    device::reverify(host, req.volume.wwid(), &device.node, &device.kernel_name).await?;
    filesystem::grow(host, FsType::Ext4, &device.node, None).await?;
    tracing::info!(volume_id = %req.volume, device = %device.node.display(), fs_bytes, device_bytes, "grew the unmounted ext4 to fill its device before mounting it");
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
    let found = filesystem::probe(&device.node).await?;
    match decide::on_probe(
        &req.volume,
        &device.node,
        fs,
        &found,
        req.published_read_only,
        read_only,
    )? {
        OnProbe::Mount => Ok(()),
        OnProbe::Format => {
            // The last look before the only write that destroys data.
            device::reverify(host, req.volume.wwid(), &device.node, &device.kernel_name).await?;
            filesystem::format(host, &device.node, fs, &req.mkfs).await?;
            // Trust, but verify: mount only what is now really there.
            let made = filesystem::probe(&device.node).await?;
            decide::after_format(&device.node, fs, &made)
        }
    }
}

fn stage_block(
    host: &Host,
    req: &StageRequest,
    device: &Device,
    table: &MountTable,
) -> Result<(), AgentError> {
    let staging = req.staging.as_path();
    let seen = look_at(staging, device, table)?;
    let at = Found::new(&req.volume, staging, &seen);
    if decide::block_path(at)? == Step::AlreadyDone {
        return Ok(());
    }
    ensure_unused(req, device, table)?;
    read_only(host, req, device)?;
    BlockRecord {
        volume_id: req.volume.to_string(),
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
    let mounted_at = device
        .numbers()
        .find_map(|n| table.mounts_of(n).next())
        .map(|m| m.mount_point.as_path());
    if let Some(at) = mounted_at {
        // Mounted is reason enough: no exclusive open is tried.
        return decide::unused(&req.volume, &device.node, Some(at), Holder::Free);
    }
    let holder = block::holder(&device.node).map_err(|e| AgentError::io(&device.node, e))?;
    decide::unused(&req.volume, &device.node, None, holder)
}

/// Whether the volume is to be staged read-only ([`decide::read_only`]).
fn read_only(host: &Host, req: &StageRequest, device: &Device) -> Result<bool, AgentError> {
    decide::read_only(
        &device.node,
        device_read_only(host, device)?,
        req.capability.mode.read_only(),
        req.published_read_only,
    )
}

/// Whether the kernel marks the device read-only.
fn device_read_only(host: &Host, device: &Device) -> Result<bool, AgentError> {
    block::read_only(host, &device.kernel_name)
        .map_err(|e| AgentError::io(host.sys("block").join(&device.kernel_name), e))
}

/// Unstages the volume: unmounts the staging mount (or removes the raw
/// block record) once nothing on this node publishes it any more. The
/// staging directory itself belongs to the CO and stays.
pub(crate) async fn unstage(host: &Host, req: &UnstageRequest) -> Result<(), AgentError> {
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
    decide::unstage_record(&req.volume, staging, &record)?;
    refuse_if_published(host, req, &table, record.device())?;
    BlockRecord::remove(staging)?;
    tracing::info!(volume_id = %req.volume, staging = %staging.display(), "unstaged raw block");
    Ok(())
}

/// Refuses to unstage while the volume is published anywhere on the node
/// ([`decide::unpublished_first`]).
fn refuse_if_published(
    host: &Host,
    req: &UnstageRequest,
    table: &MountTable,
    number: DeviceNumber,
) -> Result<(), AgentError> {
    let targets = device::publications(host, table, number, &[req.staging.as_path()]);
    decide::unpublished_first(&req.volume, targets)
}
