//! WWIDs and volume IDs: each either parses to a value that prints back to
//! a spelling that parses to the same value, or is refused with an error
//! that says what it is and why.

use csi_scsi_contract::{VolumeId, Wwid, WwidKind};
use proptest::prelude::*;
use proptest::sample::select;

use crate::generators::{binding_uid, canonical_wwid, volume_id};
use crate::support::{clear_error, config, hostile_text, near_miss};

/// Other ways tools spell the WWID whose canonical text is `c`.
fn spellings(c: &str) -> Vec<String> {
    let (prefix, id) = c.split_once('.').expect("canonical has a prefix");
    let digit = match prefix {
        "naa" => '3',
        "eui" => '2',
        "t10" => '1',
        _ => '8',
    };
    let serial = format!("{digit}{id}");
    let mut out = vec![
        c.to_owned(),
        serial.clone(),
        format!("scsi-{serial}"),
        format!("dm-uuid-mpath-{serial}"),
        format!("mpath-{serial}"),
        format!(" {c}\n"),
        format!("{c}\0\0"),
    ];
    if prefix == "naa" || prefix == "eui" {
        out.push(format!("{prefix}.{}", id.to_ascii_uppercase()));
    }
    if prefix == "naa" {
        out.push(format!("wwn-0x{id}"));
        out.push(format!("0x{id}"));
    }
    if prefix == "t10" {
        // multipath prints a T10 id with its blanks; the kernel too.
        out.push(format!("1{}", id.replace('_', "   ")));
        out.push(format!("t10.{}", id.replace('_', " ")));
    }
    out
}

/// Checks what an accepted WWID must be: canonical, stable, and reachable
/// from each name the agent derives from it.
fn check_accepted(w: &Wwid) -> Result<(), TestCaseError> {
    let s = w.as_str();
    prop_assert!(s.len() <= 256, "canonical WWID of {} bytes", s.len());
    prop_assert!(
        ["naa.", "eui.", "t10.", "name."]
            .iter()
            .any(|p| s.starts_with(p)),
        "{s:?} has no canonical prefix"
    );
    prop_assert!(
        s.chars().all(|c| c.is_ascii_graphic()),
        "{s:?} has blanks, controls or non-ASCII"
    );
    prop_assert_eq!(Wwid::parse(s), Ok(w.clone()), "canonical text re-parses");
    prop_assert_eq!(w.to_string(), s);
    prop_assert_eq!(
        Wwid::parse(&w.udev_serial()),
        Ok(w.clone()),
        "udev serial {}",
        w.udev_serial()
    );
    for name in w.by_id_names() {
        prop_assert_eq!(Wwid::parse(&name), Ok(w.clone()), "by-id name {}", name);
    }
    let want = match s.split_once('.').map(|(p, _)| p) {
        Some("naa") => WwidKind::Naa,
        Some("eui") => WwidKind::Eui,
        Some("t10") => WwidKind::T10,
        _ => WwidKind::Name,
    };
    prop_assert_eq!(w.kind(), want);
    Ok(())
}

/// Any text near or far from a WWID spelling.
fn wwid_input() -> impl Strategy<Value = String> {
    let spelled = canonical_wwid()
        .prop_flat_map(|c| select(spellings(&c)))
        .boxed();
    prop_oneof![
        2 => hostile_text(),
        2 => spelled.clone(),
        4 => near_miss(spelled),
    ]
}

proptest! {
    #![proptest_config(config(1024))]

    /// Any text is a canonical WWID or a clear refusal.
    #[test]
    fn any_text_is_a_wwid_or_a_clear_refusal(input in wwid_input()) {
        match Wwid::parse(&input) {
            Ok(w) => check_accepted(&w)?,
            Err(e) => clear_error(&e, &["invalid WWID"])?,
        }
    }

    /// Every spelling of one LUN's identity is the same WWID.
    #[test]
    fn every_spelling_of_a_wwid_is_the_same_wwid(c in canonical_wwid()) {
        match Wwid::parse(&c) {
            Ok(w) => {
                prop_assert_eq!(w.as_str(), c.as_str());
                check_accepted(&w)?;
                for s in spellings(&c) {
                    prop_assert_eq!(Wwid::parse(&s), Ok(w.clone()), "spelling {:?}", s);
                }
            }
            // Only an identifier too long for the canonical limit is refused.
            Err(e) => {
                prop_assert!(c.len() > 256, "{c:?} refused: {e}");
                clear_error(&e, &["invalid WWID"])?;
            }
        }
    }

    /// A volume ID the proxy issued parses back to its WWID and binding.
    #[test]
    fn issued_volume_ids_round_trip((c, binding) in volume_id()) {
        prop_assume!(c.len() <= 256);
        let id = format!("{c}:{binding}");
        let v = VolumeId::parse(&id).map_err(|e| TestCaseError::fail(format!("{id:?}: {e}")))?;
        prop_assert_eq!(v.wwid().as_str(), c.as_str());
        prop_assert_eq!(v.binding_uid(), binding.as_str());
        prop_assert_eq!(id.parse::<VolumeId>(), Ok(v.clone()));
        prop_assert_eq!(v.to_string(), id);
    }

    /// Near misses of a volume ID (a mutated WWID or binding, another
    /// spelling of the WWID, `..`, NULs, long fields) are refused clearly;
    /// whatever is accepted is exactly a volume ID the proxy could issue.
    #[test]
    fn volume_id_near_misses_are_refused_clearly(
        input in prop_oneof![
            2 => hostile_text(),
            4 => near_miss(volume_id().prop_map(|(c, b)| format!("{c}:{b}"))),
            2 => (canonical_wwid(), binding_uid())
                .prop_flat_map(|(c, b)| select(spellings(&c)).prop_map(move |s| format!("{s}:{b}"))),
            1 => "(\\.\\./)+[a-z]{1,8}:[a-z0-9]{1,8}",
        ]
    ) {
        match VolumeId::parse(&input) {
            Ok(v) => {
                prop_assert_eq!(v.to_string(), input.as_str(), "accepted a volume ID that does not print back the same");
                check_accepted(v.wwid())?;
                let b = v.binding_uid();
                prop_assert!(!b.is_empty() && b.len() <= 64);
                prop_assert!(b.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
            }
            Err(e) => clear_error(&e, &["volume ID"])?,
        }
    }
}
