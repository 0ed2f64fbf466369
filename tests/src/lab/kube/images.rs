//! The lab's container images, made here from Debian's busybox-static
//! (there is no registry): a docker-archive tarball with one layer, which
//! each node's containerd imports. `local/busybox:1` runs the workloads;
//! `local/pause:1` is the same layer with a sleeping entrypoint, the Pod
//! sandbox image.

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::super::net::sh;

/// The workload image's name as a Pod spec writes it.
pub const BUSYBOX: &str = "local/busybox:1";
/// The sandbox image (containerd's `sandbox_image`), fully qualified.
pub const PAUSE: &str = "docker.io/local/pause:1";

/// Applets the workloads use; each is a symlink to busybox.
const APPLETS: &[&str] = &[
    "sh", "sleep", "cat", "echo", "df", "dd", "ls", "mkdir", "sync", "test", "stat", "blockdev",
    "head", "grep", "true", "wc", "md5sum", "rm",
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
    let layer = work.join("layer.tar");
    sh(
        "tar",
        &[
            "--numeric-owner",
            "--owner=0",
            "--group=0",
            "-C",
            &rootfs.display().to_string(),
            "-cf",
            &layer.display().to_string(),
            ".",
        ],
    )?;
    let diff_id = sha256(&layer)?;
    let config = |entrypoint: serde_json::Value| {
        serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {"Env": ["PATH=/bin"], "Entrypoint": entrypoint, "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]},
        })
    };
    std::fs::write(
        work.join("busybox.json"),
        serde_json::to_vec(&config(serde_json::Value::Null))?,
    )?;
    std::fs::write(
        work.join("pause.json"),
        serde_json::to_vec(&config(serde_json::json!(["/bin/sleep", "2147483647"])))?,
    )?;
    let manifest = serde_json::json!([
        {"Config": "busybox.json", "RepoTags": [format!("docker.io/{BUSYBOX}")], "Layers": ["layer.tar"]},
        {"Config": "pause.json", "RepoTags": [PAUSE], "Layers": ["layer.tar"]},
    ]);
    std::fs::write(work.join("manifest.json"), serde_json::to_vec(&manifest)?)?;
    let archive = dir.join("images.tar");
    sh(
        "tar",
        &[
            "-C",
            &work.display().to_string(),
            "-cf",
            &archive.display().to_string(),
            "manifest.json",
            "busybox.json",
            "pause.json",
            "layer.tar",
        ],
    )?;
    Ok(archive)
}

fn sha256(path: &Path) -> anyhow::Result<String> {
    let out = sh("sha256sum", &[&path.display().to_string()])?;
    Ok(out
        .split_whitespace()
        .next()
        .context("sha256sum output")?
        .to_owned())
}
