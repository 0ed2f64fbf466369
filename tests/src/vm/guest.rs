//! The lab's helper inside a VM node, and the host's side of it. kubelet
//! and a Pod act on a node's own files (the kubelet directory, a mounted
//! volume, a raw device); on a VM node those live in the guest, so the
//! lab reaches them through this helper on one TCP port (forwarded by qemu
//! to the node's lab address only):
//! - a connection that starts with `csi\n` is relayed to the agent's CSI
//!   socket in the guest (`relay` makes the host's end of it a Unix socket,
//!   where kubelet's would be);
//! - one that starts with `op <json>\n` (and the bytes it announces) does one
//!   [`Op`] and answers with a [`Reply`] line and the bytes it announces.
//!
//! Lab-only: it has no authentication, and is reachable only from the
//! lab's network namespaces.

use std::io::{Read, Seek, SeekFrom, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

/// One thing done in the guest.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// `mkdir -p`.
    Mkdir {
        /// The directory.
        path: PathBuf,
    },
    /// Writes the `len` bytes that follow at `offset` (a new file when
    /// `offset` is none), then fsyncs.
    Write {
        /// The file or device.
        path: PathBuf,
        /// Where; none writes a new file.
        offset: Option<u64>,
        /// How many bytes follow.
        len: u64,
    },
    /// Reads `len` bytes at `offset`, or the whole file.
    Read {
        /// The file or device.
        path: PathBuf,
        /// Where, and how much; none reads the whole file.
        range: Option<(u64, u64)>,
    },
    /// Runs a program and answers with its exit code and output.
    Exec {
        /// Program and arguments.
        argv: Vec<String>,
    },
}

/// The answer to an [`Op`]; `len` bytes follow it.
#[derive(Debug, Serialize, Deserialize)]
pub struct Reply {
    /// Why it failed, if it did.
    pub error: Option<String>,
    /// An exec's exit code.
    pub code: Option<i32>,
    /// Bytes that follow (read data, or an exec's stdout and stderr).
    pub len: u64,
}

/// Serves the helper on `listen`, relaying `csi` connections to `csi`.
pub async fn serve(listen: SocketAddr, csi: PathBuf) -> anyhow::Result<()> {
    let listener = TcpListener::bind(listen).await?;
    loop {
        let (conn, _) = listener.accept().await?;
        let csi = csi.clone();
        tokio::spawn(async move {
            if let Err(e) = serve_one(conn, &csi).await {
                eprintln!("csi-scsi-lab-guest: {e:#}");
            }
        });
    }
}

async fn serve_one(conn: TcpStream, csi: &Path) -> anyhow::Result<()> {
    conn.set_nodelay(true)?;
    let mut conn = BufReader::new(conn);
    let mut first = String::new();
    conn.read_line(&mut first).await?;
    if first == "csi\n" {
        let mut agent = UnixStream::connect(csi)
            .await
            .with_context(|| format!("connecting to {}", csi.display()))?;
        // Bytes the reader buffered past the first line go first.
        let pending = conn.buffer().to_vec();
        agent.write_all(&pending).await?;
        let mut conn = conn.into_inner();
        tokio::io::copy_bidirectional(&mut conn, &mut agent).await?;
        return Ok(());
    }
    let op: Op = serde_json::from_str(first.strip_prefix("op ").context("not an op")?)?;
    let input = match &op {
        Op::Write { len, .. } => {
            let mut buf = vec![0u8; *len as usize];
            conn.read_exact(&mut buf).await?;
            buf
        }
        _ => Vec::new(),
    };
    let (reply, data) = match tokio::task::spawn_blocking(move || run(op, input)).await? {
        Ok((code, data)) => (
            Reply {
                error: None,
                code,
                len: data.len() as u64,
            },
            data,
        ),
        Err(e) => (
            Reply {
                error: Some(format!("{e:#}")),
                code: None,
                len: 0,
            },
            Vec::new(),
        ),
    };
    let mut conn = conn.into_inner();
    let mut line = serde_json::to_vec(&reply)?;
    line.push(b'\n');
    conn.write_all(&line).await?;
    conn.write_all(&data).await?;
    conn.shutdown().await?;
    Ok(())
}

fn open(path: &Path, write: bool, create: bool) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(write)
        .create(create)
        .truncate(create)
        .open(path)
}

fn run(op: Op, input: Vec<u8>) -> anyhow::Result<(Option<i32>, Vec<u8>)> {
    match op {
        Op::Mkdir { path } => {
            std::fs::create_dir_all(&path)?;
            Ok((None, Vec::new()))
        }
        Op::Write { path, offset, .. } => {
            let mut f = open(&path, true, offset.is_none())?;
            f.seek(SeekFrom::Start(offset.unwrap_or(0)))?;
            f.write_all(&input)?;
            f.sync_all()?;
            Ok((None, Vec::new()))
        }
        Op::Read { path, range } => {
            let mut f = open(&path, false, false)?;
            let data = match range {
                Some((offset, len)) => {
                    f.seek(SeekFrom::Start(offset))?;
                    let mut buf = vec![0u8; len as usize];
                    f.read_exact(&mut buf)?;
                    buf
                }
                None => {
                    let mut buf = Vec::new();
                    f.read_to_end(&mut buf)?;
                    buf
                }
            };
            Ok((None, data))
        }
        Op::Exec { argv } => {
            let (program, args) = argv.split_first().context("empty argv")?;
            let out = std::process::Command::new(program).args(args).output()?;
            let mut data = out.stdout;
            data.extend_from_slice(&out.stderr);
            Ok((out.status.code(), data))
        }
    }
}

/// The host's end of the CSI relay: a Unix socket at `listen` whose every
/// connection is carried to the guest helper at `to`.
pub async fn relay(listen: PathBuf, to: SocketAddr) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(&listen);
    if let Some(dir) = listen.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let listener = UnixListener::bind(&listen)?;
    loop {
        let (mut conn, _) = listener.accept().await?;
        tokio::spawn(async move {
            let Ok(mut guest) = TcpStream::connect(to).await else {
                return;
            };
            let _ = guest.set_nodelay(true);
            if guest.write_all(b"csi\n").await.is_ok() {
                let _ = tokio::io::copy_bidirectional(&mut conn, &mut guest).await;
            }
        });
    }
}

/// The host's client of one guest's helper.
#[derive(Clone, Debug)]
pub struct Guest {
    /// The helper's address (the node's lab address).
    pub addr: SocketAddr,
}

impl Guest {
    async fn call(&self, op: &Op, input: &[u8]) -> anyhow::Result<(Option<i32>, Vec<u8>)> {
        let mut conn = TcpStream::connect(self.addr)
            .await
            .with_context(|| format!("guest helper at {}", self.addr))?;
        let mut line = b"op ".to_vec();
        line.extend(serde_json::to_vec(op)?);
        line.push(b'\n');
        conn.write_all(&line).await?;
        conn.write_all(input).await?;
        let mut conn = BufReader::new(conn);
        let mut first = String::new();
        conn.read_line(&mut first).await?;
        let reply: Reply = serde_json::from_str(&first)
            .with_context(|| format!("guest helper answered {first:?}"))?;
        let mut data = vec![0u8; reply.len as usize];
        conn.read_exact(&mut data).await?;
        if let Some(e) = reply.error {
            bail!("in the guest: {e}");
        }
        Ok((reply.code, data))
    }

    /// `mkdir -p path` in the guest.
    pub async fn mkdir(&self, path: &Path) -> anyhow::Result<()> {
        self.call(
            &Op::Mkdir {
                path: path.to_owned(),
            },
            &[],
        )
        .await
        .map(drop)
    }

    /// Writes `data` to `path` (a new file when `offset` is none), fsynced.
    pub async fn write(&self, path: &Path, offset: Option<u64>, data: &[u8]) -> anyhow::Result<()> {
        let op = Op::Write {
            path: path.to_owned(),
            offset,
            len: data.len() as u64,
        };
        self.call(&op, data).await.map(drop)
    }

    /// Reads `path` (the whole file, or `len` bytes at `offset`).
    pub async fn read(&self, path: &Path, range: Option<(u64, u64)>) -> anyhow::Result<Vec<u8>> {
        let op = Op::Read {
            path: path.to_owned(),
            range,
        };
        Ok(self.call(&op, &[]).await?.1)
    }

    /// Runs `argv` in the guest: its exit code and output.
    pub async fn exec(&self, argv: &[&str]) -> anyhow::Result<(i32, String)> {
        let op = Op::Exec {
            argv: argv.iter().map(|s| s.to_string()).collect(),
        };
        let (code, out) = self.call(&op, &[]).await?;
        Ok((
            code.unwrap_or(-1),
            String::from_utf8_lossy(&out).into_owned(),
        ))
    }

    /// [`Self::exec`], failing unless it exits 0.
    pub async fn run(&self, argv: &[&str]) -> anyhow::Result<String> {
        let (code, out) = self.exec(argv).await?;
        if code != 0 {
            bail!("{} exited {code}: {}", argv.join(" "), out.trim());
        }
        Ok(out)
    }
}
