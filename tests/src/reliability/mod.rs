//! The reliability suites: a crash suite (processes killed mid-operation),
//! a fault suite (nodes unreachable, certificates rotating, a full or
//! read-only store) and a bad-input sweep (malformed CSI requests). Each
//! prints its figures and fails on any violated invariant. Every random
//! choice comes from one seeded source, so a failing run replays from its
//! printed seed. Run them with `target/debug/reliability` (see
//! docs/reliability.md).

pub mod crash;
pub mod fault;
pub mod ledger;
pub mod report;
pub mod store;
pub mod sweep;

pub use report::SuiteReport;

/// How much work a suite does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// Bounded to a few minutes: what CI runs.
    Quick,
    /// The documented full run.
    Full,
}

impl Scale {
    /// `quick` in the quick run, `full` in the full one.
    pub fn pick<T>(self, quick: T, full: T) -> T {
        match self {
            Self::Quick => quick,
            Self::Full => full,
        }
    }
}

/// The seed in `CSI_SCSI_SEED`, or a fresh random one.
pub fn seed_from_env() -> u64 {
    std::env::var("CSI_SCSI_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| fastrand::u64(..))
}
