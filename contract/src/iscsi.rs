//! iSCSI's vocabulary: a target's [`Iqn`] (its iSCSI name) and a
//! [`Portal`] it is reached at, each parsed once from what a SCSITarget
//! says, and the limits open-iscsi puts on names and CHAP credentials.

use std::fmt;

use csi_scsi_textfs::{excerpt, text};

/// The iSCSI well-known port.
pub const DEFAULT_PORT: u16 = 3260;

/// The longest iSCSI name (RFC 3720, 3.2.6.1).
pub const MAX_NAME_LEN: usize = 223;

/// Most portals one iSCSI target may list (real arrays have a few per
/// controller; an agent logs in on each, all at once).
pub const MAX_PORTALS: usize = 16;

/// open-iscsi's limit on a CHAP name or secret (`AUTH_STR_MAX_LEN`,
/// including the NUL).
pub const MAX_CHAP_LEN: usize = 255;

/// An iSCSI name (RFC 3720 3.2.6.3) as iscsiadm takes it: printable ASCII
/// without blanks, at most [`MAX_NAME_LEN`] bytes, and one of
/// `iqn.<yyyy-mm>.<naming authority>[:<name>]`, `eui.<16 hex digits>` or
/// `naa.<16 or 32 hex digits>` (the prefixes the SCSITarget CRD requires
/// too). Kept as given: the target answers to its name as it spells it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Iqn(String);

/// Why a string is not an iSCSI name. Its text quotes the input (bounded,
/// escaped) and says what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}", .input.as_deref().map(|i| format!("{i} ")).unwrap_or_default(), .reason)]
pub struct InvalidIqn {
    /// The input, quoted and cut to a bound (`None` when it was empty).
    pub input: Option<String>,
    /// Why it was refused.
    pub reason: String,
}

// === impl Iqn ===

impl Iqn {
    /// Parses an iSCSI name of one of the three forms (see [`Iqn`]). A
    /// name that looks like an option (`-o`) has none of them.
    pub fn parse(input: &str) -> Result<Self, InvalidIqn> {
        let bad = |reason: String| InvalidIqn {
            input: Some(text::quote(input, text::INPUT_MAX)),
            reason,
        };
        if input.is_empty() {
            return Err(InvalidIqn {
                input: None,
                reason: "is required".to_owned(),
            });
        }
        if input.len() > MAX_NAME_LEN {
            return Err(bad(format!(
                "is {} bytes long; at most {MAX_NAME_LEN}",
                input.len()
            )));
        }
        if input.chars().any(char::is_control) {
            return Err(bad("contains control characters".to_owned()));
        }
        let hex = |s: &str, lens: &[usize]| {
            lens.contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
        };
        let problem = if !input.bytes().all(|b| b.is_ascii_graphic()) {
            "contains blanks or characters other than printable ASCII"
        } else if let Some(rest) = input.strip_prefix("iqn.") {
            if iqn_form(rest) {
                return Ok(Self(input.to_owned()));
            }
            "is not of the form iqn.<yyyy-mm>.<naming authority>[:<name>]"
        } else if let Some(rest) = input.strip_prefix("eui.") {
            if hex(rest, &[16]) {
                return Ok(Self(input.to_owned()));
            }
            "is not of the form eui.<16 hex digits>"
        } else if let Some(rest) = input.strip_prefix("naa.") {
            if hex(rest, &[16, 32]) {
                return Ok(Self(input.to_owned()));
            }
            "is not of the form naa.<16 or 32 hex digits>"
        } else {
            "is not an iSCSI name (iqn., eui. or naa.)"
        };
        Err(bad(problem.to_owned()))
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What follows `iqn.`: a date `yyyy-mm`, a dot, and a naming authority
/// (a reversed domain name), then optionally `:` and anything printable.
fn iqn_form(rest: &str) -> bool {
    let b = rest.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    let month_ok = rest
        .get(5..7)
        .and_then(|m| m.parse::<u8>().ok())
        .is_some_and(|m| (1..=12).contains(&m));
    let authority = rest.get(8..).map(|a| a.split(':').next().unwrap_or(""));
    digits(0..4)
        && b.get(4) == Some(&b'-')
        && digits(5..7)
        && month_ok
        && b.get(7) == Some(&b'.')
        && authority.is_some_and(|a| !a.is_empty() && !a.starts_with('.') && !a.ends_with('.'))
}

impl fmt::Display for Iqn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for Iqn {
    type Err = InvalidIqn;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl AsRef<str> for Iqn {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// An iSCSI portal: address (IPv4, IPv6 or host name) and TCP port.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Portal {
    address: String,
    port: u16,
}

/// Why a string is not a portal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid portal {input:?}: {reason}")]
pub struct InvalidPortal {
    /// What was given (an excerpt of a long input).
    pub input: String,
    /// Why it was refused.
    pub reason: &'static str,
}

// === impl Portal ===

impl Portal {
    /// A portal from an address and port (as sysfs stores them).
    pub fn new(address: &str, port: u16) -> Result<Self, InvalidPortal> {
        let bad = |reason| InvalidPortal {
            input: excerpt(&format!("{address}:{port}")),
            reason,
        };
        let address = address.trim().trim_start_matches('[').trim_end_matches(']');
        if address.is_empty() {
            return Err(bad("empty address"));
        }
        if address.starts_with('-') {
            return Err(bad("address starts with '-'"));
        }
        if !address
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | ':' | '-' | '%' | '_'))
        {
            return Err(bad(
                "address has characters outside an IP address or host name",
            ));
        }
        if port == 0 {
            return Err(bad("port 0"));
        }
        Ok(Self {
            address: address.to_owned(),
            port,
        })
    }

    /// Parses `ip:port`, `[ipv6]:port`, a bare `ip` or `[ipv6]` (port
    /// 3260), or an unbracketed IPv6 address (port 3260), as iscsiadm and
    /// `SCSITarget` portals spell them.
    pub fn parse(input: &str) -> Result<Self, InvalidPortal> {
        let bad = |reason| InvalidPortal {
            input: excerpt(input),
            reason,
        };
        let s = input.trim();
        let (address, port) = if let Some(rest) = s.strip_prefix('[') {
            let (addr, after) = rest.split_once(']').ok_or_else(|| bad("unclosed '['"))?;
            match after {
                "" => (addr, None),
                p => (
                    addr,
                    Some(p.strip_prefix(':').ok_or_else(|| bad("junk after ']'"))?),
                ),
            }
        } else if s.matches(':').count() == 1 {
            let (addr, port) = s.split_once(':').ok_or_else(|| bad("no port"))?;
            (addr, Some(port))
        } else {
            // No colon (an IPv4 address or host name), or several (IPv6
            // without brackets, which cannot carry a port).
            (s, None)
        };
        let port = match port {
            None => DEFAULT_PORT,
            Some(p) => p
                .parse::<u16>()
                .map_err(|_| bad("port is not a number from 1 to 65535"))?,
        };
        Self::new(address, port).map_err(|e| bad(e.reason))
    }

    /// The address (without brackets).
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl fmt::Display for Portal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.address.contains(':') {
            write!(f, "[{}]:{}", self.address, self.port)
        } else {
            write!(f, "{}:{}", self.address, self.port)
        }
    }
}

impl std::str::FromStr for Portal {
    type Err = InvalidPortal;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn well_formed_iscsi_names_are_kept_as_given() {
        for iqn in [
            "iqn.2003-01.org.linux-iscsi.array-a:lun0",
            "iqn.2016-04.com.open-iscsi:ef9f41e2ffa7:vs.3",
            "iqn.2026-11.io.csi-scsi.lab:array-a",
            "iqn.1992-08.com.netapp",
            "eui.0123456789ABCDEF",
            "naa.5000c5003011cb28",
            "naa.6001405d27e5d898829468b90ce4ef8c",
        ] {
            assert_eq!(Iqn::parse(iqn).map(|i| i.to_string()), Ok(iqn.to_owned()));
        }
    }

    #[test]
    fn malformed_iscsi_names_are_refused_with_a_bounded_one_line_reason() {
        let long = format!("iqn.2003-01.org.example:{}", "a".repeat(200));
        for (iqn, why) in [
            ("", "is required"),
            ("-o", "is not an iSCSI name"),
            ("--op=delete", "is not an iSCSI name"),
            ("iqn.x:a b", "contains blanks"),
            ("iqn.a\nnode.startup = automatic", "control characters"),
            ("iqn.2003-1.org.example", "is not of the form iqn."),
            ("iqn.2003-13.org.example", "is not of the form iqn."),
            ("iqn.2003-01.", "is not of the form iqn."),
            ("iqn.2003-01.:x", "is not of the form iqn."),
            ("iqn.2003-01org.example", "is not of the form iqn."),
            ("IQN.2003-01.org.example", "is not an iSCSI name"),
            ("eui.0123", "eui.<16 hex digits>"),
            ("eui.0123456789abcdeg", "eui.<16 hex digits>"),
            (
                "naa.6001405d27e5d898829468b90ce4ef8",
                "naa.<16 or 32 hex digits>",
            ),
            ("array-a", "is not an iSCSI name"),
            ("iqn.2003-01.org.ex\u{e9}", "printable ASCII"),
            (long.as_str(), "at most 223"),
        ] {
            let e = Iqn::parse(iqn).expect_err(iqn).to_string();
            assert!(e.contains(why), "{iqn:?}: {e}");
            assert!(!e.chars().any(char::is_control), "{e:?}");
            assert!(e.len() < 256, "{e}");
        }
    }

    #[test]
    fn portal_spellings() {
        for (input, shown) in [
            ("10.0.0.1:3260", "10.0.0.1:3260"),
            ("10.0.0.1", "10.0.0.1:3260"),
            (" 10.0.0.1:3261 ", "10.0.0.1:3261"),
            ("[fd00::1]:3260", "[fd00::1]:3260"),
            ("[fd00::1]", "[fd00::1]:3260"),
            ("fd00::1", "[fd00::1]:3260"),
            ("array.example.com:860", "array.example.com:860"),
        ] {
            assert_eq!(
                Portal::parse(input).map(|p| p.to_string()),
                Ok(shown.to_owned()),
                "{input:?}"
            );
        }
        for bad in [
            "",
            ":3260",
            "10.0.0.1:",
            "10.0.0.1:0",
            "10.0.0.1:70000",
            "[fd00::1",
            "[fd00::1]x",
            "-p:3260",
            "a b:3260",
            "10.0.0.1:32a",
        ] {
            assert!(Portal::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(Portal::new("fd00::1", 3260).map(|p| p.port()), Ok(3260));
    }

    proptest! {
        /// No input panics either parser; an accepted name is kept as
        /// given, and an accepted portal reads back from how it is shown.
        #[test]
        fn any_text_is_parsed_or_refused(s in "\\PC{0,64}") {
            if let Ok(iqn) = Iqn::parse(&s) {
                prop_assert_eq!(iqn.as_str(), s.as_str());
            }
            if let Ok(p) = Portal::parse(&s) {
                prop_assert_eq!(Portal::parse(&p.to_string()), Ok(p));
            }
        }

        /// Every name of the `iqn.` form within the limit is accepted.
        #[test]
        fn iqn_form_names_are_accepted(
            year in 1000u32..10000, month in 1u32..13,
            authority in "[a-z][a-z0-9.-]{0,30}[a-z0-9]", name in "(:[!-~]{1,40})?",
        ) {
            let iqn = format!("iqn.{year}-{month:02}.{authority}{name}");
            prop_assert!(Iqn::parse(&iqn).is_ok(), "{}", iqn);
        }
    }
}
