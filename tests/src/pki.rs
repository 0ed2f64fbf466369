//! Certificates for tests, issued by the real `csi-scsi-certs` CLI, laid
//! out the way a Kubernetes Secret volume mounts them.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::binaries::binary;

/// A CA directory and the certificates issued from it.
#[derive(Debug)]
pub struct Pki {
    root: PathBuf,
}

impl Pki {
    /// Creates a CA under `root/ca` with the CLI.
    pub fn init(root: &Path) -> Self {
        let this = Self {
            root: root.to_owned(),
        };
        this.certs(&["init-ca", "--out", &this.ca_dir().to_string_lossy()]);
        this
    }

    /// The CA's directory (ca.crt, ca.key).
    pub fn ca_dir(&self) -> PathBuf {
        self.root.join("ca")
    }

    /// Issues node `node`'s agent certificate into `root/<dir_name>`.
    pub fn issue_agent(&self, node: &str, dir_name: &str) -> PathBuf {
        let out = self.root.join(dir_name);
        self.certs(&[
            "issue-agent",
            "--node",
            node,
            "--ca",
            &self.ca_dir().to_string_lossy(),
            "--out",
            &out.to_string_lossy(),
        ]);
        out
    }

    /// Issues the proxy's certificate into `root/<dir_name>`.
    pub fn issue_proxy(&self, dir_name: &str) -> PathBuf {
        let out = self.root.join(dir_name);
        self.certs(&[
            "issue-proxy",
            "--ca",
            &self.ca_dir().to_string_lossy(),
            "--out",
            &out.to_string_lossy(),
        ]);
        out
    }

    fn certs(&self, args: &[&str]) {
        let out = Command::new(binary("csi-scsi-certs"))
            .args(args)
            .output()
            .expect("run csi-scsi-certs");
        assert!(
            out.status.success(),
            "csi-scsi-certs {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Turns the plain directory `dir` (tls.crt, tls.key, ca.crt) into a
/// Secret-volume layout: files in `..<stamp>/`, `..data` pointing at it,
/// and each file a symlink through `..data`.
pub fn as_secret_volume(dir: &Path) {
    let stamp = dir.join("..2026_01_01_00_00_00.0");
    std::fs::create_dir(&stamp).expect("create timestamp dir");
    for f in ["tls.crt", "tls.key", "ca.crt"] {
        std::fs::rename(dir.join(f), stamp.join(f)).expect("move file");
    }
    std::os::unix::fs::symlink(stamp.file_name().expect("name"), dir.join("..data"))
        .expect("..data link");
    for f in ["tls.crt", "tls.key", "ca.crt"] {
        std::os::unix::fs::symlink(format!("..data/{f}"), dir.join(f)).expect("file link");
    }
}

/// Rotates a Secret volume the way kubelet does: the new files go into a
/// fresh timestamped dir, `..data_tmp` points at it and is renamed over
/// `..data` (one atomic step), then the old dir is removed.
pub fn rotate_secret_volume(dir: &Path, new_files: &Path, generation: u32) {
    let old = std::fs::read_link(dir.join("..data")).expect("..data link");
    let stamp = dir.join(format!("..2026_01_01_00_00_00.{generation}"));
    std::fs::create_dir(&stamp).expect("create timestamp dir");
    for f in ["tls.crt", "tls.key", "ca.crt"] {
        std::fs::copy(new_files.join(f), stamp.join(f)).expect("copy file");
    }
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(stamp.file_name().expect("name"), &tmp).expect("tmp link");
    std::fs::rename(&tmp, dir.join("..data")).expect("swap ..data");
    std::fs::remove_dir_all(dir.join(old)).expect("remove old data");
}
