//! Volume IDs as the proxy issues them: `<wwid>:<binding-uid>`, parsed by
//! the contract's [`VolumeId`], the grammar the agent parses too.

use csi_scsi_contract::VolumeId;

/// A volume ID split into the LUN and the binding it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeRef(VolumeId);

impl VolumeRef {
    /// The volume `id` names, or `None` when it is not a volume ID this
    /// driver could have issued (the WWID not in canonical form, the
    /// binding UID malformed): such an ID names no volume.
    pub fn parse(id: &str) -> Option<Self> {
        VolumeId::parse(id).ok().map(Self)
    }

    /// The LUN's canonical WWID.
    pub fn wwid(&self) -> &str {
        self.0.wwid().as_str()
    }

    /// The binding UID.
    pub fn uid(&self) -> &str {
        self.0.binding_uid()
    }
}

impl std::fmt::Display for VolumeRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}
