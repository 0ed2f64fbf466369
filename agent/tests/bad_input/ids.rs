//! Identifiers: WWPNs, SCSI addresses, portals, by-path names and node
//! names. Each either parses to a value that prints back to a spelling
//! that parses to the same value, or is refused with an error that says
//! what it is and why. WWIDs and volume IDs are the contract crate's
//! (contract/tests/bad_input/ids.rs).

use std::sync::OnceLock;

use csi_scsi_agent::host::fc::Wwpn;
use csi_scsi_agent::host::iscsiadm::Portal;
use csi_scsi_agent::host::sysfs::{ByPath, DeviceState, Hctl, ScanAddress};
use csi_scsi_certs::{CertificateAuthority, Identity, TrustDomain, Validity};
use proptest::prelude::*;
use proptest::sample::select;

use crate::support::{
    clear_error, config, hex, hostile_text, is_node_name, near_miss, valid_or_near,
};

/// The kernel's SCSI device states.
const STATES: [&str; 10] = [
    "running",
    "offline",
    "transport-offline",
    "blocked",
    "created",
    "created-block",
    "quiesce",
    "cancel",
    "deleted",
    "cancel-offline",
];

proptest! {
    #![proptest_config(config(1024))]

    /// A WWPN in any of its spellings is the same port; anything else is a
    /// clear refusal.
    #[test]
    fn wwpns_parse_in_every_spelling_or_are_refused(
        value in any::<u64>(),
        noise in valid_or_near(hex(16)),
        upper in any::<bool>(),
        sep in select(vec![None, Some(':'), Some('-')]),
    ) {
        let plain = format!("{value:016x}");
        let plain = if upper { plain.to_ascii_uppercase() } else { plain };
        let spelled = match sep {
            None => plain.clone(),
            Some(c) => plain
                .as_bytes()
                .chunks(2)
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .collect::<Vec<_>>()
                .join(&c.to_string()),
        };
        let w = Wwpn::parse(&spelled).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(w.as_u64(), value);
        prop_assert_eq!(Wwpn::parse(&w.to_0x()), Ok(w));
        prop_assert_eq!(Wwpn::parse(&format!(" 0X{plain}\n")), Ok(w));
        prop_assert_eq!(w.to_string(), format!("{value:016x}"));
        match Wwpn::parse(&noise) {
            Ok(n) => prop_assert_eq!(Wwpn::parse(&n.to_string()), Ok(n)),
            Err(e) => clear_error(&e, &["WWPN"])?,
        }
    }

    /// Arbitrary text never panics the WWPN parser, and what it accepts
    /// prints back to the same port.
    #[test]
    fn any_text_is_a_wwpn_or_a_clear_refusal(input in hostile_text()) {
        match Wwpn::parse(&input) {
            Ok(w) => prop_assert_eq!(Wwpn::parse(&w.to_string()), Ok(w)),
            Err(e) => clear_error(&e, &["WWPN"])?,
        }
    }

    /// SCSI addresses print and parse back; anything else is `None`, never
    /// a panic. Scan addresses print as the kernel's `C T L` with `-`.
    #[test]
    fn scsi_addresses_round_trip(
        host in any::<u32>(), channel in any::<u32>(), target in any::<u32>(), lun in any::<u64>(),
        noise in prop_oneof![hostile_text(), near_miss(Just("1:0:0:1".to_owned()))],
        wild in any::<(bool, bool, bool)>(),
    ) {
        let h = Hctl { host, channel, target, lun };
        prop_assert_eq!(Hctl::parse(&h.to_string()), Some(h));
        if let Some(n) = Hctl::parse(&noise) {
            prop_assert_eq!(Hctl::parse(&n.to_string()), Some(n));
        }
        let scan = ScanAddress {
            channel: (!wild.0).then_some(channel),
            target: (!wild.1).then_some(target),
            lun: (!wild.2).then_some(lun),
        };
        let text = scan.to_string();
        let parts: Vec<&str> = text.split(' ').collect();
        prop_assert_eq!(parts.len(), 3, "{}", text);
        prop_assert_eq!(parts[0] == "-", wild.0);
        prop_assert_eq!(parts[2] == "-", wild.2);
    }

    /// A SCSI device state is one of the kernel's words, or kept as
    /// written (trimmed); never a panic.
    #[test]
    fn device_states_are_known_words_or_kept(
        noise in prop_oneof![
            hostile_text(),
            valid_or_near(select(STATES.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())),
        ],
    ) {
        match DeviceState::parse(&noise) {
            DeviceState::Unknown(s) => {
                prop_assert_eq!(s.as_str(), noise.trim());
                prop_assert!(!STATES.contains(&noise.trim()), "{:?} not recognised", noise);
            }
            DeviceState::Running => prop_assert_eq!(noise.trim(), "running"),
            _ => prop_assert!(STATES.contains(&noise.trim()), "{:?} recognised", noise),
        }
    }

    /// A portal (IPv4, IPv6 with or without brackets, host name) prints
    /// and parses back; a bare address gets the iSCSI port.
    #[test]
    fn portals_round_trip(
        address in prop_oneof![
            (any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>()).prop_map(|(a, b, c, d)| format!("{a}.{b}.{c}.{d}")),
            any::<[u16; 8]>().prop_map(|g| std::net::Ipv6Addr::from(g).to_string()),
            "fe80::[0-9a-f]{1,4}%eth[0-9]",
            "[a-z][a-z0-9-]{0,20}(\\.[a-z][a-z0-9-]{0,20}){0,3}",
        ],
        port in 1u16..,
    ) {
        let p = Portal::new(&address, port).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(Portal::parse(&p.to_string()), Ok(p.clone()));
        prop_assert_eq!(p.address(), address.as_str());
        prop_assert_eq!(p.port(), port);
        let bare = if address.contains(':') { format!("[{address}]") } else { address.clone() };
        prop_assert_eq!(Portal::parse(&bare).map(|p| p.port()), Ok(3260));
    }

    /// Anything near a portal is a portal that prints back, or a clear
    /// refusal; a portal never starts with `-` (it is passed to iscsiadm).
    #[test]
    fn portal_near_misses_are_refused_clearly(
        input in prop_oneof![
            hostile_text(),
            near_miss(select(vec![
                "10.0.0.1:3260".to_owned(),
                "[fe80::1]:3260".to_owned(),
                "array-a.example:860".to_owned(),
            ])),
            "-[a-z]{1,8}(:[0-9]{1,5})?",
        ]
    ) {
        match Portal::parse(&input) {
            Ok(p) => {
                prop_assert!(!p.address().is_empty() && !p.address().starts_with('-'));
                prop_assert!(p.port() != 0);
                prop_assert_eq!(Portal::parse(&p.to_string()), Ok(p.clone()));
            }
            Err(e) => clear_error(&e, &["portal"])?,
        }
    }

    /// by-path names udev makes for iSCSI and FC paths decode to their
    /// portal, target, WWPN and LUN; anything else is `None`.
    #[test]
    fn by_path_names_decode(
        portal in prop_oneof![
            (any::<u8>(), any::<u8>(), 1u16..).prop_map(|(a, b, port)| format!("10.{a}.{b}.1:{port}")),
            any::<[u16; 8]>().prop_map(|g| format!("[{}]:3260", std::net::Ipv6Addr::from(g))),
        ],
        target in "iqn\\.[0-9]{4}-[0-9]{2}\\.[a-z.]{1,20}(:[!-~]{1,30})?",
        wwpn in any::<u64>(),
        lun in any::<u64>(),
        bus in select(vec!["", "pci-0000:05:00.0-", "platform-3b000000.fc-pci-0000:01:00.1-"]),
        noise in prop_oneof![hostile_text(), near_miss(Just("ip-10.0.0.1:3260-iscsi-iqn.2000-01.a:b-lun-1".to_owned()))],
    ) {
        // udev spells LUNs above 255 as 0x + 16 hex digits.
        let lun_text = if lun < 256 { lun.to_string() } else { format!("0x{lun:016x}") };
        let p = Portal::parse(&portal).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let name = format!("ip-{portal}-iscsi-{target}-lun-{lun_text}");
        prop_assert_eq!(
            ByPath::parse(&name),
            Some(ByPath::Iscsi { portal: p, target: target.clone(), lun }),
            "{}", name
        );
        prop_assert_eq!(ByPath::parse(&format!("{name}-part1")), None);
        let w = Wwpn::parse(&format!("{wwpn:016x}")).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let fc = format!("{bus}fc-{}-lun-{lun_text}", w.to_0x());
        prop_assert_eq!(ByPath::parse(&fc), Some(ByPath::Fc { wwpn: w, lun }), "{}", fc);
        if let Some(ByPath::Iscsi { target, .. }) = ByPath::parse(&noise) {
            prop_assert!(!target.is_empty() && target.chars().all(|c| c.is_ascii_graphic()));
        }
    }
}

/// A valid node name.
fn node_name() -> impl Strategy<Value = String> + Clone {
    "[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?(\\.[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?){0,3}"
}

/// Names near a node name: one edit, `..` and `/` (path segments in a
/// SPIFFE URI), upper case, an over-long label or name. Node names come
/// from the operator (flags, the certs CLI) and errors quote them whole,
/// so they are kept to 300 characters.
fn node_name_input() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => node_name(),
        4 => near_miss(node_name()),
        1 => hostile_text(),
        1 => node_name().prop_map(|n| format!("../{n}")),
        1 => node_name().prop_map(|n| format!("{n}/../proxy")),
        1 => "[a-z]{64,70}",
        1 => "[a-z]{60}(\\.[a-z]{60}){3,4}",
    ]
    .prop_map(|n| n.chars().take(300).collect())
}

fn domain() -> TrustDomain {
    TrustDomain::new("csi-scsi.local").expect("valid trust domain")
}

/// One CA for every case: creating it is the slow part.
fn ca() -> &'static CertificateAuthority {
    static CA: OnceLock<CertificateAuthority> = OnceLock::new();
    CA.get_or_init(|| {
        csi_scsi_certs::install_crypto_provider();
        CertificateAuthority::create(&domain(), Validity::days(1)).expect("CA")
    })
}

proptest! {
    #![proptest_config(config(1024))]

    /// A peer certificate's SPIFFE URI names a node only when the node
    /// name is a DNS-1123 subdomain, and then it is exactly that node's
    /// URI; a trust domain is checked the same way.
    #[test]
    fn spiffe_uris_name_only_valid_nodes(
        node in node_name_input(),
        // A trust domain is a flag the operator sets, and its error quotes
        // it whole: kept to a flag's length here.
        td in prop_oneof![hostile_text(), near_miss(Just("csi-scsi.local".to_owned()))]
            .prop_map(|t| t.chars().take(300).collect::<String>()),
    ) {
        let d = domain();
        let uri = format!("spiffe://csi-scsi.local/node/{node}");
        match d.parse_uri(&uri) {
            Some(Identity::Node(n)) => {
                prop_assert!(is_node_name(&n), "accepted node name {n:?}");
                prop_assert_eq!(d.uri(&Identity::Node(n.clone())), uri);
                prop_assert_eq!(n, node);
            }
            Some(Identity::Proxy) => return Err(TestCaseError::fail(format!("{uri:?} parsed as the proxy"))),
            None => prop_assert!(!is_node_name(&node), "refused valid node name {node:?}"),
        }
        match TrustDomain::new(&td) {
            Ok(t) => prop_assert_eq!(t.as_str(), td.as_str()),
            Err(e) => clear_error(&e, &["trust domain"])?,
        }
    }
}

proptest! {
    // Each case generates a key pair.
    #![proptest_config(config(48))]

    /// The CA issues an agent certificate only for a valid node name, and
    /// refuses any other with an error naming it.
    #[test]
    fn certificates_are_issued_only_for_valid_node_names(node in node_name_input()) {
        match ca().issue(&Identity::Node(node.clone()), Validity::days(1)) {
            Ok(c) => {
                prop_assert!(is_node_name(&node), "issued a certificate for {node:?}");
                prop_assert_eq!(c.identity, Identity::Node(node));
            }
            Err(e) => {
                prop_assert!(!is_node_name(&node), "refused valid node name {node:?}: {e}");
                clear_error(&e, &["node name", "URI"])?;
            }
        }
    }
}
