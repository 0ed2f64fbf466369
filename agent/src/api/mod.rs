//! The agent API served to the proxy over mutual TLS.

mod auth;
pub mod enrolment;
mod epoch;
mod metrics;
mod server;
mod status;

pub use auth::ProxyOnly;
pub use epoch::EpochFence;
pub use server::AgentApi;
