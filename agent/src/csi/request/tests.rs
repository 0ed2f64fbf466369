//! Request parsing: every refusal names its field; paths must resolve under
//! the kubelet directory.

use std::collections::HashMap;
use std::time::Duration;

use csi_scsi_proto::csi::volume_capability::{
    AccessMode as ProtoAccessMode, BlockVolume, MountVolume,
};

use super::*;
use crate::host::command::CommandRunner;

const VOLUME: &str = "naa.6001405d27e5d898829468b90ce4ef8c:7f0c1e2a";

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    host: Host,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = std::fs::canonicalize(dir.path()).expect("canonical");
    let kubelet = root.join("kubelet");
    std::fs::create_dir_all(kubelet.join("plugins/pv1")).expect("mkdir");
    std::fs::create_dir_all(root.join("outside")).expect("mkdir");
    let host = Host {
        sysfs: root.join("sys"),
        dev: root.join("dev"),
        mountinfo: PathBuf::from("/proc/self/mountinfo"),
        kubelet_dir: kubelet,
        iscsi_nodes: std::path::PathBuf::from("/nonexistent/iscsi/nodes"),
        tools: Default::default(),
        runner: CommandRunner::new(Duration::from_secs(5)),
    };
    Fixture {
        _dir: dir,
        root,
        host,
    }
}

fn mount_capability(fs_type: &str, flags: &[&str], mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(ProtoAccessType::Mount(MountVolume {
            fs_type: fs_type.to_owned(),
            mount_flags: flags.iter().map(|f| (*f).to_owned()).collect(),
            volume_mount_group: String::new(),
        })),
        access_mode: Some(ProtoAccessMode { mode: mode as i32 }),
    }
}

fn stage_request(
    f: &Fixture,
    staging: &str,
    cap: Option<VolumeCapability>,
) -> NodeStageVolumeRequest {
    NodeStageVolumeRequest {
        volume_id: VOLUME.to_owned(),
        publish_context: HashMap::new(),
        staging_target_path: staging.replace("<k>", &f.host.kubelet_dir.display().to_string()),
        volume_capability: cap,
        secrets: HashMap::new(),
        volume_context: HashMap::new(),
    }
}

fn field_of(err: AgentError) -> &'static str {
    match err {
        AgentError::InvalidArgument { field, .. } => field,
        other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
    }
}

#[test]
fn a_path_under_the_kubelet_dir_resolves_even_before_it_exists() {
    let f = fixture();
    let p = KubeletPath::parse(
        &f.host,
        "target_path",
        &format!("{}/pods/p1/./vol/../mount", f.host.kubelet_dir.display()),
    )
    .expect("under kubelet");
    assert_eq!(p.as_path(), f.host.kubelet_dir.join("pods/p1/mount"));
}

#[test]
fn paths_that_escape_the_kubelet_dir_are_invalid_arguments() {
    let f = fixture();
    let k = f.host.kubelet_dir.display().to_string();
    std::os::unix::fs::symlink(
        f.root.join("outside"),
        f.host.kubelet_dir.join("plugins/escape"),
    )
    .expect("symlink");
    for raw in [
        format!("{k}/../etc"),
        format!("{k}/plugins/../../outside/x"),
        format!("{k}/missing/../../outside"),
        format!("{k}/plugins/escape/globalmount"),
        format!("{k}/plugins/escape"),
        "/etc/passwd".to_owned(),
        k.clone(),
        format!("{k}/."),
        "relative/path".to_owned(),
        String::new(),
    ] {
        let err = KubeletPath::parse(&f.host, "staging_target_path", &raw).expect_err(&raw);
        assert_eq!(field_of(err), "staging_target_path", "{raw}");
    }
}

#[test]
fn a_symlink_out_reached_through_dot_dot_after_a_missing_component_is_refused() {
    let f = fixture();
    let k = f.host.kubelet_dir.display().to_string();
    let link = |to: &Path, at: &str| {
        std::os::unix::fs::symlink(to, f.host.kubelet_dir.join(at)).expect("symlink")
    };
    link(&f.root.join("outside"), "escape");
    link(Path::new("../outside"), "rel-escape");
    link(Path::new("loop"), "loop");
    std::fs::write(f.host.kubelet_dir.join("file"), "x").expect("file");
    for raw in [
        // `missing` does not exist: the walk drops it at `..` and looks at
        // `escape` on disk, as the kernel will once the agent creates
        // `missing`.
        format!("{k}/missing/../escape"),
        format!("{k}/missing/../escape/x"),
        format!("{k}/missing/../rel-escape/secret"),
        format!("{k}/a/b/../../escape/new"),
        format!("{k}/file/../escape"),
        format!("{k}/plugins/new/../../escape"),
        format!("{k}/missing/../loop"),
    ] {
        let err = KubeletPath::parse(&f.host, "target_path", &raw).expect_err(&raw);
        let text = err.to_string();
        assert_eq!(field_of(err), "target_path", "{raw}: {text}");
    }
}

#[test]
fn paths_through_missing_components_resolve_like_the_kernel() {
    let f = fixture();
    let k = f.host.kubelet_dir.display().to_string();
    // A relative symlink that stays inside, reached after a missing
    // component: followed, and its `..` is the parent of its target.
    std::os::unix::fs::symlink("plugins/pv1", f.host.kubelet_dir.join("alias")).expect("symlink");
    for (raw, want) in [
        (format!("{k}/missing/../alias/g"), "plugins/pv1/g"),
        (format!("{k}/missing/../alias/../other"), "plugins/other"),
        (format!("{k}/new/deeper/../x"), "new/x"),
        (
            format!("{k}/plugins/pv1/new/mount"),
            "plugins/pv1/new/mount",
        ),
    ] {
        let p = KubeletPath::parse(&f.host, "target_path", &raw).expect(&raw);
        assert_eq!(p.as_path(), f.host.kubelet_dir.join(want), "{raw}");
    }
}

#[test]
fn paths_beyond_the_kernels_limits_are_refused_without_being_echoed() {
    let f = fixture();
    let k = f.host.kubelet_dir.display().to_string();
    // Nothing of either exists, so resolving alone would accept both.
    for raw in [
        format!("{k}/{}", "d/".repeat(3000)),
        format!("{k}/{}", "n".repeat(1 << 20)),
    ] {
        let err = KubeletPath::parse(&f.host, "target_path", &raw).expect_err("too long");
        let text = err.to_string();
        assert!(text.len() < 512, "{} bytes: {text}", text.len());
        assert_eq!(field_of(err), "target_path");
    }
}

#[test]
fn oversized_options_are_refused_without_being_echoed() {
    let f = fixture();
    let mut huge_mkfs = stage_request(
        &f,
        "<k>/plugins/pv1/globalmount",
        Some(mount_capability("xfs", &[], Mode::SingleNodeWriter)),
    );
    huge_mkfs
        .volume_context
        .insert(MKFS_OPTIONS_KEY.into(), "-K ".repeat(2000));
    let huge_flag = stage_request(
        &f,
        "<k>/plugins/pv1/globalmount",
        Some(mount_capability(
            "xfs",
            &[&"o".repeat(5000)],
            Mode::SingleNodeWriter,
        )),
    );
    let huge_fs = stage_request(
        &f,
        "<k>/plugins/pv1/globalmount",
        Some(mount_capability(
            &"x".repeat(1 << 20),
            &[],
            Mode::SingleNodeWriter,
        )),
    );
    for (r, field) in [
        (huge_mkfs, "volume_context.mkfsOptions"),
        (huge_flag, "volume_capability.mount.mount_flags"),
        (huge_fs, "volume_capability.mount.fs_type"),
    ] {
        let err = stage(&f.host, &r).expect_err(field);
        assert!(err.to_string().len() < 512, "{err}");
        assert_eq!(field_of(err), field);
    }
}

#[test]
fn a_symlink_that_stays_inside_the_kubelet_dir_is_followed() {
    let f = fixture();
    std::os::unix::fs::symlink(
        f.host.kubelet_dir.join("plugins/pv1"),
        f.host.kubelet_dir.join("alias"),
    )
    .expect("symlink");
    let p = KubeletPath::parse(
        &f.host,
        "volume_path",
        &format!("{}/alias/globalmount", f.host.kubelet_dir.display()),
    )
    .expect("inside");
    assert_eq!(
        p.as_path(),
        f.host.kubelet_dir.join("plugins/pv1/globalmount")
    );
}

#[test]
fn a_stage_request_parses_into_typed_values() {
    let f = fixture();
    let mut r = stage_request(
        &f,
        "<k>/plugins/pv1/globalmount",
        Some(mount_capability(
            "xfs",
            &["noatime"],
            Mode::SingleNodeWriter,
        )),
    );
    r.volume_context
        .insert(MKFS_OPTIONS_KEY.to_owned(), "-L data".to_owned());
    let s = stage(&f.host, &r).expect("valid");
    assert_eq!(s.volume.to_string(), VOLUME);
    assert_eq!(s.capability.mode, AccessMode::SingleNodeWriter);
    assert!(matches!(
        s.capability.access,
        AccessType::Mount {
            fs: FsType::Xfs,
            ..
        }
    ));
    assert_eq!(s.mkfs.args(), ["-L", "data"]);
}

#[test]
fn an_unset_fs_type_means_ext4() {
    let f = fixture();
    let r = stage_request(
        &f,
        "<k>/plugins/pv1/globalmount",
        Some(mount_capability("", &[], Mode::SingleNodeWriter)),
    );
    let s = stage(&f.host, &r).expect("valid");
    assert!(matches!(
        s.capability.access,
        AccessType::Mount {
            fs: FsType::Ext4,
            ..
        }
    ));
}

#[test]
fn bad_stage_requests_name_the_field() {
    let f = fixture();
    let good = || Some(mount_capability("ext4", &[], Mode::SingleNodeWriter));
    let cases: Vec<(NodeStageVolumeRequest, &str)> = vec![
        (
            stage_request(&f, "<k>/plugins/pv1/g", None),
            "volume_capability",
        ),
        (
            stage_request(
                &f,
                "<k>/plugins/pv1/g",
                Some(mount_capability("ext4", &[], Mode::Unknown)),
            ),
            "volume_capability.access_mode",
        ),
        (
            stage_request(
                &f,
                "<k>/plugins/pv1/g",
                Some(VolumeCapability {
                    access_type: None,
                    access_mode: Some(ProtoAccessMode {
                        mode: Mode::SingleNodeWriter as i32,
                    }),
                }),
            ),
            "volume_capability.access_type",
        ),
        (
            stage_request(
                &f,
                "<k>/plugins/pv1/g",
                Some(mount_capability("btrfs", &[], Mode::SingleNodeWriter)),
            ),
            "volume_capability.mount.fs_type",
        ),
        (
            stage_request(
                &f,
                "<k>/plugins/pv1/g",
                Some(mount_capability(
                    "ext4",
                    &["errors=panic"],
                    Mode::SingleNodeWriter,
                )),
            ),
            "volume_capability.mount.mount_flags",
        ),
        (
            stage_request(&f, "<k>/../etc", good()),
            "staging_target_path",
        ),
        (
            NodeStageVolumeRequest {
                volume_id: String::new(),
                ..stage_request(&f, "<k>/plugins/pv1/g", good())
            },
            "volume_id",
        ),
        (
            NodeStageVolumeRequest {
                volume_context: HashMap::from([(MKFS_OPTIONS_KEY.to_owned(), "-F".to_owned())]),
                ..stage_request(&f, "<k>/plugins/pv1/g", good())
            },
            "volume_context.mkfsOptions",
        ),
    ];
    for (request, field) in cases {
        assert_eq!(field_of(stage(&f.host, &request).expect_err(field)), field);
    }
    let mut unknown_mode = stage_request(&f, "<k>/plugins/pv1/g", good());
    if let Some(c) = unknown_mode.volume_capability.as_mut() {
        c.access_mode = Some(ProtoAccessMode { mode: 42 });
    }
    assert_eq!(
        field_of(stage(&f.host, &unknown_mode).expect_err("mode 42")),
        "volume_capability.access_mode"
    );
}

#[test]
fn malformed_volume_ids_are_refused() {
    let f = fixture();
    for bad in ["sdb", "naa.6001405d27e5d898829468b90ce4ef8c", "../../etc:1"] {
        let r = NodeUnstageVolumeRequest {
            volume_id: bad.to_owned(),
            staging_target_path: format!("{}/plugins/pv1/g", f.host.kubelet_dir.display()),
        };
        let err = unstage(&f.host, &r).expect_err(bad);
        assert!(
            matches!(err, AgentError::InvalidVolumeId(_)),
            "{bad}: {err:?}"
        );
    }
}

#[test]
fn publish_without_a_staging_path_is_a_failed_precondition() {
    let f = fixture();
    let r = NodePublishVolumeRequest {
        volume_id: VOLUME.to_owned(),
        publish_context: HashMap::new(),
        staging_target_path: String::new(),
        target_path: format!("{}/pods/p1/mount", f.host.kubelet_dir.display()),
        volume_capability: Some(VolumeCapability {
            access_type: Some(ProtoAccessType::Block(BlockVolume {})),
            access_mode: Some(ProtoAccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
        }),
        readonly: false,
        secrets: HashMap::new(),
        volume_context: HashMap::new(),
    };
    assert!(matches!(
        publish(&f.host, &r),
        Err(AgentError::StagingPathMissing)
    ));
}

#[test]
fn capacity_ranges_are_checked() {
    let range = |required_bytes, limit_bytes| CapacityRange {
        required_bytes,
        limit_bytes,
    };
    assert_eq!(capacity_range(None).expect("none"), (None, None));
    assert_eq!(
        capacity_range(Some(&range(0, 0))).expect("zeros"),
        (None, None)
    );
    assert_eq!(
        capacity_range(Some(&range(10, 20))).expect("ok"),
        (Some(10), Some(20))
    );
    assert_eq!(
        field_of(capacity_range(Some(&range(-1, 0))).expect_err("neg")),
        "capacity_range.required_bytes"
    );
    assert_eq!(
        field_of(capacity_range(Some(&range(30, 20))).expect_err("inverted")),
        "capacity_range"
    );
}

#[test]
fn access_modes_know_their_publication_rules() {
    assert!(AccessMode::SingleNodeSingleWriter.one_publication_per_node());
    assert!(AccessMode::SingleNodeWriter.one_publication_per_node());
    assert!(!AccessMode::SingleNodeMultiWriter.one_publication_per_node());
    assert!(!AccessMode::MultiNodeMultiWriter.one_publication_per_node());
    assert!(AccessMode::MultiNodeReaderOnly.read_only());
    assert!(AccessMode::MultiNodeSingleWriter.multi_node());
    assert_eq!(
        AccessMode::SingleNodeMultiWriter.name(),
        "SINGLE_NODE_MULTI_WRITER"
    );
}

#[test]
fn a_stats_or_expand_lookup_of_an_id_or_path_no_volume_can_have_is_not_found() {
    let f = fixture();
    let k = f.host.kubelet_dir.display().to_string();
    let stats = |id: &str, path: &str| {
        super::stats(
            &f.host,
            &NodeGetVolumeStatsRequest {
                volume_id: id.to_owned(),
                volume_path: path.to_owned(),
                staging_target_path: String::new(),
            },
        )
    };
    let code =
        |r: Result<StatsRequest, AgentError>| crate::csi::status::code(&r.expect_err("refused"));
    // Missing fields stay INVALID_ARGUMENT (the spec's "missing field").
    assert_eq!(code(stats("", "some/path")), tonic::Code::InvalidArgument);
    assert_eq!(code(stats(VOLUME, "")), tonic::Code::InvalidArgument);
    // An ID this driver never issues, a relative path, a path outside the
    // kubelet directory: no volume can be there.
    let pv = format!("{k}/plugins/pv1");
    assert_eq!(code(stats("fake-vol-id-12ab", &pv)), tonic::Code::NotFound);
    assert_eq!(code(stats(VOLUME, "some/path")), tonic::Code::NotFound);
    let outside = f.root.join("outside").display().to_string();
    assert_eq!(code(stats(VOLUME, &outside)), tonic::Code::NotFound);
    let expand = super::expand(
        &f.host,
        &NodeExpandVolumeRequest {
            volume_id: "fake-vol-id-12ab".to_owned(),
            volume_path: "some/path".to_owned(),
            capacity_range: None,
            volume_capability: None,
            staging_target_path: String::new(),
            secrets: HashMap::new(),
        },
    );
    assert_eq!(
        crate::csi::status::code(&expand.expect_err("refused")),
        tonic::Code::NotFound
    );
    assert!(
        stats(VOLUME, &pv).is_ok(),
        "a real path under kubelet parses"
    );
}

#[test]
fn a_read_only_publication_reaches_stage_and_publish_through_the_publish_context() {
    let f = fixture();
    let cap = mount_capability("ext4", &[], Mode::SingleNodeWriter);
    let mut req = stage_request(&f, "<k>/plugins/pv1/g", Some(cap.clone()));
    assert!(!stage(&f.host, &req).expect("parse").published_read_only);
    req.publish_context.insert(
        csi_scsi_proto::publish_context::READONLY.into(),
        "true".into(),
    );
    assert!(stage(&f.host, &req).expect("parse").published_read_only);
    req.publish_context.insert(
        csi_scsi_proto::publish_context::READONLY.into(),
        "yes".into(),
    );
    assert_eq!(
        field_of(stage(&f.host, &req).expect_err("not a boolean")),
        "publish_context.readonly"
    );
    let k = f.host.kubelet_dir.display().to_string();
    let publish_req = NodePublishVolumeRequest {
        volume_id: VOLUME.to_owned(),
        publish_context: HashMap::from([(
            csi_scsi_proto::publish_context::READONLY.to_owned(),
            "true".to_owned(),
        )]),
        staging_target_path: format!("{k}/plugins/pv1/g"),
        target_path: format!("{k}/pods/p1/mount"),
        volume_capability: Some(cap),
        readonly: false,
        secrets: HashMap::new(),
        volume_context: HashMap::new(),
    };
    assert!(
        publish(&f.host, &publish_req).expect("parse").read_only,
        "published read-only by the controller: bound read-only whatever the node flag says"
    );
}
