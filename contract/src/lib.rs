//! What the csi-scsi proxy and agent must agree on, spelled once: a LUN's
//! [`Wwid`] and the [`VolumeId`] (`<wwid>:<binding-uid>`) the proxy issues
//! and both sides parse. The proxy treats an ID that does not parse as one
//! it never issued; the agent refuses it. And the [`LeaderEpoch`] every
//! agent call carries, so a stale leader's destructive calls are refused.
#![forbid(unsafe_code)]

pub mod leader_epoch;
pub mod volume_id;
pub mod wwid;

pub use leader_epoch::{InvalidLeaderEpoch, LEADER_EPOCH_HEADER, LeaderEpoch};
pub use volume_id::{InvalidVolumeId, VolumeId};
pub use wwid::{InvalidWwid, Wwid, WwidKind};
