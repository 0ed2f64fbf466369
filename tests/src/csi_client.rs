//! gRPC channels for tests: CSI over a Unix socket, as kubelet and the
//! sidecars dial it.

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

/// Connects to the CSI socket at `path`. The URI is only the `:authority`
/// sent (`localhost`, as kubelet sends); the connector dials the socket.
pub async fn csi_channel(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = path.to_owned();
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map(TokioIo::new)
            }
        }))
        .await
}
