//! What the agent reads from `iscsiadm` and `multipath`: listings built
//! from known sessions, records and maps parse back to them; the captured
//! outputs in the fixtures, with lines dropped, cut, doubled or replaced,
//! and arbitrary text never panic the parsers, and whatever they return is
//! well formed (a valid target name, portal and WWID).

use csi_scsi_agent::host::iscsiadm::{
    AttachedDisk, NodeRecord, Portal, SessionDetail, SessionEntry, parse_node_list,
    parse_session_detail, parse_session_list,
};
use csi_scsi_agent::host::multipath::{TopologyMap, TopologyPath, parse_topology};
use csi_scsi_agent::host::sysfs::Hctl;
use csi_scsi_agent::wwid::Wwid;
use proptest::prelude::*;
use proptest::sample::{Index, select};

use crate::ids::canonical_wwid;
use crate::support::{config, fixtures_in, hostile_text, mutate_lines};

fn target_name() -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        "iqn\\.[0-9]{4}-[0-9]{2}\\.[a-z]{1,10}(\\.[a-z0-9]{1,8}){0,2}(:[a-z0-9.:-]{1,20})?",
        "eui\\.[0-9A-F]{16}",
    ]
}

fn portal() -> impl Strategy<Value = Portal> + Clone {
    (
        prop_oneof![
            (any::<u8>(), any::<u8>()).prop_map(|(a, b)| format!("10.{a}.{b}.1")),
            any::<[u16; 8]>().prop_map(|g| std::net::Ipv6Addr::from(g).to_string()),
        ],
        1u16..,
    )
        .prop_map(|(a, p)| Portal::new(&a, p).expect("generated portal"))
}

fn tpgt() -> impl Strategy<Value = i32> + Clone {
    prop_oneof![Just(-1), Just(1), any::<i32>()]
}

/// Lines that look like tool output and are not valid records.
fn junk() -> impl Strategy<Value = String> {
    prop_oneof![
        hostile_text().prop_map(|t| t.replace('\n', " ")),
        Just("iscsiadm: No active sessions.".to_owned()),
        Just("Target: -o (non-flash)".to_owned()),
        Just("\tCurrent Portal: 10.0.0.1:0,1".to_owned()),
        Just("tcp: [x] 10.0.0.1:3260,1 iqn.a (non-flash)".to_owned()),
        Just("Oct 13 10:24:01 | sdc: couldn't get asymmetric access state".to_owned()),
        Just("mpathx (not-a-wwid) dm-3 IBM,2145".to_owned()),
        Just("  |- 1:0:0:x sdz 8:0 active ready running".to_owned()),
        Just("`-+- policy='service-time 0' prio=0 status=enabled".to_owned()),
    ]
}

/// Checks what every parsed iSCSI record must be.
fn check_target(t: &str) -> Result<(), TestCaseError> {
    prop_assert!(!t.is_empty() && t.len() <= 223, "target {t:?}");
    prop_assert!(t.chars().all(|c| c.is_ascii_graphic()), "target {t:?}");
    Ok(())
}

fn check_portal(p: &Portal) -> Result<(), TestCaseError> {
    prop_assert!(!p.address().is_empty() && !p.address().starts_with('-'));
    prop_assert!(p.port() != 0);
    prop_assert_eq!(Portal::parse(&p.to_string()), Ok(p.clone()));
    Ok(())
}

fn check_iscsi_outputs(text: &str) -> Result<(), TestCaseError> {
    for r in parse_node_list(text) {
        check_target(&r.target)?;
        check_portal(&r.portal)?;
    }
    for s in parse_session_list(text) {
        check_target(&s.target)?;
        check_portal(&s.portal)?;
        check_target(&s.transport)?;
    }
    for d in parse_session_detail(text) {
        check_target(&d.target)?;
        check_portal(&d.current_portal)?;
        if let Some(p) = &d.persistent_portal {
            check_portal(p)?;
        }
        for disk in &d.disks {
            prop_assert!(!disk.kernel_name.is_empty());
            prop_assert!(disk.kernel_name.chars().all(|c| c.is_ascii_alphanumeric()));
        }
    }
    Ok(())
}

/// One map of `multipath -ll`, with its printed spelling of the WWID.
#[derive(Clone, Debug)]
struct MapSpec {
    map: TopologyMap,
    wwid_text: String,
    old_format: bool,
}

fn path_spec() -> impl Strategy<Value = (Hctl, String, String, [String; 3])> {
    (
        (0u32..64, 0u32..4, 0u32..64, 0u64..512),
        "sd[a-z]{1,3}",
        (0u32..260, 0u32..1024).prop_map(|(a, b)| format!("{a}:{b}")),
        (
            select(vec!["active", "failed"]),
            select(vec!["ready", "faulty", "ghost", "undef", "i/o pending"]),
            select(vec!["running", "offline", "transport-offline"]),
        ),
    )
        .prop_map(|((host, channel, target, lun), dev, dev_t, (a, b, c))| {
            (
                Hctl {
                    host,
                    channel,
                    target,
                    lun,
                },
                dev,
                dev_t,
                [a.to_owned(), b.to_owned(), c.to_owned()],
            )
        })
}

/// A WWID as multipath prints it in a map header. A T10 id's blanks are
/// printed as they are and the header has no quoting, so words with
/// ` | ` (a warning line) or ` (` (an alias) cannot be told apart; real T10
/// ids (vendor, product, serial) hold neither.
fn topology_wwid() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => canonical_wwid().prop_filter("not T10", |c| !c.starts_with("t10.") && c.len() <= 256),
        1 => prop::collection::vec("[A-Za-z0-9.:-]{1,12}", 1..4).prop_map(|w| format!("t10.{}", w.join("_"))),
    ]
}

fn map_spec() -> impl Strategy<Value = MapSpec> {
    (
        topology_wwid(),
        prop::option::of("[a-z][a-z0-9_]{0,12}"),
        0u32..100,
        (
            "[A-Z0-9]{1,8}",
            " {0,4}",
            "[A-Za-z0-9 ]{0,12}[A-Za-z0-9]",
            " {0,4}",
        ),
        prop::option::of("[0-9]{1,4}(\\.[0-9])?[KMGT]"),
        prop::collection::vec(prop::collection::vec(path_spec(), 1..4), 0..3),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(c, alias, dm, (vendor, vpad, product, ppad), size, groups, blanks, old_format)| {
                let wwid = Wwid::parse(&c).expect("canonical WWID");
                // multipath prints the udev serial; a T10 id with its blanks.
                let mut wwid_text = wwid.udev_serial();
                if blanks && wwid_text.starts_with('1') {
                    wwid_text = wwid_text.replace('_', "   ");
                }
                let paths = groups
                    .iter()
                    .enumerate()
                    .flat_map(|(g, ps)| {
                        ps.iter()
                            .map(move |(hctl, dev, dev_t, states)| TopologyPath {
                                hctl: *hctl,
                                devnode: dev.clone(),
                                dev_t: Some(dev_t.clone()),
                                dm_state: Some(states[0].clone()),
                                checker_state: Some(states[1].clone()),
                                device_state: (!old_format).then(|| states[2].clone()),
                                group: g,
                            })
                    })
                    .collect();
                MapSpec {
                    map: TopologyMap {
                        wwid,
                        alias,
                        dm_name: format!("dm-{dm}"),
                        vendor: format!("{vendor}{vpad}"),
                        product: format!("{product}{ppad}"),
                        size,
                        paths,
                    },
                    wwid_text,
                    old_format,
                }
            },
        )
}

/// `multipath -ll` for `spec` (the old format: `[bracketed]` states, no
/// device state).
fn topology_text(spec: &MapSpec) -> String {
    let m = &spec.map;
    let mut out = match &m.alias {
        Some(a) => format!(
            "{a} ({}) {} {},{}\n",
            spec.wwid_text, m.dm_name, m.vendor, m.product
        ),
        None => format!(
            "{} {} {},{}\n",
            spec.wwid_text, m.dm_name, m.vendor, m.product
        ),
    };
    if let Some(size) = &m.size {
        if spec.old_format {
            out.push_str(&format!("[size={size}][features=0][hwhandler=0][rw]\n"));
        } else {
            out.push_str(&format!(
                "size={size} features='0' hwhandler='1 alua' wp=rw\n"
            ));
        }
    }
    let groups = m.paths.iter().map(|p| p.group).max().map_or(0, |g| g + 1);
    for g in 0..groups {
        let last_group = g + 1 == groups;
        let (head, indent) = if last_group {
            ("`-+-", "  ")
        } else {
            ("|-+-", "| ")
        };
        if spec.old_format {
            out.push_str("\\_ round-robin 0 [prio=1][active]\n");
        } else {
            out.push_str(&format!(
                "{head} policy='service-time 0' prio=50 status=active\n"
            ));
        }
        let paths: Vec<_> = m.paths.iter().filter(|p| p.group == g).collect();
        for (i, p) in paths.iter().enumerate() {
            let branch = if i + 1 == paths.len() { "`-" } else { "|-" };
            let dev_t = p.dev_t.as_deref().unwrap_or_default();
            let dm = p.dm_state.as_deref().unwrap_or_default();
            let checker = p.checker_state.as_deref().unwrap_or_default();
            if spec.old_format {
                out.push_str(&format!(
                    " \\_ {} {} {dev_t} [{dm}][{checker}]\n",
                    p.hctl, p.devnode
                ));
            } else {
                let state = p.device_state.as_deref().unwrap_or_default();
                out.push_str(&format!(
                    "{indent}{branch} {}  {} {dev_t}  {dm} {checker} {state}\n",
                    p.hctl, p.devnode
                ));
            }
        }
    }
    out
}

/// The map `parse_topology` must return for `spec` (vendor and product
/// trimmed).
fn expected(spec: &MapSpec) -> TopologyMap {
    let mut m = spec.map.clone();
    m.vendor = m.vendor.trim().to_owned();
    m.product = m.product.trim().to_owned();
    m
}

fn check_maps(maps: &[TopologyMap]) -> Result<(), TestCaseError> {
    for m in maps {
        prop_assert_eq!(Wwid::parse(m.wwid.as_str()), Ok(m.wwid.clone()));
        prop_assert!(
            m.dm_name.starts_with("dm-") && m.dm_name[3..].bytes().all(|b| b.is_ascii_digit())
        );
        let name = m.name();
        prop_assert!(!name.is_empty());
        for p in &m.paths {
            prop_assert!(!p.devnode.is_empty() && p.devnode.len() <= 32);
            prop_assert!(
                p.devnode
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '!')
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(1024))]

    /// `-m node` and discovery listings parse back to their records, and a
    /// junk line among them costs only itself.
    #[test]
    fn node_listings_round_trip(
        records in prop::collection::vec((portal(), tpgt(), target_name()), 0..6),
        junk in junk(),
        at in any::<Index>(),
    ) {
        let mut lines: Vec<String> = records.iter().map(|(p, t, n)| format!("{p},{t} {n}")).collect();
        let want: Vec<NodeRecord> = records
            .iter()
            .map(|(portal, tpgt, target)| NodeRecord { portal: portal.clone(), tpgt: *tpgt, target: target.clone() })
            .collect();
        prop_assert_eq!(parse_node_list(&lines.join("\n")), want.clone());
        lines.insert(at.index(lines.len() + 1), junk);
        let got = parse_node_list(&lines.join("\n"));
        let mut it = got.iter();
        prop_assert!(want.iter().all(|w| it.any(|g| g == w)), "lost a record: {got:?}");
    }

    /// `-m session` listings, new and old form, parse back to their
    /// sessions.
    #[test]
    fn session_listings_round_trip(
        sessions in prop::collection::vec(
            (
                select(vec!["tcp", "iser", "bnx2i.00:0a:f7:1f:3b:08"]),
                any::<u32>(),
                portal(),
                tpgt(),
                target_name(),
                any::<bool>(),
            ),
            0..6,
        ),
    ) {
        let text: String = sessions
            .iter()
            .map(|(tr, sid, p, t, n, new)| {
                if *new {
                    format!("{tr}: [{sid}] {p},{t} {n} (non-flash)\n")
                } else {
                    format!("{tr} [{sid}] {p},{t} {n}\n")
                }
            })
            .collect();
        let want: Vec<SessionEntry> = sessions
            .iter()
            .map(|(tr, sid, p, t, n, _)| SessionEntry {
                transport: (*tr).to_owned(),
                sid: *sid,
                portal: p.clone(),
                tpgt: *t,
                target: n.clone(),
            })
            .collect();
        prop_assert_eq!(parse_session_list(&text), want);
    }

    /// `-m session -P 3` detail parses back to each session: portals, SID,
    /// states, host and disks.
    #[test]
    fn session_detail_round_trips(
        targets in prop::collection::vec(
            (
                target_name(),
                prop::collection::vec(
                    (portal(), tpgt(), any::<u32>(), 0u32..1000, "iqn\\.1993-08\\.org\\.debian:01:[0-9a-f]{12}",
                     prop::collection::vec(((0u32..4, 0u32..16, 0u64..256), "sd[a-z]{1,3}"), 0..3)),
                    1..3,
                ),
            ),
            0..3,
        ),
    ) {
        let mut text = String::from("iSCSI Transport Class version 2.0-870\nversion 2.0-874\n");
        let mut want = Vec::new();
        for (target, sessions) in &targets {
            text.push_str(&format!("Target: {target} (non-flash)\n"));
            for (portal, tpgt, sid, host, initiator, disks) in sessions {
                text.push_str(&format!(
                    "\tCurrent Portal: {portal},{tpgt}\n\
                     \tPersistent Portal: {portal},{tpgt}\n\
                     \t\t**********\n\t\tInterface:\n\t\t**********\n\
                     \t\tIface Name: default\n\
                     \t\tIface Transport: tcp\n\
                     \t\tIface Initiatorname: {initiator}\n\
                     \t\tSID: {sid}\n\
                     \t\tiSCSI Connection State: LOGGED IN\n\
                     \t\tiSCSI Session State: LOGGED_IN\n\
                     \t\t************************\n\t\tAttached SCSI devices:\n\
                     \t\t************************\n\
                     \t\tHost Number: {host}\tState: running\n"
                ));
                let mut attached = Vec::new();
                for ((channel, id, lun), name) in disks {
                    text.push_str(&format!(
                        "\t\tscsi{host} Channel {channel:02} Id {id} Lun: {lun}\n\
                         \t\t\tAttached scsi disk {name}\t\tState: running\n"
                    ));
                    attached.push(AttachedDisk {
                        hctl: Hctl { host: *host, channel: *channel, target: *id, lun: *lun },
                        kernel_name: name.clone(),
                        state: Some("running".to_owned()),
                    });
                }
                want.push(SessionDetail {
                    target: target.clone(),
                    current_portal: portal.clone(),
                    persistent_portal: Some(portal.clone()),
                    tpgt: *tpgt,
                    sid: *sid,
                    iface: Some("default".to_owned()),
                    initiator: Some(initiator.clone()),
                    connection_state: Some("LOGGED IN".to_owned()),
                    session_state: Some("LOGGED_IN".to_owned()),
                    scsi_host: Some(*host),
                    disks: attached,
                });
            }
        }
        prop_assert_eq!(parse_session_detail(&text), want, "{}", text);
    }

    /// The captured iscsiadm outputs with a line dropped, doubled, cut or
    /// replaced, and arbitrary text, never panic the three parsers; what
    /// they return is well formed.
    #[test]
    fn iscsiadm_outputs_survive_damage(
        which in any::<Index>(),
        edits in prop::collection::vec((any::<Index>(), junk(), 0u8..5), 1..4),
        text in hostile_text(),
    ) {
        let mut all = fixtures_in("tools/iscsiadm/session");
        all.extend(fixtures_in("tools/iscsiadm/node"));
        all.extend(fixtures_in("tools/iscsiadm/discovery-st"));
        let mut damaged = all[which.index(all.len())].clone();
        for (at, j, op) in &edits {
            damaged = mutate_lines(&damaged, *at, j, *op);
        }
        check_iscsi_outputs(&damaged)?;
        check_iscsi_outputs(&text)?;
    }

    /// `multipath -ll` (new and old format, with or without alias, T10
    /// WWIDs with blanks) parses back to its maps and paths.
    #[test]
    fn topologies_round_trip(specs in prop::collection::vec(map_spec(), 0..4), warning in any::<bool>()) {
        let mut text = String::new();
        if warning {
            text.push_str("Oct 13 10:24:01 | /lib/udev/scsi_id exited with 1\n");
        }
        for s in &specs {
            text.push_str(&topology_text(s));
        }
        let want: Vec<TopologyMap> = specs.iter().map(expected).collect();
        prop_assert_eq!(parse_topology(&text), want, "{}", text);
    }

    /// The captured topologies with lines damaged, and arbitrary text,
    /// never panic the parser; every map it returns has a canonical WWID,
    /// a dm name and sane path names.
    #[test]
    fn multipath_outputs_survive_damage(
        which in any::<Index>(),
        edits in prop::collection::vec((any::<Index>(), junk(), 0u8..5), 1..4),
        text in hostile_text(),
    ) {
        let mut all = fixtures_in("tools/multipath/multipath-ll");
        all.extend(fixtures_in("tools/multipath/multipath-l"));
        all.extend(fixtures_in("tools/multipath/multipath-v4-ll"));
        all.extend(fixtures_in("tools/multipath/multipathd-show"));
        let mut damaged = all[which.index(all.len())].clone();
        for (at, j, op) in &edits {
            damaged = mutate_lines(&damaged, *at, j, *op);
        }
        check_maps(&parse_topology(&damaged))?;
        check_maps(&parse_topology(&text))?;
    }
}
