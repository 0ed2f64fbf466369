//! Processes the bench starts, and what /proc says about them.

use std::fs::File;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A process the bench started; stopped (SIGTERM, then SIGKILL) when dropped.
#[derive(Debug)]
pub struct Proc {
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    /// Starts `program` with `args`, output to `log`. `RUST_LOG` is set to
    /// `info`, the binaries' own default, so the figures include the
    /// logging a production deployment does.
    pub fn spawn(program: &Path, args: &[String], log: &Path) -> anyhow::Result<Self> {
        let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let child = Command::new(program)
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        Ok(Self {
            child: Some(child),
            log: log.to_owned(),
        })
    }

    /// Starts this bench binary in one of its helper modes (`__echo`, ...).
    pub fn helper(args: &[String], log: &Path) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("the bench's own path")?;
        Self::spawn(&exe, args, log)
    }

    /// The process ID.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// Its output so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last lines of its output, for error messages.
    pub fn log_tail(&self) -> String {
        crate::tail::tail(&self.log(), 15)
    }

    /// Fails with the log when the process has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(c) = self.child.as_mut()
            && let Ok(Some(status)) = c.try_wait()
        {
            bail!(
                "{} exited ({status}):\n{}",
                self.log.display(),
                self.log_tail()
            );
        }
        Ok(())
    }

    /// Stops the process: SIGTERM, up to 5 s, then SIGKILL.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Resident memory of `pid` now and at its peak (VmRSS, VmHWM), in MiB.
pub fn rss_mib(pid: u32) -> anyhow::Result<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> anyhow::Result<f64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .with_context(|| format!("no {name} in /proc/{pid}/status"))?;
        let kib: f64 = line
            .split_whitespace()
            .nth(1)
            .context("malformed status line")?
            .parse()?;
        Ok(kib / 1024.0)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// Open file descriptors of `pid`.
pub fn fd_count(pid: u32) -> anyhow::Result<usize> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))?.count())
}

/// Calls `probe` every 20 ms until it returns `Some`, for at most `limit`.
pub async fn wait_until<T, F, Fut>(what: &str, limit: Duration, mut probe: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = probe().await {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out after {limit:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads a file another process writes once it is ready (written to a
/// temporary name and renamed, so it is never seen half-written).
pub async fn wait_for_file(
    path: &Path,
    owner: &mut Proc,
    limit: Duration,
) -> anyhow::Result<String> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            return Ok(text);
        }
        owner.check_alive()?;
        if Instant::now() > deadline {
            bail!(
                "timed out waiting for {}:\n{}",
                path.display(),
                owner.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes `text` to `path` atomically.
pub fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// Runs a command that must succeed; returns its stdout.
pub fn sh(cmd: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .with_context(|| format!("running {cmd}"))?;
    if !out.status.success() {
        bail!(
            "{cmd} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Mount points of this mount namespace, from mountinfo.
pub fn mount_points() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .collect()
}

/// Lazily unmounts everything under a directory when dropped, deepest first.
#[derive(Debug)]
pub struct UnmountOnDrop(pub PathBuf);

impl Drop for UnmountOnDrop {
    fn drop(&mut self) {
        let mut under: Vec<PathBuf> = mount_points()
            .into_iter()
            .filter(|p| p.starts_with(&self.0))
            .collect();
        under.reverse();
        for p in under {
            let _ = Command::new("umount").arg("-l").arg(&p).status();
        }
    }
}

/// The machine the bench runs on, for the table's header.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Machine {
    /// CPUs this process may use.
    pub cpus: usize,
    /// CPU model.
    pub cpu_model: String,
    /// Total memory in MiB.
    pub memory_mib: u64,
    /// Kernel release.
    pub kernel: String,
}

impl Machine {
    /// Reads /proc.
    pub fn probe() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
            .unwrap_or_else(|| "unknown".into());
        let memory_mib = std::fs::read_to_string("/proc/meminfo")
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kib| kib.parse::<u64>().ok())
            .map_or(0, |kib| kib / 1024);
        Self {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model,
            memory_mib,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(|_| "unknown".into()),
        }
    }
}
