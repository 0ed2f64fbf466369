//! Each lab node's own filesystem view. The lab's nodes share one host, but
//! the DaemonSet's hostPath volumes name fixed host paths
//! (`/var/lib/kubelet`, `/var/lib/csi-scsi-agent`, `/etc/iscsi`, ...), which on a
//! real cluster are each node's own. So every node gets a mount namespace
//! (a slave of the host's: the host's mounts reach it, its own stay in it)
//! where those paths are bind mounts of the node's directories; its
//! containerd, kubelet and kube-proxy run there, and so does every Pod they
//! start. Nothing in `deploy/` changes for the lab but the kernel
//! stand-in's seam (`/run/csi-scsi-lab`, see deploy/overlays/lab).

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::daemon::Daemon;
use crate::lab::net::sh;

/// Where the seam is mounted in the node's namespace (the lab overlay's
/// hostPath volume for the agent).
pub const SEAM_MOUNT: &str = "/run/csi-scsi-lab";

/// A node's mount namespace, kept alive by a bind mount of its nsfs file.
#[derive(Clone, Debug)]
pub struct NodeFs {
    handle: PathBuf,
}

/// What the namespace binds over which host path.
struct Bind {
    source: PathBuf,
    target: &'static str,
    file: bool,
}

impl NodeFs {
    /// Creates the namespace of the node whose directory is `base`.
    pub fn create(base: &Path) -> anyhow::Result<Self> {
        let host = base.join("host");
        let dir = |p: &str| host.join(p.trim_start_matches('/'));
        let mut binds = vec![
            Bind::dir(base.join("kubelet"), "/var/lib/kubelet"),
            Bind::dir(base.join("tree/etc/iscsi"), "/etc/iscsi"),
            Bind::dir(base.join(super::super::SEAM_DIR), SEAM_MOUNT),
            Bind::dir(base.join("tree"), "/run/csi-scsi-lab/tree"),
        ];
        for p in [
            "/var/lib/csi-scsi-agent",
            "/var/lib/iscsi",
            "/run/lock/iscsi",
            "/etc/multipath",
            "/run/udev",
            "/lib/modules",
            // kubelet's container logs, each node's own (a kubelet removes
            // log directories of Pods it does not know).
            "/var/log/pods",
            "/var/log/containers",
        ] {
            binds.push(Bind::dir(dir(p), p));
        }
        binds.push(Bind {
            source: dir("/etc/multipath.conf"),
            target: "/etc/multipath.conf",
            file: true,
        });
        for b in &binds {
            if b.file {
                if let Some(parent) = b.source.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                std::fs::write(&b.source, "")?;
                if !Path::new(b.target).exists() {
                    std::fs::write(b.target, "")?;
                }
            } else {
                std::fs::create_dir_all(&b.source)?;
                // The mount point, empty, on the host (the namespace only
                // covers it): created once, never written.
                if !b.target.starts_with(SEAM_MOUNT) || b.target == SEAM_MOUNT {
                    std::fs::create_dir_all(b.target)
                        .with_context(|| format!("creating the mount point {}", b.target))?;
                } else if let Ok(inner) = Path::new(b.target).strip_prefix(SEAM_MOUNT) {
                    // Inside the seam: its mount point is in the seam's
                    // directory (a node without a stand-in has none yet).
                    std::fs::create_dir_all(base.join(super::super::SEAM_DIR).join(inner))?;
                }
            }
        }
        // A persistent namespace's file must sit on a private mount.
        let ns = base.join("ns");
        std::fs::create_dir_all(&ns)?;
        let ns_s = ns.display().to_string();
        sh("mount", &["--bind", &ns_s, &ns_s])?;
        sh("mount", &["--make-private", &ns_s])?;
        let handle = ns.join("mnt");
        std::fs::write(&handle, "")?;
        sh(
            "unshare",
            &[
                &format!("--mount={}", handle.display()),
                "--propagation",
                "slave",
                "true",
            ],
        )
        .context("creating the node's mount namespace")?;
        let this = Self { handle };
        for b in &binds {
            this.run(
                "mount",
                &["--bind", &b.source.display().to_string(), b.target],
            )?;
        }
        // Bidirectional propagation (the agent's mounts reach kubelet and
        // the Pods) needs a shared mount: shared within this node only.
        this.run("mount", &["--make-rshared", "/var/lib/kubelet"])?;
        Ok(this)
    }

    /// `nsenter`'s argument that enters this namespace.
    pub fn nsenter_arg(&self) -> String {
        format!("--mount={}", self.handle.display())
    }

    /// Gives the namespace a PID 1 of its own, as a node's `/proc/1` is its
    /// init, in its mount namespace: what Kubernetes' HostExec Pods enter
    /// (`nsenter --mount=/rootfs/proc/1/ns/mnt`) to look at "the node". The
    /// lab's nodes share the host's PID namespace, whose PID 1 is the
    /// host's (and not even root's to enter here), so a process that only
    /// holds this namespace (`sleep infinity`) stands in: its `/proc/<pid>`
    /// is bind mounted over `/proc/1` in this namespace only. Returns that
    /// process (stop it with the lab).
    pub async fn anchor_proc_1(&self, log: &Path) -> anyhow::Result<Daemon> {
        let args = [
            self.nsenter_arg(),
            "sleep".to_owned(),
            "infinity".to_owned(),
        ];
        let anchor = Daemon::spawn_program(Path::new("nsenter"), &args, log);
        let pid = anchor.pid();
        // Until nsenter has entered the namespace and exec'd sleep, its
        // /proc entry is the host's nsenter.
        for _ in 0..200 {
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
            if exe.file_name().is_some_and(|n| n == "sleep") {
                self.run("mount", &["--bind", &format!("/proc/{pid}"), "/proc/1"])
                    .context("binding the node's PID 1 over /proc/1")?;
                return Ok(anchor);
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        anyhow::bail!("the node's PID 1 stand-in did not start:\n{}", anchor.log())
    }

    /// Runs `program` in this namespace (the host's network).
    pub fn run(&self, program: &str, args: &[&str]) -> anyhow::Result<String> {
        let mut all = vec![self.nsenter_arg(), program.to_owned()];
        all.extend(args.iter().map(|a| (*a).to_owned()));
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        sh("nsenter", &refs)
    }
}

impl Bind {
    fn dir(source: PathBuf, target: &'static str) -> Self {
        Self {
            source,
            target,
            file: false,
        }
    }
}
