//! Verify: read a LUN back without writing to it, so the proxy can prove
//! a wipe another node did. The identity is re-read from the array first
//! (as before a wipe): a verdict about another LUN would prove nothing.

use std::time::Duration;

use super::Devices;
use crate::error::AgentError;
use crate::host::{block, blocking};
use csi_scsi_contract::Wwid;

/// The most one verify reads at each offset.
pub const MAX_RANGE: u64 = 1 << 20;
/// The most offsets one verify reads.
pub const MAX_RANGES: usize = 64;
/// How long the reads may take (a stalled device answers in time).
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// What a verify found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verified {
    /// The device's size on this node, after any rescan.
    pub size_bytes: u64,
    /// The first range that held data, if any.
    pub nonzero_at: Option<u64>,
}

impl Devices {
    /// Reads `offsets` (`len` bytes each, kept inside the device) of
    /// `wwid` past the page cache, after rescanning it when it reports
    /// less than `expected`.
    pub async fn verify(
        &self,
        wwid: &Wwid,
        expected: u64,
        offsets: &[u64],
        len: u64,
    ) -> Result<Verified, AgentError> {
        let _op = self.begin(wwid)?;
        let (_, name, node) = self.device_of(wwid)?;
        crate::volume::device::reverify(&self.host, wwid, &node, &name).await?;
        let size = self.size_at_least(wwid, &node, expected).await?;
        let len = len.clamp(block::DIRECT_ALIGN, MAX_RANGE);
        let ranges: Vec<(u64, u64)> = offsets
            .iter()
            .map(|&at| {
                let len = len.min(size);
                (at.min(size - len), len)
            })
            .collect();
        let path = node.clone();
        let nonzero_at = blocking::within("read-back", &node, READ_TIMEOUT, move || {
            block::first_nonzero_direct(&path, &ranges)
        })
        .await?
        .map_err(|source| AgentError::WipeIo {
            wwid: wwid.clone(),
            during: "verify read-back".to_owned(),
            source,
        })?;
        Ok(Verified {
            size_bytes: size,
            nonzero_at,
        })
    }
}
