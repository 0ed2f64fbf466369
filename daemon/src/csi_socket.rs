//! The CSI Unix socket: reclaim a stale socket file only when nothing
//! listens on it, refuse to start when something does, mode 0660, and
//! remove the file on shutdown (only if it is still ours).

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

/// Why the socket could not be served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SocketError {
    /// Another process answers on this socket: two drivers must not share it.
    #[error(
        "{0} is in use: another process is listening on it (is a second csi-scsi instance running?)"
    )]
    InUse(PathBuf),
    /// The path exists and is not a socket; never delete it.
    #[error("{0} exists and is not a socket; refusing to remove it")]
    NotASocket(PathBuf),
    /// Any other I/O failure.
    #[error("{path}: {source}")]
    Io {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// A bound CSI socket; removes its file when dropped.
#[derive(Debug)]
pub struct CsiSocket {
    path: PathBuf,
    inode: u64,
    listener: Option<UnixListener>,
}

// === impl CsiSocket ===

impl CsiSocket {
    /// Binds `path` (creating its directory), reclaiming a stale socket.
    /// Needs a Tokio runtime.
    pub async fn bind(path: &Path) -> Result<Self, SocketError> {
        let io = |source| SocketError::Io {
            path: path.to_owned(),
            source,
        };
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(io)?;
        }
        match fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_socket() => {
                match tokio::net::UnixStream::connect(path).await {
                    Ok(_) => return Err(SocketError::InUse(path.to_owned())),
                    Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                        tracing::info!(path = %path.display(), "removing stale CSI socket");
                        fs::remove_file(path).map_err(io)?;
                    }
                    Err(e) => return Err(io(e)),
                }
            }
            Ok(_) => return Err(SocketError::NotASocket(path.to_owned())),
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        let listener = UnixListener::bind(path).map_err(io)?;
        fs::set_permissions(path, fs::Permissions::from_mode(0o660)).map_err(io)?;
        let inode = fs::metadata(path).map_err(io)?.ino();
        Ok(Self {
            path: path.to_owned(),
            inode,
            listener: Some(listener),
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The stream of accepted connections, for `serve_with_incoming`; the
    /// file stays owned by `self`.
    pub fn incoming(&mut self) -> Option<UnixListenerStream> {
        self.listener.take().map(UnixListenerStream::new)
    }
}

impl Drop for CsiSocket {
    fn drop(&mut self) {
        // A successor may already have replaced the file; leave theirs alone.
        let ours = fs::metadata(&self.path).is_ok_and(|m| m.ino() == self.inode);
        if ours && let Err(e) = fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot remove CSI socket");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn second_bind_on_a_live_socket_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("csi.sock");
        let first = CsiSocket::bind(&path).await.expect("first bind");
        let err = CsiSocket::bind(&path)
            .await
            .expect_err("second bind must fail");
        assert!(matches!(err, SocketError::InUse(_)), "{err}");
        assert_eq!(
            fs::metadata(&path).expect("socket").permissions().mode() & 0o777,
            0o660
        );
        drop(first);
        assert!(!path.exists(), "socket removed on drop");
    }

    #[tokio::test]
    async fn stale_socket_is_reclaimed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("csi.sock");
        // A socket file nobody listens on, as after a crash.
        drop(std::os::unix::net::UnixListener::bind(&path).expect("bind"));
        assert!(path.exists());
        let _sock = CsiSocket::bind(&path)
            .await
            .expect("stale socket reclaimed");
    }

    #[tokio::test]
    async fn a_regular_file_in_the_way_is_never_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("csi.sock");
        fs::write(&path, b"precious").expect("write");
        let err = CsiSocket::bind(&path).await.expect_err("must refuse");
        assert!(matches!(err, SocketError::NotASocket(_)), "{err}");
        assert_eq!(fs::read(&path).expect("still there"), b"precious");
    }
}
