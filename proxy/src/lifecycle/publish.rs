//! ControllerPublishVolume / ControllerUnpublishVolume: attach the LUN on a
//! node through its agent and record where it is published.

use std::collections::HashMap;

use csi_scsi_proto::agent::{AttachRequest, DetachRequest};
use csi_scsi_proto::publish_context;

use super::Lifecycle;
use crate::device::policy::{self, Publish, PublishRefusal};
use crate::device::{Access, Capability, Device, Publication};
use crate::directory::NodeAgent;
use crate::error::ProxyError;
use csi_scsi_contract::{NodeName, VolumeId, Wwid};

use super::LockKey;

fn describe(access: Option<Capability>, readonly: bool) -> String {
    let access = access.map_or_else(|| "(not recorded)".to_owned(), |c| c.to_string());
    format!("{access}{}", if readonly { ", read-only" } else { "" })
}

impl Lifecycle {
    /// Attaches volume `id` on `node`, read-write (PUBLISH_READONLY is not
    /// offered: the controller refuses `readonly`); returns the publish
    /// context (`devicePath`, `wwid`).
    pub async fn publish(
        &self,
        id: &str,
        node: &NodeName,
        access: &Access,
        request_id: &str,
    ) -> Result<HashMap<String, String>, ProxyError> {
        let vol = VolumeId::parse(id).map_err(|_| ProxyError::VolumeNotFound(id.to_owned()))?;
        let entry = match self.agents.directory().locate(node) {
            NodeAgent::Listed(entry) => entry,
            NodeAgent::Unreachable => {
                return Err(ProxyError::NodeUnreachable {
                    node: node.clone(),
                    consequence: format!("cannot attach volume {id} there now; retry"),
                });
            }
            // Not listed: nothing can be attached there ("node does not
            // exist"); the grace period only keeps the records of a node
            // that left the agents file.
            NodeAgent::Gone | NodeAgent::Unlisted => {
                return Err(ProxyError::NodeNotFound(node.clone()));
            }
            NodeAgent::NotSynced => {
                return Err(ProxyError::DirectoryNotSynced {
                    consequence: format!("cannot attach volume {id} to node {node} yet; retry"),
                });
            }
        };
        let _guard = self.lock(LockKey::Lun(vol.wwid().clone())).await?;
        let dev = self.bound(&vol).await?;
        let binding = dev
            .binding
            .as_ref()
            .ok_or_else(|| ProxyError::VolumeNotFound(id.to_owned()))?;
        // A binding's capabilities are fixed for its life, and the write
        // below checks it is still this binding.
        let wanted = binding.resolve(access);
        if !binding.allows(wanted) {
            return Err(ProxyError::InvalidArgument {
                field: "volume_capability",
                reason: format!(
                    "{wanted} is not among the volume's capabilities [{}]",
                    binding
                        .capabilities
                        .iter()
                        .map(|c| c.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
        // Each target's CHAP credentials go only to the nodes it selects,
        // and a selector a node could satisfy by labelling itself selects
        // none: refused before anything is recorded or read.
        let specs = self.target_specs_for(&dev, node).await?;
        let keys = self.selector_keys();
        for t in &specs {
            t.check_selector(keys)?;
        }
        if let Some(t) = specs.iter().find(|t| !t.selects(node, &entry.labels, keys)) {
            return Err(ProxyError::TargetNotForNode {
                node: node.clone(),
                target: t.name.clone(),
                wwid: dev.wwid.to_string(),
            });
        }
        // Record first, so a racing publish elsewhere sees this node. The
        // checks are made on the state each attempt of the compare-and-swap
        // writes: a write that lost to another proxy's (another node's
        // publication, the binding released or replaced) is judged afresh.
        let publication = Publication {
            node: node.clone(),
            access: Some(wanted),
            readonly: false,
        };
        let mut recorded = false;
        let dev = self
            .inventory
            .try_modify(&dev.wwid, |d| {
                let outcome = policy::publish(d, vol.binding_uid(), publication.clone())
                    .map_err(|refusal| refused(refusal, id, node, wanted))?;
                recorded = outcome == Publish::Recorded;
                Ok::<_, ProxyError>(recorded)
            })
            .await?
            .ok_or_else(|| ProxyError::VolumeNotFound(id.to_owned()))?;
        let already = !recorded;
        let targets = self.agent_targets(&specs).await?;
        let attach = AttachRequest {
            wwid: dev.wwid.to_string(),
            targets,
            lun: dev.lun,
        };
        match self.agents.call(node, attach, request_id).await {
            Ok(a) => Ok(HashMap::from([
                (publish_context::DEVICE_PATH.to_owned(), a.device_path),
                (publish_context::WWID.to_owned(), dev.wwid.to_string()),
            ])),
            Err(e) => {
                let e = ProxyError::from(e);
                // Undo the record only when the agent surely did not attach:
                // an answer lost to a timeout or a cut connection may follow
                // an attach that happened, and a record dropped then would
                // let the volume be published elsewhere or deleted.
                if !already
                    && e.attach_surely_refused()
                    && let Err(undo) = self
                        .edit_published(&dev.wwid, vol.binding_uid(), node)
                        .await
                {
                    tracing::warn!(error = %undo, "could not undo the publish record");
                }
                Err(e)
            }
        }
    }

    /// Detaches volume `id` from `node` (every node when `None`).
    /// A node that is gone needs no detach; one that exists without a
    /// ready agent keeps its record and the call is UNAVAILABLE.
    pub async fn unpublish(
        &self,
        id: &str,
        node: Option<&NodeName>,
        request_id: &str,
    ) -> Result<(), ProxyError> {
        // "If the volume corresponding to the volume_id or the node
        // corresponding to node_id cannot be found by the Plugin and the
        // volume can be safely regarded as ControllerUnpublished from the
        // node, the plugin SHOULD return 0 OK."
        let Some(vol) = VolumeId::parse(id).ok() else {
            return Ok(());
        };
        let _guard = self.lock(LockKey::Lun(vol.wwid().clone())).await?;
        let Some(mut dev) = self.inventory.device(vol.wwid()).await? else {
            return Ok(());
        };
        if !policy::holds_binding(&dev, vol.binding_uid()) {
            return Ok(());
        }
        let nodes: Vec<NodeName> = match node {
            None => dev.published_nodes(),
            Some(node) => vec![node.clone()],
        };
        let directory = self.agents.directory();
        for n in nodes {
            match directory.locate(&n) {
                // A node without an agent to ask (not listed, unreachable,
                // or not judged yet) that no record names: nothing was
                // attached there through this volume (a publish records the
                // node before it attaches), so it can be regarded as
                // unpublished (OK, as for a node that does not exist).
                NodeAgent::Unlisted | NodeAgent::Unreachable | NodeAgent::NotSynced
                    if dev.publication(&n).is_none() =>
                {
                    continue;
                }
                NodeAgent::Listed(_) => {
                    let targets = self.targets_for(&dev, &n).await?;
                    let detach = DetachRequest {
                        wwid: dev.wwid.to_string(),
                        targets,
                    };
                    self.agents.call(&n, detach, request_id).await?;
                }
                // It may still write to the LUN: keep the record, so the
                // volume is neither attached elsewhere nor wiped meanwhile.
                // A node out of the agents file for less than the grace
                // period may be a file cut short: the same.
                NodeAgent::Unreachable | NodeAgent::Unlisted => {
                    return Err(ProxyError::NodeUnreachable {
                        node: n,
                        consequence: format!(
                            "volume {id} may still be in use there, so it stays published to it; \
                             retry once the agent is back; if the node is down, fence it and taint \
                             it node.kubernetes.io/out-of-service (docs/operations.md)"
                        ),
                    });
                }
                // Not known gone: keep the record, as for Unreachable.
                NodeAgent::NotSynced => {
                    return Err(ProxyError::DirectoryNotSynced {
                        consequence: format!(
                            "volume {id} stays published to node {n} until it can be judged; retry"
                        ),
                    });
                }
                NodeAgent::Gone => {
                    tracing::warn!(node = %n, wwid = %dev.wwid, "node is gone; dropping its publish record");
                }
            }
            if dev.publication(&n).is_some() {
                dev = self
                    .edit_published(&dev.wwid, vol.binding_uid(), &n)
                    .await?;
                // Another writer released or re-bound the LUN meanwhile:
                // the volume is gone, and the rest is another volume's.
                if !policy::holds_binding(&dev, vol.binding_uid()) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Forgets the publication of volume `uid` on `node` with
    /// compare-and-swap; a device whose binding is no longer `uid`'s is
    /// left as it is (checked on the state each attempt writes).
    async fn edit_published(
        &self,
        wwid: &Wwid,
        uid: &str,
        node: &NodeName,
    ) -> Result<Device, ProxyError> {
        self.inventory
            .modify(wwid, |d| policy::unpublish(d, uid, node))
            .await?
            .ok_or_else(|| ProxyError::VolumeNotFound(wwid.to_string()))
    }

    /// The device bound to `vol`, or VolumeNotFound.
    pub(super) async fn bound(&self, vol: &VolumeId) -> Result<Device, ProxyError> {
        match self.inventory.device(vol.wwid()).await? {
            Some(d) if policy::serves(&d, vol.binding_uid()) => Ok(d),
            _ => Err(ProxyError::VolumeNotFound(vol.to_string())),
        }
    }
}

/// The error a publish refused on the device's state answers.
fn refused(refusal: PublishRefusal, id: &str, node: &NodeName, wanted: Capability) -> ProxyError {
    match refusal {
        PublishRefusal::NotServed => ProxyError::VolumeNotFound(id.to_owned()),
        PublishRefusal::Incompatible(p) => ProxyError::PublishedIncompatibly {
            volume: id.to_owned(),
            node: node.clone(),
            recorded: describe(p.access, p.readonly),
            asked: describe(Some(wanted), false),
        },
        PublishRefusal::Elsewhere(nodes) => ProxyError::PublishedElsewhere {
            volume: id.to_owned(),
            nodes,
            reason: "its access mode allows one node only",
        },
    }
}
