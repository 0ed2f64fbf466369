//! The agent registers itself with kubelet (in place of
//! node-driver-registrar). This test plays kubelet's plugin watcher
//! against a real agent process: it dials the registration socket in
//! `<kubelet-dir>/plugins_registry`, asks GetInfo, calls NodeGetInfo on the
//! endpoint it was given, reports a refusal and then a success, and reads
//! both back from `/status` and `/readyz`. On SIGTERM the socket goes, so
//! kubelet would deregister the driver.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use csi_scsi_certs::{CertificateAuthority, Identity, TrustDomain, Validity, write_issued};
use csi_scsi_proto::csi::NodeGetInfoRequest;
use csi_scsi_proto::csi::node_client::NodeClient;
use csi_scsi_proto::pluginregistration::registration_client::RegistrationClient;
use csi_scsi_proto::pluginregistration::{InfoRequest, RegistrationStatus};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tonic::transport::{Channel, Endpoint};

const NODE: &str = "node-a";

/// A running agent and the paths it was given; killed when dropped.
struct Agent {
    child: Child,
    dir: tempfile::TempDir,
    csi: PathBuf,
    status: SocketAddr,
}

impl Agent {
    /// Starts the agent binary with a fresh CA, an empty sysfs and a
    /// kubelet directory of its own, plus `extra` flags.
    fn start(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let domain = TrustDomain::new("csi-scsi.local").expect("trust domain");
        let ca = CertificateAuthority::create(&domain, Validity::days(1)).expect("CA");
        let issued = ca
            .issue(&Identity::Node(NODE.into()), Validity::days(1))
            .expect("agent certificate");
        write_issued(&root.join("tls"), &issued).expect("write TLS material");
        for d in ["sys", "dev", "kubelet", "state", "iscsi"] {
            std::fs::create_dir_all(root.join(d)).expect("mkdir");
        }
        std::fs::write(root.join("mountinfo"), "").expect("mountinfo");
        let csi = root.join("kubelet/plugins/csi-scsi.io/csi.sock");
        let status = free_port();
        let path = |p: &str| root.join(p).display().to_string();
        let mut args = vec![
            "--node-name".to_owned(),
            NODE.into(),
            "--csi-endpoint".into(),
            format!("unix://{}", csi.display()),
            "--agent-listen".into(),
            free_port().to_string(),
            "--status-listen".into(),
            status.to_string(),
            "--tls-dir".into(),
            path("tls"),
            "--sysfs-root".into(),
            path("sys"),
            "--dev-root".into(),
            path("dev"),
            "--mountinfo".into(),
            path("mountinfo"),
            "--kubelet-dir".into(),
            path("kubelet"),
            "--state-dir".into(),
            path("state"),
            "--iscsi-node-dir".into(),
            path("iscsi"),
            // Ready depends on nothing but the registration here.
            "--required-tools".into(),
            "sh".into(),
            "--grace-period".into(),
            "5".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let log = std::fs::File::create(root.join("agent.log")).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_csi-scsi-agent"))
            .args(&args)
            .env_remove("KUBELET_REGISTRATION")
            .env_remove("REGISTRATION_DIR")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("spawn csi-scsi-agent");
        let mut agent = Self {
            child,
            dir,
            csi,
            status,
        };
        agent.wait_for(&agent.csi.clone());
        // The status port is bound just after the CSI socket.
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(agent.status).is_err() {
            assert!(
                Instant::now() < deadline,
                "no status port:\n{}",
                agent.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        agent
    }

    /// Where kubelet's plugin watcher would find the agent.
    fn registration_socket(&self) -> PathBuf {
        self.dir
            .path()
            .join("kubelet/plugins_registry/csi-scsi.io-reg.sock")
    }

    /// Waits until `socket` answers, failing with the log if the agent dies.
    fn wait_for(&mut self, socket: &Path) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(exit) = self.child.try_wait().expect("wait") {
                panic!("the agent exited ({exit}):\n{}", self.log());
            }
            if std::os::unix::net::UnixStream::connect(socket).is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} never answered:\n{}",
                socket.display(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }

    /// `GET path` on the status port: the HTTP code and the body.
    fn get(&self, path: &str) -> (u16, String) {
        let mut stream = TcpStream::connect(self.status).expect("connect status port");
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        .expect("send");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("read");
        let code = response
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {response:?}"));
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (code, body)
    }

    /// The `kubelet_registration` block of `/status`.
    fn registration_status(&self) -> Value {
        let (code, body) = self.get("/status");
        assert_eq!(code, 200, "{body}");
        let doc: Value = serde_json::from_str(&body).expect("status JSON");
        doc["kubelet_registration"].clone()
    }

    /// Polls `/status` until its registration block satisfies `want`
    /// (the document is cached for a second).
    fn await_registration(&self, want: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let block = self.registration_status();
            if want(&block) {
                return block;
            }
            assert!(Instant::now() < deadline, "status stayed {block}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends SIGTERM and waits for the exit.
    fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).expect("pid"));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(exit) = self.child.try_wait().expect("wait") {
                return exit;
            }
            assert!(Instant::now() < deadline, "no exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
}

/// A channel over the Unix socket at `path`, as kubelet dials it.
async fn unix_channel(path: &Path) -> Channel {
    let path = path.to_owned();
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map(TokioIo::new)
            }
        }))
        .await
        .expect("dial Unix socket")
}

#[tokio::test]
async fn kubelet_registers_the_agent_and_its_verdict_shows_on_status() {
    let mut agent = Agent::start(&[]);
    let socket = agent.registration_socket();
    agent.wait_for(&socket);
    let pending = agent.registration_status();
    assert_eq!(pending["state"], "pending", "{pending}");
    assert_eq!(pending["socket"], socket.display().to_string());
    assert_eq!(pending["info_requested"], Value::Null);
    assert_eq!(
        agent.get("/readyz").0,
        200,
        "pending does not block /readyz"
    );

    // kubelet's plugin watcher: GetInfo, then the CSI endpoint itself.
    let mut registration = RegistrationClient::new(unix_channel(&socket).await);
    let info = registration
        .get_info(InfoRequest {})
        .await
        .expect("GetInfo")
        .into_inner();
    assert_eq!(info.r#type, "CSIPlugin");
    assert_eq!(info.name, "csi-scsi.io");
    assert_eq!(info.endpoint, agent.csi.display().to_string());
    assert!(Path::new(&info.endpoint).is_absolute());
    assert_eq!(info.supported_versions, ["1.0.0"]);
    let node = NodeClient::new(unix_channel(Path::new(&info.endpoint)).await)
        .node_get_info(NodeGetInfoRequest {})
        .await
        .expect("NodeGetInfo on the registered endpoint")
        .into_inner();
    assert_eq!(node.node_id, NODE);

    registration
        .notify_registration_status(RegistrationStatus {
            plugin_registered: false,
            error: "some error".into(),
        })
        .await
        .expect("NotifyRegistrationStatus(false)");
    let failed = agent.await_registration(|b| b["state"] == "failed");
    assert_eq!(failed["error"], "some error", "{failed}");
    assert!(failed["info_requested"].is_string(), "{failed}");
    assert!(failed["reported"].is_string(), "{failed}");
    let (code, body) = agent.get("/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("kubelet-registration") && body.contains("some error"),
        "{body}"
    );

    registration
        .notify_registration_status(RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .expect("NotifyRegistrationStatus(true)");
    let registered = agent.await_registration(|b| b["state"] == "registered");
    assert!(registered.get("error").is_none(), "{registered}");
    let (code, body) = agent.get("/readyz");
    assert_eq!(code, 200, "{body}");

    drop(registration);
    let exit = agent.terminate();
    assert!(exit.success(), "{exit}:\n{}", agent.log());
    assert!(
        !socket.exists(),
        "the registration socket outlived the agent: kubelet would not deregister"
    );
    assert!(!agent.csi.exists());
}

#[tokio::test]
async fn a_stale_registration_socket_is_replaced() {
    // As after a crash: a socket file nobody listens on.
    let dir = tempfile::tempdir().expect("tempdir");
    let registry = dir.path().join("registry");
    std::fs::create_dir_all(&registry).expect("mkdir");
    let stale = registry.join("csi-scsi.io-reg.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).expect("stale socket"));
    let registry_flag = registry.display().to_string();
    let mut agent = Agent::start(&[
        "--registration-dir",
        &registry_flag,
        "--kubelet-registration-path",
        "/var/lib/kubelet/plugins/csi-scsi.io/csi.sock",
    ]);
    agent.wait_for(&stale);
    let info = RegistrationClient::new(unix_channel(&stale).await)
        .get_info(InfoRequest {})
        .await
        .expect("GetInfo")
        .into_inner();
    assert_eq!(
        info.endpoint,
        "/var/lib/kubelet/plugins/csi-scsi.io/csi.sock"
    );
    assert!(!agent.registration_socket().exists());
}

#[tokio::test]
async fn registration_off_serves_no_socket() {
    let agent = Agent::start(&["--kubelet-registration", "off"]);
    assert_eq!(agent.registration_status(), Value::Null);
    assert!(!agent.dir.path().join("kubelet/plugins_registry").exists());
    assert_eq!(agent.get("/readyz").0, 200);
}
