//! The layers every csi-scsi gRPC server runs, composed in this one place
//! so that no server forgets one or stacks them in another order.
//! Outermost first: the request ID (every later layer and the handler name
//! the same one), the call metrics (which see every call, refused ones
//! included), the named UNIMPLEMENTED answer.

use tower::ServiceBuilder;
use tower::layer::util::{Identity, Stack};

use crate::metrics::{GrpcMetricsLayer, Metrics};
use crate::request_id::{CallSpan, RequestIdLayer};
use crate::unserved::NameUnservedLayer;

/// The stack [`server_layers`] returns.
pub type ServerLayers = ServiceBuilder<
    Stack<NameUnservedLayer, Stack<GrpcMetricsLayer, Stack<RequestIdLayer, Identity>>>,
>;

/// The layers of a server that serves `served` (named in UNIMPLEMENTED
/// answers), its calls timed in `metrics`, with spans as `span` says:
/// `Server::builder().layer(server_layers(&metrics, "CSI Node", CallSpan::PerCall))`.
pub fn server_layers(metrics: &Metrics, served: &'static str, span: CallSpan) -> ServerLayers {
    ServiceBuilder::new()
        .layer(RequestIdLayer::new(span))
        .layer(metrics.grpc_layer())
        .layer(NameUnservedLayer::new(served))
}
