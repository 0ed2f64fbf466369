//! The proxy's parsers of outside input: volume IDs (from the sidecars),
//! StorageClass parameters and their `deviceSelector`, and the agents file.

use std::collections::BTreeMap;

use csi_scsi_contract::{NodeName, VolumeId};
use csi_scsi_proxy::device::{Cleanup, FsType};
use csi_scsi_proxy::directory::{AgentDirectory, AgentEntry, FileDirectory};
use csi_scsi_proxy::parameters::{ClassParameters, InvalidParameter, fs_type};
use csi_scsi_proxy::selector::Selector;
use proptest::prelude::*;
use proptest::sample::select;

use crate::support::{clear_error, config, hex, hostile_text, is_node_name, near_miss};

/// A canonical WWID, as the agents report them.
fn wwid() -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        prop_oneof![hex(16), hex(32)].prop_map(|h| format!("naa.{h}")),
        hex(16).prop_map(|h| format!("eui.{h}")),
        "[A-Za-z0-9.:-]{1,16}(_[A-Za-z0-9.:-]{1,16}){0,3}".prop_map(|t| format!("t10.{t}")),
        "iqn\\.[0-9]{4}-[0-9]{2}\\.[a-z.]{1,20}:[a-z0-9.-]{1,20}".prop_map(|n| format!("name.{n}")),
    ]
}

fn binding() -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        "[a-f0-9]{8}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{12}",
        "[A-Za-z0-9-]{1,64}"
    ]
}

/// A label key or value as the selector accepts them.
fn key() -> impl Strategy<Value = String> + Clone {
    "[a-z0-9]([a-z0-9._/-]{0,14}[a-z0-9])?"
        .prop_filter("not an operator word", |k| k != "in" && k != "notin")
}

fn value() -> impl Strategy<Value = String> + Clone {
    "[A-Za-z0-9]([A-Za-z0-9._-]{0,10}[A-Za-z0-9])?"
}

/// One requirement of a selector, as Kubernetes defines it.
#[derive(Clone, Debug)]
enum Req {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

impl Req {
    /// What Kubernetes says `labels` satisfy: the independent oracle.
    fn holds(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Self::Equals(k, v) => labels.get(k) == Some(v),
            Self::NotEquals(k, v) => labels.get(k) != Some(v),
            Self::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Self::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Self::Exists(k) => labels.contains_key(k),
            Self::NotExists(k) => !labels.contains_key(k),
        }
    }

    /// Its text, with blanks where the syntax allows them.
    fn text(&self, pad: &str, double: bool) -> String {
        let list = |vs: &[String]| vs.join(&format!("{pad},{pad}"));
        match self {
            Self::Equals(k, v) if double => format!("{k}{pad}=={pad}{v}"),
            Self::Equals(k, v) => format!("{k}{pad}={pad}{v}"),
            Self::NotEquals(k, v) => format!("{k}{pad}!={pad}{v}"),
            Self::In(k, vs) => format!("{k} in {pad}({pad}{}{pad})", list(vs)),
            Self::NotIn(k, vs) => format!("{k} notin {pad}({pad}{}{pad})", list(vs)),
            Self::Exists(k) => k.clone(),
            Self::NotExists(k) => format!("!{k}"),
        }
    }
}

fn req(keys: Vec<String>, values: Vec<String>) -> impl Strategy<Value = Req> {
    let k = select(keys);
    let v = select(values);
    let vs = prop::collection::vec(v.clone(), 1..4);
    prop_oneof![
        (k.clone(), v.clone()).prop_map(|(k, v)| Req::Equals(k, v)),
        (k.clone(), v).prop_map(|(k, v)| Req::NotEquals(k, v)),
        (k.clone(), vs.clone()).prop_map(|(k, vs)| Req::In(k, vs)),
        (k.clone(), vs).prop_map(|(k, vs)| Req::NotIn(k, vs)),
        k.clone().prop_map(Req::Exists),
        k.prop_map(Req::NotExists),
    ]
}

/// Requirements over a few keys and values, and label sets over the same
/// ones, so that matches and misses both happen.
fn selector_case() -> impl Strategy<Value = (Vec<Req>, Vec<BTreeMap<String, String>>, String, bool)>
{
    (
        prop::collection::vec(key(), 1..4),
        prop::collection::vec(value(), 1..4),
    )
        .prop_flat_map(|(keys, values)| {
            (
                prop::collection::vec(req(keys.clone(), values.clone()), 0..5),
                prop::collection::vec(
                    prop::collection::btree_map(select(keys), select(values), 0..4),
                    1..6,
                ),
                select(vec!["", " ", "  "]).prop_map(str::to_owned),
                any::<bool>(),
            )
        })
}

proptest! {
    #![proptest_config(config(1024))]

    /// A volume ID the proxy issued splits back into its WWID and binding
    /// and prints the same.
    #[test]
    fn issued_volume_ids_round_trip(w in wwid(), b in binding()) {
        let id = format!("{w}:{b}");
        let v = VolumeId::parse(&id).map_err(|e| TestCaseError::fail(format!("{id:?} refused: {e}")))?;
        prop_assert_eq!(v.wwid().as_str(), w.as_str());
        prop_assert_eq!(v.binding_uid(), b.as_str());
        prop_assert_eq!(v.to_string(), id);
    }

    /// Anything else is refused (the caller answers NOT_FOUND, or OK where
    /// the spec says so); what the contract's `VolumeId` (the one parser
    /// proxy and agent share) accepts of near misses prints back the same
    /// and holds a canonical WWID and a well-formed binding. (The grammar
    /// itself is the contract crate's property,
    /// contract/tests/bad_input/ids.rs.)
    #[test]
    fn volume_id_near_misses_are_refused(input in prop_oneof![
        hostile_text(),
        near_miss((wwid(), binding()).prop_map(|(w, b)| format!("{w}:{b}"))),
        wwid().prop_map(|w| format!("{w}:")),
        binding().prop_map(|b| format!("../../{b}:{b}")),
        (wwid(), binding()).prop_map(|(w, b)| format!("{w}\n:{b}")),
    ]) {
        if let Ok(v) = VolumeId::parse(&input) {
            let (wwid, uid) = (v.wwid().as_str(), v.binding_uid());
            prop_assert_eq!(v.to_string(), input.as_str());
            prop_assert!(["naa.", "eui.", "t10.", "name."].iter().any(|p| wwid.starts_with(p)), "{:?}", wwid);
            prop_assert!(wwid.len() <= 256 && wwid.chars().all(|c| c.is_ascii_graphic()));
            prop_assert!(!uid.is_empty() && uid.len() <= 64);
            prop_assert!(uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
        }
    }

    /// A selector built from requirements matches exactly the label sets
    /// Kubernetes says it does, however it is spaced.
    #[test]
    fn selectors_match_like_kubernetes((reqs, label_sets, pad, double) in selector_case()) {
        let text = reqs.iter().map(|r| r.text(&pad, double)).collect::<Vec<_>>().join(&format!("{pad},{pad}"));
        let sel = Selector::parse(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(sel.is_empty(), reqs.is_empty());
        for labels in &label_sets {
            let want = reqs.iter().all(|r| r.holds(labels));
            prop_assert_eq!(sel.matches(labels), want, "{:?} on {:?}", text, labels);
        }
    }

    /// Any selector text parses or is refused with an error that quotes
    /// (an excerpt of) it and says why.
    #[test]
    fn selector_near_misses_are_refused_clearly(input in prop_oneof![
        hostile_text(),
        near_miss(Just("tier=fast,array in (a1,a2),!retired".to_owned())),
        near_miss(Just("zone notin (z1, z2)".to_owned())),
        Just("array in ()".to_owned()),
        Just("array notin ( )".to_owned()),
        "[a-z]{1,4} in \\([a-z]{0,3}(,[a-z]{0,3}){0,2}\\)",
    ]) {
        match Selector::parse(&input) {
            Ok(sel) => {
                // Whatever it is, it can be evaluated.
                let _ = sel.matches(&BTreeMap::new());
            }
            Err(e) => clear_error(&e, &["label selector"])?,
        }
    }

    /// StorageClass parameters: known keys with valid values are taken,
    /// the provisioner's own keys ignored, and anything else refused with
    /// an error that names the parameter.
    #[test]
    fn class_parameters_are_valid_or_refused_naming_the_key(
        params in prop::collection::hash_map(
            prop_oneof![
                4 => select(vec!["deviceSelector", "cleanup", "fsType"]).prop_map(str::to_owned),
                2 => "csi\\.storage\\.k8s\\.io/(pvc|pv)/(name|namespace)",
                2 => near_miss(select(vec!["deviceSelector".to_owned(), "cleanup".to_owned(), "fsType".to_owned()])),
                1 => hostile_text(),
            ],
            prop_oneof![
                select(vec![
                    "none", "discard", "zero", "random-1", "random-3", "ext4", "xfs", "tier=fast", "", "a in (b)",
                ])
                .prop_map(str::to_owned),
                near_miss(select(vec!["zero".to_owned(), "xfs".to_owned(), "tier=fast".to_owned()])),
                hostile_text(),
            ],
            0..5,
        ),
    ) {
        match ClassParameters::parse(&params) {
            Ok(c) => {
                let mine: BTreeMap<String, String> = params
                    .iter()
                    .filter(|(k, _)| !k.starts_with("csi.storage.k8s.io/"))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                prop_assert_eq!(&c.identity, &mine);
                for (k, v) in &mine {
                    match k.as_str() {
                        "cleanup" => prop_assert_eq!(c.cleanup.as_str(), v.as_str()),
                        "fsType" => prop_assert_eq!(c.fs_type.map(FsType::as_str), Some(v.as_str())),
                        "deviceSelector" => prop_assert!(Selector::parse(v).is_ok()),
                        other => return Err(TestCaseError::fail(format!("accepted unknown key {other:?}"))),
                    }
                }
                if !mine.contains_key("cleanup") {
                    prop_assert_eq!(c.cleanup, Cleanup::Zero);
                }
            }
            Err(e) => {
                clear_error(&e, &["parameter"])?;
                let named = match &e {
                    InvalidParameter::Unknown(_) => "unknown parameter",
                    InvalidParameter::Value { key, .. } => key,
                    InvalidParameter::Selector(_) => "deviceSelector",
                    _ => "parameter",
                };
                prop_assert!(e.to_string().contains(named), "{e}");
            }
        }
        // The filesystem check on its own, as CreateVolume also uses it.
        for v in params.values() {
            match fs_type(v) {
                Ok(f) => prop_assert_eq!(f.as_str(), v.as_str()),
                Err(e) => clear_error(&e, &["fsType"])?,
            }
        }
    }
}

/// A node name an agent's certificate can carry: a DNS-1123 subdomain
/// (labels of lower-case letters, digits and inner '-').
fn node_name() -> impl Strategy<Value = String> + Clone {
    prop::collection::vec("[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?", 1..4).prop_map(|l| l.join("."))
}

/// One agents-file line's parts.
fn agent_line() -> impl Strategy<Value = (String, String, BTreeMap<String, String>)> {
    (
        node_name(),
        prop_oneof![
            (any::<u8>(), 1u16..).prop_map(|(a, p)| format!("198.18.0.{a}:{p}")),
            (any::<[u16; 8]>(), 1u16..)
                .prop_map(|(g, p)| format!("[{}]:{p}", std::net::Ipv6Addr::from(g))),
            ("[a-z]{1,10}", 1u16..).prop_map(|(h, p)| format!("{h}.example:{p}")),
        ],
        prop::collection::btree_map("[a-z][a-z0-9./-]{0,12}", "[A-Za-z0-9._-]{0,8}", 0..3),
    )
}

proptest! {
    // Each case writes and reads a file.
    #![proptest_config(config(256))]

    /// An agents file parses back to its agents; with a line damaged it
    /// is refused naming the file and line, or read with that line as
    /// written. No text panics the reader.
    #[test]
    fn agents_files_round_trip_or_name_the_line(
        agents in prop::collection::btree_map(node_name(), agent_line(), 0..5),
        damage in prop::option::of((any::<prop::sample::Index>(), crate::support::nasty_char(), 0u8..9)),
        junk in prop::option::of(hostile_text()),
        comment in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("agents");
        let mut lines: Vec<String> = agents
            .iter()
            .map(|(node, (_, address, labels))| {
                let l = labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
                format!("{node} {address} {l}")
            })
            .collect();
        if comment {
            lines.insert(0, "# node address labels".to_owned());
        }
        let want: BTreeMap<NodeName, AgentEntry> = agents
            .iter()
            .map(|(node, (_, address, labels))| {
                (NodeName::parse(node).expect("a node name"), AgentEntry { address: address.clone(), labels: labels.clone(), node_uid: None })
            })
            .collect();
        std::fs::write(&path, lines.join("\n")).expect("write");
        let d = FileDirectory::load(&path).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let got = d.snapshot();
        prop_assert_eq!(got.as_ref(), &want);

        if let Some((at, c, op)) = damage
            && !lines.is_empty()
        {
            let i = at.index(lines.len());
            lines[i] = crate::support::mutate(&lines[i], at, c, op);
        }
        if let Some(j) = junk {
            lines.push(j);
        }
        let text = lines.join("\n");
        std::fs::write(&path, &text).expect("write");
        match FileDirectory::load(&path) {
            Ok(d) => prop_assert!(d.snapshot().len() <= text.lines().count()),
            Err(e) => {
                let shown = e.to_string();
                prop_assert!(shown.contains(&path.display().to_string()), "{shown}");
                let n = text.lines().count();
                let names_line = (1..=n).any(|l| shown.contains(&format!(":{l}: ")));
                prop_assert!(names_line || shown.contains("stream did not contain valid UTF-8"), "{shown}");
            }
        }
    }

    /// A node name the agents file accepts can be named by an agent's
    /// certificate (a DNS-1123 subdomain), and one it refuses cannot: a
    /// typo (`Node_A`) is refused naming the file and line, not found
    /// later as every TLS handshake with that node being refused.
    #[test]
    fn agents_files_refuse_node_names_no_certificate_can_carry(
        node in prop_oneof![
            "[a-z0-9]([a-z0-9.-]{0,20}[a-z0-9])?",
            near_miss(Just("node-a".to_owned())).prop_map(|n| n.split_whitespace().collect::<String>()),
            Just("Node_A".to_owned()),
            Just("../x".to_owned()),
            node_name(),
            "[a-z]{60,70}",
            prop::collection::vec("[a-z]{60,63}", 4..6).prop_map(|l| l.join(".")),
        ],
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("agents");
        std::fs::write(&path, format!("{node} 198.18.0.2:9810\n")).expect("write");
        let dns1123 = is_node_name(&node);
        match FileDirectory::load(&path) {
            Ok(_) => prop_assert!(dns1123 || node.is_empty() || node.starts_with('#'), "accepted node name {node:?}"),
            Err(e) => {
                prop_assert!(!dns1123, "refused node name {node:?}: {e}");
                let shown = e.to_string();
                prop_assert!(shown.contains(&format!("{}:1: ", path.display())), "{shown}");
            }
        }
    }
}
