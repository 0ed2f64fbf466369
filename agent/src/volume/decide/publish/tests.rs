//! NodePublish's rules, as tables.

use std::path::{Path, PathBuf};

use csi_scsi_contract::VolumeId;
use tonic::Code;

use super::*;
use crate::csi::status::status;
use crate::host::mount::BlockRecord;

const WWID: &str = "naa.600140500000000000000000000000a1";
const STAGING: &str = "/var/lib/kubelet/plugins/staging/pv1";
const TARGET: &str = "/var/lib/kubelet/pods/p/volumes/pv1";

fn volume() -> VolumeId {
    VolumeId::parse(&format!("{WWID}:uid-1")).expect("volume id")
}

fn mount(ours: bool, fs: &str, read_only: bool) -> SeenMount {
    SeenMount {
        ours,
        fs_type: fs.to_owned(),
        read_only,
        described: format!("device 8:16 ({fs} from /dev/sdb)"),
    }
}

fn record(volume_id: &str) -> BlockRecord {
    BlockRecord {
        volume_id: volume_id.to_owned(),
        wwid: WWID.to_owned(),
        major: 8,
        minor: 16,
    }
}

fn code<T>(r: Result<T, AgentError>) -> Result<T, Code> {
    r.map_err(|e| status(&e).code())
}

fn staged<'a>(
    v: &'a VolumeId,
    mount: Option<&'a SeenMount>,
    record: Option<&'a BlockRecord>,
) -> Found<'a> {
    Found {
        volume: v,
        path: Path::new(STAGING),
        mount,
        record,
    }
}

#[test]
fn a_filesystem_is_published_only_from_its_own_staging_mount() {
    let v = volume();
    let ours = mount(true, "ext4", false);
    let ours_xfs = mount(true, "xfs", false);
    let theirs = mount(false, "ext4", false);
    let mine = record(&v.to_string());
    let cases = [
        ("staged as asked", Some(&ours), None, Ok(())),
        (
            "staged as another fs",
            Some(&ours_xfs),
            None,
            Err(Code::InvalidArgument),
        ),
        (
            "another device there",
            Some(&theirs),
            None,
            Err(Code::FailedPrecondition),
        ),
        (
            "staged as raw block",
            None,
            Some(&mine),
            Err(Code::InvalidArgument),
        ),
        ("nothing staged", None, None, Err(Code::FailedPrecondition)),
    ];
    for (what, m, r, want) in cases {
        assert_eq!(
            code(staged_filesystem(staged(&v, m, r), FsType::Ext4)),
            want,
            "{what}"
        );
    }
}

#[test]
fn raw_block_is_published_only_from_this_volumes_record() {
    let v = volume();
    let ours = mount(true, "ext4", false);
    let mine = record(&v.to_string());
    let other = record(&format!("{WWID}:uid-2"));
    let cases = [
        ("this volume's record", None, Some(&mine), Ok(())),
        (
            "another volume's record",
            None,
            Some(&other),
            Err(Code::FailedPrecondition),
        ),
        (
            "staged as a filesystem",
            Some(&ours),
            None,
            Err(Code::InvalidArgument),
        ),
        ("nothing staged", None, None, Err(Code::FailedPrecondition)),
    ];
    for (what, m, r, want) in cases {
        assert_eq!(code(staged_block(staged(&v, m, r))), want, "{what}");
    }
}

#[test]
fn a_target_published_as_asked_is_done_and_anything_else_there_is_refused() {
    let v = volume();
    let rw = mount(true, "ext4", false);
    let ro = mount(true, "ext4", true);
    let theirs = mount(false, "ext4", false);
    let cases = [
        ("nothing there", None, false, Ok(Step::Proceed)),
        (
            "ours, read-write as asked",
            Some(&rw),
            false,
            Ok(Step::AlreadyDone),
        ),
        (
            "ours, read-only as asked",
            Some(&ro),
            true,
            Ok(Step::AlreadyDone),
        ),
        (
            "ours, read-write, asked read-only",
            Some(&rw),
            true,
            Err(Code::AlreadyExists),
        ),
        (
            "another device",
            Some(&theirs),
            false,
            Err(Code::AlreadyExists),
        ),
    ];
    for (what, m, read_only, want) in cases {
        assert_eq!(
            code(target(&v, Path::new(TARGET), m, read_only)),
            want,
            "{what}"
        );
    }
}

#[test]
fn reader_only_modes_publish_read_only_whatever_the_flag() {
    assert!(read_only(false, AccessMode::SingleNodeReaderOnly));
    assert!(read_only(false, AccessMode::MultiNodeReaderOnly));
    assert!(read_only(true, AccessMode::SingleNodeWriter));
    assert!(!read_only(false, AccessMode::SingleNodeWriter));
}

#[test]
fn a_second_publication_on_the_node_is_refused_only_where_the_mode_allows_one() {
    let v = volume();
    let other = vec![PathBuf::from("/var/lib/kubelet/pods/q/volumes/pv1")];
    let cases = [
        (AccessMode::SingleNodeWriter, Err(Code::FailedPrecondition)),
        (
            AccessMode::SingleNodeSingleWriter,
            Err(Code::FailedPrecondition),
        ),
        (AccessMode::SingleNodeMultiWriter, Ok(())),
        (AccessMode::MultiNodeMultiWriter, Ok(())),
    ];
    for (mode, want) in cases {
        assert_eq!(needs_sole_publication(mode), want.is_err(), "{mode:?}");
        assert_eq!(
            code(sole_publication(&v, mode, other.clone())),
            want,
            "{mode:?}"
        );
        assert_eq!(
            code(sole_publication(&v, mode, Vec::new())),
            Ok(()),
            "{mode:?} alone"
        );
    }
}
