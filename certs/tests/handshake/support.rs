//! Helpers for the handshake tests: a CA in a temporary directory, a TLS
//! echo server on 127.0.0.1 that reports each handshake's outcome, clients
//! built by hand for the peers the real configs would never produce, and a
//! directory laid out like a mounted Kubernetes Secret volume.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use csi_scsi_certs::{
    CA_CERT_FILE, CertificateAuthority, Identity, IdentityRejected, IssuedCertificate,
    MaterialPaths, MaterialStore, Role, TLS_CERT_FILE, TLS_KEY_FILE, TrustDomain, Validity,
    write_issued,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{CertificateError, ClientConfig, OtherError, RootCertStore, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// How long any single network step may take before the test fails.
const STEP: Duration = Duration::from_secs(10);

pub const TRUST_DOMAIN: &str = "csi-scsi.test";

// === PKI ===

/// A CA and a scratch directory to write material into.
pub struct Pki {
    pub domain: TrustDomain,
    pub ca: CertificateAuthority,
    pub dir: tempfile::TempDir,
}

impl Pki {
    pub fn new() -> Self {
        Self::in_domain(TRUST_DOMAIN)
    }

    pub fn in_domain(domain: &str) -> Self {
        csi_scsi_certs::install_crypto_provider();
        let domain = TrustDomain::new(domain).expect("valid trust domain");
        let ca = CertificateAuthority::create(&domain, Validity::days(30)).expect("create CA");
        let dir = tempfile::tempdir().expect("temporary directory");
        Self { domain, ca, dir }
    }

    /// A certificate valid for a day.
    pub fn issue(&self, id: &Identity) -> IssuedCertificate {
        self.ca
            .issue(id, Validity::days(1))
            .expect("issue certificate")
    }

    /// A certificate that expired yesterday.
    pub fn issue_expired(&self, id: &Identity) -> IssuedCertificate {
        self.ca
            .issue(id, expired())
            .expect("issue expired certificate")
    }

    /// Writes `issued` into its own directory and returns it.
    pub fn write(&self, name: &str, issued: &IssuedCertificate) -> PathBuf {
        let dir = self.dir.path().join(name);
        write_issued(&dir, issued).expect("write issued certificate");
        dir
    }

    /// A store for `role` holding a freshly issued certificate.
    pub fn store(&self, role: Role) -> Arc<MaterialStore> {
        let issued = self.issue(&role.identity());
        let name = match &role {
            Role::Agent { node } => format!("agent-{node}"),
            Role::Proxy => "proxy".to_owned(),
        };
        let dir = self.write(&name, &issued);
        MaterialStore::load(MaterialPaths::in_dir(&dir), role, self.domain.clone())
            .expect("load material")
    }

    pub fn uri(&self, id: &Identity) -> String {
        self.domain.uri(id)
    }
}

pub fn agent(node: &str) -> Role {
    Role::Agent {
        node: node.to_owned(),
    }
}

pub fn node(node: &str) -> Identity {
    Identity::Node(node.to_owned())
}

/// From ten days ago until yesterday.
pub fn expired() -> Validity {
    let now = time::OffsetDateTime::now_utc();
    Validity {
        not_before: now - time::Duration::days(10),
        not_after: now - time::Duration::days(1),
    }
}

// === Certificates ===

pub fn leaf_der(cert_pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(cert_pem.as_bytes()).expect("PEM certificate")
}

/// Serial number of a DER certificate, lower-case hex without separators.
pub fn serial_hex(der: &[u8]) -> String {
    let (_, cert) = x509_parser::parse_x509_certificate(der).expect("parse certificate");
    cert.raw_serial()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A client config trusting `ca_pem`, checking the server against the
/// name it dials, and presenting no certificate.
pub fn client_without_certificate(ca_pem: &str) -> Arc<ClientConfig> {
    let mut config = client_builder(ca_pem).with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

/// A client config trusting `ca_pem` and presenting `issued`, whatever it
/// is (from another CA, expired, an agent's server certificate).
pub fn client_presenting(ca_pem: &str, issued: &IssuedCertificate) -> Arc<ClientConfig> {
    let (chain, key) = chain_and_key(issued);
    let mut config = client_builder(ca_pem)
        .with_client_auth_cert(chain, key)
        .expect("client certificate and key");
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

fn client_builder(
    ca_pem: &str,
) -> rustls::ConfigBuilder<ClientConfig, rustls::client::WantsClientCert> {
    ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots(ca_pem))
}

/// Like [`client_presenting`], speaking only `versions`.
pub fn client_presenting_with(
    ca_pem: &str,
    issued: &IssuedCertificate,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Arc<ClientConfig> {
    let (chain, key) = chain_and_key(issued);
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .expect("protocol versions")
        .with_root_certificates(roots(ca_pem))
        .with_client_auth_cert(chain, key)
        .expect("client certificate and key");
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

/// A plain rustls server with default session settings (resumption on),
/// requiring a client certificate from `ca_pem` and presenting `issued`.
/// The control for the resumption test.
pub fn plain_server_config(ca_pem: &str, issued: &IssuedCertificate) -> Arc<ServerConfig> {
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots(ca_pem)),
        provider(),
    )
    .build()
    .expect("client verifier");
    let (chain, key) = chain_and_key(issued);
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .expect("server certificate and key");
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

fn roots(ca_pem: &str) -> RootCertStore {
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(ca.expect("PEM CA certificate"))
            .expect("CA certificate");
    }
    roots
}

fn chain_and_key(
    issued: &IssuedCertificate,
) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
    let chain = CertificateDer::pem_slice_iter(issued.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("PEM certificate chain");
    let key = PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes()).expect("PEM key");
    (chain, key)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// What webpki reports for a certificate signed by `foreign` when only
/// `trusted` is trusted. webpki matches issuers by subject name alone: when
/// both CAs carry the same subject (two CAs created for one trust domain
/// do), it tries the trusted CA's key and reports a bad signature; only a
/// foreign CA with a different subject is an unknown issuer.
pub fn foreign_ca_error(
    trusted: &CertificateAuthority,
    foreign: &CertificateAuthority,
) -> (CertificateError, rustls::AlertDescription) {
    if subject(trusted.cert_pem()) == subject(foreign.cert_pem()) {
        #[allow(deprecated)]
        let bad = CertificateError::BadSignature;
        (bad, rustls::AlertDescription::DecryptError)
    } else {
        (
            CertificateError::UnknownIssuer,
            rustls::AlertDescription::UnknownCA,
        )
    }
}

fn subject(cert_pem: &str) -> Vec<u8> {
    let der = leaf_der(cert_pem);
    let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("parse certificate");
    cert.subject().as_raw().to_vec()
}

// === Errors ===

/// The rustls error inside an I/O error from tokio-rustls.
#[track_caller]
pub fn rustls_error(e: &io::Error) -> &rustls::Error {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .unwrap_or_else(|| panic!("expected a rustls error, got {e:?}"))
}

/// The identity rejection carried in a certificate error.
#[track_caller]
pub fn identity_rejection(e: &rustls::Error) -> &IdentityRejected {
    match e {
        rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(inner))) => inner
            .downcast_ref::<IdentityRejected>()
            .unwrap_or_else(|| panic!("expected IdentityRejected, got {e:?}")),
        other => panic!("expected an identity rejection, got {other:?}"),
    }
}

#[track_caller]
pub fn expect_err<T>(result: io::Result<T>, what: &str) -> io::Error {
    match result {
        Ok(_) => panic!("{what}: expected an error, got success"),
        Err(e) => e,
    }
}

pub async fn within<F: Future>(what: &str, fut: F) -> F::Output {
    tokio::time::timeout(STEP, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: no result within {STEP:?}"))
}

// === Server ===

/// A TLS echo server; reports each handshake's outcome in accept order.
pub struct Server {
    pub addr: SocketAddr,
    outcomes: mpsc::UnboundedReceiver<io::Result<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    pub async fn spawn(config: Arc<ServerConfig>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local address");
        let (tx, outcomes) = mpsc::unbounded_channel();
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    match acceptor.accept(tcp).into_fallible().await {
                        Ok(tls) => {
                            let _ = tx.send(Ok(()));
                            echo(tls).await;
                        }
                        Err((e, tcp)) => {
                            let _ = tx.send(Err(e));
                            // The alert is out; close gracefully so the
                            // client reads it rather than a reset.
                            drain_and_close(tcp).await;
                        }
                    }
                });
            }
        });
        Self {
            addr,
            outcomes,
            task,
        }
    }

    /// The outcome of the next handshake the server attempted.
    pub async fn next_handshake(&mut self) -> io::Result<()> {
        within("server handshake", self.outcomes.recv())
            .await
            .expect("server task alive")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn echo(mut tls: tokio_rustls::server::TlsStream<TcpStream>) {
    let mut buf = [0u8; 1024];
    loop {
        match tls.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if tls.write_all(&buf[..n]).await.is_err() || tls.flush().await.is_err() {
                    return;
                }
            }
        }
    }
}

async fn drain_and_close(mut tcp: TcpStream) {
    let _ = tcp.shutdown().await;
    let mut buf = [0u8; 1024];
    let _ = tokio::time::timeout(STEP, async {
        while let Ok(n) = tcp.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

// === Client ===

pub type ClientStream = tokio_rustls::client::TlsStream<TcpStream>;

/// Dials `addr` with `config`, asking for `name` in SNI.
pub async fn connect(
    config: Arc<ClientConfig>,
    name: &str,
    addr: SocketAddr,
) -> io::Result<ClientStream> {
    let name = ServerName::try_from(name.to_owned()).expect("server name");
    within("client handshake", async {
        let tcp = TcpStream::connect(addr).await?;
        tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
    })
    .await
}

/// Sends `msg` and reads the echo.
pub async fn round_trip(tls: &mut ClientStream, msg: &[u8]) -> io::Result<Vec<u8>> {
    within("round trip", async {
        tls.write_all(msg).await?;
        tls.flush().await?;
        let mut back = vec![0u8; msg.len()];
        tls.read_exact(&mut back).await?;
        Ok(back)
    })
    .await
}

/// Connects and exchanges one message; the first error wins. With TLS 1.3
/// a refused client certificate surfaces only here, after the client's
/// own handshake has finished.
pub async fn dial_and_echo(
    config: Arc<ClientConfig>,
    name: &str,
    addr: SocketAddr,
) -> io::Result<Vec<u8>> {
    let mut tls = connect(config, name, addr).await?;
    round_trip(&mut tls, b"ping").await
}

/// The leaf certificate the server presented on this connection.
pub fn presented_leaf(tls: &ClientStream) -> CertificateDer<'static> {
    tls.get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .expect("server presented a certificate")
        .clone()
}

/// Makes two connections with `config`, each exchanging a message (which
/// also takes in any session tickets), and says how each handshake went.
pub async fn handshake_kinds(
    config: &Arc<ClientConfig>,
    server: &mut Server,
) -> Vec<rustls::HandshakeKind> {
    let mut kinds = Vec::new();
    for _ in 0..2 {
        let mut tls = connect(config.clone(), "node-a", server.addr)
            .await
            .expect("client handshake");
        server.next_handshake().await.expect("server handshake");
        assert_eq!(
            round_trip(&mut tls, b"ping").await.expect("round trip"),
            b"ping"
        );
        kinds.push(tls.get_ref().1.handshake_kind().expect("handshake done"));
    }
    kinds
}

// === Secret volume ===

/// A directory laid out the way the kubelet projects a Secret: the data in
/// a timestamped directory, `..data` pointing at it, and each key a symlink
/// through `..data`. Updates swap `..data` atomically.
pub struct SecretVolume {
    pub dir: PathBuf,
    generation: u32,
    current: Option<String>,
}

impl SecretVolume {
    pub fn create(dir: &Path, issued: &IssuedCertificate) -> Self {
        std::fs::create_dir_all(dir).expect("create volume directory");
        let mut volume = Self {
            dir: dir.to_owned(),
            generation: 0,
            current: None,
        };
        volume.update(&issued.cert_pem, &issued.key_pem, &issued.ca_pem);
        for file in [TLS_CERT_FILE, TLS_KEY_FILE, CA_CERT_FILE] {
            symlink(Path::new("..data").join(file), dir.join(file)).expect("key symlink");
        }
        volume
    }

    pub fn paths(&self) -> MaterialPaths {
        MaterialPaths::in_dir(&self.dir)
    }

    pub fn rotate_to(&mut self, issued: &IssuedCertificate) {
        self.update(&issued.cert_pem, &issued.key_pem, &issued.ca_pem);
    }

    /// Writes a new timestamped directory, points `..data_tmp` at it,
    /// renames that over `..data` and removes the previous directory.
    pub fn update(&mut self, cert: &str, key: &str, ca: &str) {
        self.generation += 1;
        let g = self.generation;
        let name = format!("..2026_01_01_00_00_{g:02}.{g}");
        let data = self.dir.join(&name);
        std::fs::create_dir(&data).expect("create timestamped directory");
        for (file, contents) in [
            (TLS_CERT_FILE, cert),
            (TLS_KEY_FILE, key),
            (CA_CERT_FILE, ca),
        ] {
            std::fs::write(data.join(file), contents).expect("write secret file");
        }
        let tmp = self.dir.join("..data_tmp");
        symlink(&name, &tmp).expect("..data_tmp symlink");
        std::fs::rename(&tmp, self.dir.join("..data")).expect("swap ..data");
        if let Some(old) = self.current.replace(name) {
            std::fs::remove_dir_all(self.dir.join(old)).expect("remove old directory");
        }
    }
}
