//! NodePublishVolume and NodeUnpublishVolume: bind the staged filesystem
//! (or the device node, for raw block) onto the target path, read-only when
//! asked, and take it away again. The target is the plugin's to create and
//! to remove.

use super::decide::publish as decide;
use super::decide::{Found, SeenMount, Step};
use super::device::{self, Device};
use super::{check_supported, look_at, mount_table};
use crate::csi::request::{AccessType, PublishRequest, UnpublishRequest};
use crate::error::AgentError;
use crate::host::Host;
use crate::host::mount::{self, BlockRecord, MountOptions};
use crate::host::mountinfo::MountTable;

/// Publishes the staged volume at the target path.
pub(crate) async fn publish(host: &Host, req: &PublishRequest) -> Result<(), AgentError> {
    check_supported(&req.capability)?;
    let device = device::require(host, req.volume.wwid())?;
    let table = mount_table(host)?;
    let read_only = decide::read_only(req.read_only, req.capability.mode);
    let staging = req.staging.as_path();
    match &req.capability.access {
        AccessType::Mount { fs, options } => {
            let seen = look_at(staging, &device, &table)?;
            decide::staged_filesystem(Found::new(&req.volume, staging, &seen), *fs)?;
            if target_step(req, &device, &table, read_only)? == Step::AlreadyDone {
                return Ok(());
            }
            check_other_publications(host, req, &device, &table)?;
            let target = req.target.as_path();
            mount::create_dir(target)?;
            let options = options.clone().with_read_only(read_only);
            mount::bind(staging, target, &options).await?;
        }
        AccessType::Block => {
            // The record first: it decides, whatever is mounted there.
            let record = BlockRecord::read(staging)?;
            let mount = table
                .mount_at(staging)
                .map(|m| SeenMount::of(m, device.is(m.device)));
            decide::staged_block(Found::new(&req.volume, staging, &(mount, record)))?;
            if target_step(req, &device, &table, read_only)? == Step::AlreadyDone {
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

/// What is at the target already ([`decide::target`]); a bind of a device
/// node is judged by the node it binds.
fn target_step(
    req: &PublishRequest,
    device: &Device,
    table: &MountTable,
    read_only: bool,
) -> Result<Step, AgentError> {
    let target = req.target.as_path();
    let mount = match table.mount_at(target) {
        Some(m) => Some(SeenMount::of(m, device.is(device::mounted_device(m)?))),
        None => None,
    };
    decide::target(&req.volume, target, mount.as_ref(), read_only)
}

/// The spec's second-publish table ([`decide::sole_publication`]): the
/// publications are looked for only when the mode allows one per node.
fn check_other_publications(
    host: &Host,
    req: &PublishRequest,
    device: &Device,
    table: &MountTable,
) -> Result<(), AgentError> {
    let mode = req.capability.mode;
    if !decide::needs_sole_publication(mode) {
        return Ok(());
    }
    let others = device::publications(
        host,
        table,
        device.number,
        &[req.staging.as_path(), req.target.as_path()],
    );
    decide::sole_publication(&req.volume, mode, others)
}

/// Unpublishes the volume: unmounts what the mount table shows of it at the
/// target, then removes the target. Already gone is success.
pub(crate) async fn unpublish(host: &Host, req: &UnpublishRequest) -> Result<(), AgentError> {
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
