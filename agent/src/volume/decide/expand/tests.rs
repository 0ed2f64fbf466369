//! NodeExpand's rules, as tables.

use std::path::Path;

use csi_scsi_contract::VolumeId;
use tonic::Code;

use super::*;
use crate::csi::status::status;
use crate::host::mount::MountOptions;

fn volume() -> VolumeId {
    VolumeId::parse("naa.600140500000000000000000000000a1:uid-1").expect("volume id")
}

fn code<T>(r: Result<T, AgentError>) -> Result<T, Code> {
    r.map_err(|e| status(&e).code())
}

#[test]
fn a_range_the_device_cannot_meet_is_out_of_range() {
    let size = 1 << 30;
    let cases = [
        ((None, None), Ok(())),
        ((Some(size), Some(size)), Ok(())),
        ((Some(size + 1), None), Err(Code::OutOfRange)),
        ((None, Some(size - 1)), Err(Code::OutOfRange)),
    ];
    for ((required, limit), want) in cases {
        assert_eq!(
            code(in_range(required, limit, size)),
            want,
            "{required:?}..{limit:?}"
        );
        assert_eq!(needs_rescan(required, size), required > Some(size));
    }
}

#[test]
fn raw_block_is_the_capabilitys_word_else_what_is_at_the_path() {
    let mount = AccessType::Mount {
        fs: FsType::Ext4,
        options: MountOptions::default(),
    };
    assert!(is_block(Some(&AccessType::Block), false, false));
    assert!(!is_block(Some(&mount), true, true));
    assert!(is_block(None, true, false));
    assert!(is_block(None, false, true));
    assert!(!is_block(None, false, false));
}

#[test]
fn only_the_volumes_own_device_or_filesystem_is_grown() {
    let v = volume();
    let at = AtPath {
        volume: &v,
        path: Path::new("/pods/p/volumes/pv1"),
    };
    let ours = DeviceNumber {
        major: 8,
        minor: 16,
    };
    let other = DeviceNumber {
        major: 8,
        minor: 32,
    };
    assert_eq!(code(block(at, None, ours)), Ok(Grow::Nothing));
    assert_eq!(code(block(at, Some((ours, true)), ours)), Ok(Grow::Nothing));
    assert_eq!(
        code(block(at, Some((other, false)), ours)),
        Err(Code::NotFound)
    );
    let seen = |ours: bool, fs: &str| SeenMount {
        ours,
        fs_type: fs.to_owned(),
        read_only: false,
        described: format!("device 8:16 ({fs} from /dev/sdb)"),
    };
    assert_eq!(
        code(filesystem(at, Some(&seen(true, "xfs")))),
        Ok(Grow::Filesystem(FsType::Xfs))
    );
    assert_eq!(code(filesystem(at, None)), Err(Code::NotFound));
    assert_eq!(
        code(filesystem(at, Some(&seen(false, "ext4")))),
        Err(Code::NotFound)
    );
    assert_eq!(
        code(filesystem(at, Some(&seen(true, "btrfs")))),
        Err(Code::FailedPrecondition)
    );
}
