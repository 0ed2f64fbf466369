//! The lab's container images, made here from Debian's busybox-static
//! (there is no registry): a docker-archive tarball with one layer, which
//! each node's containerd imports. `local/busybox:1` runs the workloads;
//! `local/pause:1` is the same layer with a sleeping entrypoint, the Pod
//! sandbox image. The archive is written by [`crate::images::archive`],
//! as `lab images` writes the driver's.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::images::archive;

/// The workload image's name as a Pod spec writes it.
pub const BUSYBOX: &str = "local/busybox:1";
/// The sandbox image (containerd's `sandbox_image`), fully qualified.
pub const PAUSE: &str = "docker.io/local/pause:1";

/// Applets the workloads use; each is a symlink to busybox.
const APPLETS: &[&str] = &[
    "sh", "sleep", "cat", "echo", "df", "dd", "ls", "mkdir", "sync", "test", "stat", "blockdev",
    "head", "grep", "true", "wc", "md5sum", "rm", "yes", "cmp", "mv", "touch",
];

/// Writes the image archive under `dir` and returns its path.
pub fn build(dir: &Path) -> anyhow::Result<PathBuf> {
    let work = dir.join("image");
    let rootfs = work.join("rootfs");
    std::fs::create_dir_all(rootfs.join("bin"))?;
    for d in ["tmp", "proc", "sys", "dev", "etc", "data"] {
        std::fs::create_dir_all(rootfs.join(d))?;
    }
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).context("busybox-static")?;
    for applet in APPLETS {
        let link = rootfs.join("bin").join(applet);
        if !link.exists() {
            std::os::unix::fs::symlink("busybox", &link)?;
        }
    }
    let layer = archive::layer(&rootfs, &work.join("layer.tar"))?;
    let staging = work.join("archive");
    if staging.exists() {
        std::fs::remove_dir_all(&staging)?;
    }
    std::fs::create_dir(&staging)?;
    let image = |reference: &str, entrypoint: &[&str]| archive::Image {
        references: vec![reference.to_owned()],
        config: archive::Config {
            entrypoint: entrypoint.iter().map(|s| (*s).to_owned()).collect(),
            user: None,
            env: vec!["PATH=/bin".into()],
        },
    };
    let archive = dir.join("images.tar");
    archive::write(
        &archive,
        &staging,
        &layer,
        &[
            image(BUSYBOX, &[]),
            image(PAUSE, &["/bin/sleep", "2147483647"]),
        ],
    )?;
    Ok(archive)
}
