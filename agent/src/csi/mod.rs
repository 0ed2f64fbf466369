//! The agent's CSI services for kubelet: the Node service, the parsing of
//! its requests, and the one mapping of errors to gRPC statuses. (Identity
//! is shared with the proxy and lives in the daemon crate.)

pub mod node;
pub mod request;
pub mod status;
