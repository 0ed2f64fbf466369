//! Tests of the filesystem tools: the allow-list and blkid parsing, and,
//! as root on real loop devices, probe, format and the offline ext4 grow
//! (this machine refuses online ext4 grows, so the grow path itself is
//! proven here on an unmounted device).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;
use crate::host::command::CommandRunner;

fn host() -> Host {
    Host {
        sysfs: PathBuf::from("/nonexistent/sys"),
        dev: PathBuf::from("/nonexistent/dev"),
        mountinfo: PathBuf::from("/proc/self/mountinfo"),
        kubelet_dir: PathBuf::from("/nonexistent/kubelet"),
        iscsi_nodes: std::path::PathBuf::from("/nonexistent/iscsi/nodes"),
        tools: Default::default(),
        runner: CommandRunner::new(Duration::from_secs(60)),
    }
}

/// A sparse file on a loop device, detached when dropped.
struct LoopDevice {
    _dir: tempfile::TempDir,
    file: PathBuf,
    device: PathBuf,
}

impl LoopDevice {
    async fn create(size: u64) -> Option<Self> {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipping: loop devices need root");
            return None;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("lun.img");
        std::fs::File::create(&file)
            .expect("create")
            .set_len(size)
            .expect("size");
        let out = host()
            .runner
            .run(
                Path::new("losetup"),
                &["--find".into(), "--show".into(), file.as_path().into()],
            )
            .await
            .expect("losetup");
        let device = PathBuf::from(out.stdout.trim());
        Some(Self {
            _dir: dir,
            file,
            device,
        })
    }

    async fn grow(&self, size: u64) {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&self.file)
            .expect("open")
            .set_len(size)
            .expect("grow");
        host()
            .runner
            .run(
                Path::new("losetup"),
                &["-c".into(), self.device.as_path().into()],
            )
            .await
            .expect("losetup -c");
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        // Test clean-up only; production code spawns through CommandRunner.
        #[allow(clippy::disallowed_methods)]
        let _ = std::process::Command::new("losetup")
            .arg("-d")
            .arg(&self.device)
            .status();
    }
}

/// ext4 block count times block size, from `dumpe2fs -h`.
async fn ext4_size(device: &Path) -> u64 {
    let out = host()
        .runner
        .run(Path::new("dumpe2fs"), &["-h".into(), device.into()])
        .await
        .expect("dumpe2fs");
    let field = |name: &str| -> u64 {
        out.stdout
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in dumpe2fs output"))
    };
    field("Block count:") * field("Block size:")
}

#[test]
fn allowed_mkfs_options_pass_and_keep_their_order() {
    let o =
        MkfsOptions::parse(FsType::Ext4, " -m 0  -L data -E lazy_itable_init=1 ").expect("allowed");
    assert_eq!(
        o.args(),
        ["-m", "0", "-L", "data", "-E", "lazy_itable_init=1"]
    );
    let o = MkfsOptions::parse(FsType::Xfs, "-K -m reflink=0 -L logs").expect("allowed");
    assert_eq!(o.args(), ["-K", "-m", "reflink=0", "-L", "logs"]);
    assert_eq!(
        MkfsOptions::parse(FsType::Xfs, "").expect("empty"),
        MkfsOptions::default()
    );
}

#[test]
fn mkfs_options_outside_the_allow_list_are_refused_by_name() {
    for (fs, text, named) in [
        (FsType::Ext4, "-F", "\"-F\""),
        (FsType::Xfs, "-f", "\"-f\""),
        (FsType::Ext4, "-m 0 /dev/sda", "\"/dev/sda\""),
        (FsType::Ext4, "-m 51", "\"51\""),
        (FsType::Ext4, "-L", "needs a value"),
        (FsType::Ext4, "-L ../../etc", "\"../../etc\""),
        (FsType::Ext4, "-E root_owner=0:0", "\"root_owner=0:0\""),
        (FsType::Xfs, "-d agcount=1", "\"-d\""),
        (
            FsType::Xfs,
            "-L much-too-long-label",
            "\"much-too-long-label\"",
        ),
    ] {
        let err = MkfsOptions::parse(fs, text).expect_err(text);
        assert!(err.contains(named), "{text}: {err}");
    }
}

#[test]
fn the_probes_values_are_classified() {
    assert_eq!(
        signature_of(Some("ext4"), Some("filesystem"), None),
        Signature::Filesystem("ext4".into())
    );
    assert_eq!(
        signature_of(Some("swap"), Some("other"), None),
        Signature::Other("a swap signature".into())
    );
    assert_eq!(
        signature_of(Some("LVM2_member"), Some("raid"), None),
        Signature::Other("a LVM2_member signature".into())
    );
    assert_eq!(
        signature_of(None, None, Some("gpt")),
        Signature::Other("a gpt partition table".into())
    );
    assert_eq!(
        signature_of(None, None, None),
        Signature::Other("an unrecognised signature".into())
    );
}

#[tokio::test]
async fn a_blank_device_probes_blank_and_a_formatted_one_probes_its_type() {
    let Some(lun) = LoopDevice::create(64 << 20).await else {
        return;
    };
    let host = host();
    assert_eq!(probe(&lun.device).await.expect("probe"), Signature::Blank);
    format(&host, &lun.device, FsType::Ext4, &MkfsOptions::default())
        .await
        .expect("mkfs");
    assert_eq!(
        probe(&lun.device).await.expect("probe"),
        Signature::Filesystem("ext4".into())
    );
}

#[tokio::test]
async fn mkfs_refuses_to_overwrite_a_filesystem_on_its_own() {
    // mkfs is never forced: a caller that skipped the probe could not
    // overwrite an xfs with mkfs.xfs (mke2fs gives no such guarantee off a
    // terminal, which is why the probe, not the tools, decides).
    let Some(lun) = LoopDevice::create(320 << 20).await else {
        return;
    };
    let host = host();
    format(&host, &lun.device, FsType::Xfs, &MkfsOptions::default())
        .await
        .expect("mkfs");
    let err = format(&host, &lun.device, FsType::Xfs, &MkfsOptions::default())
        .await
        .expect_err("existing xfs must not be overwritten");
    assert!(
        matches!(err, AgentError::Tool(CommandError::Failed { .. })),
        "{err}"
    );
}

#[tokio::test]
async fn an_unmounted_ext4_grows_to_fill_its_grown_device() {
    let Some(lun) = LoopDevice::create(64 << 20).await else {
        return;
    };
    let host = host();
    format(&host, &lun.device, FsType::Ext4, &MkfsOptions::default())
        .await
        .expect("mkfs");
    assert_eq!(ext4_size(&lun.device).await, 64 << 20);
    lun.grow(128 << 20).await;
    grow(&host, FsType::Ext4, &lun.device, None)
        .await
        .expect("offline grow");
    assert_eq!(ext4_size(&lun.device).await, 128 << 20);
    // Growing again is a no-op, not an error.
    grow(&host, FsType::Ext4, &lun.device, None)
        .await
        .expect("idempotent grow");
    assert_eq!(ext4_size(&lun.device).await, 128 << 20);
}

#[test]
fn the_kernels_refusal_of_an_online_grow_is_reported_as_such() {
    let device = Path::new("/dev/sdb");
    let err = check_grow(
        Path::new("resize2fs"),
        FsType::Ext4,
        device,
        "Filesystem at /dev/sdb is mounted on /mnt; on-line resizing required\nold_desc_blocks = 1, new_desc_blocks = 1\n",
        "resize2fs 1.47.0 (5-Feb-2023)\nresize2fs: Permission denied to resize filesystem\n",
        1,
    )
    .expect_err("refused");
    let text = err.to_string();
    assert!(
        matches!(err, AgentError::OnlineGrowRefused { .. }),
        "{text}"
    );
    assert!(text.contains("CAP_SYS_RESOURCE"), "{text}");
    assert!(text.contains("not grown"), "{text}");
    let other = check_grow(
        Path::new("resize2fs"),
        FsType::Ext4,
        device,
        "",
        "resize2fs: Bad magic number",
        1,
    )
    .expect_err("fails");
    assert!(matches!(other, AgentError::Tool(_)), "{other}");
}

#[tokio::test]
async fn a_device_that_cannot_be_read_or_has_no_size_is_not_ready_never_blank() {
    let dir = tempfile::tempdir().expect("tempdir");
    // No size: what a path in transition or a LUN just unmapped reports
    // (the crash suite met it: mkfs was only stopped by its own check).
    let empty = dir.path().join("empty");
    std::fs::write(&empty, b"").expect("empty");
    match probe(&empty).await {
        Err(AgentError::DeviceNotReady { reason, .. }) => {
            assert!(reason.contains("size of zero"), "{reason}")
        }
        other => panic!("a device of size zero must not be judged: {other:?}"),
    }
    // Cannot be opened at all.
    let gone = dir.path().join("gone");
    assert!(matches!(
        probe(&gone).await,
        Err(AgentError::DeviceNotReady { .. })
    ));
    // Shorter than it claims (a read that fails part-way): a directory
    // opens, seeks, and then refuses to be read.
    assert!(matches!(
        probe(dir.path()).await,
        Err(AgentError::DeviceNotReady { .. }) | Err(AgentError::Tool(_))
    ));
}

#[tokio::test]
async fn data_no_known_signature_explains_is_not_blank() {
    // The probe finds nothing over these (no magic where any filesystem
    // keeps one), yet they hold data: the probe areas decide.
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, offset) in [("head", 1024u64), ("tail", (8 << 20) - 512)] {
        let disk = dir.path().join(name);
        let f = std::fs::File::create(&disk).expect("create");
        f.set_len(8 << 20).expect("size");
        std::os::unix::fs::FileExt::write_all_at(&f, b"\x53\xef not zero", offset).expect("data");
        match probe(&disk).await.expect("probe") {
            Signature::Other(what) => assert!(what.contains("no known signature"), "{what}"),
            other => panic!("data at {offset} was called {other:?}"),
        }
    }
    // All zeroes and nothing found: blank.
    let zero = dir.path().join("zero");
    std::fs::File::create(&zero)
        .expect("create")
        .set_len(8 << 20)
        .expect("size");
    assert_eq!(probe(&zero).await.expect("probe"), Signature::Blank);
}

#[tokio::test]
async fn two_conflicting_signatures_are_ambivalent_never_one_of_them() {
    // An ext4 with an XFS superblock written over its first sector (the
    // two do not overlap): what `blkid -p` calls ambivalent (exit 8); the
    // safe probe must not pick one.
    let Some(lun) = LoopDevice::create(64 << 20).await else {
        return;
    };
    format(&host(), &lun.device, FsType::Ext4, &MkfsOptions::default())
        .await
        .expect("mkfs");
    let dir = tempfile::tempdir().expect("tempdir");
    let xfs = dir.path().join("xfs");
    std::fs::File::create(&xfs)
        .and_then(|f| f.set_len(400 << 20))
        .expect("an XFS image");
    let made = std::process::Command::new("mkfs.xfs")
        .arg("-q")
        .arg(&xfs)
        .status()
        .expect("mkfs.xfs");
    assert!(made.success());
    let mut sector = vec![0u8; 512];
    std::fs::File::open(&xfs)
        .and_then(|f| std::os::unix::fs::FileExt::read_exact_at(&f, &mut sector, 0))
        .expect("its superblock");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&lun.device)
        .expect("open");
    std::os::unix::fs::FileExt::write_all_at(&f, &sector, 0).expect("superblock");
    f.sync_all().expect("sync");
    drop(f);
    match probe(&lun.device).await.expect("probe") {
        Signature::Other(what) => assert!(what.contains("conflicting"), "{what}"),
        other => panic!("an ext4 with an XFS superblock was called {other:?}"),
    }
}
