//! NodePublishVolume and NodeUnpublishVolume: bind the staged filesystem
//! (or the device node, for raw block) onto the target path, read-only when
//! asked, and take it away again. The target is the plugin's to create and
//! to remove.

use super::device::{self, Device};
use super::{check_supported, mount_table};
use crate::csi::request::{AccessMode, AccessType, PublishRequest, UnpublishRequest};
use crate::error::AgentError;
use crate::host::Host;
use crate::host::filesystem::FsType;
use crate::host::mount::{self, BlockRecord, MountOptions};
use crate::host::mountinfo::MountTable;

/// Publishes the staged volume at the target path.
pub async fn publish(host: &Host, req: &PublishRequest) -> Result<(), AgentError> {
    check_supported(&req.capability)?;
    let device = device::require(host, req.volume.wwid())?;
    let table = mount_table(host)?;
    // A reader-only mode is published read-only whatever the flag says.
    let read_only = req.read_only || req.capability.mode.read_only();
    match &req.capability.access {
        AccessType::Mount { fs, options } => {
            check_staged_filesystem(req, &device, &table, *fs)?;
            if already_published(req, &device, &table, read_only)? {
                return Ok(());
            }
            check_other_publications(host, req, &device, &table)?;
            let target = req.target.as_path();
            mount::create_dir(target)?;
            let options = options.clone().with_read_only(read_only);
            mount::bind(req.staging.as_path(), target, &options).await?;
        }
        AccessType::Block => {
            check_staged_block(req, &device, &table)?;
            if already_published(req, &device, &table, read_only)? {
                return Ok(());
            }
            check_other_publications(host, req, &device, &table)?;
            let target = req.target.as_path();
            mount::create_file(target)?;
            // A read-only bind marks the publication read-only, but the
            // kernel checks read-only mounts only for regular files, not for
            // device nodes: what stops a pod writing to a read-only raw block
            // volume is the device cgroup kubelet asks the runtime for.
            mount::bind(
                &device.node,
                target,
                &MountOptions::default().with_read_only(read_only),
            )
            .await?;
        }
    }
    tracing::info!(volume_id = %req.volume, target = %req.target.as_path().display(), read_only, "published");
    Ok(())
}

/// The staging path must hold this volume's filesystem, of the type asked.
fn check_staged_filesystem(
    req: &PublishRequest,
    device: &Device,
    table: &MountTable,
    fs: FsType,
) -> Result<(), AgentError> {
    let staging = req.staging.as_path();
    let not_staged = |reason: String| AgentError::NotStaged {
        volume: req.volume.to_string(),
        path: staging.to_owned(),
        reason,
    };
    match table.mount_at(staging) {
        Some(m) if device.is(m.device) => {
            if m.fs_type == fs.name() {
                Ok(())
            } else {
                Err(AgentError::InvalidArgument {
                    field: "volume_capability.mount.fs_type",
                    reason: format!("asks for {fs}, but the volume is staged as {}", m.fs_type),
                })
            }
        }
        Some(m) => Err(not_staged(format!("it holds {}", device::describe(m)))),
        None => match BlockRecord::read(staging)? {
            Some(r) if r.wwid == req.volume.wwid().as_str() => Err(AgentError::InvalidArgument {
                field: "volume_capability",
                reason: format!(
                    "asks for a filesystem, but the volume is staged as a raw block device at {}",
                    staging.display()
                ),
            }),
            _ => Err(not_staged("nothing is mounted there".to_owned())),
        },
    }
}

/// The staging path must hold this volume's raw block record.
fn check_staged_block(
    req: &PublishRequest,
    device: &Device,
    table: &MountTable,
) -> Result<(), AgentError> {
    let staging = req.staging.as_path();
    let not_staged = |reason: String| AgentError::NotStaged {
        volume: req.volume.to_string(),
        path: staging.to_owned(),
        reason,
    };
    match BlockRecord::read(staging)? {
        Some(r)
            if r.volume_id == req.volume.to_string() && r.wwid == req.volume.wwid().as_str() =>
        {
            Ok(())
        }
        Some(r) => Err(not_staged(format!(
            "it is the staging path of volume {}",
            r.volume_id
        ))),
        None => match table.mount_at(staging) {
            Some(m) if device.is(m.device) => Err(AgentError::InvalidArgument {
                field: "volume_capability",
                reason: format!(
                    "asks for raw block, but the volume is staged as a filesystem at {}",
                    staging.display()
                ),
            }),
            _ => Err(not_staged("it has no raw block staging record".to_owned())),
        },
    }
}

/// Whether the target already publishes this volume as asked. Spec: "If the
/// volume corresponding to the volume_id has already been published at the
/// specified target_path, and is compatible with the specified
/// volume_capability and readonly flag, the Plugin MUST reply 0 OK."
/// Published there differently is ALREADY_EXISTS; something else there too.
fn already_published(
    req: &PublishRequest,
    device: &Device,
    table: &MountTable,
    read_only: bool,
) -> Result<bool, AgentError> {
    let target = req.target.as_path();
    let Some(m) = table.mount_at(target) else {
        return Ok(false);
    };
    if !device.is(device::mounted_device(m)?) {
        return Err(AgentError::PathTaken {
            path: target.to_owned(),
            holder: device::describe(m),
        });
    }
    if m.read_only() != read_only {
        let how = |ro: bool| if ro { "read-only" } else { "read-write" };
        return Err(AgentError::Incompatible {
            volume: req.volume.to_string(),
            path: target.to_owned(),
            reason: format!(
                "it is published {} and the request asks for {}",
                how(m.read_only()),
                how(read_only)
            ),
        });
    }
    Ok(true)
}

/// The spec's second-publish table: another target on this node is
/// FAILED_PRECONDITION unless the mode allows several (SINGLE_NODE_MULTI_WRITER,
/// MULTI_NODE_*).
fn check_other_publications(
    host: &Host,
    req: &PublishRequest,
    device: &Device,
    table: &MountTable,
) -> Result<(), AgentError> {
    let mode: AccessMode = req.capability.mode;
    if !mode.one_publication_per_node() {
        return Ok(());
    }
    let others = device::publications(
        host,
        table,
        device.number,
        &[req.staging.as_path(), req.target.as_path()],
    );
    match others.into_iter().next() {
        None => Ok(()),
        Some(target) => Err(AgentError::PublishedElsewhere {
            volume: req.volume.to_string(),
            target,
            mode: mode.name(),
        }),
    }
}

/// Unpublishes the volume: unmounts what the mount table shows of it at the
/// target, then removes the target. Already gone is success.
pub async fn unpublish(host: &Host, req: &UnpublishRequest) -> Result<(), AgentError> {
    let target = req.target.as_path();
    if !mount::exists(target)? {
        return Ok(());
    }
    let table = mount_table(host)?;
    if let Some(m) = table.mount_at(target) {
        let number = device::mounted_device(m)?;
        device::ensure_ours(host, &req.volume, target, number, &device::describe(m))?;
        device::unmount_ours(host, target, number).await?;
    }
    mount::remove_mount_point(target)?;
    tracing::info!(volume_id = %req.volume, target = %target.display(), "unpublished");
    Ok(())
}
