//! What a suite reports: operations run, faults injected, invariants
//! checked and every violation, with the seed that replays the run.

use std::fmt::Write as _;
use std::time::Duration;

/// The figures of one suite run.
#[derive(Debug, Default)]
pub struct SuiteReport {
    /// The suite's name.
    pub suite: String,
    /// The seed of its random source.
    pub seed: u64,
    /// Operations sent (CSI and agent calls).
    pub operations: u64,
    /// Faults injected (kills, link cuts, rotations, a full disk, ...).
    pub faults: u64,
    /// Invariant checks performed.
    pub invariants: u64,
    /// Every violated invariant, in words.
    pub violations: Vec<String>,
    /// Wall time.
    pub elapsed: Duration,
    /// Further figures worth printing (`name: value`).
    pub notes: Vec<String>,
}

impl SuiteReport {
    /// An empty report for `suite` run with `seed`.
    pub fn new(suite: &str, seed: u64) -> Self {
        Self {
            suite: suite.to_owned(),
            seed,
            ..Self::default()
        }
    }

    /// Counts one operation.
    pub fn op(&mut self) {
        self.operations += 1;
    }

    /// Counts one injected fault.
    pub fn fault(&mut self) {
        self.faults += 1;
    }

    /// Checks one invariant; records `what` as a violation when `holds` is
    /// false. Returns `holds`.
    pub fn check(&mut self, holds: bool, what: impl FnOnce() -> String) -> bool {
        self.invariants += 1;
        if !holds {
            let v = what();
            eprintln!("[{}] violation: {v}", self.suite);
            self.violations.push(v);
        }
        holds
    }

    /// Adds a figure worth printing.
    pub fn note(&mut self, line: impl Into<String>) {
        self.notes.push(line.into());
    }

    /// Whether no invariant was violated.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// The report as printed: one summary line, the notes, the violations.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<8} seed {:<20} ops {:>6}  faults {:>4}  invariants {:>6}  violations {:>3}  {:>6.1}s  {}",
            self.suite,
            self.seed,
            self.operations,
            self.faults,
            self.invariants,
            self.violations.len(),
            self.elapsed.as_secs_f64(),
            if self.passed() { "ok" } else { "FAILED" }
        );
        for n in &self.notes {
            let _ = writeln!(s, "         {n}");
        }
        for v in self.violations.iter().take(50) {
            let _ = writeln!(s, "         VIOLATION: {v}");
        }
        if self.violations.len() > 50 {
            let _ = writeln!(s, "         ... and {} more", self.violations.len() - 50);
        }
        if !self.passed() {
            let _ = writeln!(
                s,
                "         replay: CSI_SCSI_SEED={} target/debug/reliability --suite {}",
                self.seed, self.suite
            );
        }
        s
    }
}
