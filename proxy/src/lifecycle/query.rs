//! Read-only questions: one volume, a page of volumes, capacity.

use super::Lifecycle;
use crate::device::policy;
use crate::device::{Capability, Device, Phase, canonical_wwid};
use crate::error::ProxyError;
use crate::selector::Selector;
use csi_scsi_contract::{NodeName, VolumeId};

/// A volume as ListVolumes and ControllerGetVolume show it.
#[derive(Clone, Debug)]
pub struct VolumeView {
    /// The device.
    pub device: Device,
    /// Its volume ID.
    pub volume_id: String,
    /// Abnormal condition, if any.
    pub abnormal: Option<String>,
}

impl Lifecycle {
    /// One volume by ID.
    pub async fn volume(&self, id: &str) -> Result<VolumeView, ProxyError> {
        let vol = VolumeId::parse(id).map_err(|_| ProxyError::VolumeNotFound(id.to_owned()))?;
        match self.inventory.device(vol.wwid()).await? {
            // A deleted volume (its LUN still being wiped) exists no more.
            Some(d)
                if d.binding.as_ref().map(|b| b.uid.as_str()) == Some(vol.binding_uid())
                    && !policy::releasing(&d) =>
            {
                Ok(view(d))
            }
            _ => Err(ProxyError::VolumeNotFound(id.to_owned())),
        }
    }

    /// Up to `max` volumes after the token (a WWID we returned earlier).
    /// `Err(None)` when the token is not one of ours.
    pub async fn volumes(
        &self,
        token: &str,
        max: usize,
    ) -> Result<(Vec<VolumeView>, Option<String>), Option<ProxyError>> {
        // A token is a WWID this call returned: canonical, and a device.
        let mut after = match token {
            "" => None,
            token => Some(canonical_wwid(token).map_err(|_| None)?),
        };
        if let Some(wwid) = &after
            && self
                .inventory
                .device(wwid)
                .await
                .map_err(|e| Some(e.into()))?
                .is_none()
        {
            return Err(None);
        }
        let want = if max == 0 { 1000 } else { max };
        let mut out = Vec::new();
        loop {
            let page = self
                .inventory
                .devices(after.as_ref(), want.max(64))
                .await
                .map_err(|e| Some(e.into()))?;
            let exhausted = page.len() < want.max(64);
            for d in page {
                after = Some(d.wwid.clone());
                // Deleted volumes whose LUN is still being wiped are gone.
                if d.binding.is_some() && !policy::releasing(&d) {
                    out.push(view(d));
                    if out.len() == want {
                        let next = out.last().map(|v| v.device.wwid.to_string());
                        return Ok((out, next));
                    }
                }
            }
            if exhausted {
                return Ok((out, None));
            }
        }
    }

    /// Available bytes and the largest Available LUN visible from `nodes`
    /// that could hold a volume of `capabilities` (none given: any volume).
    /// The spec: the capacity reported "SHALL take those into
    /// consideration", so a LUN below the filesystem's minimum, which
    /// CreateVolume never binds to it, is not counted.
    pub async fn capacity(
        &self,
        nodes: &[NodeName],
        selector: &Selector,
        capabilities: &[Capability],
    ) -> Result<(u64, u64), ProxyError> {
        let floor = policy::floor_bytes(capabilities);
        Ok(self.inventory.capacity(nodes, selector, floor).await?)
    }
}

fn view(device: Device) -> VolumeView {
    let abnormal = match device.phase {
        Phase::Lost => Some(format!(
            "LUN is not visible from any node: {}",
            device.reason
        )),
        Phase::Failed => Some(format!("LUN failed: {}", device.reason)),
        Phase::Releasing => Some("LUN is being released".to_owned()),
        // A volume's LUN: a device awaiting proof holds no volume, and
        // ListVolumes lists none of them.
        Phase::Available | Phase::Unverified | Phase::HoldsData | Phase::Bound => None,
    };
    VolumeView {
        volume_id: device.volume_id().unwrap_or_default(),
        device,
        abnormal,
    }
}
