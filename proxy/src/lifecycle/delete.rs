//! DeleteVolume: the LUN goes Releasing and the call answers at once; a
//! release worker (`crate::reconcile::release`) wipes it through an agent
//! that sees it, one attempt at a time through [`Lifecycle::release`], and
//! offers it again. A failed wipe leaves it Failed, never Available, and is
//! retried.
//!
//! Why not wipe inside DeleteVolume: zeroing a real LUN outlasts the
//! provisioner's `--timeout`, and a wipe cut off by the caller is forgotten
//! and started over by the next retry.

use std::collections::BTreeSet;
use std::sync::Mutex;

use csi_scsi_proto::agent::{WipeMode, WipeRequest};
use tokio::sync::Notify;

use super::{Lifecycle, read_back};
use crate::agents::AgentError;
use crate::device::{Cleanup, Device, policy};
use crate::error::ProxyError;
use csi_scsi_contract::{NodeName, VolumeId, Wwid};

use super::LockKey;

/// What one release attempt did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// Wiped (or nothing to wipe) and recorded: Available, or Lost when no
    /// node sees it.
    Done,
    /// Nothing to do: no such device, its release is finished already, or
    /// an operator retired it.
    NotReleasing,
}

/// The releases asked for and running in this process: DeleteVolume adds
/// to `wanted` and wakes the workers; the workers mark what they wipe.
#[derive(Debug, Default)]
pub struct Releases {
    wanted: Mutex<BTreeSet<Wwid>>,
    running: Mutex<BTreeSet<Wwid>>,
    wake: Notify,
    /// Pinged whenever a release attempt ends.
    ended: Notify,
}

impl Releases {
    /// Asks the workers to release `wwid` soon.
    pub fn want(&self, wwid: &Wwid) {
        lock(&self.wanted).insert(wwid.clone());
        self.wake.notify_one();
    }

    /// Takes the WWIDs asked for since the last call.
    pub fn take_wanted(&self) -> BTreeSet<Wwid> {
        std::mem::take(&mut *lock(&self.wanted))
    }

    /// Waits until [`Self::want`] is called (a call made before counts).
    pub async fn woken(&self) {
        self.wake.notified().await;
    }

    /// Marks `wwid` as being wiped; `false` when it is already, so one LUN
    /// is never wiped by two workers at once.
    pub fn start(&self, wwid: &Wwid) -> bool {
        lock(&self.running).insert(wwid.clone())
    }

    /// The wipe of `wwid` ended (done, failed or aborted).
    pub fn end(&self, wwid: &Wwid) {
        lock(&self.running).remove(wwid);
        self.ended.notify_waiters();
    }

    /// Resolves when a release attempt ends after this call (a waiter
    /// takes it before looking at the LUN, so no end slips between).
    pub fn ended(&self) -> tokio::sync::futures::Notified<'_> {
        self.ended.notified()
    }

    /// How many releases are running now.
    pub fn running(&self) -> usize {
        lock(&self.running).len()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// [`crate::fault::Fault::StaleWipe`]: waits, then sends the Wipe from a
/// task of its own, which the loss of leadership does not abort (the
/// worker awaiting it may be): the call a frozen leader had in hand. Says
/// in the log when it holds and when it sends, and what came back.
async fn held_back_wipe(
    agents: std::sync::Arc<crate::agents::AgentPool>,
    node: &NodeName,
    wipe: WipeRequest,
    request_id: &str,
) -> Result<csi_scsi_proto::agent::WipeProgress, AgentError> {
    let hold = crate::fault::STALE_WIPE_HOLD;
    let (to, request_id) = (node.clone(), request_id.to_owned());
    tracing::warn!(wwid = %wipe.wwid, node = %to, %request_id, ?hold, "FAULT stale-wipe: the device is read; holding the Wipe call back");
    let call = tokio::spawn(async move {
        tokio::time::sleep(hold).await;
        let wwid = wipe.wwid.clone();
        tracing::warn!(%wwid, node = %to, %request_id, "FAULT stale-wipe: sending the held-back Wipe");
        let answer = agents.call(&to, wipe, &request_id).await;
        match &answer {
            Ok(done) => {
                tracing::warn!(%wwid, node = %to, %request_id, bytes = done.bytes_total, "FAULT stale-wipe: the held-back Wipe was done")
            }
            Err(e) => {
                tracing::warn!(%wwid, node = %to, %request_id, error = %e, "FAULT stale-wipe: the held-back Wipe was not done")
            }
        }
        answer
    });
    // The task panicked: what it sent is unknown.
    call.await.unwrap_or_else(|e| {
        Err(AgentError::Unreachable {
            node: node.to_owned(),
            detail: format!("the held-back Wipe task ended: {e}"),
        })
    })
}

/// How long DeleteVolume waits for the release it started (well inside
/// any caller's deadline).
const QUICK_RELEASE: std::time::Duration = std::time::Duration::from_millis(400);

impl Lifecycle {
    /// Deletes the volume `id`: its LUN goes Releasing (no publication,
    /// CreateVolume or volume of its name can use it from then on) and the
    /// release workers are woken. Unknown or stale IDs, and a volume being
    /// released already, succeed without touching anything.
    pub async fn delete(&self, id: &str, request_id: &str) -> Result<(), ProxyError> {
        // "If a volume corresponding to the specified volume_id does not
        // exist or the artifacts associated with the volume do not exist
        // anymore, the Plugin MUST reply 0 OK."
        let Some(vol) = VolumeId::parse(id).ok() else {
            tracing::info!(volume_id = %id, "delete of a volume ID we never issued: nothing to do");
            return Ok(());
        };
        let guard = self.lock(LockKey::Lun(vol.wwid().clone())).await?;
        let Some(mut dev) = self.inventory.device(vol.wwid()).await? else {
            return Ok(());
        };
        if dev.binding.as_ref().map(|b| b.uid.as_str()) != Some(vol.binding_uid()) {
            tracing::info!(volume_id = %id, "stale volume ID (the LUN has another binding): nothing to do");
            return Ok(());
        }
        if !dev.published.is_empty() {
            return Err(ProxyError::PublishedElsewhere {
                volume: id.to_owned(),
                nodes: dev.published_nodes(),
                reason: "unpublish it first",
            });
        }
        if policy::start_release(&mut dev) {
            self.inventory.update(dev).await?;
            tracing::info!(volume_id = %id, %request_id, "volume deleted: LUN Releasing, to be wiped");
        }
        crate::fault::hold_next_wipe(vol.wwid().as_str());
        self.releases.want(vol.wwid());
        drop(guard);
        // A quick wipe (discard, none, a small LUN) ends while the caller
        // waits a moment: answering after it, the LUN is offered again and
        // no node call on the volume meets its wipe. A long one goes on
        // alone; the answer is OK either way.
        let until = tokio::time::Instant::now() + QUICK_RELEASE;
        loop {
            let ended = self.releases.ended();
            match self.inventory.device(vol.wwid()).await? {
                Some(d)
                    if policy::releasing(&d)
                        && d.binding.as_ref().map(|b| b.uid.as_str())
                            == Some(vol.binding_uid()) => {}
                _ => break,
            }
            // Woken by the end of a release (this one's, or another's: the
            // look above tells), not by a poll.
            if tokio::time::timeout_at(until, ended).await.is_err() {
                break;
            }
        }
        Ok(())
    }

    /// One attempt at releasing `wwid`: wipe it through an agent that sees
    /// it and make it Available. Only a release worker calls this, and only
    /// one at a time per LUN ([`Releases::start`]). A wipe that failed is
    /// recorded (`policy::wipe_failed`) and returned as the error. A LUN an
    /// operator retired is not wiped (`policy::wipe_due`): nothing to do.
    pub async fn release(&self, wwid: &Wwid, request_id: &str) -> Result<Released, ProxyError> {
        let Some(dev) = self.inventory.device(wwid).await? else {
            return Ok(Released::NotReleasing);
        };
        if !policy::wipe_due(&dev) {
            if dev.retired && policy::releasing(&dev) {
                tracing::info!(%wwid, %request_id, "LUN retired by an operator: not wiped");
            }
            return Ok(Released::NotReleasing);
        }
        // No binding: a new LUN its target's `newLuns: wipe` hands to the
        // release workers; it is zeroed as a release by default would.
        let (uid, cleanup) = match dev.binding.as_ref() {
            Some(b) => (Some(b.uid.clone()), b.cleanup),
            None => (None, Cleanup::Zero),
        };
        if let Some(mode) = cleanup.wipe_mode() {
            if let Err(e) = self.wipe(&dev, mode, request_id).await {
                let failed = match &e {
                    ProxyError::Agent(
                        failed @ (AgentError::Refused { .. } | AgentError::Failed { .. }),
                    ) => Some(format!("wipe failed: {failed}")),
                    unproven @ ProxyError::WipeUnproven { .. } => Some(unproven.to_string()),
                    _ => None,
                };
                if let Some(reason) = failed {
                    tracing::warn!(%wwid, %reason, "release failed; retried later");
                    self.record(wwid, uid.as_deref(), |d| {
                        policy::wipe_failed(d, reason.clone())
                    })
                    .await?;
                }
                return Err(e);
            }
            tracing::info!(%wwid, cleanup = cleanup.as_str(), "LUN wiped");
        }
        self.record(wwid, uid.as_deref(), policy::released).await?;
        Ok(Released::Done)
    }

    /// Asks the agents that see `dev`, one after another, to wipe it.
    async fn wipe(&self, dev: &Device, mode: WipeMode, request_id: &str) -> Result<(), ProxyError> {
        let nodes = dev.node_names();
        if nodes.is_empty() {
            return Err(ProxyError::DeviceState {
                wwid: dev.wwid.to_string(),
                state: "not visible from any node".into(),
                reason: "the wipe resumes once a node sees the LUN again".into(),
            });
        }
        let mut failures = Vec::new();
        for node in &nodes {
            let wipe = WipeRequest {
                wwid: dev.wwid.to_string(),
                mode: mode as i32,
                expected_size_bytes: dev.size_bytes,
            };
            let answer = if crate::fault::take_held_wipe(dev.wwid.as_str()) {
                held_back_wipe(self.agents.clone(), node, wipe, request_id).await
            } else {
                self.agents.call(node, wipe, request_id).await
            };
            match answer {
                Ok(done) => {
                    // Every mode but `none` promises the whole LUN: an
                    // agent that erased less (its device at an old size)
                    // has not wiped what the inventory will offer again.
                    if mode != WipeMode::None && done.bytes_total < dev.size_bytes {
                        return Err(ProxyError::WipeUnproven {
                            wwid: dev.wwid.to_string(),
                            reason: format!(
                                "node {node} erased {} bytes, the inventory records {}",
                                done.bytes_total, dev.size_bytes
                            ),
                        });
                    }
                    if matches!(mode, WipeMode::Zero | WipeMode::Discard) {
                        self.verify_zeroes(dev, node, request_id).await?;
                    }
                    return Ok(());
                }
                // Not present, or unreachable, on this node: try another.
                Err(
                    e @ (AgentError::NotSent(_)
                    | AgentError::NotFound { .. }
                    | AgentError::Unreachable { .. }
                    | AgentError::TimedOut { .. }),
                ) => failures.push(e.to_string()),
                // The agent is still busy with an earlier wipe of it (one
                // a restarted proxy started): not a failed wipe; ask later.
                Err(AgentError::Busy { .. }) => {
                    return Err(ProxyError::Busy(format!("wipe of {}", dev.wwid)));
                }
                // The wipe itself failed (in use, I/O error).
                Err(e @ (AgentError::Refused { .. } | AgentError::Failed { .. })) => {
                    return Err(e.into());
                }
            }
        }
        Err(ProxyError::AgentsUnavailable {
            what: format!("wiping {}", dev.wwid),
            detail: failures.join("; "),
        })
    }

    /// Reads the LUN `wiped_on` zeroed back from another node that sees
    /// it: its size, both ends and ranges spread at random over the
    /// recorded size. The wiping node checked its own read-back; another
    /// node's reads past its page cache are the witness that the array
    /// holds zeroes. A node that answers otherwise is a disagreement
    /// (`WipeUnproven`: the LUN goes Failed, never Available). When no
    /// other node sees the LUN, or none can answer now, the wiping node's
    /// read-back stands.
    async fn verify_zeroes(
        &self,
        dev: &Device,
        wiped_on: &NodeName,
        request_id: &str,
    ) -> Result<(), ProxyError> {
        let mut rng = fastrand::Rng::new();
        let size = dev.size_bytes;
        let verify = read_back::spread(dev.wwid.as_str(), size, &mut rng);
        let mut skipped = Vec::new();
        for node in dev.node_names().iter().filter(|n| *n != wiped_on) {
            let unproven = |reason: String| ProxyError::WipeUnproven {
                wwid: dev.wwid.to_string(),
                reason,
            };
            match self.agents.call(node, verify.clone(), request_id).await {
                Ok(v) if v.size_bytes < size => {
                    return Err(unproven(format!(
                        "node {node} reads {} bytes after node {wiped_on} wiped it, the inventory records {size}",
                        v.size_bytes
                    )));
                }
                Ok(v) if !v.zeroes => {
                    return Err(unproven(format!(
                        "node {node} reads data at byte {} after node {wiped_on} zeroed it",
                        v.nonzero_offset
                    )));
                }
                Ok(_) => {
                    tracing::info!(wwid = %dev.wwid, %node, %wiped_on, "wipe verified from another node");
                    return Ok(());
                }
                // This node cannot be a witness now (not there, down,
                // busy, an older agent without Verify): ask another.
                Err(e) => skipped.push(e.to_string()),
            }
        }
        if !skipped.is_empty() {
            tracing::warn!(wwid = %dev.wwid, %wiped_on, skipped = %skipped.join("; "), "no other node could verify the wipe; the wiping node's read-back stands");
        }
        Ok(())
    }

    /// Applies `change` to `wwid` if it is still the release of binding
    /// `uid` (`None`: of a new LUN, holding no binding). Read afresh:
    /// during a wipe of hours discovery writes the device too, and the
    /// result must not be lost to that race.
    async fn record(
        &self,
        wwid: &Wwid,
        uid: Option<&str>,
        change: impl Fn(&mut Device) + Send,
    ) -> Result<(), ProxyError> {
        self.inventory
            .modify(wwid, move |d| {
                let ours =
                    policy::releasing(d) && d.binding.as_ref().map(|b| b.uid.as_str()) == uid;
                if ours {
                    change(d);
                }
                ours
            })
            .await?;
        Ok(())
    }
}
