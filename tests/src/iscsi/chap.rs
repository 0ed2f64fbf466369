//! CHAP for iSCSI (RFC 7143 section 12.1.3, RFC 1994): MD5 only
//! (CHAP_A=5), binary values encoded as `0x` hex (we also read `0b`
//! base64), and the random challenge for mutual CHAP.

use md5::{Digest, Md5};

use super::IscsiError;

/// CHAP credentials for a login.
///
/// `username`/`password` authenticate the initiator to the target (tgt's
/// incoming account). `mutual`, when set, is the (username, password) the
/// target must prove it knows (tgt's `--outgoing` account); the login then
/// fails unless the target answers our challenge correctly.
#[derive(Clone, PartialEq, Eq)]
pub struct Chap {
    /// CHAP_N we send.
    pub username: String,
    /// The secret shared with the target.
    pub password: String,
    /// Mutual CHAP: the name and secret the target must answer with.
    pub mutual: Option<(String, String)>,
}

impl std::fmt::Debug for Chap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chap")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .field(
                "mutual",
                &self.mutual.as_ref().map(|(user, _)| (user, "<redacted>")),
            )
            .finish()
    }
}

/// CHAP_A value for MD5.
pub(crate) const ALGORITHM_MD5: &str = "5";

/// Longest challenge we accept from a target (RFC 7143 allows up to 1024
/// bytes).
const MAX_CHALLENGE: usize = 1024;

/// The CHAP response: MD5(identifier || secret || challenge).
pub(crate) fn response(id: u8, secret: &[u8], challenge: &[u8]) -> [u8; 16] {
    let mut h = Md5::new();
    h.update([id]);
    h.update(secret);
    h.update(challenge);
    h.finalize().into()
}

/// A CHAP_I value: decimal, or `0x` hex, in 0..=255.
pub(crate) fn parse_identifier(s: &str) -> Result<u8, IscsiError> {
    let n = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => s.parse::<u32>().ok(),
    };
    n.and_then(|n| u8::try_from(n).ok())
        .ok_or_else(|| IscsiError::Protocol(format!("bad CHAP_I {s:?}")))
}

/// A binary value (`0x` hex or `0b` base64), at most 1024 bytes.
pub(crate) fn parse_binary(s: &str) -> Result<Vec<u8>, IscsiError> {
    let bad = || IscsiError::Protocol("malformed CHAP binary value".into());
    if s.len() > 2 * MAX_CHALLENGE + 2 {
        return Err(IscsiError::Protocol(format!(
            "CHAP value of {} characters is too long",
            s.len()
        )));
    }
    let out = if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        decode_hex(hex).ok_or_else(bad)?
    } else if let Some(b64) = s.strip_prefix("0b").or_else(|| s.strip_prefix("0B")) {
        decode_base64(b64).ok_or_else(bad)?
    } else {
        return Err(bad());
    };
    if out.is_empty() || out.len() > MAX_CHALLENGE {
        return Err(bad());
    }
    Ok(out)
}

/// `0x`-prefixed lowercase hex.
pub(crate) fn encode_hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(2 + 2 * bytes.len());
    s.push_str("0x");
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    // An odd length means a leading zero nibble was dropped.
    let padded;
    let s = if s.len() % 2 == 1 {
        padded = format!("0{s}");
        padded.as_str()
    } else {
        s
    };
    s.as_bytes()
        .chunks(2)
        .map(|pair| {
            let hi = char::from(pair[0]).to_digit(16)?;
            let lo = char::from(*pair.get(1)?).to_digit(16)?;
            u8::try_from(hi * 16 + lo).ok()
        })
        .collect()
}

fn decode_base64(s: &str) -> Option<Vec<u8>> {
    let s = s.trim_end_matches('=');
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(u8::try_from((acc >> bits) & 0xff).ok()?);
        }
    }
    Some(out)
}

/// `n` bytes from the kernel's CSPRNG (a mutual CHAP challenge must not be
/// guessable).
pub(crate) fn random_bytes<const N: usize>() -> Result<[u8; N], IscsiError> {
    use std::io::Read;
    let mut out = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut out))
        .map_err(|e| IscsiError::Protocol(format!("reading /dev/urandom: {e}")))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc1994_style_response() {
        // MD5(0x01 || "secret" || 0x0102) computed independently:
        // printf '\x01secret\x01\x02' | md5sum
        let r = response(1, b"secret", &[1, 2]);
        assert_eq!(encode_hex(&r), "0x18c6ee42cdcc2258144945ad28cad5a2");
    }

    #[test]
    fn values() {
        assert_eq!(parse_identifier("7").ok(), Some(7));
        assert_eq!(parse_identifier("0xff").ok(), Some(255));
        assert!(parse_identifier("256").is_err());
        assert!(parse_identifier("x").is_err());
        assert_eq!(parse_binary("0x0a0B").ok(), Some(vec![10, 11]));
        assert_eq!(parse_binary("0xabc").ok(), Some(vec![0x0a, 0xbc]));
        assert_eq!(parse_binary("0bAQID").ok(), Some(vec![1, 2, 3]));
        assert!(parse_binary("0x").is_err());
        assert!(parse_binary("0xzz").is_err());
        assert!(parse_binary("1234").is_err());
        assert!(parse_binary(&format!("0x{}", "00".repeat(2000))).is_err());
    }

    #[test]
    fn debug_redacts() {
        let c = Chap {
            username: "u".into(),
            password: "topsecret".into(),
            mutual: Some(("t".into(), "alsosecret".into())),
        };
        let d = format!("{c:?}");
        assert!(!d.contains("secret"), "{d}");
        assert!(d.contains("redacted"));
    }
}
