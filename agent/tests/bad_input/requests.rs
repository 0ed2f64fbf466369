//! Requests from outside the node: kubelet's CSI Node requests (volume ID,
//! staging and target paths, capabilities) and the proxy's agent API
//! messages, built from near-miss fields and also decoded from damaged
//! bytes. Parsing never panics, every refusal names its field, and a path
//! that is accepted stays under the kubelet directory however `..` and
//! symlinks are arranged.

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use csi_scsi_agent::csi::request::{self, KubeletPath};
use csi_scsi_agent::device::{TargetSpec, Transport};
use csi_scsi_agent::error::AgentError;
use csi_scsi_agent::host::Host;
use csi_scsi_agent::host::command::CommandRunner;
use csi_scsi_contract::Wwid;
use csi_scsi_proto::agent::{
    AttachRequest, ChapCredentials, DetachRequest, DiscoverRequest, FibreChannelTarget,
    IscsiTarget, RescanRequest, Target, WipeMode, WipeRequest, target,
};
use csi_scsi_proto::csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use csi_scsi_proto::csi::{
    CapacityRange, NodeExpandVolumeRequest, NodeGetVolumeStatsRequest, NodePublishVolumeRequest,
    NodeStageVolumeRequest, NodeUnpublishVolumeRequest, NodeUnstageVolumeRequest, VolumeCapability,
};
use proptest::prelude::*;
use proptest::sample::{Index, select};
use prost::Message;

use crate::generators::canonical_wwid;
use crate::support::{
    clear_error, config, hex, hostile_text, names_field, near_miss, valid_or_near,
};

/// A kubelet directory with the traps a hostile path can use: symlinks
/// out of it (absolute and relative), one that stays inside, a loop, a
/// regular file where a directory is expected.
struct Kubelet {
    _dir: tempfile::TempDir,
    /// The canonical root of the scratch tree.
    root: PathBuf,
    host: Host,
}

fn kubelet() -> &'static Kubelet {
    static K: OnceLock<Kubelet> = OnceLock::new();
    K.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = std::fs::canonicalize(dir.path()).expect("canonical tempdir");
        let k = root.join("kubelet");
        for d in [
            "pods/p1/volumes",
            "plugins/kubernetes.io/csi/pv/globalmount",
        ] {
            std::fs::create_dir_all(k.join(d)).expect("mkdir");
        }
        std::fs::create_dir_all(root.join("outside/secret")).expect("mkdir");
        let link =
            |to: &Path, at: &str| std::os::unix::fs::symlink(to, k.join(at)).expect("symlink");
        link(&root.join("outside"), "escape");
        link(Path::new("../outside"), "rel-escape");
        link(Path::new("plugins"), "inside");
        link(Path::new("loop"), "loop");
        link(&root.join("outside"), "pods/p1/escape");
        std::fs::write(k.join("file"), "x").expect("file");
        let host = Host {
            sysfs: root.join("sys"),
            dev: root.join("dev"),
            mountinfo: root.join("mountinfo"),
            kubelet_dir: k,
            iscsi_nodes: std::path::PathBuf::from("/nonexistent/iscsi/nodes"),
            tools: BTreeMap::new(),
            runner: CommandRunner::new(Duration::from_secs(5)),
        };
        Kubelet {
            _dir: dir,
            root,
            host,
        }
    })
}

/// Paths near and under the kubelet directory, made of the fixture's
/// traps, `..`, `.`, empty components, NULs, blanks and non-ASCII.
fn path_input() -> impl Strategy<Value = String> {
    let k = kubelet().host.kubelet_dir.display().to_string();
    let root = kubelet().root.display().to_string();
    let prefix = select(vec![
        k.clone(),
        k.clone(),
        k.clone(),
        format!("/{k}"),
        root,
        "/".to_owned(),
        String::new(),
        "..".to_owned(),
    ]);
    let k2 = k.clone();
    let component = select(vec![
        "pods",
        "p1",
        "volumes",
        "plugins",
        "kubernetes.io",
        "csi",
        "pv",
        "globalmount",
        "mount",
        "escape",
        "rel-escape",
        "inside",
        "loop",
        "file",
        "missing",
        "new",
        "..",
        "..",
        ".",
        "",
        "a b",
        "x\0y",
        "é",
        "line\nbreak",
        "secret",
        "outside",
        "kubelet",
    ]);
    prop_oneof![
        8 => (prefix, prop::collection::vec(component, 0..8), any::<bool>()).prop_map(|(p, cs, slash)| {
            let mut s = p;
            for c in cs {
                s.push('/');
                s.push_str(c);
            }
            if slash {
                s.push('/');
            }
            s
        }),
        1 => hostile_text(),
        1 => near_miss(Just(format!("{k2}/pods/p1/volumes/kubernetes.io~csi/pv/mount"))),
        // A missing component, `..`, then a symlink out.
        1 => (
            select(vec!["missing", "new", "file", "é"]),
            select(vec!["escape", "rel-escape", "pods/p1/escape", "inside"]),
            select(vec!["", "/x", "/secret"]),
        )
            .prop_map(move |(m, e, t)| format!("{k}/{m}/../{e}{t}")),
    ]
}

/// Checks that an accepted path is strictly under the kubelet directory
/// as written: normalised (no `.` or `..` left) and below it.
fn check_under_kubelet(p: &Path) -> Result<(), TestCaseError> {
    let k = &kubelet().host.kubelet_dir;
    prop_assert!(
        p.starts_with(k) && p != k,
        "{} is not strictly under {}",
        p.display(),
        k.display()
    );
    prop_assert!(
        p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_))),
        "{} is not normalised",
        p.display()
    );
    Ok(())
}

/// Checks that an accepted path is under the kubelet directory as the
/// kernel will resolve it when the agent creates and mounts it: its
/// deepest existing ancestor, symlinks followed, is inside.
fn check_resolves_under_kubelet(p: &Path) -> Result<(), TestCaseError> {
    check_under_kubelet(p)?;
    let k = &kubelet().host.kubelet_dir;
    for a in p.ancestors() {
        if let Ok(real) = std::fs::canonicalize(a) {
            prop_assert!(
                real.starts_with(k),
                "{} resolves through {} to {}, outside the kubelet directory",
                p.display(),
                a.display(),
                real.display()
            );
            break;
        }
    }
    Ok(())
}

fn volume_id_input() -> impl Strategy<Value = String> {
    let valid = (
        canonical_wwid().prop_filter("fits", |c| c.len() <= 256),
        "[a-f0-9-]{8,36}",
    )
        .prop_map(|(w, b)| format!("{w}:{b}"));
    prop_oneof![
        2 => valid.clone(),
        2 => near_miss(valid),
        1 => hostile_text(),
        1 => Just(String::new()),
    ]
}

fn capability() -> impl Strategy<Value = Option<VolumeCapability>> {
    let flag = prop_oneof![
        select(vec![
            "ro",
            "rw",
            "noatime",
            "discard",
            "nouuid",
            "rw,noexec",
            "errors=panic",
            "-o",
            "bind",
            "nosuid,,nodev"
        ])
        .prop_map(str::to_owned),
        hostile_text(),
    ];
    let mount = (
        prop_oneof![
            select(vec!["", "ext4", "xfs", "btrfs", "EXT4", "ext4 "]).prop_map(str::to_owned),
            hostile_text()
        ],
        prop::collection::vec(flag, 0..4),
        prop_oneof![4 => Just(String::new()), 1 => hostile_text()],
    )
        .prop_map(|(fs_type, mount_flags, volume_mount_group)| {
            AccessType::Mount(MountVolume {
                fs_type,
                mount_flags,
                volume_mount_group,
            })
        });
    let access = prop_oneof![
        Just(None),
        Just(Some(AccessType::Block(BlockVolume {}))),
        mount.prop_map(Some)
    ];
    let mode = prop_oneof![
        Just(None),
        (-2i32..10).prop_map(|mode| Some(AccessMode { mode }))
    ];
    prop::option::weighted(0.9, (access, mode)).prop_map(|c| {
        c.map(|(access_type, access_mode)| VolumeCapability {
            access_type,
            access_mode,
        })
    })
}

fn volume_context() -> impl Strategy<Value = HashMap<String, String>> {
    prop::collection::hash_map(
        prop_oneof![Just("mkfsOptions".to_owned()), "[a-zA-Z]{1,10}"],
        prop_oneof![
            select(vec![
                "-m 0",
                "-i 8192",
                "-K",
                "-m",
                "-E lazy_itable_init=1",
                "-O ^has_journal",
                "; rm -rf /",
                "-b 4096 -m 1"
            ])
            .prop_map(str::to_owned),
            hostile_text()
        ],
        0..3,
    )
}

/// `msg` encoded, then damaged: bytes flipped, cut, or inserted.
fn damaged<M: Message + Default>(
    msg: &M,
    edits: &[(Index, u8, u8)],
) -> Result<M, prost::DecodeError> {
    let mut bytes = msg.encode_to_vec();
    for (at, b, op) in edits {
        if bytes.is_empty() {
            bytes.push(*b);
            continue;
        }
        let i = at.index(bytes.len());
        match op {
            0 => bytes[i] ^= b | 1,
            1 => bytes.truncate(i),
            _ => bytes.insert(i, *b),
        }
    }
    M::decode(bytes.as_slice())
}

fn byte_edits() -> impl Strategy<Value = Vec<(Index, u8, u8)>> {
    prop_oneof![
        2 => Just(Vec::new()),
        1 => prop::collection::vec((any::<Index>(), any::<u8>(), 0u8..3), 1..4),
    ]
}

/// The fields a Node request's refusal may name.
const NODE_FIELDS: &[&str] = &[
    "volume_id",
    "volume ID",
    "WWID",
    "staging_target_path",
    "target_path",
    "volume_path",
    "volume_capability",
    "mkfsOptions",
    "capacity_range",
];

fn check_node_refusal(e: &AgentError) -> Result<(), TestCaseError> {
    names_field(e, NODE_FIELDS)
}

proptest! {
    #![proptest_config(config(1024))]

    /// A staging or target path is accepted only when it lands strictly
    /// under the kubelet directory; any other is refused naming the field.
    /// (Resolution through symlinks: see the property below.)
    #[test]
    fn kubelet_paths_stay_under_kubelet(raw in path_input()) {
        let k = kubelet();
        match KubeletPath::parse(&k.host, "staging_target_path", &raw) {
            Ok(p) => check_under_kubelet(p.as_path())?,
            Err(e) => {
                prop_assert!(matches!(e, AgentError::InvalidArgument { field: "staging_target_path", .. }), "{e:?}");
                names_field(&e, &["staging_target_path"])?;
            }
        }
    }

    /// An accepted path stays under the kubelet directory as the kernel
    /// resolves it, too: `<kubelet>/missing/../escape`, where `escape` is a
    /// symlink out of the directory, is refused, not resolved lexically
    /// past the missing component to `<kubelet>/escape` (which the kernel
    /// would follow out when the agent mounts there).
    #[test]
    fn kubelet_paths_never_escape_through_symlinks(raw in path_input()) {
        if let Ok(p) = KubeletPath::parse(&kubelet().host, "staging_target_path", &raw) {
            check_resolves_under_kubelet(p.as_path())?;
        }
    }

    /// Refusals of Node requests are bounded and on one line (a refused
    /// mount flag, too, is quoted as an escaped excerpt).
    #[test]
    fn node_request_refusals_are_bounded_and_on_one_line(
        raw in prop_oneof![path_input(), "/[a-z]{1,8}\n[a-z]{1,8}"],
        cap in capability(),
    ) {
        let k = kubelet();
        if let Err(e) = KubeletPath::parse(&k.host, "staging_target_path", &raw) {
            clear_error(&e, &["staging_target_path"])?;
        }
        let r = NodeStageVolumeRequest {
            volume_id: "naa.6001405d27e5d898829468b90ce4ef8c:b1".to_owned(),
            staging_target_path: k.host.kubelet_dir.join("new").display().to_string(),
            volume_capability: cap,
            ..Default::default()
        };
        if let Err(e) = request::stage(&k.host, &r) {
            clear_error(&e, NODE_FIELDS)?;
        }
    }

    /// Plain new paths under the kubelet directory are accepted as
    /// themselves.
    #[test]
    fn plain_paths_under_kubelet_are_accepted(
        cs in prop::collection::vec(
            select(vec!["pods", "p1", "volumes", "new", "pv-1", "globalmount", "a b"]),
            1..6,
        ),
    ) {
        let k = kubelet();
        let want = cs.iter().fold(k.host.kubelet_dir.clone(), |p, c| p.join(c));
        let p = KubeletPath::parse(&k.host, "target_path", &want.display().to_string())
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(p.as_path(), want.as_path());
    }

    /// NodeStageVolume and NodePublishVolume, from near-miss fields or
    /// damaged bytes, parse or are refused naming a field; what parses
    /// holds the volume ID as sent and paths under the kubelet directory.
    #[test]
    fn stage_and_publish_requests_parse_or_name_the_field(
        volume_id in volume_id_input(),
        staging in path_input(),
        target in path_input(),
        cap in capability(),
        context in volume_context(),
        readonly in any::<bool>(),
        edits in byte_edits(),
    ) {
        let k = kubelet();
        let stage = NodeStageVolumeRequest {
            volume_id: volume_id.clone(),
            staging_target_path: staging.clone(),
            volume_capability: cap.clone(),
            volume_context: context.clone(),
            ..Default::default()
        };
        match damaged(&stage, &edits) {
            Ok(r) => match request::stage(&k.host, &r) {
                Ok(s) => {
                    prop_assert_eq!(s.volume.to_string(), r.volume_id);
                    check_under_kubelet(s.staging.as_path())?;
                }
                Err(e) => check_node_refusal(&e)?,
            },
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
        let publish = NodePublishVolumeRequest {
            volume_id,
            staging_target_path: staging,
            target_path: target,
            volume_capability: cap,
            readonly,
            volume_context: context,
            ..Default::default()
        };
        match damaged(&publish, &edits) {
            Ok(r) => match request::publish(&k.host, &r) {
                Ok(p) => {
                    prop_assert_eq!(p.volume.to_string(), r.volume_id);
                    check_under_kubelet(p.staging.as_path())?;
                    check_under_kubelet(p.target.as_path())?;
                    prop_assert!(p.staging != p.target);
                }
                // The spec's one FAILED_PRECONDITION refusal at parse time.
                Err(AgentError::StagingPathMissing) => prop_assert!(r.staging_target_path.is_empty()),
                Err(e) => check_node_refusal(&e)?,
            },
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }

    /// The other Node requests (unstage, unpublish, stats, expand) the same.
    #[test]
    fn other_node_requests_parse_or_name_the_field(
        volume_id in volume_id_input(),
        path in path_input(),
        cap in capability(),
        range in prop::option::of((any::<i64>(), any::<i64>())),
        edits in byte_edits(),
    ) {
        let k = kubelet();
        let h = &k.host;
        let unstage = NodeUnstageVolumeRequest { volume_id: volume_id.clone(), staging_target_path: path.clone() };
        if let Ok(r) = damaged(&unstage, &edits) {
            match request::unstage(h, &r) {
                Ok(u) => check_under_kubelet(u.staging.as_path())?,
                Err(e) => check_node_refusal(&e)?,
            }
        }
        let unpublish = NodeUnpublishVolumeRequest { volume_id: volume_id.clone(), target_path: path.clone() };
        if let Ok(r) = damaged(&unpublish, &edits) {
            match request::unpublish(h, &r) {
                Ok(u) => check_under_kubelet(u.target.as_path())?,
                Err(e) => check_node_refusal(&e)?,
            }
        }
        let stats = NodeGetVolumeStatsRequest {
            volume_id: volume_id.clone(),
            volume_path: path.clone(),
            ..Default::default()
        };
        if let Ok(r) = damaged(&stats, &edits) {
            match request::stats(h, &r) {
                Ok(s) => check_under_kubelet(s.path.as_path())?,
                Err(e) => check_node_refusal(&e)?,
            }
        }
        let expand = NodeExpandVolumeRequest {
            volume_id,
            volume_path: path,
            capacity_range: range.map(|(required_bytes, limit_bytes)| CapacityRange { required_bytes, limit_bytes }),
            volume_capability: cap,
            ..Default::default()
        };
        if let Ok(r) = damaged(&expand, &edits) {
            match request::expand(h, &r) {
                Ok(x) => {
                    check_under_kubelet(x.path.as_path())?;
                    if let (Some(req), Some(lim)) = (x.required_bytes, x.limit_bytes) {
                        prop_assert!(req <= lim);
                    }
                }
                Err(e) => check_node_refusal(&e)?,
            }
        }
    }
}

// --- The agent API ---

/// What the agent API checks in a target before touching the host (the
/// server's `target()` calls the same constructor).
fn target_spec(t: &Target) -> Result<TargetSpec, AgentError> {
    TargetSpec::from_api(t)
}

fn api_target() -> impl Strategy<Value = Target> {
    let portal = valid_or_near(select(vec![
        "10.0.0.1:3260".to_owned(),
        "[fe80::1]:3260".to_owned(),
        "array-a".to_owned(),
        "198.18.0.9".to_owned(),
    ]));
    let iqn = prop_oneof![
        3 => valid_or_near(Just("iqn.2003-01.org.linux-iscsi.array-a:lun0".to_owned())),
        1 => hostile_text(),
        1 => Just("-o".to_owned()),
    ];
    let chap = prop::option::of(
        (
            valid_or_near(Just("user".to_owned())),
            hostile_text(),
            prop_oneof![Just(String::new()), hostile_text()],
            hostile_text(),
        )
            .prop_map(|(username, password, mutual_username, mutual_password)| {
                ChapCredentials {
                    username,
                    password,
                    mutual_username,
                    mutual_password,
                }
            }),
    );
    let iscsi =
        (prop::collection::vec(portal, 0..3), iqn, chap).prop_map(|(portals, iqn, chap)| {
            target::Transport::Iscsi(IscsiTarget { portals, iqn, chap })
        });
    let fc = prop::collection::vec(valid_or_near(hex(16).prop_map(|h| format!("0x{h}"))), 0..3)
        .prop_map(|wwpns| target::Transport::FibreChannel(FibreChannelTarget { wwpns }));
    (
        valid_or_near(Just("array-a".to_owned())),
        prop_oneof![4 => iscsi.prop_map(Some), 2 => fc.prop_map(Some), 1 => Just(None)],
    )
        .prop_map(|(name, transport)| Target { name, transport })
}

fn api_wwid() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => canonical_wwid(),
        2 => near_miss(canonical_wwid()),
        1 => hostile_text(),
    ]
}

/// Whether `name` has one of the forms of an iSCSI name (RFC 3720
/// 3.2.6.3): `iqn.<yyyy-mm>.<naming authority>[:<anything>]`,
/// `eui.<16 hex digits>`, `naa.<16 or 32 hex digits>`. Written apart from
/// the agent's check, as the oracle of the property.
fn iscsi_name_form(name: &str) -> bool {
    let hex = |s: &str| s.chars().all(|c| c.is_ascii_hexdigit());
    if let Some(h) = name.strip_prefix("eui.") {
        return h.len() == 16 && hex(h);
    }
    if let Some(h) = name.strip_prefix("naa.") {
        return (h.len() == 16 || h.len() == 32) && hex(h);
    }
    let Some(rest) = name.strip_prefix("iqn.") else {
        return false;
    };
    let (head, _) = rest.split_once(':').unwrap_or((rest, ""));
    let Some((date, authority)) = head.split_once('.') else {
        return false;
    };
    let Some((year, month)) = date.split_once('-') else {
        return false;
    };
    year.len() == 4
        && year.chars().all(|c| c.is_ascii_digit())
        && month.len() == 2
        && month.chars().all(|c| c.is_ascii_digit())
        && month.parse::<u8>().is_ok_and(|m| (1..=12).contains(&m))
        && !authority.is_empty()
        && !authority.starts_with('.')
        && !authority.ends_with('.')
}

/// Checks what an accepted target must be: portals and WWPNs valid.
fn check_spec(spec: &TargetSpec) -> Result<(), TestCaseError> {
    match &spec.transport {
        Transport::Iscsi { portals, .. } => {
            prop_assert!(!portals.is_empty());
            for p in portals {
                prop_assert!(
                    !p.address().is_empty() && !p.address().starts_with('-') && p.port() != 0
                );
            }
        }
        Transport::Fc { .. } => {}
    }
    Ok(())
}

/// The agent API's check of a WWID: accepted ones are canonical, refusals
/// say it is the WWID.
fn check_wwid(wwid: &str) -> Result<(), TestCaseError> {
    match Wwid::parse(wwid) {
        Ok(w) => prop_assert_eq!(Wwid::parse(w.as_str()), Ok(w.clone())),
        Err(e) => clear_error(&e, &["WWID"])?,
    }
    Ok(())
}

/// The agent API's checks of targets: accepted ones are well formed,
/// refusals name the field.
fn check_targets(targets: &[Target]) -> Result<(), TestCaseError> {
    for t in targets {
        match target_spec(t) {
            Ok(spec) => check_spec(&spec)?,
            Err(e) => clear_error(&e, &["target"])?,
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(1024))]

    /// Attach, Detach, Discover, Wipe and Rescan requests, built from
    /// near-miss fields and then damaged as bytes, decode or fail to
    /// decode cleanly; the decoded ones pass the API's checks or are
    /// refused naming the field.
    #[test]
    fn agent_api_requests_decode_and_validate(
        wwid in api_wwid(),
        targets in prop::collection::vec(api_target(), 0..3),
        lun in any::<u32>(),
        mode in -1i32..8,
        edits in byte_edits(),
    ) {
        let attach = AttachRequest { wwid: wwid.clone(), targets: targets.clone(), lun };
        match damaged(&attach, &edits) {
            Ok(r) => {
                check_wwid(&r.wwid)?;
                check_targets(&r.targets)?;
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
        let detach = DetachRequest { wwid: wwid.clone(), targets: targets.clone() };
        if let Ok(r) = damaged(&detach, &edits) {
            check_wwid(&r.wwid)?;
            check_targets(&r.targets)?;
        }
        let discover = DiscoverRequest { target: targets.first().cloned() };
        if let Ok(r) = damaged(&discover, &edits) {
            check_targets(r.target.as_slice())?;
        }
        let wipe = WipeRequest { wwid: wwid.clone(), mode, expected_size_bytes: 1 << 30 };
        if let Ok(r) = damaged(&wipe, &edits) {
            check_wwid(&r.wwid)?;
            // An unknown mode is an error value, never a panic.
            prop_assert_eq!(WipeMode::try_from(r.mode).is_ok(), (0..=5).contains(&r.mode));
        }
        let rescan = RescanRequest { wwid };
        if let Ok(r) = damaged(&rescan, &edits) {
            check_wwid(&r.wwid)?;
        }
    }

    /// An iSCSI target whose IQN or CHAP text iscsiadm would refuse, or
    /// whose IQN is no iSCSI name, is refused when the request is parsed
    /// (`TargetSpec::iscsi`), as INVALID_ARGUMENT naming the field, not
    /// refused by the login of every portal (NoPortalAnswered,
    /// UNAVAILABLE, which the proxy retries). Well-formed names pass.
    #[test]
    fn iscsi_targets_with_bad_names_are_refused_at_parse_time(
        iqn in prop_oneof![
            Just(String::new()),
            Just("-o".to_owned()),
            "iqn\\.[a-z]{1,8} [a-z]{1,8}",
            "[a-z]{224,230}",
            hostile_text(),
            "iqn\\.(19|20)[0-9]{2}-(0[1-9]|1[0-2])\\.[a-z0-9-]{1,12}(\\.[a-z0-9-]{1,12}){0,2}(:[!-~]{1,40})?",
            near_miss(Just("iqn.2003-01.org.linux-iscsi.array-a:lun0".to_owned())),
            hex(16).prop_map(|h| format!("eui.{h}")),
            prop_oneof![hex(16), hex(32)].prop_map(|h| format!("naa.{h}")),
            near_miss(Just("naa.6001405d27e5d898829468b90ce4ef8c".to_owned())),
        ],
        username in prop_oneof![Just("user".to_owned()), "user\n[a-z]{1,4}"],
    ) {
        // iscsiadm.rs `check_target`: what the login refuses; and RFC
        // 3720's three forms of an iSCSI name.
        let iqn_ok = !iqn.is_empty()
            && iqn.len() <= 223
            && !iqn.starts_with('-')
            && iqn.chars().all(|c| c.is_ascii_graphic())
            && iscsi_name_form(&iqn);
        let chap_ok = !username.chars().any(char::is_control);
        let chap = ChapCredentials {
            username: username.clone(),
            password: "secret".to_owned(),
            ..Default::default()
        };
        let r = TargetSpec::iscsi("array-a", &iqn, &["10.0.0.1:3260".to_owned()], Some(&chap));
        match r {
            Ok(_) => prop_assert!(iqn_ok && chap_ok, "accepted iqn {iqn:?} with CHAP user {username:?}"),
            Err(e) => {
                prop_assert!(!(iqn_ok && chap_ok), "refused a valid target: {e}");
                clear_error(&e, &["target.iscsi"])?;
            }
        }
    }

    /// Arbitrary bytes decode as each agent API request or fail cleanly.
    #[test]
    fn arbitrary_bytes_decode_cleanly(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(r) = AttachRequest::decode(bytes.as_slice()) {
            check_wwid(&r.wwid)?;
            check_targets(&r.targets)?;
        }
        if let Ok(r) = DiscoverRequest::decode(bytes.as_slice()) {
            check_targets(r.target.as_slice())?;
        }
        if let Ok(r) = WipeRequest::decode(bytes.as_slice()) {
            check_wwid(&r.wwid)?;
        }
        if let Ok(r) = NodeStageVolumeRequest::decode(bytes.as_slice()) {
            match request::stage(&kubelet().host, &r) {
                Ok(s) => check_under_kubelet(s.staging.as_path())?,
                Err(e) => check_node_refusal(&e)?,
            }
        }
    }
}
