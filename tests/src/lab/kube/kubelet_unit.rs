//! A lab node's kubelet as a service, as systemd keeps it on a real node:
//! how it starts (its command line, its log), and its main PID in a file.
//! The lab's own steps stop and start it through this, and so does
//! `systemctl` on the node's shell ([`super::node_shell`]), which
//! Kubernetes' disruptive e2e specs reach over SSH: both see one kubelet,
//! also after the process that started the lab has exited (`--keep`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::daemon::Daemon;

/// The unit file's name in the node's directory.
const UNIT: &str = "kubelet.unit.json";
/// The main PID's file's name in the node's directory.
const PID: &str = "kubelet.pid";
/// How long a stop waits for kubelet to exit after SIGTERM before SIGKILL
/// (systemd's default `TimeoutStopSec` is 90 s; kubelet exits in well
/// under a second).
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a start waits for `nsenter` to enter the node's namespaces and
/// exec kubelet (milliseconds, unless the host is starved).
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A node's kubelet service.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KubeletUnit {
    /// The program (`nsenter`, into the node's namespaces).
    program: PathBuf,
    /// Its arguments (kubelet's among them).
    args: Vec<String>,
    /// Where kubelet writes (appended to across restarts).
    log: PathBuf,
    /// The node's directory (`nodes/<name>`): the unit and PID files.
    base: PathBuf,
}

/// What `systemctl show kubelet --property ActiveState` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActiveState {
    /// Its main process runs.
    Active,
    /// It does not.
    Inactive,
}

impl ActiveState {
    /// systemd's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Inactive => "inactive",
        }
    }
}

impl KubeletUnit {
    /// Writes the unit of the node whose directory is `base`.
    pub fn create(
        base: &Path,
        program: &Path,
        args: Vec<String>,
        log: PathBuf,
    ) -> anyhow::Result<Self> {
        let unit = Self {
            program: program.to_owned(),
            args,
            log,
            base: base.to_owned(),
        };
        std::fs::write(base.join(UNIT), serde_json::to_vec_pretty(&unit)?)?;
        Ok(unit)
    }

    /// The unit of the node whose directory is `base` (written by
    /// [`Self::create`] when the lab started it).
    pub fn load(base: &Path) -> anyhow::Result<Self> {
        let path = base.join(UNIT);
        let text = std::fs::read(&path)
            .with_context(|| format!("reading {} (a Kubernetes lab node's)", path.display()))?;
        serde_json::from_slice(&text).with_context(|| format!("parsing {}", path.display()))
    }

    /// kubelet's output so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The running kubelet's PID: the recorded one, if that process is
    /// alive (not a zombie) and is this unit's ([`Self::is_command_line`]:
    /// a reused PID is not taken for it).
    pub fn main_pid(&self) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(self.base.join(PID))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // pid (comm) state ...: comm may hold spaces, so read after ')'.
        let state = stat.rsplit_once(')')?.1.split_whitespace().next()?;
        if state == "Z" || state == "X" {
            return None;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let ours = self.is_command_line(&cmdline);
        ours.then_some(pid)
    }

    /// Whether `cmdline` (NUL-separated, as `/proc/<pid>/cmdline`) is this
    /// unit's process once `nsenter` (the program) has exec'd what its
    /// arguments name: its name is one of the unit's arguments and its
    /// own arguments are their tail. `nsenter` itself, before that exec,
    /// is not yet the main process ([`Self::start`] waits it out).
    fn is_command_line(&self, cmdline: &[u8]) -> bool {
        let mut words: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if words.last().is_some_and(|w| w.is_empty()) {
            words.pop();
        }
        let Some((name, rest)) = words.split_first() else {
            return false;
        };
        let ours: Vec<&[u8]> = self.args.iter().map(|a| a.as_bytes()).collect();
        ours.contains(name) && !rest.is_empty() && ours.ends_with(rest)
    }

    /// Whether kubelet runs.
    pub fn active_state(&self) -> ActiveState {
        match self.main_pid() {
            Some(_) => ActiveState::Active,
            None => ActiveState::Inactive,
        }
    }

    /// Starts kubelet unless it runs (as `systemctl start`); returns its
    /// PID once `nsenter` has exec'd it, so that what reads the unit next
    /// (`systemctl show`, a stop) finds it. The process outlives the
    /// caller (`lab down` stops it: its command line names the lab's
    /// directory).
    pub async fn start(&self) -> anyhow::Result<u32> {
        if let Some(pid) = self.main_pid() {
            return Ok(pid);
        }
        let pid = Daemon::spawn_program(&self.program, &self.args, &self.log).detach();
        std::fs::write(self.base.join(PID), format!("{pid}\n"))
            .with_context(|| format!("recording kubelet's PID in {}", self.base.display()))?;
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        while self.main_pid() != Some(pid) {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "kubelet (PID {pid}) did not start:\n{}",
                crate::tail::tail(&self.log(), 20)
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(pid)
    }

    /// Stops kubelet as systemd does: SIGTERM, then SIGKILL after
    /// [`STOP_TIMEOUT`]; returns once it has exited. Its Pods keep running.
    pub async fn stop(&self) {
        self.signal_and_wait(nix::sys::signal::Signal::SIGTERM)
            .await;
    }

    /// Kills kubelet (SIGKILL, as a power cut); returns once it has exited.
    pub async fn kill(&self) {
        self.signal_and_wait(nix::sys::signal::Signal::SIGKILL)
            .await;
    }

    async fn signal_and_wait(&self, signal: nix::sys::signal::Signal) {
        let Some(pid) = self.main_pid() else {
            return;
        };
        if let Ok(raw) = i32::try_from(pid) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), signal);
        }
        let deadline = tokio::time::Instant::now() + STOP_TIMEOUT;
        while self.main_pid() == Some(pid) {
            if tokio::time::Instant::now() > deadline {
                crate::lab::sigkill(pid);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
