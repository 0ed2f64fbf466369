//! What every long-running csi-scsi process needs, shared by the proxy and
//! the agent: the CSI Unix socket, the mutual-TLS transport of the agent
//! API, readiness checks behind CSI `Probe`, the Identity service, signal
//! handling with a bounded drain, logging set-up, and per-key locks. No CSI
//! domain logic.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod agent_tcp;
mod agent_transport;
mod csi_identity;
mod csi_socket;
mod endpoint;
pub mod grpc_timeout;
mod keyed_lock;
mod logging;
mod metrics;
mod process;
mod process_args;
mod readiness;
pub mod request_id;
mod server_layers;
mod shutdown;
mod status_http;
mod unserved;

pub use agent_tcp::{Severance, UNACKED_LIMIT};
pub use agent_transport::{
    HandshakeLimit, TransportError, agent_channel, certificate_refused, enrolment_channel,
    severable_agent_channel, tls_incoming, tls_incoming_bounded,
};
pub use csi_identity::{IdentityService, NODE_TOPOLOGY_KEY, PLUGIN_NAME};
pub use csi_socket::{CsiSocket, SocketError};
pub use endpoint::{EndpointError, parse_csi_endpoint};
pub use keyed_lock::{KeyGuard, KeyedLocks, TimedOut};
pub use logging::{LogFormat, init_logging};
pub use metrics::{
    ErrorRecord, GrpcMetricsLayer, GrpcMetricsService, MeteredBody, Metrics, RECENT_ERRORS,
    code_name, rfc3339, rpc_histogram, set_gauge, set_gauges,
};
pub use process::{EX_USAGE, parse_args, run_main};
pub use process_args::ProcessArgs;
pub use readiness::{Check, Readiness, TlsMaterialCheck, ToolsCheck};
pub use request_id::{CallSpan, RequestId, RequestIdLayer, RequestIdService};
pub use server_layers::{ServerLayers, server_layers};
pub use shutdown::Shutdown;
pub use status_http::{
    CONNECTION_MAX_AGE, HEADER_READ_TIMEOUT, MAX_CONNECTIONS, METRICS_CONTENT_TYPE,
    PER_PEER_CONNECTIONS, PROBE_CONNECTIONS, SNAPSHOT_TTL, SocketCheck, StatusListener,
    StatusService, StatusSource, TrustedPeers,
};
pub use unserved::{NameUnserved, NameUnservedLayer};
