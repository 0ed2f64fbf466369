//! What the csi-scsi proxy and agent must agree on, spelled once: a LUN's
//! [`Wwid`] and the [`VolumeId`] (`<wwid>:<binding-uid>`) the proxy issues
//! and both sides parse (the proxy treats an ID that does not parse as one
//! it never issued; the agent refuses it); the [`LeaderEpoch`] every agent
//! call carries, so a stale leader's destructive calls are refused; the
//! [`NodeName`] that names a node's agent and its publications; and the
//! vocabulary of a target and a volume, each parsed once at the edge: an
//! iSCSI [`Iqn`] and [`Portal`] (with open-iscsi's name and CHAP limits),
//! an FC [`Wwpn`], a CSI [`AccessMode`] and an [`FsType`].
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod access_mode;
pub mod fc;
pub mod fs_type;
pub mod iscsi;
pub mod leader_epoch;
pub mod node_name;
mod stored_text;
pub mod volume_id;
pub mod wwid;

pub use access_mode::{AccessMode, UnknownAccessMode};
pub use fc::{InvalidWwpn, Wwpn};
pub use fs_type::{FsType, UnknownFsType};
pub use iscsi::{InvalidIqn, InvalidPortal, Iqn, Portal};
pub use leader_epoch::{InvalidLeaderEpoch, LEADER_EPOCH_HEADER, LeaderEpoch};
pub use node_name::{InvalidNodeName, NodeName};
pub use volume_id::{InvalidVolumeId, VolumeId};
pub use wwid::{InvalidWwid, Wwid, WwidKind};
