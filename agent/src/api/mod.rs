//! The agent API served to the proxy over mutual TLS.

mod auth;
pub(crate) mod enrolment;
mod epoch;
mod metrics;
mod server;
mod status;

pub(crate) use auth::ProxyOnly;
pub(crate) use epoch::EpochFence;
pub(crate) use server::AgentApi;
