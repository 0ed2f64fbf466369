//! DeleteVolume: release the LUN, wipe it through an agent that sees it,
//! and offer it again. A failed wipe leaves it Failed, never Available.

use csi_scsi_proto::agent::WipeRequest;

use super::Lifecycle;
use crate::agents::AgentError;
use crate::device::{Device, Phase, policy};
use crate::error::ProxyError;
use crate::volume_id::VolumeRef;

impl Lifecycle {
    /// Deletes the volume `id`. Unknown or stale IDs succeed without
    /// touching anything.
    pub async fn delete(&self, id: &str, request_id: &str) -> Result<(), ProxyError> {
        // "If a volume corresponding to the specified volume_id does not
        // exist or the artifacts associated with the volume do not exist
        // anymore, the Plugin MUST reply 0 OK."
        let Some(vol) = VolumeRef::parse(id) else {
            tracing::info!(volume_id = %id, "delete of a volume ID we never issued: nothing to do");
            return Ok(());
        };
        let _guard = self.lock(vol.wwid()).await?;
        let Some(dev) = self.inventory.device(vol.wwid()).await? else {
            return Ok(());
        };
        if dev.binding.as_ref().map(|b| b.uid.as_str()) != Some(vol.uid()) {
            tracing::info!(volume_id = %id, "stale volume ID (the LUN has another binding): nothing to do");
            return Ok(());
        }
        if !dev.published.is_empty() {
            return Err(ProxyError::PublishedElsewhere {
                volume: id.to_owned(),
                nodes: dev.published_nodes().join(","),
                reason: "unpublish it first",
            });
        }
        self.release(dev, request_id).await
    }

    /// Resumes the release of `wwid` left Releasing (a restart mid-wipe,
    /// agents down), under its lock so a DeleteVolume retry and this pass
    /// never wipe at once. `Ok(false)`: nothing to resume.
    pub async fn resume_release(&self, wwid: &str, request_id: &str) -> Result<bool, ProxyError> {
        // Held: a DeleteVolume is at it right now; the pass moves on.
        let Ok(_guard) = self
            .locks
            .lock_timeout(wwid.to_owned(), std::time::Duration::from_millis(10))
            .await
        else {
            return Ok(false);
        };
        match self.inventory.device(wwid).await? {
            Some(dev) if dev.phase == Phase::Releasing => {
                self.release(dev, request_id).await.map(|()| true)
            }
            _ => Ok(false),
        }
    }

    /// Wipes a device whose volume is gone and makes it Available. Resumes
    /// a release interrupted by a restart or a failed wipe. The caller
    /// holds the device's lock.
    async fn release(&self, mut dev: Device, request_id: &str) -> Result<(), ProxyError> {
        if policy::start_release(&mut dev) {
            dev = self.inventory.update(dev).await?;
        }
        let Some(cleanup) = dev.binding.as_ref().map(|b| b.cleanup) else {
            // Releasing with no binding: nothing says how to wipe it, so
            // it is not offered again by itself.
            return Err(ProxyError::DeviceState {
                wwid: dev.wwid.clone(),
                state: format!("{:?} without a binding", dev.phase),
                reason: "the cleanup it was created with is unknown".into(),
            });
        };
        let Some(mode) = cleanup.wipe_mode() else {
            return self.make_available(dev).await;
        };
        let nodes = dev.node_names();
        if nodes.is_empty() {
            return Err(ProxyError::DeviceState {
                wwid: dev.wwid.clone(),
                state: "not visible from any node".into(),
                reason: "the wipe resumes once a node sees the LUN again".into(),
            });
        }
        let mut failures = Vec::new();
        for node in &nodes {
            let wipe = WipeRequest {
                wwid: dev.wwid.clone(),
                mode: mode as i32,
            };
            match self.agents.call(node, wipe, request_id).await {
                Ok(_) => {
                    tracing::info!(wwid = %dev.wwid, %node, cleanup = cleanup.as_str(), "LUN wiped");
                    return self.make_available(dev).await;
                }
                // Not present, or unreachable, on this node: try another.
                Err(
                    e @ (AgentError::NotSent(_)
                    | AgentError::NotFound { .. }
                    | AgentError::Unreachable { .. }
                    | AgentError::TimedOut { .. }),
                ) => failures.push(e.to_string()),
                // The agent is still busy with an earlier wipe of it (a
                // retry overtook it): not a failed wipe; ask again later.
                Err(AgentError::Busy { .. }) => {
                    return Err(ProxyError::Busy(format!("wipe of {}", dev.wwid)));
                }
                // The wipe itself failed (in use, I/O error): never offer
                // this LUN again until someone looks at it.
                Err(e @ (AgentError::Refused { .. } | AgentError::Failed { .. })) => {
                    policy::wipe_failed(&mut dev, format!("wipe failed: {e}"));
                    tracing::warn!(wwid = %dev.wwid, reason = %dev.reason, "release failed");
                    self.inventory.update(dev).await?;
                    return Err(e.into());
                }
            }
        }
        Err(ProxyError::AgentsUnavailable {
            what: format!("wiping {}", dev.wwid),
            detail: failures.join("; "),
        })
    }

    async fn make_available(&self, mut dev: Device) -> Result<(), ProxyError> {
        policy::released(&mut dev);
        self.inventory.update(dev).await?;
        Ok(())
    }
}
