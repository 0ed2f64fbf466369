//! Wipe: verify the WWID, refuse if the device is in use anywhere on this
//! node, then erase it (discard, zero or random passes) while holding it
//! exclusively, reporting progress. A device that is not here is NOT_FOUND;
//! an interrupted wipe is simply asked again.

use tokio::sync::mpsc;

use super::Devices;
use crate::error::AgentError;
use crate::host::command::Arg;
use crate::host::erase::{ClaimError, Eraser, expected_device};
use csi_scsi_contract::Wwid;

/// How thoroughly to erase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WipeMode {
    /// Remove filesystem and partition signatures only.
    Signatures,
    /// Discard every block (zero where the device cannot).
    Discard,
    /// Write zeroes everywhere.
    Zero,
    /// `n` passes of random data.
    Random(u32),
}

/// One progress report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WipeStep {
    /// Bytes done in this pass.
    pub bytes_done: u64,
    /// Bytes in a pass.
    pub bytes_total: u64,
    /// Pass number (1-based) and number of passes.
    pub pass: u32,
    /// Number of passes.
    pub passes: u32,
    /// `signatures`, `discard`, `zero`, `random`.
    pub method: &'static str,
    /// Last message.
    pub done: bool,
}

/// Progress granularity.
const CHUNK: u64 = 64 << 20;

impl Devices {
    /// Erases `wwid`; progress goes to `tx` (a closed receiver is ignored).
    pub async fn wipe(
        &self,
        wwid: &Wwid,
        mode: WipeMode,
        expected: u64,
        tx: mpsc::Sender<WipeStep>,
    ) -> Result<(), AgentError> {
        let op = self.begin(wwid)?;
        let lun = self
            .lun(wwid)?
            .ok_or_else(|| AgentError::DeviceNotFound(wwid.clone()))?;
        let _held = self.lock_paths_of(&lun).await;
        // Read again under the lock: a logout may have removed it meanwhile.
        let (lun, name, node) = self.device_of(wwid)?;
        // Never erase a device that is not provably the one asked for: every
        // path re-reads its identity from the array first.
        crate::volume::device::reverify(&self.host, wwid, &node, &name).await?;
        self.check_unused(wwid, &lun)?;

        if mode == WipeMode::Signatures {
            let _ = tx.send(step(0, 0, 1, 1, "signatures", false)).await;
            self.host
                .runner
                .run(
                    &self.host.tool("wipefs"),
                    &[Arg::from("--all"), Arg::from(node.as_os_str())],
                )
                .await?;
            let _ = tx.send(step(0, 0, 1, 1, "signatures", true)).await;
            return Ok(());
        }
        // The erase must cover the LUN the inventory knows, not whatever
        // this node reports now: a path in transition reports 0 bytes, a
        // node whose rescan failed after an expansion the old size.
        let size = self.size_at_least(wwid, &node, expected).await?;
        if size < expected {
            return Err(smaller_than_recorded(&node, size, expected));
        }
        let number = expected_device(&node).map_err(|e| AgentError::io(&node, e))?;
        // Once claimed (O_EXCL), the device is busy to any detach or
        // logout; only until then does the target lock keep it here.
        let eraser = Eraser::claim(&node, number).map_err(|e| match e {
            ClaimError::InUse(p) => AgentError::DeviceInUse {
                wwid: wwid.clone(),
                holder: format!("{} is held open", p.display()),
            },
            ClaimError::NoSize(p) => AgentError::DeviceNotReady {
                device: p,
                reason: super::rescan::NO_SIZE.to_owned(),
            },
            ClaimError::Changed(p) => AgentError::DeviceNotReady {
                device: p,
                reason: "it changed while it was being opened".to_owned(),
            },
            ClaimError::Io { source, .. } => AgentError::WipeIo {
                wwid: wwid.clone(),
                during: "opening the device".to_owned(),
                source,
            },
        })?;
        // It may have shrunk between the check and the claim.
        if eraser.size() < expected {
            return Err(smaller_than_recorded(&node, eraser.size(), expected));
        }
        drop(_held);
        let bytes = eraser.size();
        let wwid_c = wwid.clone();
        // The guard goes with the erase: it ends when the erase does, even
        // if this future is dropped first.
        let result = tokio::task::spawn_blocking(move || {
            let _op = op;
            erase(eraser, mode, &wwid_c, &tx)
        })
        .await
        .map_err(|e| AgentError::WipeFailed {
            wwid: wwid.clone(),
            reason: format!("wipe task failed: {e}"),
        })?;
        match result {
            Ok(()) => {
                // The size says what was covered (the lab checks it
                // against the array's after an expansion).
                tracing::info!(%wwid, ?mode, bytes, "wiped");
                Ok(())
            }
            // Gone from under the wipe (its target logged out, the array
            // unmapped it): not this node's to finish; another node or a
            // later pass wipes it whole.
            Err(e) if matches!(self.lun(wwid), Ok(None)) => {
                tracing::warn!(%wwid, error = %e, "device vanished during the wipe");
                Err(AgentError::DeviceNotFound(wwid.clone()))
            }
            Err(e) => Err(e),
        }
    }
}

fn smaller_than_recorded(node: &std::path::Path, size: u64, expected: u64) -> AgentError {
    AgentError::DeviceNotReady {
        device: node.to_owned(),
        reason: format!(
            "it reports {size} bytes but the inventory records {expected}, and a rescan did not \
             grow it: an erase of the smaller device would leave the rest of the LUN as it was"
        ),
    }
}

fn step(
    done: u64,
    total: u64,
    pass: u32,
    passes: u32,
    method: &'static str,
    last: bool,
) -> WipeStep {
    WipeStep {
        bytes_done: done,
        bytes_total: total,
        pass,
        passes,
        method,
        done: last,
    }
}

fn erase(
    mut eraser: Eraser,
    mode: WipeMode,
    wwid: &Wwid,
    tx: &mpsc::Sender<WipeStep>,
) -> Result<(), AgentError> {
    let failed = |reason: String| AgentError::WipeFailed {
        wwid: wwid.clone(),
        reason,
    };
    let size = eraser.size();
    let (mut method, passes) = match mode {
        WipeMode::Discard => ("discard", 1),
        WipeMode::Zero | WipeMode::Signatures => ("zero", 1),
        WipeMode::Random(n) => ("random", n.max(1)),
    };
    for pass in 1..=passes {
        let mut off = 0;
        while off < size {
            let len = CHUNK.min(size - off);
            let r = match method {
                "discard" => match eraser.discard(off, len) {
                    Ok(true) => Ok(()),
                    // The device cannot discard: zero instead, from here on.
                    Ok(false) => {
                        tracing::info!(%wwid, "device cannot discard; zeroing instead");
                        method = "zero";
                        eraser.zero(off, len)
                    }
                    Err(e) => Err(e),
                },
                "zero" => eraser.zero(off, len),
                _ => eraser.randomize(off, len),
            };
            r.map_err(|source| AgentError::WipeIo {
                wwid: wwid.clone(),
                during: format!("{method} at byte {off}"),
                source,
            })?;
            off += len;
            let _ = tx.blocking_send(step(off, size, pass, passes, method, false));
        }
        eraser.sync().map_err(|source| AgentError::WipeIo {
            wwid: wwid.clone(),
            during: "sync".to_owned(),
            source,
        })?;
    }
    let edge = crate::host::filesystem::PROBE_AREA.min(size);
    if method == "random" {
        // Random data at the ends would read as "not blank" forever: zero
        // the probe areas, so the next volume's stage can format the LUN.
        for at in [0, size - edge] {
            eraser.zero(at, edge).map_err(|source| AgentError::WipeIo {
                wwid: wwid.clone(),
                during: format!("zero at byte {at}"),
                source,
            })?;
        }
        eraser.sync().map_err(|source| AgentError::WipeIo {
            wwid: wwid.clone(),
            during: "sync".to_owned(),
            source,
        })?;
    }
    // Proof the erase took: both ends read back as zeroes, and, where the
    // whole LUN should, a few ranges spread over it, chosen afresh for
    // each wipe (a fixed set could be the one place an erase reached).
    let mut ranges = vec![(0, edge), (size - edge, edge)];
    if method != "random" {
        ranges.extend(spread_ranges(size, &mut fastrand::Rng::new()));
    }
    for (at, len) in ranges {
        match eraser.reads_zero(at, len) {
            Ok(true) => {}
            Ok(false) => {
                return Err(failed(format!(
                    "data still present after the erase (at byte {at})"
                )));
            }
            Err(source) => {
                return Err(AgentError::WipeIo {
                    wwid: wwid.clone(),
                    during: format!("read-back at byte {at}"),
                    source,
                });
            }
        }
    }
    let _ = tx.blocking_send(step(size, size, passes, passes, method, true));
    Ok(())
}

/// How many ranges inside the LUN a wipe reads back, besides its ends.
pub(super) const SPREAD_RANGES: usize = 8;
/// The length of each of them.
pub(super) const SPREAD_LEN: u64 = 64 << 10;

/// [`SPREAD_RANGES`] ranges of [`SPREAD_LEN`] bytes, 4 KiB aligned, at
/// random places of a device of `size` bytes (fewer on a tiny one).
pub(super) fn spread_ranges(size: u64, rng: &mut fastrand::Rng) -> Vec<(u64, u64)> {
    let len = SPREAD_LEN.min(size);
    let room = (size - len) / 4096;
    (0..SPREAD_RANGES)
        .map(|_| (rng.u64(0..=room) * 4096, len))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_ranges_lie_inside_the_device_aligned_and_vary() {
        let mut rng = fastrand::Rng::with_seed(7);
        for size in [4096, 65_536, 1 << 20, (512 << 20) + 4096, 3 << 40] {
            let ranges = spread_ranges(size, &mut rng);
            assert_eq!(ranges.len(), SPREAD_RANGES);
            for (at, len) in ranges {
                assert_eq!(at % 4096, 0, "{at}");
                assert!(at + len <= size, "{at}+{len} > {size}");
                assert!(len > 0);
            }
        }
        let a = spread_ranges(1 << 30, &mut rng);
        let b = spread_ranges(1 << 30, &mut rng);
        assert_ne!(a, b, "each wipe reads other places");
    }
}
