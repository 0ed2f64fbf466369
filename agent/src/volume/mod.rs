//! The node side of a volume's life: stage, publish, and their inverses,
//! stats and expansion. Domain logic only: every read or change of the
//! machine goes through [`crate::host`], and requests arrive already parsed
//! ([`crate::csi::request`]). Every call is idempotent: a call that finds
//! its work already done answers success, and one that finds something
//! else in its way refuses without touching it.

pub(crate) mod decide;
pub(crate) mod device;
pub(crate) mod expand;
pub(crate) mod publish;
pub(crate) mod stage;
pub(crate) mod stats;

use crate::csi::request::{AccessType, Capability};
use crate::error::AgentError;
use crate::host::Host;
use crate::host::mountinfo::MountTable;

/// Refuses capabilities this driver cannot honour ("Exceeds capabilities"):
/// a filesystem mounted on several nodes at once would be corrupted, so
/// multi-node modes are for raw block only.
pub(crate) fn check_supported(capability: &Capability) -> Result<(), AgentError> {
    if capability.mode.multi_node() && matches!(capability.access, AccessType::Mount { .. }) {
        return Err(AgentError::UnsupportedCapability(format!(
            "access mode {} needs raw block access: ext4 and xfs cannot be mounted on several nodes at once",
            capability.mode.name()
        )));
    }
    Ok(())
}

/// What is at a staging path, judged against `device`: the mount there,
/// and, only where nothing is mounted, the raw block record.
pub(crate) fn look_at(
    path: &std::path::Path,
    device: &device::Device,
    table: &MountTable,
) -> Result<
    (
        Option<decide::SeenMount>,
        Option<crate::host::mount::BlockRecord>,
    ),
    AgentError,
> {
    match table.mount_at(path) {
        Some(m) => Ok((Some(decide::SeenMount::of(m, device.is(m.device))), None)),
        None => Ok((None, crate::host::mount::BlockRecord::read(path)?)),
    }
}

/// The host's mount table now.
pub(crate) fn mount_table(host: &Host) -> Result<MountTable, AgentError> {
    MountTable::read(host).map_err(|e| AgentError::io(&host.mountinfo, e))
}

/// The most mounts stacked on one path that an unmount loop removes; more
/// than this is not something this plugin made.
const MAX_STACKED: usize = 8;
