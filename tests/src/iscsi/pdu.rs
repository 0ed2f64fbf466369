//! iSCSI PDU framing (RFC 7143 section 11): the 48-byte Basic Header
//! Segment, the data segment padded to 4 bytes, and the `key=value\0` text
//! format of Login and Text PDUs. No digests (we negotiate
//! HeaderDigest=None, DataDigest=None).

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::IscsiError;

/// Length of the Basic Header Segment.
pub(crate) const BHS_LEN: usize = 48;

/// The "Immediate delivery" bit of byte 0.
pub(crate) const IMMEDIATE: u8 = 0x40;
/// The Final bit of byte 1.
pub(crate) const FINAL: u8 = 0x80;
/// The reserved tag value ("no task").
pub(crate) const RESERVED_TAG: u32 = 0xffff_ffff;

/// Opcodes (byte 0, low 6 bits).
pub(crate) mod op {
    pub(crate) const NOP_OUT: u8 = 0x00;
    pub(crate) const SCSI_COMMAND: u8 = 0x01;
    pub(crate) const LOGIN_REQUEST: u8 = 0x03;
    pub(crate) const TEXT_REQUEST: u8 = 0x04;
    pub(crate) const LOGOUT_REQUEST: u8 = 0x06;
    pub(crate) const NOP_IN: u8 = 0x20;
    pub(crate) const SCSI_RESPONSE: u8 = 0x21;
    pub(crate) const LOGIN_RESPONSE: u8 = 0x23;
    pub(crate) const TEXT_RESPONSE: u8 = 0x24;
    pub(crate) const DATA_IN: u8 = 0x25;
    pub(crate) const LOGOUT_RESPONSE: u8 = 0x26;
    pub(crate) const R2T: u8 = 0x31;
    pub(crate) const ASYNC_MESSAGE: u8 = 0x32;
    pub(crate) const REJECT: u8 = 0x3f;
}

/// Largest data segment the format can carry (24-bit length).
const MAX_SEGMENT_FORMAT: usize = 0x00ff_ffff;

/// One PDU: header and (unpadded) data segment. AHS are read and dropped:
/// none of the PDUs this initiator handles needs them.
#[derive(Clone)]
pub(crate) struct Pdu {
    pub(crate) bhs: [u8; BHS_LEN],
    pub(crate) data: Vec<u8>,
}

impl std::fmt::Debug for Pdu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Login data can hold CHAP responses: show sizes, not contents.
        f.debug_struct("Pdu")
            .field("opcode", &format_args!("{:#04x}", self.opcode()))
            .field("flags", &format_args!("{:#04x}", self.flags()))
            .field("itt", &format_args!("{:#010x}", self.itt()))
            .field("data_len", &self.data.len())
            .finish()
    }
}

impl Pdu {
    /// A PDU with `byte0` (opcode plus the immediate bit) and `flags`.
    pub(crate) fn new(byte0: u8, flags: u8) -> Self {
        let mut bhs = [0u8; BHS_LEN];
        bhs[0] = byte0;
        bhs[1] = flags;
        Self {
            bhs,
            data: Vec::new(),
        }
    }

    pub(crate) fn opcode(&self) -> u8 {
        self.bhs[0] & 0x3f
    }

    pub(crate) fn flags(&self) -> u8 {
        self.bhs[1]
    }

    pub(crate) fn itt(&self) -> u32 {
        self.u32_at(16)
    }

    pub(crate) fn set_itt(&mut self, itt: u32) {
        self.set_u32(16, itt);
    }

    /// The big-endian u32 at `off` (a fixed BHS offset, always in range).
    pub(crate) fn u32_at(&self, off: usize) -> u32 {
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.bhs[off..off + 4]);
        u32::from_be_bytes(b)
    }

    pub(crate) fn u16_at(&self, off: usize) -> u16 {
        u16::from_be_bytes([self.bhs[off], self.bhs[off + 1]])
    }

    pub(crate) fn set_u32(&mut self, off: usize, v: u32) {
        self.bhs[off..off + 4].copy_from_slice(&v.to_be_bytes());
    }

    pub(crate) fn set_u16(&mut self, off: usize, v: u16) {
        self.bhs[off..off + 2].copy_from_slice(&v.to_be_bytes());
    }

    pub(crate) fn set_bytes(&mut self, off: usize, v: &[u8]) {
        self.bhs[off..off + v.len()].copy_from_slice(v);
    }

    /// The wire form: BHS with DataSegmentLength set, data, padding.
    fn encode(&self) -> Result<Vec<u8>, IscsiError> {
        let len = self.data.len();
        if len > MAX_SEGMENT_FORMAT {
            return Err(IscsiError::Protocol(format!(
                "data segment of {len} bytes does not fit a PDU"
            )));
        }
        let mut out = Vec::with_capacity(BHS_LEN + padded(len));
        out.extend_from_slice(&self.bhs);
        out[4] = 0; // no AHS
        let l = (len as u32).to_be_bytes();
        out[5..8].copy_from_slice(&l[1..4]);
        out.extend_from_slice(&self.data);
        out.resize(BHS_LEN + padded(len), 0);
        Ok(out)
    }
}

/// `len` rounded up to a multiple of 4.
fn padded(len: usize) -> usize {
    len.div_ceil(4) * 4
}

/// Writes one PDU.
pub(crate) async fn write_pdu<W: AsyncWrite + Unpin>(
    w: &mut W,
    pdu: &Pdu,
) -> Result<(), IscsiError> {
    let bytes = pdu.encode()?;
    w.write_all(&bytes).await.map_err(IscsiError::Connection)?;
    w.flush().await.map_err(IscsiError::Connection)
}

/// Reads one PDU, refusing a data segment longer than `max_data` (our
/// declared MaxRecvDataSegmentLength) before allocating it.
pub(crate) async fn read_pdu<R: AsyncRead + Unpin>(
    r: &mut R,
    max_data: usize,
) -> Result<Pdu, IscsiError> {
    let mut bhs = [0u8; BHS_LEN];
    r.read_exact(&mut bhs)
        .await
        .map_err(IscsiError::Connection)?;
    let ahs_len = usize::from(bhs[4]) * 4;
    let data_len = usize::from(bhs[5]) << 16 | usize::from(bhs[6]) << 8 | usize::from(bhs[7]);
    if data_len > max_data {
        return Err(IscsiError::Protocol(format!(
            "target sent a {data_len}-byte data segment (opcode {:#04x}), more than our \
             MaxRecvDataSegmentLength {max_data}",
            bhs[0] & 0x3f
        )));
    }
    if ahs_len > 0 {
        // At most 255 * 4 bytes: bounded by the format.
        let mut ahs = vec![0u8; ahs_len];
        r.read_exact(&mut ahs)
            .await
            .map_err(IscsiError::Connection)?;
    }
    let mut data = vec![0u8; padded(data_len)];
    r.read_exact(&mut data)
        .await
        .map_err(IscsiError::Connection)?;
    data.truncate(data_len);
    Ok(Pdu { bhs, data })
}

/// Encodes text keys as `key=value\0...`.
pub(crate) fn encode_text<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in pairs {
        out.extend_from_slice(k.as_ref().as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_ref().as_bytes());
        out.push(0);
    }
    out
}

/// Decodes `key=value\0...` (the last NUL may be missing; empty entries
/// are skipped).
pub(crate) fn decode_text(data: &[u8]) -> Result<Vec<(String, String)>, IscsiError> {
    let mut out = Vec::new();
    for item in data.split(|&b| b == 0).filter(|s| !s.is_empty()) {
        let item = std::str::from_utf8(item)
            .map_err(|_| IscsiError::Protocol("text key is not UTF-8".into()))?;
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| IscsiError::Protocol(format!("text item without '=': {item:?}")))?;
        out.push((k.to_owned(), v.to_owned()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn round_trip_with_padding() {
        let mut p = Pdu::new(op::TEXT_REQUEST | IMMEDIATE, FINAL);
        p.set_itt(7);
        p.data = b"abcde".to_vec();
        let wire = p.encode().unwrap_or_default();
        assert_eq!(wire.len(), 48 + 8);
        assert_eq!(&wire[5..8], &[0, 0, 5]);
        let back = read_pdu(&mut &wire[..], 1024).await;
        let back = back.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back.itt(), 7);
        assert_eq!(back.data, b"abcde");
    }

    #[tokio::test]
    async fn oversized_segment_is_refused_before_reading() {
        let mut bhs = [0u8; BHS_LEN];
        bhs[0] = op::DATA_IN;
        bhs[5] = 0xff;
        let r = read_pdu(&mut &bhs[..], 8192).await;
        assert!(matches!(r, Err(IscsiError::Protocol(_))));
    }

    #[tokio::test]
    async fn truncated_stream_is_a_connection_error() {
        let r = read_pdu(&mut &[0u8; 10][..], 8192).await;
        assert!(matches!(r, Err(IscsiError::Connection(_))));
    }

    #[test]
    fn text_keys() {
        let enc = encode_text(&[("A", "1"), ("B", "x=y")]);
        assert_eq!(enc, b"A=1\0B=x=y\0");
        let dec = decode_text(b"A=1\0\0B=x=y").unwrap_or_default();
        assert_eq!(
            dec,
            vec![("A".into(), "1".into()), ("B".into(), "x=y".into())]
        );
        assert!(decode_text(b"novalue\0").is_err());
        assert!(decode_text(b"A=\xff\0").is_err());
    }
}
