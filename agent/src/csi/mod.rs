//! The agent's CSI services for kubelet: the Node service, the parsing of
//! its requests, and the one mapping of errors to gRPC statuses. (Identity
//! is shared with the proxy and lives in the daemon crate.)

pub(crate) mod node;
pub mod request;
pub(crate) mod status;
