//! ControllerExpandVolume: the driver cannot grow a LUN. It rescans; if the
//! array already grew it, expansion goes on; if not, it records a pending
//! resize request for the storage administrator and answers so the resizer
//! retries.

use csi_scsi_proto::agent::RescanRequest;

use super::Lifecycle;
use crate::device::{Capability, ResizeRequest};
use crate::error::ProxyError;
use csi_scsi_contract::VolumeId;

use super::LockKey;

impl Lifecycle {
    /// Returns the new capacity and whether node expansion is needed.
    pub async fn expand(
        &self,
        id: &str,
        required: u64,
        block: Option<bool>,
        request_id: &str,
    ) -> Result<(u64, bool), ProxyError> {
        let vol = VolumeId::parse(id).map_err(|_| ProxyError::VolumeNotFound(id.to_owned()))?;
        let _guard = self.lock(LockKey::Lun(vol.wwid().clone())).await?;
        let mut dev = self.bound(&vol).await?;
        let binding = dev
            .binding
            .clone()
            .ok_or_else(|| ProxyError::VolumeNotFound(id.to_owned()))?;
        let is_block = |c: &Capability| matches!(c, Capability::Block(_));
        let bound_block = binding.capabilities.iter().all(is_block);
        // "Exceeds capabilities": the request names an access type the
        // volume was not created with.
        if let Some(asked) = block
            && !binding.capabilities.iter().any(|c| is_block(c) == asked)
        {
            return Err(ProxyError::InvalidArgument {
                field: "volume_capability",
                reason: format!(
                    "asks for {}, but the volume was created for {}",
                    if asked { "raw block" } else { "a filesystem" },
                    if bound_block {
                        "raw block"
                    } else {
                        "a filesystem"
                    }
                ),
            });
        }
        let is_block = block.unwrap_or(bound_block);
        let node_expansion = !is_block;
        if dev.size_bytes < required {
            // Ask the nodes that see it to re-read its capacity, all at once
            // (each rescan takes about a second on a real host).
            let rescans = dev.node_names().into_iter().map(|node| {
                let rescan = RescanRequest {
                    wwid: dev.wwid.to_string(),
                };
                async move {
                    match self.agents.call(&node, rescan, request_id).await {
                        Ok(r) => Some(r.size_bytes),
                        Err(e) => {
                            tracing::warn!(%node, error = %e, "rescan failed");
                            None
                        }
                    }
                }
            });
            let grown = futures::future::join_all(rescans)
                .await
                .into_iter()
                .flatten()
                .fold(dev.size_bytes, u64::max);
            if grown > dev.size_bytes {
                // Applied to a fresh read: discovery may have written the
                // device while the rescans ran.
                dev = self
                    .inventory
                    .modify(&dev.wwid, |d| {
                        let larger = grown > d.size_bytes;
                        d.size_bytes = d.size_bytes.max(grown);
                        larger
                    })
                    .await?
                    .ok_or_else(|| ProxyError::VolumeNotFound(id.to_owned()))?;
            }
        }
        let name = format!("resize-{}", binding.volume_name);
        if dev.size_bytes >= required {
            if let Some(mut r) = self
                .inventory
                .resizes()
                .await?
                .into_iter()
                .find(|r| r.name == name && !r.done)
            {
                r.done = true;
                r.current_bytes = dev.size_bytes;
                self.inventory.put_resize(r).await?;
            }
            return Ok((dev.size_bytes, node_expansion));
        }
        self.inventory
            .put_resize(ResizeRequest {
                name: name.clone(),
                volume_id: id.to_owned(),
                wwid: dev.wwid.to_string(),
                requested_bytes: required,
                current_bytes: dev.size_bytes,
                created: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs() as i64)
                    .unwrap_or(0),
                done: false,
            })
            .await?;
        Err(ProxyError::ResizePending {
            wwid: dev.wwid.to_string(),
            have: dev.size_bytes,
            want: required,
            request: name,
        })
    }
}
