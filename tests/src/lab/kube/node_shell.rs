//! Each lab node's shell, reached as any node is: SSH on its address, port
//! 22 (Debian's `sshd`, in the node's network namespace). Kubernetes'
//! disruptive e2e specs reach nodes this way (`KUBE_SSH_KEY_PATH`,
//! `KUBE_SSH_USER`): they run `sudo systemctl stop|start kubelet`,
//! `systemctl show kubelet --property ActiveState --value`, and look at
//! the node's mounts and `/var/lib/kubelet`. A session's command runs in
//! the node's mount namespace ([`super::node_fs`]), where those paths are
//! the node's own; `systemctl` there is the lab's (`lab node-systemctl`),
//! which acts on the node's [`KubeletUnit`]; `sudo` runs its command (root
//! already). Only root's key, made per lab, logs in.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

use super::kubelet_unit::{ActiveState, KubeletUnit};
use super::node_fs::NodeFs;
use crate::binaries::binary;
use crate::daemon::Daemon;
use crate::lab::net::sh;

/// Debian's sshd (re-executing itself needs its absolute path).
const SSHD: &str = "/usr/sbin/sshd";
/// The user the e2e specs log in as.
pub const USER: &str = "root";
/// The environment variable naming the node's directory in a session.
const NODE_DIR_ENV: &str = "CSI_SCSI_LAB_NODE_DIR";
/// The environment variable naming the host's mount namespace in a
/// session (the node's `/proc/1` is the host's init, which this host's
/// root may not enter).
const HOST_MNT_ENV: &str = "CSI_SCSI_LAB_HOST_MNT";

/// The lab's SSH keys and the commands its node sessions find first on
/// their PATH (`<lab>/kube/node-shell`).
#[derive(Clone, Debug)]
pub struct NodeShell {
    dir: PathBuf,
}

impl NodeShell {
    /// Makes the keys (root's, the nodes' host key) and the commands.
    pub fn prepare(kube_dir: &Path) -> anyhow::Result<Self> {
        let dir = kube_dir.join("node-shell");
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin)?;
        let shell = Self { dir };
        for key in [shell.key(), shell.host_key()] {
            if !key.exists() {
                let path = key.display().to_string();
                sh(
                    "ssh-keygen",
                    &[
                        "-q",
                        "-t",
                        "ed25519",
                        "-N",
                        "",
                        "-C",
                        "csi-scsi-lab",
                        "-f",
                        &path,
                    ],
                )?;
            }
        }
        std::fs::copy(shell.key().with_extension("pub"), shell.authorized_keys())?;
        let lab = quote(&binary("lab").display().to_string());
        write_script(
            &bin.join("systemctl"),
            &format!(
                "# systemctl on a lab node: the kubelet unit only (tests/src/lab/kube/node_shell.rs).\n\
                 # The lab's command runs in the host's mount namespace (the session's\n\
                 # sshd's), where the unit's command line (nsenter into the node's\n\
                 # namespaces) resolves.\n\
                 exec nsenter --mount=\"${HOST_MNT_ENV}\" -- {lab} node-systemctl \"${NODE_DIR_ENV}\" \"$@\"\n"
            ),
        )?;
        write_script(
            &bin.join("sudo"),
            "# sudo on a lab node: sessions are root's already.\n\
             if [ \"$1\" = --version ]; then echo 'Sudo version 1 (csi-scsi lab node: runs its command as root)'; exit 0; fi\n\
             exec \"$@\"\n",
        )?;
        Ok(shell)
    }

    /// The private key that logs in (`KUBE_SSH_KEY_PATH`).
    pub fn key(&self) -> PathBuf {
        self.dir.join("id_ed25519")
    }

    fn host_key(&self) -> PathBuf {
        self.dir.join("host_key")
    }

    fn authorized_keys(&self) -> PathBuf {
        self.dir.join("authorized_keys")
    }

    /// Starts the sshd of the node whose directory is `base`, on `ip`:22 in
    /// network namespace `netns`; returns once it accepts connections.
    pub async fn start(
        &self,
        base: &Path,
        ip: IpAddr,
        netns: &str,
        fs: &NodeFs,
    ) -> anyhow::Result<Daemon> {
        // sshd's privilege separation directory (the package's tmpfiles.d
        // makes it at boot; nothing booted here).
        std::fs::create_dir_all("/run/sshd")?;
        let session = base.join("node-shell");
        write_script(
            &session,
            &format!(
                "# A session on this lab node (sshd's ForceCommand): the command runs in\n\
                 # the node's mount namespace, the lab's systemctl and sudo first on PATH.\n\
                 export PATH={path}\n\
                 export {NODE_DIR_ENV}={base}\n\
                 # sshd's session process stays in the host's mount namespace.\n\
                 export {HOST_MNT_ENV}=/proc/$PPID/ns/mnt\n\
                 exec nsenter {mount} /bin/sh -c \"$SSH_ORIGINAL_COMMAND\"\n",
                path = quote(&format!(
                    "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    self.dir.join("bin").display()
                )),
                base = quote(&base.display().to_string()),
                mount = quote(&fs.nsenter_arg()),
            ),
        )?;
        let config = base.join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "ListenAddress {ip}:22\n\
                 HostKey {host_key}\n\
                 AuthorizedKeysFile {authorized}\n\
                 AllowUsers {USER}\n\
                 PermitRootLogin prohibit-password\n\
                 PasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\n\
                 UsePAM no\n\
                 # The lab's files live under /tmp (mode 1777).\n\
                 StrictModes no\n\
                 PidFile none\n\
                 PrintMotd no\n\
                 ForceCommand {session}\n",
                host_key = self.host_key().display(),
                authorized = self.authorized_keys().display(),
                session = session.display(),
            ),
        )?;
        let args = [
            format!("--net=/run/netns/{netns}"),
            SSHD.to_owned(),
            "-D".into(),
            "-e".into(),
            "-f".into(),
            config.display().to_string(),
        ];
        let sshd = Daemon::spawn_program(Path::new("nsenter"), &args, &base.join("sshd.log"));
        let address = std::net::SocketAddr::new(ip, 22);
        for _ in 0..100 {
            if std::net::TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok() {
                return Ok(sshd);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::bail!("sshd on {address} did not start:\n{}", sshd.log())
    }

    /// Runs `command` on the node at `ip` as the e2e specs do (OpenSSH's
    /// client, root's key); returns its standard output, or an error with
    /// its exit status and standard error.
    pub fn run(&self, ip: IpAddr, command: &str) -> anyhow::Result<String> {
        let key = self.key().display().to_string();
        let target = format!("{USER}@{ip}");
        sh(
            "ssh",
            &[
                "-i",
                &key,
                "-o",
                "BatchMode=yes",
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "LogLevel=ERROR",
                "-o",
                "ConnectTimeout=10",
                &target,
                command,
            ],
        )
        .with_context(|| format!("`{command}` on {ip} over SSH"))
    }
}

/// `lab node-systemctl <node dir> ARGS`: the part of systemctl the e2e
/// specs use, for the node's kubelet unit. Returns what systemctl would
/// print and its exit status (3 for a unit that is not active, as
/// systemd's `is-active` and `status`), or an error for anything else.
pub async fn systemctl(node_dir: &Path, args: &[String]) -> anyhow::Result<(String, u8)> {
    let unit = KubeletUnit::load(node_dir)?;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let state = |unit: &KubeletUnit| match unit.active_state() {
        ActiveState::Active => 0,
        ActiveState::Inactive => 3,
    };
    Ok(match args.as_slice() {
        ["start", "kubelet"] => {
            unit.start().await?;
            (String::new(), 0)
        }
        ["stop", "kubelet"] => {
            unit.stop().await;
            (String::new(), 0)
        }
        ["restart", "kubelet"] => {
            unit.stop().await;
            unit.start().await?;
            (String::new(), 0)
        }
        ["is-active", "kubelet"] => (format!("{}\n", unit.active_state().as_str()), state(&unit)),
        ["show", "kubelet", "--property", property, "--value"] => match *property {
            "ActiveState" => (format!("{}\n", unit.active_state().as_str()), 0),
            "MainPID" => (format!("{}\n", unit.main_pid().unwrap_or(0)), 0),
            other => anyhow::bail!("lab node: property {other:?} of kubelet is not kept"),
        },
        ["status", "kubelet"] => {
            let mut out = format!(
                "* kubelet.service - kubelet (lab node)\n     Active: {}\n",
                unit.active_state().as_str()
            );
            if let Some(pid) = unit.main_pid() {
                out.push_str(&format!("   Main PID: {pid} (kubelet)\n"));
            }
            (out, state(&unit))
        }
        _ => anyhow::bail!(
            "lab node: systemctl here knows only start|stop|restart|is-active|status kubelet and show kubelet --property ActiveState|MainPID --value (got {:?})",
            args.join(" ")
        ),
    })
}

/// `s` as one shell word.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn write_script(path: &Path, body: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, format!("#!/bin/sh\n{body}"))
        .with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A unit whose "kubelet" is `sleep` (a real process) started as the
    /// lab starts kubelet (`nsenter`, which execs it), in a fresh node
    /// directory.
    fn unit(dir: &Path) -> KubeletUnit {
        // The second operand makes the command line this test's own.
        let marker = format!("0.{}", std::process::id());
        KubeletUnit::create(
            dir,
            Path::new("nsenter"),
            vec![
                "--net=/proc/self/ns/net".into(),
                "sleep".into(),
                "1000".into(),
                marker,
            ],
            dir.join("kubelet.log"),
        )
        .expect("the unit file")
    }

    async fn systemctl_says(dir: &Path, args: &str) -> (String, u8) {
        let args: Vec<String> = args.split(' ').map(str::to_owned).collect();
        systemctl(dir, &args).await.expect("systemctl answers")
    }

    #[tokio::test]
    async fn systemctl_starts_stops_and_reports_the_nodes_kubelet() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let unit = unit(dir.path());
        let show = "show kubelet --property ActiveState --value";
        assert_eq!(
            systemctl_says(dir.path(), show).await,
            ("inactive\n".into(), 0)
        );
        assert_eq!(
            systemctl_says(dir.path(), "is-active kubelet").await,
            ("inactive\n".into(), 3)
        );
        assert_eq!(
            systemctl_says(dir.path(), "start kubelet").await,
            (String::new(), 0)
        );
        let pid = unit.main_pid().expect("running after start");
        assert_eq!(
            systemctl_says(dir.path(), show).await,
            ("active\n".into(), 0)
        );
        let (status, code) = systemctl_says(dir.path(), "status kubelet").await;
        assert_eq!(code, 0);
        assert!(status.contains(&format!("Main PID: {pid} ")), "{status}");
        // start is idempotent: the same process.
        systemctl_says(dir.path(), "start kubelet").await;
        assert_eq!(unit.main_pid(), Some(pid));
        // restart: a new process.
        systemctl_says(dir.path(), "restart kubelet").await;
        let restarted = unit.main_pid().expect("running after restart");
        assert_ne!(restarted, pid);
        assert_eq!(
            systemctl_says(dir.path(), "show kubelet --property MainPID --value").await,
            (format!("{restarted}\n"), 0)
        );
        systemctl_says(dir.path(), "stop kubelet").await;
        assert_eq!(unit.main_pid(), None);
        assert_eq!(
            systemctl_says(dir.path(), show).await,
            ("inactive\n".into(), 0)
        );
        // stop is idempotent.
        assert_eq!(
            systemctl_says(dir.path(), "stop kubelet").await,
            (String::new(), 0)
        );
    }

    #[tokio::test]
    async fn a_recorded_pid_of_another_process_is_not_the_kubelet() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let unit = unit(dir.path());
        // This test's own process: alive, but not the unit's command line.
        std::fs::write(
            dir.path().join("kubelet.pid"),
            std::process::id().to_string(),
        )
        .expect("writing the PID file");
        assert_eq!(unit.main_pid(), None);
        assert_eq!(unit.active_state(), ActiveState::Inactive);
        // stop must not signal it (this test would die).
        unit.stop().await;
        let pid = unit.start().await.expect("started");
        assert_ne!(pid, std::process::id());
        unit.stop().await;
        assert_eq!(unit.main_pid(), None);
    }

    #[tokio::test]
    async fn systemctl_refuses_what_it_does_not_keep() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        unit(dir.path());
        for args in [
            "start containerd",
            "daemon-reload",
            "show kubelet --property ExecMainStartTimestamp --value",
        ] {
            let args: Vec<String> = args.split(' ').map(str::to_owned).collect();
            let Err(err) = systemctl(dir.path(), &args).await else {
                panic!("{args:?} answered");
            };
            assert!(err.to_string().contains("lab node:"), "{err}");
        }
        // A node directory without a unit is an error, not "inactive".
        let empty = tempfile::tempdir().expect("a temporary directory");
        let args = vec!["is-active".to_owned(), "kubelet".to_owned()];
        assert!(systemctl(empty.path(), &args).await.is_err());
    }
}
