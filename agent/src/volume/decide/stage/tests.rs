//! NodeStage's and NodeUnstage's rules, as tables: what was read, what the
//! step does, and the gRPC code a refusal answers.

use std::path::{Path, PathBuf};

use csi_scsi_contract::VolumeId;
use tonic::Code;

use super::*;
use crate::csi::status::status;
use crate::volume::decide::SeenMount;

const WWID: &str = "naa.600140500000000000000000000000a1";

fn volume() -> VolumeId {
    VolumeId::parse(&format!("{WWID}:uid-1")).expect("volume id")
}

fn mount(ours: bool, fs: &str) -> SeenMount {
    SeenMount {
        ours,
        fs_type: fs.to_owned(),
        read_only: false,
        described: format!("device 8:16 ({fs} from /dev/sdb)"),
    }
}

fn record(volume_id: &str, wwid: &str) -> BlockRecord {
    BlockRecord {
        volume_id: volume_id.to_owned(),
        wwid: wwid.to_owned(),
        major: 8,
        minor: 16,
    }
}

fn code<T: std::fmt::Debug>(r: Result<T, AgentError>) -> Result<T, Code> {
    r.map_err(|e| status(&e).code())
}

const STAGING: &str = "/var/lib/kubelet/plugins/staging/pv1";

#[test]
fn a_filesystem_stage_is_done_refused_or_to_do_by_what_is_at_the_path() {
    let v = volume();
    let ours_ext4 = mount(true, "ext4");
    let ours_xfs = mount(true, "xfs");
    let theirs = mount(false, "ext4");
    let mine = record(&v.to_string(), WWID);
    let cases = [
        ("nothing there", None, None, Ok(Step::Proceed)),
        (
            "ours, same fs: the spec's repeat",
            Some(&ours_ext4),
            None,
            Ok(Step::AlreadyDone),
        ),
        (
            "ours, other fs",
            Some(&ours_xfs),
            None,
            Err(Code::AlreadyExists),
        ),
        (
            "another device",
            Some(&theirs),
            None,
            Err(Code::AlreadyExists),
        ),
        (
            "staged as raw block",
            None,
            Some(&mine),
            Err(Code::AlreadyExists),
        ),
    ];
    for (what, mount, record, want) in cases {
        let at = Found {
            volume: &v,
            path: Path::new(STAGING),
            mount,
            record,
        };
        assert_eq!(code(filesystem_path(at, FsType::Ext4)), want, "{what}");
    }
}

#[test]
fn a_block_stage_is_done_only_for_this_volumes_record() {
    let v = volume();
    let ours = mount(true, "ext4");
    let theirs = mount(false, "ext4");
    let mine = record(&v.to_string(), WWID);
    let other_volume = record(&format!("{WWID}:uid-2"), WWID);
    let other_wwid = record(&v.to_string(), "naa.600140500000000000000000000000b2");
    let cases = [
        ("nothing there", None, None, Ok(Step::Proceed)),
        (
            "this volume's record",
            None,
            Some(&mine),
            Ok(Step::AlreadyDone),
        ),
        (
            "another volume's record",
            None,
            Some(&other_volume),
            Err(Code::AlreadyExists),
        ),
        (
            "a record of another WWID",
            None,
            Some(&other_wwid),
            Err(Code::AlreadyExists),
        ),
        (
            "ours as a filesystem",
            Some(&ours),
            None,
            Err(Code::AlreadyExists),
        ),
        (
            "another device mounted",
            Some(&theirs),
            None,
            Err(Code::AlreadyExists),
        ),
    ];
    for (what, mount, record, want) in cases {
        let at = Found {
            volume: &v,
            path: Path::new(STAGING),
            mount,
            record,
        };
        assert_eq!(code(block_path(at)), want, "{what}");
    }
}

#[test]
fn a_device_mounted_or_held_is_never_staged() {
    let v = volume();
    let node = Path::new("/dev/sdb");
    let elsewhere = Path::new("/mnt/elsewhere");
    assert_eq!(code(unused(&v, node, None, Holder::Free)), Ok(()));
    assert_eq!(
        code(unused(&v, node, Some(elsewhere), Holder::Free)),
        Err(Code::FailedPrecondition)
    );
    assert_eq!(
        code(unused(&v, node, None, Holder::Busy)),
        Err(Code::FailedPrecondition)
    );
}

#[test]
fn a_read_only_device_is_staged_only_where_read_only_is_asked() {
    let node = Path::new("/dev/sdb");
    // (device ro, mode ro, published ro) -> stage ro, or refused
    let cases = [
        ((false, false, false), Ok(false)),
        ((false, true, false), Ok(false)),
        ((false, false, true), Ok(true)),
        ((true, true, false), Ok(true)),
        ((true, false, true), Ok(true)),
        ((true, false, false), Err(Code::FailedPrecondition)),
    ];
    for ((dev, mode, published), want) in cases {
        assert_eq!(
            code(read_only(node, dev, mode, published)),
            want,
            "device ro {dev}, mode ro {mode}, published ro {published}"
        );
    }
}

#[test]
fn only_a_blank_writable_device_is_formatted() {
    let v = volume();
    let node = Path::new("/dev/sdb");
    let ext4 = Signature::Filesystem("ext4".to_owned());
    let xfs = Signature::Filesystem("xfs".to_owned());
    let lvm = Signature::Other("LVM2_member".to_owned());
    // (found, published ro, read ro) -> action
    let cases = [
        (&Signature::Blank, false, false, Ok(OnProbe::Format)),
        (&ext4, false, false, Ok(OnProbe::Mount)),
        (&ext4, true, true, Ok(OnProbe::Mount)),
        (&Signature::Blank, true, true, Err(Code::FailedPrecondition)),
        (
            &Signature::Blank,
            false,
            true,
            Err(Code::FailedPrecondition),
        ),
        (&xfs, false, false, Err(Code::FailedPrecondition)),
        (&lvm, false, false, Err(Code::FailedPrecondition)),
        (&lvm, true, true, Err(Code::FailedPrecondition)),
    ];
    for (found, published, ro, want) in cases {
        assert_eq!(
            code(on_probe(&v, node, FsType::Ext4, found, published, ro)),
            want,
            "{found:?}, published ro {published}, read-only {ro}"
        );
    }
}

#[test]
fn what_a_format_made_is_mounted_only_if_it_is_the_asked_filesystem() {
    let node = Path::new("/dev/sdb");
    assert_eq!(
        code(after_format(
            node,
            FsType::Xfs,
            &Signature::Filesystem("xfs".to_owned())
        )),
        Ok(())
    );
    for made in [Signature::Blank, Signature::Filesystem("ext4".to_owned())] {
        assert!(after_format(node, FsType::Xfs, &made).is_err(), "{made:?}");
    }
}

#[test]
fn unstage_removes_only_this_volumes_record_and_only_once_unpublished() {
    let v = volume();
    let at = Path::new(STAGING);
    assert_eq!(
        code(unstage_record(&v, at, &record(&v.to_string(), WWID))),
        Ok(())
    );
    assert!(unstage_record(&v, at, &record(&format!("{WWID}:uid-2"), WWID)).is_err());
    assert_eq!(code(unpublished_first(&v, Vec::new())), Ok(()));
    assert_eq!(
        code(unpublished_first(
            &v,
            vec![PathBuf::from("/pods/a/volumes/pv1")]
        )),
        Err(Code::FailedPrecondition)
    );
}

#[test]
fn only_a_read_write_ext4_that_its_device_outgrew_grows_before_it_is_mounted() {
    // (fs, read-only, may grow unmounted)
    for (fs, ro, want) in [
        (FsType::Ext4, false, true),
        (FsType::Ext4, true, false),
        (FsType::Xfs, false, false),
        (FsType::Xfs, true, false),
    ] {
        assert_eq!(grows_unmounted(fs, ro), want, "{fs} read-only {ro}");
    }
    // (filesystem bytes, device bytes, outgrown)
    for (fs_bytes, device_bytes, want) in [
        (64 << 20, 64 << 20, false),
        (64 << 20, (64 << 20) + 4096, false),
        (64 << 20, (64 << 20) + GROW_SLACK, true),
        (64 << 20, 128 << 20, true),
        // A filesystem larger than its device (a LUN shrunk) is not grown.
        (128 << 20, 64 << 20, false),
        (u64::MAX, u64::MAX, false),
    ] {
        assert_eq!(
            outgrown(fs_bytes, device_bytes),
            want,
            "{fs_bytes} on {device_bytes}"
        );
    }
}
