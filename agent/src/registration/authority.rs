//! kubelet's plugin watcher dials the registration socket by its bare path,
//! so grpc-go sends that path as the HTTP/2 `:authority` (kubernetes issue
//! 109081). h2 refuses such a request as malformed (PROTOCOL_ERROR), and
//! node-driver-registrar only escapes it by being written in Go. The agent
//! therefore reads each registration connection itself: frames pass through
//! unchanged, except that every request header block is decoded (HPACK, with
//! the client's dynamic table) and re-encoded with `:authority: localhost`
//! as literals that never touch the server's dynamic table. Nothing else
//! about a request changes.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};

/// The HTTP/2 client connection preface.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The smallest frame size every HTTP/2 peer accepts.
const MAX_FRAME: usize = 16_384;
/// Header blocks of registration calls are tiny; more is an attack or a bug.
const MAX_BLOCK: usize = 64 * 1024;
/// The authority every registration request is given.
const AUTHORITY: &[u8] = b"localhost";

/// Serves `client` (kubelet's connection) through a pipe whose other end is
/// returned for the gRPC server; the rewriting runs until either side closes.
pub(crate) fn fix_authority<S>(client: S) -> DuplexStream
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (server_end, ours) = tokio::io::duplex(64 * 1024);
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut ours_read, mut ours_write) = tokio::io::split(ours);
    tokio::spawn(async move {
        let upstream = rewrite_requests(&mut client_read, &mut ours_write);
        let downstream = tokio::io::copy(&mut ours_read, &mut client_write);
        let (up, down) = tokio::join!(upstream, downstream);
        if let Err(e) = up {
            tracing::debug!(error = %e, "kubelet registration connection closed");
        }
        drop(down);
    });
    server_end
}

/// Copies an HTTP/2 client byte stream from `from` to `to`, rewriting the
/// `:authority` of every request.
async fn rewrite_requests<R, W>(from: &mut R, to: &mut W) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; 24];
    from.read_exact(&mut preface).await?;
    if &preface != PREFACE {
        return Err(invalid("not an HTTP/2 connection"));
    }
    to.write_all(&preface).await?;
    let mut decoder = loona_hpack::Decoder::new();
    // A header block that spans CONTINUATION frames: stream, END_STREAM, bytes.
    let mut pending: Option<(u32, u8, Vec<u8>)> = None;
    loop {
        let mut head = [0u8; 9];
        match from.read_exact(&mut head).await {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return to.shutdown().await,
            other => other?,
        };
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        if len > MAX_BLOCK {
            return Err(invalid("frame larger than any registration call"));
        }
        let mut payload = vec![0u8; len];
        from.read_exact(&mut payload).await?;
        match kind {
            HEADERS => {
                let fragment = header_fragment(flags, &payload)?;
                let block = (stream, flags & END_STREAM, fragment.to_vec());
                if flags & END_HEADERS != 0 {
                    emit(&mut decoder, block, to).await?;
                } else {
                    pending = Some(block);
                }
            }
            CONTINUATION => {
                let Some((id, end_stream, mut block)) = pending.take() else {
                    return Err(invalid("CONTINUATION without HEADERS"));
                };
                if id != stream || block.len() + payload.len() > MAX_BLOCK {
                    return Err(invalid("bad CONTINUATION"));
                }
                block.extend_from_slice(&payload);
                if flags & END_HEADERS != 0 {
                    emit(&mut decoder, (id, end_stream, block), to).await?;
                } else {
                    pending = Some((id, end_stream, block));
                }
            }
            _ => {
                to.write_all(&head).await?;
                to.write_all(&payload).await?;
            }
        }
        to.flush().await?;
    }
}

/// The header block fragment of a HEADERS frame, without padding and
/// priority fields.
fn header_fragment(flags: u8, payload: &[u8]) -> io::Result<&[u8]> {
    let mut body = payload;
    let mut pad = 0usize;
    if flags & PADDED != 0 {
        let (&n, rest) = body
            .split_first()
            .ok_or_else(|| invalid("empty padded frame"))?;
        pad = usize::from(n);
        body = rest;
    }
    if flags & PRIORITY != 0 {
        body = body
            .get(5..)
            .ok_or_else(|| invalid("short priority field"))?;
    }
    body.get(..body.len().saturating_sub(pad))
        .filter(|_| pad <= body.len())
        .ok_or_else(|| invalid("padding longer than the frame"))
}

/// Decodes one request header block, sets its authority, and writes it as
/// HEADERS (plus CONTINUATION frames if it had to be split).
async fn emit<W: AsyncWrite + Unpin>(
    decoder: &mut loona_hpack::Decoder<'_>,
    (stream, end_stream, block): (u32, u8, Vec<u8>),
    to: &mut W,
) -> io::Result<()> {
    let headers = decoder
        .decode(&block)
        .map_err(|e| invalid(&format!("undecodable request headers: {e}")))?;
    let mut encoded = Vec::with_capacity(block.len() + 16);
    for (name, value) in &headers {
        let value: &[u8] = if name == b":authority" {
            AUTHORITY
        } else {
            value
        };
        literal(&mut encoded, name, value);
    }
    let chunks: Vec<&[u8]> = encoded.chunks(MAX_FRAME).collect();
    let last = chunks.len().saturating_sub(1);
    for (i, chunk) in chunks.iter().enumerate() {
        let kind = if i == 0 { HEADERS } else { CONTINUATION };
        let mut flags = if i == 0 { end_stream } else { 0 };
        if i == last {
            flags |= END_HEADERS;
        }
        to.write_all(&frame_head(chunk.len(), kind, flags, stream))
            .await?;
        to.write_all(chunk).await?;
    }
    Ok(())
}

fn frame_head(len: usize, kind: u8, flags: u8, stream: u32) -> [u8; 9] {
    let s = stream.to_be_bytes();
    // len ≤ MAX_FRAME (chunks), so it fits 24 bits.
    [
        (len >> 16) as u8,
        (len >> 8) as u8,
        len as u8,
        kind,
        flags,
        s[0],
        s[1],
        s[2],
        s[3],
    ]
}

/// A "literal header field without indexing, new name" (RFC 7541 §6.2.2),
/// without Huffman coding: the server's dynamic table is never touched.
fn literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0x00);
    string(out, name);
    string(out, value);
}

/// A string literal (RFC 7541 §5.2) with H = 0.
fn string(out: &mut Vec<u8>, s: &[u8]) {
    integer(out, s.len(), 7, 0x00);
    out.extend_from_slice(s);
}

/// An integer with an N-bit prefix (RFC 7541 §5.1).
fn integer(out: &mut Vec<u8>, mut value: usize, prefix: u32, first: u8) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

fn invalid(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_follow_rfc_7541_examples() {
        // C.1.1: 10 with a 5-bit prefix; C.1.2: 1337 with a 5-bit prefix.
        let mut out = Vec::new();
        integer(&mut out, 10, 5, 0);
        assert_eq!(out, [0b01010]);
        out.clear();
        integer(&mut out, 1337, 5, 0);
        assert_eq!(out, [31, 154, 10]);
    }

    #[test]
    fn a_re_encoded_block_decodes_to_the_same_headers_but_the_authority() {
        let headers = [
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":path", b"/pluginregistration.Registration/GetInfo"),
            (
                b":authority",
                b"/var/lib/kubelet/plugins_registry/csi-scsi.io-reg.sock",
            ),
            (b"content-type", b"application/grpc"),
        ];
        let mut block = Vec::new();
        for (n, v) in headers {
            literal(&mut block, n, v);
        }
        let mut decoder = loona_hpack::Decoder::new();
        let decoded = decoder.decode(&block).expect("decodes");
        assert_eq!(decoded.len(), 5);
        assert_eq!(
            decoded[3].1,
            b"/var/lib/kubelet/plugins_registry/csi-scsi.io-reg.sock"
        );
    }

    #[test]
    fn padding_and_priority_are_stripped() {
        // PADDED: pad length 2; PRIORITY: 5 bytes; fragment "ab"; padding "00".
        let payload = [2, 0, 0, 0, 1, 16, b'a', b'b', 0, 0];
        assert_eq!(
            header_fragment(PADDED | PRIORITY, &payload).expect("ok"),
            b"ab"
        );
        assert!(header_fragment(PADDED, &[9, b'a']).is_err());
    }
}
