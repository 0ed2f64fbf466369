//! Fibre Channel's vocabulary: [`Wwpn`], a port (or node) name in one
//! canonical spelling whichever way it was written, as a SCSITarget lists
//! it and as sysfs and `/dev/disk/by-path` show it.

use std::fmt;

use csi_scsi_textfs::excerpt;

/// A Fibre Channel port name (WWPN) or node name (WWNN): 64 bits, shown as
/// 16 lowercase hex digits (`500a0981891b8dc5`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Wwpn(u64);

/// Why a string is not a WWPN.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid WWPN {input:?}: {reason}")]
pub struct InvalidWwpn {
    /// What was given (an excerpt of a long input).
    pub input: String,
    /// Why it was refused.
    pub reason: &'static str,
}

// === impl Wwpn ===

impl Wwpn {
    /// Parses the usual spellings: 16 hex digits (`500A0981891B8DC5`),
    /// `0x`-prefixed (`0x500a0981891b8dc5`, as sysfs and by-path write it),
    /// or 8 bytes separated by `:` or `-` (`50:0a:09:81:89:1b:8d:c5`), in
    /// either case, with surrounding blanks ignored.
    pub fn parse(input: &str) -> Result<Self, InvalidWwpn> {
        let bad = |reason| InvalidWwpn {
            input: excerpt(input),
            reason,
        };
        let s = input.trim();
        if s.is_empty() {
            return Err(bad("empty"));
        }
        let hex: String = if s.contains([':', '-']) {
            let groups: Vec<&str> = s.split([':', '-']).collect();
            if groups.len() != 8 || groups.iter().any(|g| g.len() != 2) {
                return Err(bad("separated form must be 8 groups of 2 hex digits"));
            }
            groups.concat()
        } else {
            s.strip_prefix("0x")
                .or_else(|| s.strip_prefix("0X"))
                .unwrap_or(s)
                .to_owned()
        };
        if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad("not hexadecimal"));
        }
        if hex.len() != 16 {
            return Err(bad("a WWPN has 16 hex digits"));
        }
        u64::from_str_radix(&hex, 16)
            .map(Self)
            .map_err(|_| bad("not hexadecimal"))
    }

    /// The 64-bit value.
    pub fn as_u64(self) -> u64 {
        self.0
    }

    /// The spelling sysfs and `/dev/disk/by-path` use: `0x` + 16 lowercase hex digits.
    pub fn to_0x(self) -> String {
        format!("0x{:016x}", self.0)
    }
}

impl fmt::Display for Wwpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl std::str::FromStr for Wwpn {
    type Err = InvalidWwpn;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn wwpn(s: &str) -> Wwpn {
        Wwpn::parse(s).expect("test WWPN")
    }

    #[test]
    fn every_usual_spelling_is_one_wwpn() {
        let want = "500a0981891b8dc5";
        for spelling in [
            "500a0981891b8dc5",
            "500A0981891B8DC5",
            "0x500a0981891b8dc5",
            "0X500A0981891B8DC5",
            "50:0a:09:81:89:1b:8d:c5",
            "50:0A:09:81:89:1B:8D:C5",
            "50-0a-09-81-89-1b-8d-c5",
            "  0x500a0981891b8dc5\n",
        ] {
            assert_eq!(
                Wwpn::parse(spelling).map(|w| w.to_string()),
                Ok(want.to_owned()),
                "{spelling:?}"
            );
        }
        assert_eq!(wwpn(want).to_0x(), "0x500a0981891b8dc5");
        assert_eq!(wwpn(want).as_u64(), 0x500a_0981_891b_8dc5);
        assert_eq!(
            "0x21000024ff2c4e52".parse::<Wwpn>(),
            Ok(wwpn("21:00:00:24:ff:2c:4e:52"))
        );
    }

    #[test]
    fn malformed_wwpns_are_refused() {
        for bad in [
            "",
            "0x",
            "0x0",
            "0xffffffff",
            "500a0981891b8dc",
            "500a0981891b8dc5a",
            "500a0981891b8dcg",
            "50:0a:09:81:89:1b:8d",
            "500:a0:98:18:91:b8:dc:5",
            "50:0a:09:81:89:1b:8d:c5:00",
            "0x500a0981891b8dc5-lun-0",
            "+00a0981891b8dc5",
        ] {
            assert!(Wwpn::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }

    proptest! {
        /// Every 64-bit name reads back from each spelling it is shown in.
        #[test]
        fn every_wwpn_parses_back_from_its_spellings(n in any::<u64>()) {
            let w = Wwpn(n);
            prop_assert_eq!(Wwpn::parse(&w.to_string()), Ok(w));
            prop_assert_eq!(Wwpn::parse(&w.to_0x()), Ok(w));
        }

        /// No input panics the parser, and what it accepts is canonical.
        #[test]
        fn any_text_is_parsed_or_refused(s in "\\PC{0,40}") {
            if let Ok(w) = Wwpn::parse(&s) {
                prop_assert_eq!(Wwpn::parse(&w.to_string()), Ok(w));
            }
        }
    }
}
