//! What the csi-scsi proxy and agent must agree on, spelled once: a LUN's
//! [`Wwid`] and the [`VolumeId`] (`<wwid>:<binding-uid>`) the proxy issues
//! and both sides parse. The proxy treats an ID that does not parse as one
//! it never issued; the agent refuses it.
#![forbid(unsafe_code)]

pub mod volume_id;
pub mod wwid;

pub use volume_id::{InvalidVolumeId, VolumeId};
pub use wwid::{InvalidWwid, Wwid, WwidKind};
