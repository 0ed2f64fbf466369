//! The agent API served to the proxy over mutual TLS.

mod auth;
pub mod enrolment;
mod metrics;
mod server;
mod status;

pub use server::AgentApi;
