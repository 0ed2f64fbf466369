//! The stand-in's `iscsid`: how an `iscsiadm` inside the agent's container
//! reaches the node's kernel stand-in, as the real iscsiadm reaches the
//! host's iscsid over a Unix socket. In a Pod the agent sees only its image
//! and the DaemonSet's hostPath volumes, so the lab's `iscsiadm` there is a
//! client (this binary, invoked as `iscsiadm`) that hands its command line
//! to the `watch` process on the node, which runs it against the node's
//! tree with host paths (one stand-in process per command line, as the
//! host-process lab's wrapper runs it: calls run concurrently, and a rescan
//! that waits for the watcher does not block it) and answers with the exit
//! code and output.
//!
//! One request per connection: a JSON line `{"args": [...]}`, answered
//! with `{"code": N, "stdout": "...", "stderr": "..."}`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use super::iscsiadm::Outcome;

/// The socket's name beside the client's `bin/` directory.
pub const SOCKET: &str = "iscsid.sock";

#[derive(Serialize, Deserialize)]
struct Request {
    args: Vec<String>,
}

#[derive(Serialize, Deserialize)]
struct Response {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Serves `iscsiadm` requests on `socket`: each runs as `command` (the
/// stand-in with the node's context, ending in `iscsiadm`) followed by the
/// request's arguments; each command line is appended to `argv_log` first
/// (tests prove no secret is ever on one).
pub async fn serve(
    command: Vec<String>,
    socket: PathBuf,
    argv_log: PathBuf,
) -> std::io::Result<()> {
    let _ = std::fs::remove_file(&socket);
    let listener = tokio::net::UnixListener::bind(&socket)?;
    let command = std::sync::Arc::new(command);
    loop {
        let (stream, _) = listener.accept().await?;
        let command = command.clone();
        let argv_log = argv_log.clone();
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut line = String::new();
            if tokio::io::BufReader::new(read)
                .read_line(&mut line)
                .await
                .is_err()
            {
                return;
            }
            let (code, stdout, stderr) = match serde_json::from_str::<Request>(&line) {
                Ok(req) => {
                    log_argv(&argv_log, &req.args);
                    run(&command, &req.args).await
                }
                Err(e) => (7, String::new(), format!("iscsiadm: bad request: {e}\n")),
            };
            let mut out = serde_json::to_vec(&Response {
                code,
                stdout,
                stderr,
            })
            .unwrap_or_default();
            out.push(b'\n');
            let _ = write.write_all(&out).await;
        });
    }
}

async fn run(command: &[String], args: &[String]) -> Outcome {
    let Some((program, rest)) = command.split_first() else {
        return (7, String::new(), "iscsiadm: no stand-in to run\n".into());
    };
    match tokio::process::Command::new(program)
        .args(rest)
        .args(args)
        .output()
        .await
    {
        Ok(out) => (
            out.status.code().unwrap_or(1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ),
        Err(e) => (
            7,
            String::new(),
            format!("iscsiadm: running the stand-in: {e}\n"),
        ),
    }
}

fn log_argv(path: &Path, args: &[String]) {
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{}", args.join(" "));
    }
}

/// Runs one `iscsiadm` command line through the node's stand-in at
/// `socket`. Unreachable is open-iscsi's "could not connect to iscsid"
/// (exit 20), what the real tool answers when iscsid is down.
pub fn client(socket: &Path, args: &[String]) -> Outcome {
    let ask = || -> std::io::Result<Response> {
        let mut stream = std::os::unix::net::UnixStream::connect(socket)?;
        let mut req = serde_json::to_vec(&Request {
            args: args.to_vec(),
        })?;
        req.push(b'\n');
        stream.write_all(&req)?;
        let mut line = String::new();
        BufReader::new(stream).read_line(&mut line)?;
        Ok(serde_json::from_str(&line)?)
    };
    match ask() {
        Ok(r) => (r.code, r.stdout, r.stderr),
        Err(e) => (
            20,
            String::new(),
            format!(
                "iscsiadm: can not connect to iSCSI daemon ({}): {e}\n",
                socket.display()
            ),
        ),
    }
}
