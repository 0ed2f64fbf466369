//! The node side's decisions, apart from its I/O: each step of stage,
//! publish, unstage, unpublish and expand (and the last look at a device
//! before a write) is a pure function of what the
//! shell read (the mount at a path, a raw block record, a probe's result,
//! read-only flags, filesystem types) and returns what to do: already done,
//! go on (format, mount, bind), or a refusal with its reason. The shell
//! (`stage.rs`, `publish.rs`, `expand.rs`) reads, calls these, and acts;
//! the rules are table-tested here without root or devices.

pub(crate) mod device;
pub(crate) mod expand;
pub(crate) mod publish;
pub(crate) mod stage;

use std::path::Path;

use csi_scsi_contract::VolumeId;

use crate::host::mount::BlockRecord;
use crate::host::mountinfo::Mount;

/// What the shell saw at a staging path: the mount there, and the raw
/// block record (read only where the rule needs it).
pub(crate) type Seen = (Option<SeenMount>, Option<BlockRecord>);

/// A staging path as the shell found it, for the volume asked about.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Found<'a> {
    /// The volume of the request.
    pub(crate) volume: &'a VolumeId,
    /// The staging path.
    pub(crate) path: &'a Path,
    /// The mount there, if any.
    pub(crate) mount: Option<&'a SeenMount>,
    /// The raw block record there, if any (read only where the rule needs it).
    pub(crate) record: Option<&'a BlockRecord>,
}

impl<'a> Found<'a> {
    /// What `seen` shows at `path`, for `volume`.
    pub(crate) fn new(volume: &'a VolumeId, path: &'a Path, seen: &'a Seen) -> Self {
        Self {
            volume,
            path,
            mount: seen.0.as_ref(),
            record: seen.1.as_ref(),
        }
    }
}

/// A mount found at a path, judged against the volume's device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SeenMount {
    /// Whether it is a mount of the volume's device.
    pub ours: bool,
    /// The mounted filesystem's type as the mount table names it.
    pub fs_type: String,
    /// Whether it is mounted read-only.
    pub read_only: bool,
    /// The mount, described for people (in refusals).
    pub described: String,
}

impl SeenMount {
    /// `mount`, of the volume's device when `ours`.
    pub(crate) fn of(mount: &Mount, ours: bool) -> Self {
        Self {
            ours,
            fs_type: mount.fs_type.clone(),
            read_only: mount.read_only(),
            described: super::device::describe(mount),
        }
    }
}

/// What a step found: its work already done, or work to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Done before (the spec's idempotent repeat): answer OK, change nothing.
    AlreadyDone,
    /// Nothing is in the way: do the work.
    Proceed,
}

fn how(read_only: bool) -> &'static str {
    if read_only { "read-only" } else { "read-write" }
}
