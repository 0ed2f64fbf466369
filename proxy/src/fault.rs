//! Deliberate defects for proving the reliability suites can fail. Only
//! debug builds with the `fault-injection` feature (which only the test
//! crate enables) read `CSI_SCSI_FAULT` (a comma-separated list); every
//! other build compiles each check to `false`, so no shipped binary can be
//! told to misbehave.

/// A defect the suites must catch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// CreateVolume picks a free LUN and binds it in two steps without the
    /// compare-and-swap, so concurrent binds can claim one LUN twice.
    SkipCas,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Self::SkipCas => "skip-cas",
        }
    }
}

/// Whether `fault` was asked for (test builds only).
pub fn injected(fault: Fault) -> bool {
    #[cfg(all(debug_assertions, feature = "fault-injection"))]
    {
        static ASKED: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
        let asked = ASKED.get_or_init(|| {
            let v: Vec<String> = std::env::var("CSI_SCSI_FAULT")
                .unwrap_or_default()
                .split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect();
            if !v.is_empty() {
                tracing::warn!(faults = ?v, "DELIBERATE DEFECTS INJECTED (CSI_SCSI_FAULT): test use only");
            }
            v
        });
        asked.iter().any(|a| a == fault.name())
    }
    #[cfg(not(all(debug_assertions, feature = "fault-injection")))]
    {
        let _ = fault.name();
        false
    }
}
