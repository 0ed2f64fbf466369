//! `Wwid`: the one stable identity of a LUN (its VPD page 0x83
//! logical-unit designator), in one canonical form whichever spelling it
//! was read in: the kernel's `device/wwid` (`naa.6001405d…`), udev's
//! `ID_SERIAL` (`36001405d…`), a `/dev/disk/by-id` name (`wwn-0x6001405d…`,
//! `scsi-36001405d…`, `dm-uuid-mpath-36001405d…`) or a dm uuid
//! (`mpath-36001405d…`).
//!
//! Canonical form: `naa.<lower hex>`, `eui.<lower hex>`, `t10.<id>` (runs of
//! blanks as one `_`, as udev spells them) or `name.<scsi name string>`.

use std::fmt;

use csi_scsi_textfs::excerpt;

/// A LUN's WWID in canonical form.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Wwid(String);

/// The longest canonical WWID. The proxy accepts no longer, and no real
/// designator comes near it.
pub const MAX_LEN: usize = 256;

/// The longest text [`Wwid::parse`] reads: [`MAX_LEN`] plus room for the
/// longest spelling of a canonical WWID, its by-id name
/// `dm-uuid-mpath-<udev serial>` (11 characters longer).
const MAX_INPUT_LEN: usize = MAX_LEN + 16;
// The refusal below spells the limit out.
const _: () = assert!(MAX_INPUT_LEN == 272);

/// [`Wwid::parse_canonical`]'s reason for a WWID spelled another way.
pub const NOT_CANONICAL: &str =
    "not in canonical form (naa./eui./t10./name., lower-case hex, no blanks)";

/// Why a string is not a WWID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid WWID {input:?}: {reason}")]
pub struct InvalidWwid {
    /// What was given, cut to an [`excerpt`] (control characters escaped
    /// by `Debug`).
    pub input: String,
    /// Why it was refused.
    pub reason: &'static str,
}

/// The designator kind, as VPD page 0x83 types it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WwidKind {
    /// NAA (type 3).
    Naa,
    /// EUI-64 (type 2).
    Eui,
    /// T10 vendor ID (type 1).
    T10,
    /// SCSI name string (type 8).
    Name,
}

// === impl Wwid ===

impl Wwid {
    /// Parses any of the spellings listed in the module doc.
    pub fn parse(input: &str) -> Result<Self, InvalidWwid> {
        let bad = |reason| InvalidWwid {
            input: excerpt(input),
            reason,
        };
        let s = input.trim_matches(|c: char| c == '\0' || c.is_ascii_whitespace());
        if s.is_empty() {
            return Err(bad("empty"));
        }
        if s.chars().any(|c| c.is_control()) {
            return Err(bad("contains control characters"));
        }
        if s.len() > MAX_INPUT_LEN {
            return Err(bad("longer than 272 characters"));
        }
        let s = s
            .strip_prefix("dm-uuid-mpath-")
            .or_else(|| s.strip_prefix("mpath-"))
            .or_else(|| s.strip_prefix("scsi-"))
            .unwrap_or(s);
        if let Some(hex) = s.strip_prefix("wwn-0x").or_else(|| s.strip_prefix("0x")) {
            return Self::from_hex(WwidKind::Naa, hex).map_err(bad);
        }
        let (kind, rest) = if let Some(r) = s.strip_prefix("naa.") {
            (WwidKind::Naa, r)
        } else if let Some(r) = s.strip_prefix("eui.") {
            (WwidKind::Eui, r)
        } else if let Some(r) = s.strip_prefix("t10.") {
            (WwidKind::T10, r)
        } else if let Some(r) = s.strip_prefix("name.") {
            (WwidKind::Name, r)
        } else {
            // udev's ID_SERIAL: the designator type as one leading digit.
            match s.split_at_checked(1) {
                Some(("3", r)) => (WwidKind::Naa, r),
                Some(("2", r)) => (WwidKind::Eui, r),
                Some(("1", r)) => (WwidKind::T10, r),
                Some(("8", r)) => (WwidKind::Name, r),
                _ => {
                    return Err(bad(
                        "unknown designator prefix (want naa., eui., t10., or a udev type digit)",
                    ));
                }
            }
        };
        match kind {
            WwidKind::Naa | WwidKind::Eui => Self::from_hex(kind, rest).map_err(bad),
            WwidKind::T10 | WwidKind::Name => Self::from_text(kind, rest).map_err(bad),
        }
    }

    /// Parses only the canonical spelling, exactly (no other prefix, case
    /// or blanks): for a WWID this driver wrote itself (an ID it issued, a
    /// stored key), where any other spelling means it did not write it.
    pub fn parse_canonical(input: &str) -> Result<Self, InvalidWwid> {
        let wwid = Self::parse(input)?;
        if wwid.as_str() != input {
            return Err(InvalidWwid {
                input: excerpt(input),
                reason: NOT_CANONICAL,
            });
        }
        Ok(wwid)
    }

    /// A WWID from a designator's identifier bytes (VPD page 0x83).
    pub fn from_designator(kind: WwidKind, identifier: &[u8]) -> Result<Self, InvalidWwid> {
        let bad = |reason| InvalidWwid {
            input: excerpt(&format!("{identifier:02x?}")),
            reason,
        };
        match kind {
            WwidKind::Naa | WwidKind::Eui => {
                let hex: String = identifier.iter().map(|b| format!("{b:02x}")).collect();
                Self::from_hex(kind, &hex).map_err(bad)
            }
            WwidKind::T10 | WwidKind::Name => {
                let text = std::str::from_utf8(identifier).map_err(|_| bad("not UTF-8"))?;
                let text = text.trim_end_matches('\0');
                if text.chars().any(|c| c.is_control()) {
                    return Err(bad("contains control characters"));
                }
                Self::from_text(kind, text).map_err(bad)
            }
        }
    }

    fn from_hex(kind: WwidKind, hex: &str) -> Result<Self, &'static str> {
        let valid_len = match kind {
            // NAA 2/3/5 are 8 bytes, NAA 6 is 16.
            WwidKind::Naa => matches!(hex.len(), 16 | 32),
            WwidKind::Eui => matches!(hex.len(), 16 | 24 | 32),
            _ => false,
        };
        if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err("identifier is not hexadecimal");
        }
        if !valid_len {
            return Err("identifier has the wrong length for its designator type");
        }
        let prefix = if kind == WwidKind::Naa { "naa" } else { "eui" };
        Ok(Self(format!("{prefix}.{}", hex.to_ascii_lowercase())))
    }

    fn from_text(kind: WwidKind, text: &str) -> Result<Self, &'static str> {
        // SPC-4: a SCSI name string starts with "iqn.", "eui." or "naa.";
        // anything else is a label (InfiniBox's "vol=...") or an edited
        // example, not an identity.
        let named = ["iqn.", "eui.", "naa."].iter().any(|p| {
            text.get(..p.len())
                .is_some_and(|h| h.eq_ignore_ascii_case(p))
        });
        if kind == WwidKind::Name && !named {
            return Err("SCSI name string must start with iqn., eui. or naa.");
        }
        // udev replaces blanks with '_'; do the same so every source agrees.
        let words: Vec<&str> = text.split([' ', '_']).filter(|w| !w.is_empty()).collect();
        if words.is_empty() {
            return Err("empty identifier");
        }
        if words
            .iter()
            .any(|w| w.chars().any(|c| !c.is_ascii_graphic()))
        {
            return Err("identifier has characters outside printable ASCII");
        }
        let prefix = if kind == WwidKind::T10 { "t10" } else { "name" };
        let canonical = format!("{prefix}.{}", words.join("_"));
        // Every accepted WWID must parse again from its canonical text and
        // its by-id names, and fit what the proxy stores.
        if canonical.len() > MAX_LEN {
            return Err("identifier too long (a canonical WWID has at most 256 characters)");
        }
        Ok(Self(canonical))
    }

    /// The canonical text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The designator kind.
    pub fn kind(&self) -> WwidKind {
        match self.0.split_once('.').map(|(p, _)| p) {
            Some("naa") => WwidKind::Naa,
            Some("eui") => WwidKind::Eui,
            Some("t10") => WwidKind::T10,
            _ => WwidKind::Name,
        }
    }

    /// The identifier without its `naa.`-style prefix.
    pub fn identifier(&self) -> &str {
        self.0.split_once('.').map(|(_, id)| id).unwrap_or(&self.0)
    }

    /// udev's `ID_SERIAL` spelling (`3` + NAA hex, …), which multipath also
    /// uses: `dm-uuid-mpath-<this>` and `scsi-<this>` in `/dev/disk/by-id`.
    pub fn udev_serial(&self) -> String {
        let digit = match self.kind() {
            WwidKind::Naa => '3',
            WwidKind::Eui => '2',
            WwidKind::T10 => '1',
            WwidKind::Name => '8',
        };
        format!("{digit}{}", self.identifier())
    }

    /// Names under `/dev/disk/by-id` that point at this LUN, best first: the
    /// multipath map, then the `wwn-` and `scsi-` links of one path.
    pub fn by_id_names(&self) -> Vec<String> {
        let serial = self.udev_serial();
        let mut names = vec![format!("dm-uuid-mpath-{serial}")];
        if self.kind() == WwidKind::Naa {
            names.push(format!("wwn-0x{}", self.identifier()));
        }
        names.push(format!("scsi-{serial}"));
        names
    }
}

impl fmt::Display for Wwid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for Wwid {
    type Err = InvalidWwid;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

// A stored WWID is its canonical text; reading one back refuses any other
// spelling (a record written by hand, or by something that did not
// canonicalise) rather than quietly changing the key it is stored under.
crate::stored_text::stored_as_text!(Wwid, Wwid::parse_canonical);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_of_one_naa_lun_is_the_same_wwid() {
        // Spellings of one LIO LUN from the fixtures (udevadm, by-id, dm uuid).
        let want = "naa.6001405d27e5d898829468b90ce4ef8c";
        for spelling in [
            "naa.6001405d27e5d898829468b90ce4ef8c",
            "naa.6001405D27E5D898829468B90CE4EF8C\n",
            "36001405d27e5d898829468b90ce4ef8c",
            "wwn-0x6001405d27e5d898829468b90ce4ef8c",
            "scsi-36001405d27e5d898829468b90ce4ef8c",
            "dm-uuid-mpath-36001405d27e5d898829468b90ce4ef8c",
            "mpath-36001405d27e5d898829468b90ce4ef8c",
        ] {
            assert_eq!(
                Wwid::parse(spelling).map(|w| w.to_string()),
                Ok(want.to_owned()),
                "{spelling:?}"
            );
        }
    }

    #[test]
    fn naa5_eui_and_t10_parse() {
        assert_eq!(
            Wwid::parse("350002ac20398383d").expect("naa5").as_str(),
            "naa.50002ac20398383d"
        );
        assert_eq!(
            Wwid::parse("eui.0123456789abcdef").expect("eui").kind(),
            WwidKind::Eui
        );
        // multipath keeps the blanks of a T10 id; udev's by-id turns them into '_'.
        let a = Wwid::parse("1IET     00080001").expect("t10");
        let b = Wwid::parse("scsi-1IET_00080001").expect("t10 by-id");
        let c = Wwid::parse("t10.IET     00080001").expect("kernel t10");
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert_eq!(a.as_str(), "t10.IET_00080001");
    }

    #[test]
    fn malformed_wwids_are_refused_with_a_reason() {
        for bad in [
            "",
            "sdb",
            "naa.12345",
            "naa.zz05076810840239d00000000000011f",
            "828ce9096eb211eaabc8005056a49b44",
            "t10.IET\n00080001",
            "9abc",
        ] {
            assert!(Wwid::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn an_identifier_too_long_for_canonical_form_is_refused() {
        // 252 characters: "t10." makes 256, the limit; every spelling parses.
        let id = "A".repeat(252);
        let w = Wwid::parse(&format!("1{id}")).expect("at the limit");
        for name in w.by_id_names() {
            assert_eq!(Wwid::parse(&name), Ok(w.clone()), "{name}");
        }
        // One more would make a WWID that could not be parsed back.
        let e = Wwid::parse(&format!("1{id}A")).expect_err("over the limit");
        assert!(e.reason.contains("too long"), "{e}");
        assert!(Wwid::parse(&format!("8iqn.{id}")).is_err());
    }

    #[test]
    fn errors_quote_an_excerpt_of_a_long_input() {
        let e = Wwid::parse(&"x".repeat(100_000)).expect_err("too long");
        assert!(e.to_string().len() < 200, "{e}");
        assert!(e.to_string().contains("100000 bytes"), "{e}");
    }

    #[test]
    fn only_the_canonical_spelling_parses_canonically() {
        for canonical in [
            "naa.6001405d27e5d898829468b90ce4ef8c",
            "naa.50002ac20398383d",
            "eui.0123456789abcdef",
            "t10.IET_00080001",
            "name.iqn.2003-01.org:disk_1",
        ] {
            assert_eq!(
                Wwid::parse_canonical(canonical).map(|w| w.to_string()),
                Ok(canonical.to_owned())
            );
        }
        for (other, reason) in [
            ("naa.6001405D27E5D898829468B90CE4EF8C", NOT_CANONICAL),
            ("36001405d27e5d898829468b90ce4ef8c", NOT_CANONICAL),
            ("wwn-0x6001405d27e5d898829468b90ce4ef8c", NOT_CANONICAL),
            ("naa.6001405d27e5d898829468b90ce4ef8c\n", NOT_CANONICAL),
            (" naa.6001405d27e5d898829468b90ce4ef8c", NOT_CANONICAL),
            ("t10.IET     00080001", NOT_CANONICAL),
            (
                "naa.12345",
                "identifier has the wrong length for its designator type",
            ),
            ("", "empty"),
        ] {
            let e = Wwid::parse_canonical(other).expect_err(other);
            assert_eq!(e.reason, reason, "{other:?}");
            // What parses canonically is exactly what parse accepts and
            // prints back unchanged.
            assert!(Wwid::parse(other).is_err() || reason == NOT_CANONICAL);
        }
    }

    proptest::proptest! {
        /// `parse_canonical` accepts a text exactly when `parse` does and
        /// prints it back unchanged.
        #[test]
        fn canonical_parsing_is_parse_that_prints_back(s in "(naa\\.|eui\\.|t10\\.|3|wwn-0x)?[0-9a-fA-F_ ]{0,34}") {
            let canonical = Wwid::parse(&s).ok().filter(|w| w.as_str() == s);
            proptest::prop_assert_eq!(Wwid::parse_canonical(&s).ok(), canonical);
        }
    }

    #[test]
    fn by_id_names_prefer_the_multipath_map() {
        let w = Wwid::parse("naa.618cf24100f8f457014a764c000001f6").expect("wwid");
        assert_eq!(
            w.by_id_names(),
            vec![
                "dm-uuid-mpath-3618cf24100f8f457014a764c000001f6",
                "wwn-0x618cf24100f8f457014a764c000001f6",
                "scsi-3618cf24100f8f457014a764c000001f6",
            ]
        );
    }

    #[cfg(feature = "serde")]
    #[test]
    fn a_stored_wwid_reads_back_only_in_canonical_form() {
        let w = Wwid::parse("naa.6001405d27e5d898829468b90ce4ef8c").expect("wwid");
        let json = serde_json::to_string(&w).expect("serialise");
        assert_eq!(json, "\"naa.6001405d27e5d898829468b90ce4ef8c\"");
        assert_eq!(serde_json::from_str::<Wwid>(&json).expect("read back"), w);
        for refused in [
            "\"36001405d27e5d898829468b90ce4ef8c\"",
            "\"naa.6001405D27E5D898829468B90CE4EF8C\"",
            "\"sdb\"",
            "17",
        ] {
            assert!(
                serde_json::from_str::<Wwid>(refused).is_err(),
                "{refused} read as a WWID"
            );
        }
    }
}
