//! Calling agents: one lazily opened HTTP/2 channel per agent (mTLS, the
//! peer must be that node), a tower stack per call (deadline, retries on
//! UNAVAILABLE for idempotent calls, bounded concurrency), fan-out, the
//! CSI caller's deadline carried to every agent call, and the metrics of
//! those calls.

mod call;
pub mod deadline;
mod error;
mod fanout;
mod metrics;
mod pool;
mod retry;
mod stack;

pub(crate) use call::transport_failure;
pub use call::{AgentCall, Caller, NotLeading, REQUEST_ID_HEADER, Rpc};
pub use error::{AgentError, Refusal};
pub use fanout::fan_out;
pub use metrics::{AgentCallMetrics, AgentCallTimer};
pub use pool::{AgentPool, CallConfig, PoolError};
pub use retry::{Backoff, InvalidBackoff, RetryPolicy};
