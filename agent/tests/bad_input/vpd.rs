//! VPD pages 0x83 and 0x80 as the kernel caches them in sysfs: arbitrary
//! bytes never panic the parser; pages built from designators parse back to
//! them, and truncated ones to the complete prefix; the LUN's WWID is the
//! best logical-unit designator.

use csi_scsi_agent::vpd::{
    Association, CodeSet, DesignatorType, PageLayout, VpdError, lun_wwid,
    parse_device_identification, parse_unit_serial,
};
use csi_scsi_contract::Wwid;
use proptest::prelude::*;

use crate::support::{clear_error, config};

/// One designation descriptor, as its header fields.
#[derive(Clone, Debug)]
struct Desc {
    protocol: u8,
    code_set: u8,
    piv: bool,
    association: u8,
    designator_type: u8,
    identifier: Vec<u8>,
}

impl Desc {
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.protocol << 4 | self.code_set);
        out.push(u8::from(self.piv) << 7 | self.association << 4 | self.designator_type);
        // Byte 2 is reserved (zero) in every real header.
        out.push(0);
        out.push(u8::try_from(self.identifier.len()).expect("identifier fits a byte"));
        out.extend_from_slice(&self.identifier);
    }

    fn len(&self) -> usize {
        4 + self.identifier.len()
    }
}

/// A page 0x83 holding `descs`.
fn page(peripheral: u8, descs: &[Desc]) -> Vec<u8> {
    let mut body = Vec::new();
    for d in descs {
        d.encode(&mut body);
    }
    let len = u16::try_from(body.len()).expect("page fits");
    let mut page = vec![peripheral, 0x83];
    page.extend_from_slice(&len.to_be_bytes());
    page.extend(body);
    page
}

fn code_set(n: u8) -> CodeSet {
    match n {
        1 => CodeSet::Binary,
        2 => CodeSet::Ascii,
        3 => CodeSet::Utf8,
        n => CodeSet::Reserved(n),
    }
}

fn association(n: u8) -> Association {
    match n {
        0 => Association::LogicalUnit,
        1 => Association::TargetPort,
        2 => Association::TargetDevice,
        _ => Association::Reserved,
    }
}

fn designator_type(n: u8) -> DesignatorType {
    match n {
        0 => DesignatorType::VendorSpecific,
        1 => DesignatorType::T10VendorId,
        2 => DesignatorType::Eui64,
        3 => DesignatorType::Naa,
        4 => DesignatorType::RelativeTargetPort,
        5 => DesignatorType::TargetPortGroup,
        6 => DesignatorType::LogicalUnitGroup,
        7 => DesignatorType::Md5LogicalUnit,
        8 => DesignatorType::ScsiNameString,
        9 => DesignatorType::ProtocolSpecific,
        0xa => DesignatorType::Uuid,
        n => DesignatorType::Reserved(n),
    }
}

/// Any descriptor: every header value, identifiers of every length up to
/// the 255 bytes a header can declare.
fn any_desc() -> impl Strategy<Value = Desc> {
    (
        0u8..16,
        0u8..16,
        any::<bool>(),
        0u8..4,
        0u8..16,
        prop_oneof![
            3 => prop::collection::vec(any::<u8>(), 0..24),
            1 => prop::collection::vec(any::<u8>(), 0..=255),
        ],
    )
        .prop_map(
            |(protocol, code_set, piv, association, designator_type, identifier)| Desc {
                protocol,
                code_set,
                piv,
                association,
                designator_type,
                identifier,
            },
        )
}

/// Descriptors shaped like real identities, with some of their fields
/// pushed out of range: NAA and EUI binary or as hex text, T10 and SCSI
/// name strings with NUL padding, blanks and controls.
fn identity_desc() -> impl Strategy<Value = Desc> {
    let text = prop_oneof![
        "[A-Z]{1,8} {0,4}[A-Za-z0-9]{1,40}\0{0,4}",
        "(iqn|eui|naa|vol=|host=)[!-~]{0,60}\0{0,4}",
        "[ -~]{0,10}[\0-\x1f][ -~]{0,10}",
        "[!-~]{240,255}",
    ]
    .prop_map(String::into_bytes);
    prop_oneof![
        (prop_oneof![Just(8usize), Just(16), 0usize..20], 0u8..2)
            .prop_flat_map(|(n, a)| (prop::collection::vec(any::<u8>(), n), Just(a)))
            .prop_map(|(id, a)| (1u8, a, 3u8, id)),
        (prop_oneof![Just(8usize), Just(12), Just(16), 0usize..20])
            .prop_flat_map(|n| prop::collection::vec(any::<u8>(), n))
            .prop_map(|id| (1u8, 0u8, 2u8, id)),
        "[0-9a-fA-F]{14,34}".prop_map(|h| (2u8, 0u8, 3u8, h.into_bytes())),
        (text.clone(), 2u8..4).prop_map(|(t, c)| (c, 0u8, 1u8, t)),
        (text, 2u8..4).prop_map(|(t, c)| (c, 0u8, 8u8, t)),
    ]
    .prop_map(
        |(code_set, association, designator_type, identifier)| Desc {
            protocol: 0,
            code_set,
            piv: false,
            association,
            designator_type,
            identifier,
        },
    )
}

fn descs() -> impl Strategy<Value = Vec<Desc>> {
    prop::collection::vec(prop_oneof![any_desc(), identity_desc()], 0..8)
}

/// The designators a page must parse to, from what was encoded.
fn check_designators(
    got: &[csi_scsi_agent::vpd::Designator],
    want: &[Desc],
) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        prop_assert_eq!(g.protocol_id, w.piv.then_some(w.protocol));
        prop_assert_eq!(g.code_set, code_set(w.code_set));
        prop_assert_eq!(g.association, association(w.association));
        prop_assert_eq!(g.designator_type, designator_type(w.designator_type));
        prop_assert_eq!(&g.identifier, &w.identifier);
    }
    Ok(())
}

/// What a WWID taken from a page must be: canonical and re-parseable.
fn check_wwid(w: &Wwid) -> Result<(), TestCaseError> {
    prop_assert!(w.as_str().len() <= 256, "{} bytes", w.as_str().len());
    prop_assert!(
        w.as_str().chars().all(|c| c.is_ascii_graphic()),
        "{:?}",
        w.as_str()
    );
    prop_assert_eq!(Wwid::parse(w.as_str()), Ok(w.clone()));
    for name in w.by_id_names() {
        prop_assert_eq!(Wwid::parse(&name), Ok(w.clone()), "by-id name {}", name);
    }
    Ok(())
}

fn clear_vpd_error(e: &VpdError) -> Result<(), TestCaseError> {
    clear_error(e, &["VPD", "serial"])
}

proptest! {
    #![proptest_config(config(1024))]

    /// Arbitrary bytes (as any page, and with the page code forced to
    /// 0x83 so the walk is reached) parse or are refused clearly; any WWID
    /// found is canonical.
    #[test]
    fn arbitrary_bytes_never_panic_the_page_parser(
        mut bytes in prop::collection::vec(any::<u8>(), 0..600),
        force in any::<bool>(),
    ) {
        if force && bytes.len() > 1 {
            bytes[1] = 0x83;
        }
        match parse_device_identification(&bytes) {
            Ok(id) => {
                prop_assert!(bytes.len() >= 4 && bytes[1] == 0x83);
                prop_assert_eq!(id.peripheral, bytes[0]);
                if let Some(w) = id.lun_wwid() {
                    check_wwid(&w)?;
                }
            }
            Err(e) => {
                prop_assert!(bytes.len() < 4 || bytes[1] != 0x83, "refused a page 0x83: {e}");
                clear_vpd_error(&e)?;
            }
        }
        match lun_wwid(&bytes) {
            Ok(Some(w)) => check_wwid(&w)?,
            Ok(None) => {}
            Err(e) => clear_vpd_error(&e)?,
        }
    }

    /// A page built from designators parses back to exactly them.
    #[test]
    fn pages_round_trip(peripheral in any::<u8>(), descs in descs()) {
        let bytes = page(peripheral, &descs);
        let id = parse_device_identification(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(id.layout, PageLayout::Descriptors);
        prop_assert!(!id.truncated);
        check_designators(&id.designators, &descs)?;
        if let Some(w) = id.lun_wwid() {
            check_wwid(&w)?;
        }
    }

    /// A page cut short keeps the designators that were complete, and says
    /// it was truncated.
    #[test]
    fn truncated_pages_keep_their_complete_designators(
        descs in descs(),
        cut in any::<prop::sample::Index>(),
    ) {
        let bytes = page(0, &descs);
        let k = 4 + cut.index(bytes.len() - 3);
        let id = parse_device_identification(&bytes[..k]).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut end = 4;
        let complete = descs
            .iter()
            .take_while(|d| {
                end += d.len();
                end <= k
            })
            .count();
        // A 16-byte remainder is the old EMC layout only when its byte 2 is
        // not zero, which a real header's reserved byte never is.
        prop_assert_eq!(id.layout, PageLayout::Descriptors);
        check_designators(&id.designators, &descs[..complete])?;
        prop_assert_eq!(id.truncated, k < bytes.len());
    }

    /// The LUN's WWID is the logical-unit NAA of the best NAA type (6, then
    /// 5, then others; the first on a tie), whatever else the page holds:
    /// target-port NAAs, labels, reserved types.
    #[test]
    fn the_best_logical_unit_naa_is_the_wwid(
        naas in prop::collection::vec(
            (prop_oneof![Just(8usize), Just(16)], 0u8..16, prop_oneof![Just(0u8), 1u8..4])
                .prop_flat_map(|(n, nibble, assoc)| {
                    (prop::collection::vec(any::<u8>(), n), Just(nibble), Just(assoc))
                })
                .prop_map(|(mut id, nibble, association)| {
                    id[0] = nibble << 4 | (id[0] & 0x0f);
                    Desc { protocol: 0, code_set: 1, piv: false, association, designator_type: 3, identifier: id }
                }),
            1..5,
        ),
        others in prop::collection::vec(
            any_desc().prop_filter("not an identity type", |d| !matches!(d.designator_type, 1 | 2 | 3 | 8)),
            0..4,
        ),
        order in any::<prop::sample::Index>(),
    ) {
        let mut all = naas.clone();
        let at = order.index(all.len() + 1);
        for (i, o) in others.into_iter().enumerate() {
            all.insert((at + i).min(all.len()), o);
        }
        let rank = |d: &Desc| match d.identifier[0] >> 4 { 6 => 2, 5 => 1, _ => 0 };
        let best = all
            .iter()
            .filter(|d| d.designator_type == 3 && d.association == 0)
            .fold(None::<&Desc>, |best, d| match best {
                Some(b) if rank(b) >= rank(d) => Some(b),
                _ => Some(d),
            });
        let got = lun_wwid(&page(0, &all)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let want = best.map(|d| {
            format!("naa.{}", d.identifier.iter().map(|b| format!("{b:02x}")).collect::<String>())
        });
        prop_assert_eq!(got.as_ref().map(Wwid::as_str), want.as_deref());
    }

    /// The old EMC layout (a bare 16-byte NAA 6 after the header) is read
    /// as that NAA.
    #[test]
    fn legacy_emc_pages_give_their_naa(mut naa in prop::collection::vec(any::<u8>(), 16)) {
        naa[0] = 0x60 | (naa[0] & 0x0f);
        naa[2] |= 1;
        let mut bytes = vec![0, 0x83, 0, 16];
        bytes.extend_from_slice(&naa);
        let id = parse_device_identification(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(id.layout, PageLayout::LegacyEmcNaa);
        let hex: String = naa.iter().map(|b| format!("{b:02x}")).collect();
        prop_assert_eq!(id.lun_wwid().map(|w| w.to_string()), Some(format!("naa.{hex}")));
    }

    /// A unit serial page gives the serial trimmed of NULs and blanks, or
    /// nothing, or a clear refusal; never a serial with controls.
    #[test]
    fn unit_serials_are_printable_or_refused(
        serial in prop_oneof!["[!-~]([ -~]{0,30}[!-~])?", "[ -~]{0,8}[\0-\x1f\x7f-\u{ff}][ -~]{0,8}"],
        pad in "[ \0]{0,4}",
        garbage in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let body = format!("{pad}{serial}{pad}").into_bytes();
        let mut bytes = vec![0, 0x80, 0, u8::try_from(body.len()).expect("short")];
        bytes.extend(body);
        let trimmed = serial.trim_matches(|c: char| c == '\0' || c.is_ascii_whitespace());
        match parse_unit_serial(&bytes) {
            Ok(Some(s)) => prop_assert_eq!(s, trimmed),
            Ok(None) => prop_assert!(trimmed.is_empty()),
            Err(e) => {
                prop_assert!(!trimmed.bytes().all(|b| (0x20..=0x7e).contains(&b)), "refused {serial:?}: {e}");
                clear_vpd_error(&e)?;
            }
        }
        match parse_unit_serial(&garbage) {
            Ok(Some(s)) => {
                prop_assert!(!s.is_empty() && s.bytes().all(|b| (0x20..=0x7e).contains(&b)));
                prop_assert_eq!(s.trim(), s.as_str());
            }
            Ok(None) => {}
            Err(e) => clear_vpd_error(&e)?,
        }
    }
}
