//! Starting agents and proxies for the tests, and test-side TLS clients.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use csi_scsi_tests::daemon::{Daemon, free_port};
use csi_scsi_tests::patience::eventually;
use csi_scsi_tests::pki::Pki;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tempfile::TempDir;

/// A temp dir with a CA in it.
pub struct Env {
    pub dir: TempDir,
    pub pki: Pki,
}

/// A running agent and where to reach it.
pub struct Agent {
    pub daemon: Daemon,
    pub csi: PathBuf,
    pub api: SocketAddr,
}

/// A running proxy.
pub struct Proxy {
    pub daemon: Daemon,
    pub csi: PathBuf,
}

impl Env {
    pub fn new() -> Self {
        csi_scsi_certs::install_crypto_provider();
        let dir = tempfile::tempdir().expect("tempdir");
        let pki = Pki::init(dir.path());
        Self { dir, pki }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Starts the agent of `node` with its certificate in `tls_dir`.
    pub fn agent_args(&self, node: &str, tls_dir: &Path, csi: &Path, port: u16) -> Vec<String> {
        vec![
            "--node-name".into(),
            node.into(),
            "--csi-endpoint".into(),
            format!("unix://{}", csi.display()),
            "--agent-listen".into(),
            format!("127.0.0.1:{port}"),
            "--status-listen".into(),
            "127.0.0.1:0".into(),
            "--tls-dir".into(),
            tls_dir.display().to_string(),
            "--required-tools".into(),
            "sh".into(),
            "--tls-poll-interval".into(),
            "1".into(),
            "--grace-period".into(),
            "5".into(),
            // Registration defaults to the host's /var/lib/kubelet, which
            // every agent of a parallel test (and a lab) would fight over.
            "--kubelet-registration".into(),
            "off".into(),
        ]
    }

    /// Issues node's certificate and starts its agent; waits until both of
    /// its sockets accept connections.
    pub async fn start_agent(&self, node: &str) -> Agent {
        let tls = self.pki.issue_agent(node, &format!("{node}-tls"));
        self.start_agent_with(node, &tls, &[]).await
    }

    pub async fn start_agent_with(&self, node: &str, tls: &Path, extra: &[&str]) -> Agent {
        let csi = self.path(&format!("{node}/csi.sock"));
        // free_port() releases the port before the agent binds it, so a
        // parallel test may take it first: then the agent exits naming the
        // address, and it starts again on another port.
        for _ in 0..3 {
            let port = free_port();
            let mut args = self.agent_args(node, tls, &csi, port);
            args.extend(extra.iter().map(|s| s.to_string()));
            let log = self.path(&format!("{node}.log"));
            // A restarted agent appends to its predecessor's log.
            let since = std::fs::read_to_string(&log).map_or(0, |l| l.len());
            let mut daemon = Daemon::spawn("csi-scsi-agent", &args, &log);
            let api: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
            match wait_for_sockets(&mut daemon, since, &csi, Some(api)).await {
                Started::Serving => return Agent { daemon, csi, api },
                Started::PortTaken => continue,
            }
        }
        panic!("the agent of {node} found its port taken three times")
    }

    /// Issues the proxy's certificate and starts the proxy.
    pub async fn start_proxy(&self) -> Proxy {
        let tls = self.pki.issue_proxy("proxy-tls");
        let csi = self.path("proxy/csi.sock");
        let agents = self.path("agents.txt");
        if !agents.exists() {
            std::fs::write(&agents, "").expect("agents file");
        }
        let args = vec![
            "--csi-endpoint".into(),
            csi.display().to_string(),
            "--tls-dir".into(),
            tls.display().to_string(),
            "--store".into(),
            self.path("proxy/inventory.db").display().to_string(),
            "--agents-file".into(),
            agents.display().to_string(),
            "--status-listen".into(),
            "127.0.0.1:0".into(),
        ];
        let log = self.path("proxy.log");
        let since = std::fs::read_to_string(&log).map_or(0, |l| l.len());
        let mut daemon = Daemon::spawn("csi-scsi-proxy", &args, &log);
        match wait_for_sockets(&mut daemon, since, &csi, None).await {
            Started::Serving => Proxy { daemon, csi },
            Started::PortTaken => panic!("the proxy binds only port 0:\n{}", daemon.log()),
        }
    }
}

/// How a daemon's start ended.
enum Started {
    /// Its sockets accept connections.
    Serving,
    /// It exited because its TCP port was taken.
    PortTaken,
}

/// Waits until `daemon`'s sockets accept connections; a daemon that exits
/// first fails the test with its log (from byte `since`), unless its port
/// was taken.
async fn wait_for_sockets(
    daemon: &mut Daemon,
    since: usize,
    csi: &Path,
    api: Option<SocketAddr>,
) -> Started {
    eventually("daemon sockets", || {
        let exited = daemon.try_exit();
        let log = daemon.log().get(since..).unwrap_or_default().to_owned();
        async move {
            if let Some(status) = exited {
                if log.contains("Address already in use") {
                    return Some(Started::PortTaken);
                }
                panic!("daemon exited ({status}) before serving:\n{log}");
            }
            let csi_up = tokio::net::UnixStream::connect(csi).await.is_ok();
            let api_up = match api {
                Some(a) => tokio::net::TcpStream::connect(a).await.is_ok(),
                None => true,
            };
            (csi_up && api_up).then_some(Started::Serving)
        }
    })
    .await
}

/// Reads the first certificate of a PEM file.
/// The proxy's TLS material: a certificate freshly issued by `env`'s CA.
pub fn proxy_store(env: &Env) -> Arc<csi_scsi_certs::MaterialStore> {
    let dir = env.pki.issue_proxy("proxy-tls");
    csi_scsi_certs::MaterialStore::load(
        csi_scsi_certs::MaterialPaths::in_dir(&dir),
        csi_scsi_certs::Role::Proxy,
        csi_scsi_certs::TrustDomain::new("csi-scsi.local").expect("domain"),
    )
    .expect("proxy material")
}

pub fn cert_der(path: &Path) -> CertificateDer<'static> {
    CertificateDer::from_pem_file(path).expect("certificate")
}

/// A test-side client config: trusts `ca`, presents `client` (a dir with
/// tls.crt and tls.key) if given, and records the server's leaf.
pub fn client_config(ca: &Path, client: Option<&Path>) -> (Arc<ClientConfig>, Arc<Recorder>) {
    let mut roots = RootCertStore::empty();
    roots.add(cert_der(ca)).expect("root");
    let recorder = Arc::new(Recorder {
        inner: WebPkiServerVerifier::builder(Arc::new(roots))
            .build()
            .expect("verifier"),
        seen: Mutex::new(None),
    });
    let builder = ClientConfig::builder()
        .dangerous()
        .with_custom_certificate_verifier(recorder.clone());
    let mut config = match client {
        Some(dir) => {
            let chain: Vec<_> = CertificateDer::pem_file_iter(dir.join("tls.crt"))
                .expect("chain")
                .collect::<Result<_, _>>()
                .expect("chain");
            let key = PrivateKeyDer::from_pem_file(dir.join("tls.key")).expect("key");
            builder
                .with_client_auth_cert(chain, key)
                .expect("client cert")
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    // Every test handshake must show the server's current certificate.
    config.resumption = rustls::client::Resumption::disabled();
    (Arc::new(config), recorder)
}

/// Runs a gRPC health check on the agent API at `addr` through `config`,
/// with TLS server name `node`. The error is the whole cause chain.
pub async fn health_check(
    addr: SocketAddr,
    node: &str,
    config: Arc<ClientConfig>,
) -> Result<(), String> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("https://{addr}")).expect("uri");
    let transport = tonic_tls::TcpTransport::from_endpoint(&endpoint);
    let name = ServerName::try_from(node.to_owned()).expect("server name");
    let connector = tonic_tls::rustls::TlsConnector::new(transport, config, name);
    let channel = endpoint.connect_with_connector_lazy(connector);
    check_channel(channel).await
}

/// A health check over an existing channel.
pub async fn check_channel(channel: tonic::transport::Channel) -> Result<(), String> {
    let mut client = tonic_health::pb::health_client::HealthClient::new(channel);
    let request = tonic_health::pb::HealthCheckRequest {
        service: String::new(),
    };
    match tokio::time::timeout(std::time::Duration::from_secs(10), client.check(request)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(status)) => Err(error_chain(&status)),
        Err(_) => Err("timed out".into()),
    }
}

/// `e` and all its sources, joined.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// A server verifier that checks the chain (not the name) and remembers
/// the leaf the server presented.
#[derive(Debug)]
pub struct Recorder {
    inner: Arc<WebPkiServerVerifier>,
    pub seen: Mutex<Option<Vec<u8>>>,
}

impl Recorder {
    pub fn last_leaf(&self) -> Option<Vec<u8>> {
        self.seen.lock().expect("lock").clone()
    }
}

impl ServerCertVerifier for Recorder {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        *self.seen.lock().expect("lock") = Some(end_entity.to_vec());
        self.inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
