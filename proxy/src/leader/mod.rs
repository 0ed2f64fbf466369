//! Leader election through a `coordination.k8s.io/v1` Lease, so that one
//! proxy replica runs discovery and writes the inventory. The algorithm is
//! client-go's: a candidate takes the Lease when its holder has not renewed
//! it for a whole lease duration *as observed on the candidate's own clock*
//! (no clock comparison across machines); the holder renews every retry
//! period and steps down when it could not renew within the renew deadline,
//! which is shorter than the lease duration, so it stops before anyone else
//! may start. Every write is a resourceVersion-guarded replace.
//!
//! `LeaderHandle` is what the rest of the proxy sees: `is_leader()`, the
//! leader epoch its agent calls carry (`epoch()`: the Lease's
//! `leaseTransitions` when this replica acquired it), a
//! `watch` to follow changes, `LeaderGate` to answer the Controller calls
//! that change state with UNAVAILABLE on a non-leader, and
//! `run_while_leader` for background work.

mod election;
mod gate;
mod handle;

pub use election::{LeaderElection, LeaseConfig, LeaseConfigError};
pub use gate::{ControllerMethod, LeaderGate, LeaderGated};
pub use handle::{LeaderCheck, LeaderHandle, exit_when_leadership_lost, run_while_leader};
