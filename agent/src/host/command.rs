//! Runs host tools: the only place in the workspace that spawns processes.
//! Every run has a timeout, captures stdout and stderr, logs its argv at
//! debug level with secrets redacted, and kills the child if abandoned.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// One argument of a command; secrets never reach logs or errors.
#[derive(Clone)]
pub enum Arg {
    /// An ordinary argument.
    Plain(OsString),
    /// A secret (a CHAP password): passed to the tool, shown as `<redacted>`.
    Secret(String),
}

/// What a finished command produced.
#[derive(Debug, Clone)]
pub struct Output {
    /// Exit code (-1 when killed by a signal).
    pub code: i32,
    /// Standard output, decoded lossily.
    pub stdout: String,
    /// Standard error, decoded lossily.
    pub stderr: String,
}

/// Why a command did not produce an [`Output`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError {
    /// The tool could not be started (missing, not executable).
    #[error("cannot run {tool}: {source}")]
    Spawn {
        /// The tool.
        tool: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The tool ran past its timeout and was killed.
    #[error("{tool} did not finish within {after:?} and was killed")]
    Timeout {
        /// The tool.
        tool: PathBuf,
        /// The timeout.
        after: Duration,
    },
    /// The tool exited non-zero.
    #[error("{tool} exited with code {code}: {stderr_tail}")]
    Failed {
        /// The tool.
        tool: PathBuf,
        /// Its exit code.
        code: i32,
        /// The last lines of its stderr (or stdout when stderr was empty).
        stderr_tail: String,
    },
}

/// Spawns tools with a default timeout.
#[derive(Debug, Clone)]
pub struct CommandRunner {
    timeout: Duration,
}

// === impl Arg ===

impl Arg {
    /// A secret argument.
    pub fn secret(s: &str) -> Self {
        Self::Secret(s.to_owned())
    }
}

impl<T: Into<OsString>> From<T> for Arg {
    fn from(s: T) -> Self {
        Self::Plain(s.into())
    }
}

impl std::fmt::Debug for Arg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Plain(s) => write!(f, "{}", s.to_string_lossy()),
            Self::Secret(_) => f.write_str("<redacted>"),
        }
    }
}

// === impl CommandRunner ===

impl CommandRunner {
    /// A runner whose commands time out after `timeout` unless told otherwise.
    pub fn new(timeout: Duration) -> Self {
        Self { timeout }
    }

    /// Runs `tool args` with the default timeout; any exit code is returned
    /// for the caller to interpret.
    pub async fn output(&self, tool: &Path, args: &[Arg]) -> Result<Output, CommandError> {
        self.output_within(tool, args, self.timeout).await
    }

    /// Runs `tool args`; a non-zero exit is [`CommandError::Failed`].
    pub async fn run(&self, tool: &Path, args: &[Arg]) -> Result<Output, CommandError> {
        self.run_within(tool, args, self.timeout).await
    }

    /// [`CommandRunner::run`] with an explicit timeout.
    pub async fn run_within(
        &self,
        tool: &Path,
        args: &[Arg],
        timeout: Duration,
    ) -> Result<Output, CommandError> {
        let out = self.output_within(tool, args, timeout).await?;
        if out.code == 0 {
            Ok(out)
        } else {
            Err(CommandError::Failed {
                tool: tool.to_owned(),
                code: out.code,
                stderr_tail: out.error_tail(4, TAIL_MAX),
            })
        }
    }

    /// [`CommandRunner::output`] with an explicit timeout.
    pub async fn output_within(
        &self,
        tool: &Path,
        args: &[Arg],
        timeout: Duration,
    ) -> Result<Output, CommandError> {
        tracing::debug!(tool = %tool.display(), args = ?args, "running host tool");
        // The one sanctioned process spawn (see clippy.toml).
        #[allow(clippy::disallowed_methods)]
        let mut cmd = tokio::process::Command::new(tool);
        cmd.args(args.iter().map(|a| match a {
            Arg::Plain(s) => s.clone(),
            Arg::Secret(s) => OsString::from(s),
        }))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("LC_ALL", "C")
        .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|source| CommandError::Spawn {
            tool: tool.to_owned(),
            source,
        })?;
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let run = async move {
            let (out, err) = tokio::join!(read_bounded(stdout), read_bounded(stderr));
            let status = child.wait().await?;
            Ok::<_, std::io::Error>((status, out?, err?))
        };
        // A tool that changes the host (a login, a scan, mkfs) runs to its
        // end or its timeout, never cut off because the call that started
        // it went away (a client gave up, a connection dropped): a killed
        // mkfs leaves a half-written signature, a killed scan half a disk.
        // Only the timeout kills it (the child is dropped with the task).
        let finished = tokio::spawn(tokio::time::timeout(timeout, run)).await;
        match finished {
            Err(join) => Err(CommandError::Spawn {
                tool: tool.to_owned(),
                source: std::io::Error::other(join),
            }),
            Ok(Err(_)) => Err(CommandError::Timeout {
                tool: tool.to_owned(),
                after: timeout,
            }),
            Ok(Ok(Err(source))) => Err(CommandError::Spawn {
                tool: tool.to_owned(),
                source,
            }),
            Ok(Ok(Ok((status, stdout, stderr)))) => Ok(Output {
                code: status.code().unwrap_or(-1),
                stdout,
                stderr,
            }),
        }
    }
}

/// Most bytes of one stream of a tool's output kept: beyond, the rest is
/// read and dropped (a tool stuck printing cannot fill the agent's memory,
/// and never blocks on a full pipe).
pub const MAX_OUTPUT: usize = 4 << 20;

/// Reads `stream` to its end, keeping the first [`MAX_OUTPUT`] bytes.
async fn read_bounded(
    stream: Option<impl tokio::io::AsyncRead + Unpin>,
) -> std::io::Result<String> {
    use tokio::io::AsyncReadExt;
    let Some(mut stream) = stream else {
        return Ok(String::new());
    };
    let mut kept = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    let mut dropped = 0usize;
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        let room = MAX_OUTPUT.saturating_sub(kept.len()).min(n);
        kept.extend_from_slice(&chunk[..room]);
        dropped += n - room;
    }
    let mut text = String::from_utf8_lossy(&kept).into_owned();
    if dropped > 0 {
        text.push_str(&format!("\n…({dropped} more bytes dropped)"));
    }
    Ok(text)
}

/// Most bytes of a tool's output an error message quotes.
const TAIL_MAX: usize = 600;

// === impl Output ===

impl Output {
    /// What an error quotes of a tool: the last `lines` lines of stderr
    /// (stdout when stderr is empty), joined with ` | `, at most `max`
    /// bytes.
    pub fn error_tail(&self, lines: usize, max: usize) -> String {
        let text = if self.stderr.trim().is_empty() {
            &self.stdout
        } else {
            &self.stderr
        };
        let all: Vec<&str> = text.trim().lines().collect();
        let start = all.len().saturating_sub(lines);
        csi_scsi_textfs::text::bounded(&all[start..].join(" | "), max).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn failing_tool_error_carries_stderr_and_code() {
        let r = CommandRunner::new(Duration::from_secs(5));
        let err = r
            .run(
                Path::new("sh"),
                &["-c".into(), "echo first >&2; echo boom >&2; exit 3".into()],
            )
            .await
            .expect_err("must fail");
        match err {
            CommandError::Failed {
                code, stderr_tail, ..
            } => {
                assert_eq!(code, 3);
                assert_eq!(stderr_tail, "first | boom");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_tool_that_prints_without_end_is_kept_to_the_bound_and_finishes() {
        let r = CommandRunner::new(Duration::from_secs(30));
        // 12 MiB on stdout, more than the bound: read to the end (the tool is
        // never blocked on a full pipe), kept to MAX_OUTPUT.
        let out = r
            .output(
                Path::new("sh"),
                &[
                    "-c".into(),
                    "head -c 12582912 /dev/zero | tr '\\0' x; echo done >&2".into(),
                ],
            )
            .await
            .expect("runs");
        assert_eq!(out.code, 0);
        assert!(out.stdout.len() < MAX_OUTPUT + 100, "{}", out.stdout.len());
        assert!(
            out.stdout.ends_with("(8388608 more bytes dropped)"),
            "{}",
            &out.stdout[out.stdout.len() - 60..]
        );
        assert_eq!(out.stderr.trim(), "done");
    }

    #[tokio::test]
    async fn a_tool_runs_to_its_end_when_its_caller_goes_away() {
        // A gRPC call dropped mid-scan (the proxy restarted, the client gave
        // up) must not kill the tool halfway through changing the host.
        let dir = tempfile::tempdir().expect("tempdir");
        let done = dir.path().join("done");
        let r = CommandRunner::new(Duration::from_secs(10));
        let script = format!("sleep 0.5; touch {}", done.display());
        let args: [Arg; 2] = ["-c".into(), script.into()];
        let caller = r.run(Path::new("sh"), &args);
        assert!(
            tokio::time::timeout(Duration::from_millis(100), caller)
                .await
                .is_err(),
            "the caller gave up first"
        );
        let start = std::time::Instant::now();
        while !done.exists() && start.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(done.exists(), "the tool was killed with its caller");
    }

    #[tokio::test]
    async fn slow_tool_is_killed_at_the_timeout() {
        let r = CommandRunner::new(Duration::from_millis(200));
        let err = r
            .run(Path::new("sleep"), &["5".into()])
            .await
            .expect_err("must time out");
        assert!(matches!(err, CommandError::Timeout { .. }), "{err}");
    }

    #[test]
    fn secret_arguments_are_redacted_in_debug() {
        let args = [Arg::from("-v"), Arg::secret("hunter2")];
        let shown = format!("{args:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }

    #[tokio::test]
    async fn missing_tool_is_a_spawn_error() {
        let r = CommandRunner::new(Duration::from_secs(1));
        let err = r
            .run(Path::new("/nonexistent/tool"), &[])
            .await
            .expect_err("must fail");
        assert!(matches!(err, CommandError::Spawn { .. }), "{err}");
    }
}
