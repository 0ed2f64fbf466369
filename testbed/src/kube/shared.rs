//! One API-only control plane per test binary, started on first use and
//! shared by every test in it (starting one costs 5-8 s).
//!
//! It lives in a `static`, so it is never dropped and the `Daemon`s never
//! stop their processes. Two things make sure etcd and kube-apiserver still
//! die with the test binary, however it ends:
//! - a watchdog `sh` blocks reading a pipe whose write end only this process
//!   holds; the kernel closes it when the process exits (even on SIGKILL),
//!   and the watchdog then kills both processes and removes their directory;
//! - should the watchdog itself have died (Ctrl-C reaches the whole process
//!   group, which also stops the plane), the next start sweeps leftover
//!   directories of dead test processes and any process still running from
//!   one (matched by the directory on its command line, never by name).

use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::OnceLock;

use anyhow::Context;

use super::{ControlPlane, ControlPlaneConfig, GoTools, KubeMinor};

/// Prefix of the shared planes' directories under the temporary directory.
const PREFIX: &str = "csi-scsi-kube-test-";

/// The shared plane and the pipe that keeps its watchdog waiting.
struct Shared {
    plane: ControlPlane,
    _watchdog: ChildStdin,
}

static SHARED: OnceLock<Result<Shared, String>> = OnceLock::new();

/// The binary's control plane (etcd, kube-apiserver, kubectl), started on
/// first call; `setup` runs once right after it is ready (install CRDs,
/// namespaces...). Panics in every caller if it could not start.
pub fn shared_plane(
    setup: impl FnOnce(&ControlPlane) -> anyhow::Result<()>,
) -> &'static ControlPlane {
    let shared = SHARED.get_or_init(|| start(setup).map_err(|e| format!("{e:#}")));
    match shared {
        Ok(s) => &s.plane,
        Err(e) => panic!("shared control plane: {e}"),
    }
}

fn start(setup: impl FnOnce(&ControlPlane) -> anyhow::Result<()>) -> anyhow::Result<Shared> {
    sweep_leftovers();
    let dir = std::env::temp_dir().join(format!("{PREFIX}{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // CI runs the backend tests once more against the oldest supported
    // minor (CSI_SCSI_KUBERNETES_MINOR).
    let tools = GoTools::build_at(
        KubeMinor::from_env()?,
        &["etcd", "kube-apiserver", "kubectl"],
    )?;
    let minor = tools.kubernetes();
    // Its own runtime on its own thread: each #[tokio::test] has a runtime
    // that ends with the test, and the caller may be on any of them.
    let config = ControlPlaneConfig::api_only(&dir);
    let plane = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(ControlPlane::start(config, tools))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the control plane's start-up thread panicked"))??;
    let watchdog = watchdog(&plane.pids(), &dir)?;
    let version = plane.git_version()?;
    anyhow::ensure!(
        minor.matches(&version),
        "the shared control plane was built at Kubernetes {minor} but serves {version}"
    );
    eprintln!(
        "shared control plane: Kubernetes {version} in {}",
        dir.display()
    );
    setup(&plane).context("setting up the shared control plane")?;
    Ok(Shared {
        plane,
        _watchdog: watchdog,
    })
}

/// Starts the `sh` that kills `pids` and removes `dir` once its stdin
/// closes (this process exited); returns the write end to keep open.
fn watchdog(pids: &[u32], dir: &Path) -> anyhow::Result<ChildStdin> {
    let script = r#"dir="$1"; shift
read -r _ || true
kill -TERM "$@" 2>/dev/null
i=0; while kill -0 "$@" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
kill -KILL "$@" 2>/dev/null
rm -rf "$dir""#;
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("csi-scsi-plane-watchdog")
        .arg(dir)
        .args(pids.iter().map(u32::to_string))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("spawning the control plane's watchdog")?;
    child.stdin.take().context("watchdog stdin")
}

/// Removes the directories of shared planes whose test process is gone,
/// killing what still runs from them.
fn sweep_leftovers() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let dir = entry.path();
        for stray in processes_under(&dir) {
            let _ = Command::new("kill")
                .args(["-KILL", &stray.to_string()])
                .status();
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// PIDs whose command line names a path under `dir`.
fn processes_under(dir: &Path) -> Vec<u32> {
    let dir = dir.to_string_lossy();
    // The directory itself as an argument, or a path under it.
    let needles = [format!("{dir}\0"), format!("{dir}/")];
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|p| p.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline: PathBuf = format!("/proc/{pid}/cmdline").into();
            std::fs::read(cmdline)
                .map(|c| {
                    let c = String::from_utf8_lossy(&c);
                    needles.iter().any(|n| c.contains(n.as_str()))
                })
                .unwrap_or(false)
        })
        .collect()
}
