//! The leader epoch: which term of the proxy's leadership an agent call
//! acts for. The proxy sends it with every agent call in
//! [`LEADER_EPOCH_HEADER`]; the agent remembers the highest it has seen and
//! refuses a destructive call (Attach, Detach, Wipe) from an older term, so
//! a proxy frozen past its Lease cannot act after its successor did.

use std::fmt;

/// gRPC metadata key carrying the caller's leader epoch. A call without it
/// (an older proxy, a test) is epoch 0.
pub const LEADER_EPOCH_HEADER: &str = "x-csi-scsi-leader-epoch";

/// A term of leadership: the proxy Lease's creation time (Unix seconds,
/// the high bits) and its `leaseTransitions` when its holder acquired it
/// (the low 20 bits): a later holder of the same Lease has a higher count,
/// and a Lease created anew a later creation time. Embedded mode (one
/// proxy, no election) is always epoch 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaderEpoch(pub u64);

/// Why a header value is not a leader epoch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("leader epoch {0:?} is not a decimal number of at most 20 digits")]
pub struct InvalidLeaderEpoch(String);

impl LeaderEpoch {
    /// Parses a header value: decimal digits only, as [`fmt::Display`]
    /// prints them.
    pub fn parse(s: &str) -> Result<Self, InvalidLeaderEpoch> {
        let bad = || InvalidLeaderEpoch(csi_scsi_textfs::excerpt(s));
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        s.parse().map(Self).map_err(|_| bad())
    }
}

impl fmt::Display for LeaderEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_epoch_reads_back_as_printed_and_nothing_else_reads() {
        for n in [0, 7, u64::MAX] {
            let e = LeaderEpoch(n);
            assert_eq!(LeaderEpoch::parse(&e.to_string()), Ok(e));
        }
        for bad in [
            "",
            "-1",
            "+1",
            " 1",
            "1 ",
            "0x10",
            "18446744073709551616",
            "7a",
        ] {
            assert!(LeaderEpoch::parse(bad).is_err(), "{bad:?}");
        }
    }
}
