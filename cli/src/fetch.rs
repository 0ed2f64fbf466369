//! One HTTP/1.1 GET to a status endpoint (plain HTTP: the endpoints serve
//! nothing secret), with a timeout over connect, request and body.

use std::fmt;
use std::time::Duration;

use anyhow::{Context, bail};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// Where a status endpoint is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// `host:port`.
    authority: String,
    /// Path prefix, without a trailing slash (usually empty).
    base: String,
}

impl Endpoint {
    /// `http://host:port[/prefix]` or `host:port`.
    pub fn parse(url: &str) -> anyhow::Result<Self> {
        let rest = if let Some(r) = url.strip_prefix("http://") {
            r
        } else if url.starts_with("https://") {
            bail!("{url}: the status endpoints serve plain HTTP; use http://");
        } else if url.contains("://") {
            bail!("{url}: only http:// URLs are supported");
        } else {
            url
        };
        let (authority, base) = match rest.split_once('/') {
            Some((a, b)) => (a, format!("/{}", b.trim_end_matches('/'))),
            None => (rest, String::new()),
        };
        if authority.is_empty() {
            bail!("{url}: no host");
        }
        let authority = if authority
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
            || authority.ends_with(']')
        {
            authority.to_owned()
        } else {
            format!("{authority}:80")
        };
        Ok(Self {
            authority,
            base: if base == "/" { String::new() } else { base },
        })
    }

    /// GETs `path`: the status code, content type and body.
    async fn get(&self, path: &str, timeout: Duration) -> anyhow::Result<(u16, String, Bytes)> {
        let uri = format!("{}{path}", self.base);
        tokio::time::timeout(timeout, async {
            let stream = tokio::net::TcpStream::connect(&self.authority)
                .await
                .with_context(|| format!("cannot connect to {self}"))?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .with_context(|| format!("HTTP handshake with {self}"))?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            let request = hyper::Request::get(&uri)
                .header(hyper::header::HOST, &self.authority)
                .header(hyper::header::USER_AGENT, "csi-scsi-cli")
                .body(Empty::<Bytes>::new())?;
            let response = sender
                .send_request(request)
                .await
                .with_context(|| format!("GET {self}{path}"))?;
            let status = response.status().as_u16();
            let content_type = response
                .headers()
                .get(hyper::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            let body = response
                .into_body()
                .collect()
                .await
                .with_context(|| format!("reading the answer of {self}{path}"))?
                .to_bytes();
            Ok((status, content_type, body))
        })
        .await
        .map_err(|_| anyhow::anyhow!("{self}{path} did not answer within {timeout:?}"))?
    }

    /// GETs `path` and parses its JSON.
    pub async fn get_json(&self, path: &str, timeout: Duration) -> anyhow::Result<Value> {
        let (status, content_type, body) = self.get(path, timeout).await?;
        if status != 200 {
            bail!(
                "{self}{path} answered {status}: {}",
                String::from_utf8_lossy(&body).trim()
            );
        }
        if !content_type.starts_with("application/json") {
            bail!("{self}{path} answered {content_type:?}, not JSON");
        }
        serde_json::from_slice(&body).with_context(|| format!("{self}{path}: not valid JSON"))
    }

    /// `Ok` when `/readyz` answers 200, else the failing checks.
    pub async fn readiness(&self, timeout: Duration) -> anyhow::Result<Result<(), Vec<String>>> {
        let (status, _, body) = self.get("/readyz", timeout).await?;
        let text = String::from_utf8_lossy(&body);
        match status {
            200 => Ok(Ok(())),
            503 => Ok(Err(text
                .lines()
                .filter_map(|l| l.strip_prefix("[-] "))
                .map(str::to_owned)
                .collect())),
            other => bail!("{self}/readyz answered {other}: {}", text.trim()),
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}{}", self.authority, self.base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_with_or_without_scheme() {
        let e = Endpoint::parse("http://198.18.0.11:9811").expect("url");
        assert_eq!(e.to_string(), "http://198.18.0.11:9811");
        let e = Endpoint::parse("127.0.0.1:9812/").expect("url");
        assert_eq!(e.to_string(), "http://127.0.0.1:9812");
        let e = Endpoint::parse("http://example.invalid/csi/").expect("url");
        assert_eq!(e.to_string(), "http://example.invalid:80/csi");
        assert!(Endpoint::parse("https://x:1").is_err());
        assert!(Endpoint::parse("ftp://x:1").is_err());
        assert!(Endpoint::parse("http://").is_err());
    }
}
