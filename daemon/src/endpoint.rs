//! The `--csi-endpoint` flag: `unix:///path/csi.sock` or a bare path, as
//! the CSI sidecars accept.

use std::path::PathBuf;

/// Why an endpoint was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum EndpointError {
    /// Only Unix sockets are served to kubelet and the sidecars.
    #[error(
        "CSI endpoint {0:?} is not a Unix socket: use unix:///path/csi.sock or an absolute path"
    )]
    NotUnix(String),
    /// A relative path would depend on the working directory.
    #[error("CSI endpoint {0:?} must be an absolute path")]
    Relative(String),
}

/// Parses `unix:///abs/path`, `unix:/abs/path` or `/abs/path`.
pub fn parse_csi_endpoint(endpoint: &str) -> Result<PathBuf, EndpointError> {
    let path = if let Some(rest) = endpoint.strip_prefix("unix://") {
        rest
    } else if let Some(rest) = endpoint.strip_prefix("unix:") {
        rest
    } else if endpoint.contains("://") {
        return Err(EndpointError::NotUnix(endpoint.to_owned()));
    } else {
        endpoint
    };
    if !path.starts_with('/') {
        return Err(EndpointError::Relative(endpoint.to_owned()));
    }
    Ok(PathBuf::from(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_spellings_sidecars_use() {
        for (input, want) in [
            ("unix:///csi/csi.sock", "/csi/csi.sock"),
            ("unix:/csi/csi.sock", "/csi/csi.sock"),
            (
                "/var/lib/kubelet/plugins/csi-scsi.io/csi.sock",
                "/var/lib/kubelet/plugins/csi-scsi.io/csi.sock",
            ),
        ] {
            assert_eq!(
                parse_csi_endpoint(input),
                Ok(PathBuf::from(want)),
                "{input}"
            );
        }
    }

    #[test]
    fn refuses_tcp_and_relative_endpoints() {
        assert_eq!(
            parse_csi_endpoint("tcp://127.0.0.1:10000"),
            Err(EndpointError::NotUnix("tcp://127.0.0.1:10000".into()))
        );
        assert_eq!(
            parse_csi_endpoint("unix://csi.sock"),
            Err(EndpointError::Relative("unix://csi.sock".into()))
        );
        assert_eq!(
            parse_csi_endpoint("csi.sock"),
            Err(EndpointError::Relative("csi.sock".into()))
        );
    }
}
