//! Proving a new LUN blank before it is offered. An array may hand over a
//! LUN with somebody's data on it, and NodeStage mounts a filesystem it
//! finds as it is: the first volume bound to such a LUN would get that
//! data. So a LUN its target shows for the first time stays Unverified
//! until a node that sees it reads it back (both ends, where signatures
//! sit, and ranges spread at random) as zeroes; data anywhere holds it
//! (HoldsData) until it reads blank, or its target's `newLuns: wipe` has
//! it wiped. Only a qualification worker (`crate::reconcile::qualify`)
//! calls this.

use csi_scsi_contract::{NodeName, Wwid};

use super::{Lifecycle, read_back};
use crate::device::{Device, Phase, policy};
use crate::error::ProxyError;

/// What one probe of a LUN found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probed {
    /// Every range read zeroes: it is Available now.
    Blank,
    /// A range held data: it is HoldsData, with this reason.
    Data(String),
    /// It changed while it was read (its recorded size): probe it again.
    Changed,
    /// Nothing to do: no such device, or it does not await proof.
    NotAwaiting,
}

impl Lifecycle {
    /// Probes `wwid` if it awaits proof, through the first node that sees
    /// it and answers, and records what it found. A node that reads it
    /// smaller than recorded, or cannot read it, is doubt: the next node is
    /// asked, and with none left it stays as it is (`Err`, retried).
    pub async fn qualify(&self, wwid: &Wwid, request_id: &str) -> Result<Probed, ProxyError> {
        let Some(dev) = self.inventory.device(wwid).await? else {
            return Ok(Probed::NotAwaiting);
        };
        if !policy::await_proof(&dev) {
            return Ok(Probed::NotAwaiting);
        }
        if dev.size_bytes == 0 {
            return Err(ProxyError::DeviceState {
                wwid: dev.wwid.to_string(),
                state: "recorded at 0 bytes".into(),
                reason: "probed once a node reports its size".into(),
            });
        }
        let mut failures = Vec::new();
        for node in dev.node_names() {
            match self.read_blank(&dev, &node, request_id).await {
                Ok(None) => {
                    let size = dev.size_bytes;
                    let after = self
                        .inventory
                        .modify(wwid, move |d| policy::proven_blank(d, size))
                        .await?;
                    return Ok(match after {
                        Some(d) if d.phase == Phase::Available => {
                            tracing::info!(%wwid, %node, size, "new LUN reads blank: offered");
                            Probed::Blank
                        }
                        Some(d) if policy::await_proof(&d) => Probed::Changed,
                        _ => Probed::NotAwaiting,
                    });
                }
                Ok(Some(offset)) => {
                    let reason = format!(
                        "a probe read data at byte {offset} through node {node}: not offered until it reads blank (erase it on the array) or its target sets newLuns: wipe"
                    );
                    let held = reason.clone();
                    let was = dev.phase;
                    let after = self
                        .inventory
                        .modify(wwid, move |d| policy::found_data(d, held.clone()))
                        .await?;
                    return Ok(match after {
                        Some(d) if d.phase == Phase::HoldsData => {
                            if was != Phase::HoldsData {
                                tracing::warn!(%wwid, %node, offset, "new LUN holds data: held");
                            }
                            Probed::Data(reason)
                        }
                        Some(d) if policy::await_proof(&d) => Probed::Changed,
                        _ => Probed::NotAwaiting,
                    });
                }
                Err(e) => failures.push(format!("{node}: {e}")),
            }
        }
        Err(ProxyError::AgentsUnavailable {
            what: format!("probing new LUN {wwid}"),
            detail: if failures.is_empty() {
                "no node sees it".into()
            } else {
                failures.join("; ")
            },
        })
    }

    /// Reads `dev` back through `node`: `None` when every range is
    /// zeroes, else the offset of the first range that is not.
    async fn read_blank(
        &self,
        dev: &Device,
        node: &NodeName,
        request_id: &str,
    ) -> Result<Option<u64>, ProxyError> {
        let size = dev.size_bytes;
        let mut rng = fastrand::Rng::new();
        for read in [
            read_back::ends(dev.wwid.as_str(), size),
            read_back::spread(dev.wwid.as_str(), size, &mut rng),
        ] {
            let v = self.agents.call(node, read, request_id).await?;
            if v.size_bytes < size {
                return Err(ProxyError::DeviceState {
                    wwid: dev.wwid.to_string(),
                    state: format!("{} bytes on node {node}", v.size_bytes),
                    reason: format!("the inventory records {size}; a probe of less proves nothing"),
                });
            }
            if !v.zeroes {
                return Ok(Some(v.nonzero_offset));
            }
        }
        Ok(None)
    }
}
