//! etcd, kube-apiserver and (for the lab) kube-controller-manager and
//! kube-scheduler as real processes, with the flags a kubeadm cluster
//! uses where they matter here: client-certificate authentication, Node
//! and RBAC authorisation, NodeRestriction, service-account tokens.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

use super::{GoTools, KubePki, Kubectl};
use crate::daemon::{Daemon, free_port};

/// What to start, and where.
#[derive(Clone, Debug)]
pub struct ControlPlaneConfig {
    /// Data, certificates, kubeconfigs and logs.
    pub dir: PathBuf,
    /// The address the API server listens on and advertises.
    pub address: IpAddr,
    /// Also start kube-controller-manager and kube-scheduler (a cluster
    /// with nodes); the backend tests need only the API server.
    pub controllers: bool,
    /// Service ClusterIPs (virtual: no kube-proxy runs). From 198.18.0.0/15.
    pub service_cidr: String,
}

/// A running control plane.
pub struct ControlPlane {
    /// Its certificates.
    pub pki: KubePki,
    /// `https://<address>:<port>`.
    pub server: String,
    /// kubectl as cluster-admin (system:masters).
    pub admin: Kubectl,
    /// etcd's client URL (tests compact history through it).
    pub etcd_url: String,
    /// The Go tools it was started from (kubectl, kubelet, sidecars...).
    pub tools: GoTools,
    etcd: Daemon,
    apiserver: Daemon,
    controllers: Vec<Daemon>,
    dir: PathBuf,
}

impl ControlPlaneConfig {
    /// An API server on 127.0.0.1 only, under `dir` (backend tests).
    pub fn api_only(dir: &Path) -> Self {
        Self {
            dir: dir.to_owned(),
            address: IpAddr::from([127, 0, 0, 1]),
            controllers: false,
            service_cidr: "198.19.255.0/24".into(),
        }
    }
}

impl ControlPlane {
    /// Starts the control plane and waits until the API server is ready.
    pub async fn start(config: ControlPlaneConfig, tools: GoTools) -> anyhow::Result<Self> {
        let dir = &config.dir;
        std::fs::create_dir_all(dir)?;
        let pki = KubePki::create(&dir.join("pki"))?;
        let etcd_port = free_port();
        let peer_port = free_port();
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd = Daemon::spawn_program(
            tools.path("etcd"),
            &strings(&[
                "--name=lab",
                &format!("--data-dir={}", dir.join("etcd").display()),
                &format!("--listen-client-urls={etcd_url}"),
                &format!("--advertise-client-urls={etcd_url}"),
                &format!("--listen-peer-urls={peer_url}"),
                &format!("--initial-advertise-peer-urls={peer_url}"),
                &format!("--initial-cluster=lab={peer_url}"),
                "--log-level=warn",
                // Many short-lived test objects: keep history small.
                "--quota-backend-bytes=2147483648",
            ]),
            &dir.join("etcd.log"),
        );

        let port = free_port();
        let server = format!("https://{}:{port}", url_host(config.address));
        let serving = pki.serving(
            "kube-apiserver",
            &[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
            &[
                config.address,
                IpAddr::from([127, 0, 0, 1]),
                service_ip(&config.service_cidr)?,
            ],
        )?;
        // kubeadm binds this identity to system:kubelet-api-admin; the lab
        // has no kubeadm, so it is an admin (logs, exec, port-forward).
        let kubelet_client = pki.client(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            &["system:masters"],
        )?;
        let admin = pki.client("admin", "lab-admin", &["system:masters"])?;
        let admin_config = dir.join("admin.kubeconfig");
        // Every request at Metadata level: who asked what (the bench counts
        // the proxy's requests per volume; a failed test shows who was refused).
        let audit_policy = dir.join("audit-policy.yaml");
        std::fs::write(
            &audit_policy,
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [\"RequestReceived\"]\nrules:\n- level: Metadata\n",
        )?;
        pki.kubeconfig_cert(&admin_config, &server, &admin)?;
        let apiserver = Daemon::spawn_program(
            tools.path("kube-apiserver"),
            &strings(&[
                &format!("--etcd-servers={etcd_url}"),
                &format!("--bind-address={}", config.address),
                &format!("--advertise-address={}", config.address),
                &format!("--secure-port={port}"),
                &format!("--cert-dir={}", dir.join("apiserver-certs").display()),
                &format!("--tls-cert-file={}", serving.cert.display()),
                &format!("--tls-private-key-file={}", serving.key.display()),
                &format!("--client-ca-file={}", pki.ca().display()),
                &format!(
                    "--kubelet-client-certificate={}",
                    kubelet_client.cert.display()
                ),
                &format!("--kubelet-client-key={}", kubelet_client.key.display()),
                &format!("--kubelet-certificate-authority={}", pki.ca().display()),
                "--kubelet-preferred-address-types=InternalIP",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                &format!("--service-account-key-file={}", pki.sa_pub().display()),
                &format!(
                    "--service-account-signing-key-file={}",
                    pki.sa_key().display()
                ),
                &format!("--service-cluster-ip-range={}", config.service_cidr),
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                "--allow-privileged=true",
                "--anonymous-auth=false",
                "--profiling=false",
                &format!("--audit-policy-file={}", audit_policy.display()),
                &format!("--audit-log-path={}", dir.join("audit.log").display()),
                "--audit-log-maxsize=200",
                // The `kubernetes` Service's endpoints (in-cluster clients
                // reach the API server through it) name the advertised
                // address, which may not be loopback.
                match config.address.is_loopback() {
                    true => "--endpoint-reconciler-type=none",
                    false => "--endpoint-reconciler-type=lease",
                },
                "--v=1",
            ]),
            &dir.join("kube-apiserver.log"),
        );
        let tools_for_admin = tools.clone();
        let admin = Kubectl::new(tools_for_admin.path("kubectl"), &admin_config);
        let mut this = Self {
            pki,
            server,
            admin,
            etcd_url,
            tools,
            etcd,
            apiserver,
            controllers: Vec::new(),
            dir: dir.clone(),
        };
        this.wait_ready().await?;
        if config.controllers {
            this.start_controllers()?;
        }
        Ok(this)
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
        loop {
            if let Ok(body) = self.admin.run(&["get", "--raw", "/readyz"])
                && body.trim() == "ok"
            {
                return Ok(());
            }
            if let Some(status) = self.apiserver.try_exit() {
                anyhow::bail!(
                    "kube-apiserver exited ({status}):\n{}",
                    tail(&self.apiserver.log())
                );
            }
            if let Some(status) = self.etcd.try_exit() {
                anyhow::bail!("etcd exited ({status}):\n{}", tail(&self.etcd.log()));
            }
            if tokio::time::Instant::now() > deadline {
                anyhow::bail!(
                    "kube-apiserver not ready after 90 s:\n{}",
                    tail(&self.apiserver.log())
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn start_controllers(&mut self) -> anyhow::Result<()> {
        let dir = self.dir.clone();
        let kcm_cert = self.pki.client(
            "kube-controller-manager",
            "system:kube-controller-manager",
            &[],
        )?;
        let kcm_config = dir.join("kube-controller-manager.kubeconfig");
        self.pki
            .kubeconfig_cert(&kcm_config, &self.server, &kcm_cert)?;
        let sched_cert = self
            .pki
            .client("kube-scheduler", "system:kube-scheduler", &[])?;
        let sched_config = dir.join("kube-scheduler.kubeconfig");
        self.pki
            .kubeconfig_cert(&sched_config, &self.server, &sched_cert)?;
        let kcm = Daemon::spawn_program(
            self.tools.path("kube-controller-manager"),
            &strings(&[
                &format!("--kubeconfig={}", kcm_config.display()),
                &format!("--authentication-kubeconfig={}", kcm_config.display()),
                &format!("--authorization-kubeconfig={}", kcm_config.display()),
                &format!(
                    "--service-account-private-key-file={}",
                    self.pki.sa_key().display()
                ),
                &format!("--root-ca-file={}", self.pki.ca().display()),
                &format!("--cluster-signing-cert-file={}", self.pki.ca().display()),
                &format!("--cluster-signing-key-file={}", self.pki.ca_key().display()),
                "--use-service-account-credentials=true",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                &format!("--secure-port={}", free_port()),
                &format!("--cert-dir={}", dir.join("kcm-certs").display()),
                // The lab's node-lifecycle timing: NotReady after 20 s without a heartbeat.
                "--node-monitor-grace-period=20s",
                "--node-monitor-period=2s",
                "--v=1",
            ]),
            &dir.join("kube-controller-manager.log"),
        );
        let scheduler = Daemon::spawn_program(
            self.tools.path("kube-scheduler"),
            &strings(&[
                &format!("--kubeconfig={}", sched_config.display()),
                &format!("--authentication-kubeconfig={}", sched_config.display()),
                &format!("--authorization-kubeconfig={}", sched_config.display()),
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                &format!("--secure-port={}", free_port()),
                &format!("--cert-dir={}", dir.join("scheduler-certs").display()),
                "--v=1",
            ]),
            &dir.join("kube-scheduler.log"),
        );
        self.controllers.push(kcm);
        self.controllers.push(scheduler);
        Ok(())
    }

    /// The release the API server says it is (`/version`'s `gitVersion`, `v1.37.2`).
    pub fn git_version(&self) -> anyhow::Result<String> {
        let raw = self.admin.run(&["get", "--raw", "/version"])?;
        let version: serde_json::Value =
            serde_json::from_str(&raw).with_context(|| format!("/version: {raw}"))?;
        version["gitVersion"]
            .as_str()
            .map(str::to_owned)
            .with_context(|| format!("/version has no gitVersion: {version}"))
    }

    /// The API server's audit log (JSON lines, one event per request stage).
    pub fn audit_log(&self) -> PathBuf {
        self.dir.join("audit.log")
    }

    /// Leaves every process running after this handle is dropped.
    pub fn detach(self) {
        self.etcd.detach();
        self.apiserver.detach();
        for c in self.controllers {
            c.detach();
        }
    }

    /// PIDs of every process it started (the lab's record, for `down`).
    pub fn pids(&self) -> Vec<u32> {
        let mut pids = vec![self.etcd.pid(), self.apiserver.pid()];
        pids.extend(self.controllers.iter().map(Daemon::pid));
        pids
    }

    /// A service account's token from the TokenRequest API, written to
    /// `file`, and a kubeconfig using it: the identity a Pod would have.
    pub fn service_account_kubeconfig(
        &self,
        namespace: &str,
        account: &str,
        file: &Path,
    ) -> anyhow::Result<PathBuf> {
        let token = self
            .admin
            .run(&[
                "create",
                "token",
                account,
                "-n",
                namespace,
                "--duration=24h",
            ])
            .with_context(|| format!("TokenRequest for {namespace}/{account}"))?;
        let token_file = file.with_extension("token");
        std::fs::write(&token_file, token.trim())?;
        self.pki.kubeconfig_token(file, &self.server, &token_file)?;
        Ok(file.to_owned())
    }
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

fn url_host(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

/// The first address of the service range: the `kubernetes` Service's ClusterIP.
fn service_ip(cidr: &str) -> anyhow::Result<IpAddr> {
    let base: std::net::Ipv4Addr = cidr
        .split('/')
        .next()
        .unwrap_or_default()
        .parse()
        .with_context(|| format!("service CIDR {cidr}"))?;
    Ok(IpAddr::V4(std::net::Ipv4Addr::from(u32::from(base) + 1)))
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}
