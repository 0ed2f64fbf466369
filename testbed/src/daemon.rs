//! A csi-scsi process under test: spawned with its arguments, its log
//! captured to a file, stopped with SIGTERM (then SIGKILL) when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use crate::binaries::binary;

/// A running binary.
#[derive(Debug)]
pub struct Daemon {
    child: Option<Child>,
    log: PathBuf,
}

impl Daemon {
    /// Starts `name` with `args`; stderr and stdout go to `log`.
    pub fn spawn(name: &str, args: &[String], log: &Path) -> Self {
        Self::spawn_program(&binary(name), args, log)
    }

    /// Starts any program (for example `nsenter ... <agent>`).
    pub fn spawn_program(program: &Path, args: &[String], log: &Path) -> Self {
        Self::spawn_with(program, args, &[], log)
    }

    /// Starts `program` with extra environment `env`; appends to `log`
    /// (a restarted process keeps its predecessor's log above its own).
    pub fn spawn_with(
        program: &Path,
        args: &[String],
        env: &[(String, String)],
        log: &Path,
    ) -> Self {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("open log file");
        let err = out.try_clone().expect("clone log file");
        let child = Command::new(program)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "info,csi_scsi=debug")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn daemon");
        Self {
            child: Some(child),
            log: log.to_owned(),
        }
    }

    /// The process's output so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The process ID.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// Leaves the process running when this handle is dropped.
    pub fn detach(mut self) -> u32 {
        let pid = self.pid();
        self.child = None;
        pid
    }

    /// The exit status if the process has exited.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Sends SIGTERM and waits (bounded) for the exit status.
    pub async fn terminate(&mut self) -> ExitStatus {
        signal(self.pid(), "TERM");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = self.try_exit() {
                self.child = None;
                return status;
            }
            if tokio::time::Instant::now() > deadline {
                signal(self.pid(), "KILL");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(child.id(), "TERM");
            for _ in 0..100 {
                if child.try_wait().ok().flatten().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Sends a signal with kill(1): the harness stays free of unsafe code.
fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status();
}

/// A free TCP port on 127.0.0.1 (bound, read, released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}
