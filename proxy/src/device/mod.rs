//! The device model and its life cycle: the records both stores keep
//! (`model`), typed capabilities (`access`), which Node label keys a
//! target's selector may rest on (`node_label`), why discovery refuses a
//! target (`target_refusal`), where CreateVolume may bind a LUN and which
//! nodes the volume is then accessible from (`placement`), and every
//! transition between phases as a pure function (`policy`). The inventory
//! does the I/O.

pub mod access;
mod model;
pub mod node_label;
pub mod placement;
pub mod policy;
mod target_refusal;

pub use access::{Access, Capability, UnknownCapability};
pub use csi_scsi_contract::{AccessMode, FsType};
pub use model::{
    BindRequest, Binding, Cleanup, Device, DiscoveryOutcome, DiscoveryRound, FcTarget, IscsiTarget,
    LunReport, NewLuns, NodeView, Phase, Publication, ResizeRequest, SecretRef, Target,
    TargetConflict, Transport, canonical_wwid,
};
pub use node_label::{KubeletSettableSelector, LabelSetter, SelectorKeys};
pub use placement::{Placement, PlacementError};
pub use target_refusal::{InvalidTransport, TargetRefused, TransportFault};
