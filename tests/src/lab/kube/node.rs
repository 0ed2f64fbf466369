//! A real Kubernetes node for each lab node: its own containerd (root,
//! state, socket, CNI bridge in the node's network namespace), a real
//! kubelet (root directory `/var/lib/kubelet` as on any node, cgroup root
//! of its own, the node's address) and kube-proxy (the `kubernetes`
//! Service for in-cluster clients), all in the node's network namespace
//! and its own mount namespace ([`super::node_fs`]), where the Pods run
//! too.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::kubelet_unit::KubeletUnit;
use super::node_config;
use super::node_fs::NodeFs;
use super::node_shell::NodeShell;
use crate::daemon::Daemon;
use crate::kube::{ControlPlane, GoTools};
use crate::lab::net::sh;

/// One node's runtime processes and files.
pub struct KubeNode {
    /// The Node's name (the lab node's name).
    pub name: String,
    /// containerd.
    pub containerd: Daemon,
    /// kubelet, as a service (its PID in a file: `systemctl` on the
    /// node's shell stops and starts the same one).
    pub kubelet: KubeletUnit,
    /// kube-proxy.
    pub kube_proxy: Daemon,
    /// Its sshd (the node's shell: [`super::node_shell`]).
    pub sshd: Daemon,
    /// What the node's `/proc/1` shows ([`NodeFs::anchor_proc_1`]).
    pub proc_1: Daemon,
    /// Its mount namespace.
    pub fs: NodeFs,
    /// Its cgroup root (`/csi-scsi-<prefix>-<node>`), removed by `lab down`.
    pub cgroup_root: String,
    containerd_args: Vec<String>,
    containerd_log: PathBuf,
    kube_proxy_args: Vec<String>,
    kube_proxy_log: PathBuf,
    containerd_socket: PathBuf,
}

/// What [`KubeNode::power_off`] stopped.
#[derive(Debug, Default)]
pub struct PowerCut {
    /// Volume filesystems shut down (their mount points).
    pub filesystems: Vec<String>,
    /// containerd shims killed.
    pub shims: usize,
    /// Processes of the node's Pods killed (the agent's among them).
    pub pod_processes: usize,
}

/// Where one node's runtime lives.
pub struct NodeSpec<'a> {
    /// Node name.
    pub name: &'a str,
    /// Its address (in its network namespace).
    pub ip: IpAddr,
    /// Its network namespace (`/run/netns/<netns>`).
    pub netns: &'a str,
    /// Its directory (`nodes/<name>`).
    pub base: &'a Path,
    /// Its mount namespace.
    pub fs: &'a NodeFs,
    /// Its Pods' subnet (CNI host-local range).
    pub pod_subnet: String,
    /// Every node's Pods (kube-proxy's `--cluster-cidr`).
    pub cluster_cidr: String,
    /// Its cgroup root.
    pub cgroup_root: String,
    /// The lab's node shell (keys, commands).
    pub shell: &'a NodeShell,
}

impl KubeNode {
    /// Starts containerd, imports the images (the node's "registry"), then
    /// starts kubelet and kube-proxy.
    pub async fn start(
        spec: &NodeSpec<'_>,
        plane: &ControlPlane,
        tools: &GoTools,
        images: &[PathBuf],
    ) -> anyhow::Result<Self> {
        let rt = spec.base.join("runtime");
        let ctrd = rt.join("containerd");
        let cni = rt.join("cni");
        std::fs::create_dir_all(&ctrd)?;
        std::fs::create_dir_all(&cni)?;
        let sock = containerd_socket(spec.base);
        std::fs::write(
            cni.join("10-lab.conflist"),
            serde_json::to_vec_pretty(&node_config::cni_network(
                &spec.pod_subnet,
                &super::cni::ipam_dir(&rt),
            ))?,
        )?;
        let config = ctrd.join("config.toml");
        std::fs::write(
            &config,
            node_config::containerd(&node_config::ContainerdPaths {
                root: ctrd.join("root"),
                state: ctrd.join("state"),
                socket: sock.clone(),
                opt: ctrd.join("opt"),
                runc_root: ctrd.join("runc"),
                cni_conf: cni.clone(),
                // Root here lacks CAP_SYS_RESOURCE: runc may only raise
                // oom_score_adj.
                restrict_oom_score_adj: true,
            }),
        )?;
        let proc_1 = spec.fs.anchor_proc_1(&spec.base.join("proc-1.log")).await?;
        let netns = format!("--net=/run/netns/{}", spec.netns);
        let mntns = spec.fs.nsenter_arg();
        let containerd_args = vec![
            netns.clone(),
            mntns.clone(),
            "containerd".into(),
            "--config".into(),
            config.display().to_string(),
        ];
        let containerd_log = spec.base.join("containerd.log");
        let containerd =
            Daemon::spawn_program(Path::new("nsenter"), &containerd_args, &containerd_log);
        wait_for_socket(&sock, &containerd).await?;
        for archive in images {
            import_image(&sock, archive)
                .with_context(|| format!("importing {}", archive.display()))?;
        }

        // The node's identity: system:node:<name> in system:nodes, so the
        // Node authorizer and NodeRestriction apply as on any cluster.
        let client = plane.pki.client(
            &format!("kubelet-{}", spec.name),
            &format!("system:node:{}", spec.name),
            &["system:nodes"],
        )?;
        let kubeconfig = rt.join("kubelet.kubeconfig");
        plane
            .pki
            .kubeconfig_cert(&kubeconfig, &plane.server, &client)?;
        let serving = plane.pki.serving(
            &format!("kubelet-serving-{}", spec.name),
            &[spec.name],
            &[spec.ip],
        )?;
        let kubelet_config = rt.join("kubelet.yaml");
        std::fs::write(
            &kubelet_config,
            node_config::kubelet(&node_config::KubeletSettings {
                address: spec.ip,
                client_ca: &plane.pki.ca(),
                serving: (&serving.cert, &serving.key),
                runtime_socket: &sock,
                shared_host_cgroup_root: Some(&spec.cgroup_root),
            }),
        )?;
        let kubelet_args = vec![
            netns.clone(),
            mntns.clone(),
            tools.path("kubelet").display().to_string(),
            format!("--config={}", kubelet_config.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            "--root-dir=/var/lib/kubelet".into(),
            format!("--cert-dir={}", rt.join("kubelet-pki").display()),
            format!("--hostname-override={}", spec.name),
            format!("--node-ip={}", spec.ip),
            "--v=2".into(),
        ];
        crate::lab::cgroups::create_root(&spec.cgroup_root)?;
        let kubelet = KubeletUnit::create(
            spec.base,
            Path::new("nsenter"),
            kubelet_args,
            spec.base.join("kubelet.log"),
        )?;
        kubelet.start().await?;

        // kube-proxy as system:kube-proxy (bound to system:node-proxier by
        // the API server's bootstrap policy), iptables mode in the node's
        // network namespace. The conntrack sysctls are host-wide: left alone.
        let proxier = plane.pki.client(
            &format!("kube-proxy-{}", spec.name),
            "system:kube-proxy",
            &[],
        )?;
        let proxy_kubeconfig = rt.join("kube-proxy.kubeconfig");
        plane
            .pki
            .kubeconfig_cert(&proxy_kubeconfig, &plane.server, &proxier)?;
        let kube_proxy_args = vec![
            netns,
            mntns,
            tools.path("kube-proxy").display().to_string(),
            format!("--kubeconfig={}", proxy_kubeconfig.display()),
            format!("--hostname-override={}", spec.name),
            "--proxy-mode=iptables".into(),
            format!("--cluster-cidr={}", spec.cluster_cidr),
            "--conntrack-max-per-core=0".into(),
            "--conntrack-tcp-timeout-established=0".into(),
            "--conntrack-tcp-timeout-close-wait=0".into(),
            "--metrics-bind-address=127.0.0.1:10249".into(),
            "--healthz-bind-address=127.0.0.1:10256".into(),
            "--v=2".into(),
        ];
        let kube_proxy_log = spec.base.join("kube-proxy.log");
        let kube_proxy =
            Daemon::spawn_program(Path::new("nsenter"), &kube_proxy_args, &kube_proxy_log);
        let sshd = spec
            .shell
            .start(spec.base, spec.ip, spec.netns, spec.fs)
            .await?;
        Ok(Self {
            name: spec.name.to_owned(),
            containerd,
            kubelet,
            kube_proxy,
            sshd,
            proc_1,
            fs: spec.fs.clone(),
            cgroup_root: spec.cgroup_root.clone(),
            containerd_args,
            containerd_log,
            kube_proxy_args,
            kube_proxy_log,
            containerd_socket: sock,
        })
    }

    /// Stops kubelet (SIGTERM, as systemd would): its Pods keep running.
    pub async fn stop_kubelet(&mut self) {
        self.kubelet.stop().await;
    }

    /// Starts kubelet again with the same flags; returns its PID (to
    /// record for `lab down`).
    pub async fn restart_kubelet(&mut self) -> anyhow::Result<u32> {
        self.kubelet.start().await
    }

    /// Cuts the node's power as far as one host allows. First every
    /// filesystem of its volumes is shut down as a power cut leaves it (no
    /// further write, no log flush: `xfs_io -x -c shutdown`, which ext4
    /// honours too), so the stale mounts left in its namespace never write
    /// again, not even when they are unmounted after it comes back; then
    /// kubelet, kube-proxy, containerd, its shims and every process of its
    /// Pods (the agent's too) are SIGKILLed. Call [`Self::power_on`] next.
    pub async fn power_off(&mut self) -> anyhow::Result<PowerCut> {
        // Killed even when a shutdown fails: power_on must find them gone.
        let filesystems = self.shut_down_volume_filesystems();
        self.kubelet.kill().await;
        for daemon in [&mut self.kube_proxy, &mut self.containerd] {
            crate::lab::sigkill(daemon.pid());
            // Reaps it (the signal it sends then finds it dead).
            daemon.terminate().await;
        }
        let shims = shims_of(&self.containerd_socket);
        for pid in &shims {
            crate::lab::sigkill(*pid);
        }
        let (_, pod_processes) = crate::lab::cgroups::kill_all(&self.cgroup_root);
        Ok(PowerCut {
            filesystems: filesystems?,
            shims: shims.len(),
            pod_processes,
        })
    }

    /// Shuts down every volume filesystem kubelet staged on the node, as
    /// a power cut leaves it; returns their mount points.
    fn shut_down_volume_filesystems(&self) -> anyhow::Result<Vec<String>> {
        let filesystems = self.staged_filesystems()?;
        for target in &filesystems {
            sh(
                "nsenter",
                &[
                    &self.fs.nsenter_arg(),
                    "xfs_io",
                    "-x",
                    "-c",
                    "shutdown",
                    target,
                ],
            )
            .with_context(|| format!("shutting down {target} on {}", self.name))?;
        }
        Ok(filesystems)
    }

    /// kubelet's staging mounts of filesystem volumes on the node (one per
    /// volume: its Pods' mounts are binds of them, the same filesystem).
    pub fn staged_filesystems(&self) -> anyhow::Result<Vec<String>> {
        let mounts = sh(
            "nsenter",
            &[
                &self.fs.nsenter_arg(),
                "findmnt",
                "-rn",
                "-o",
                "TARGET,FSTYPE",
            ],
        )?;
        Ok(mounts
            .lines()
            .filter_map(|line| {
                let mut f = line.split_whitespace();
                let (target, fstype) = (f.next()?, f.next()?);
                (target.starts_with(STAGING) && matches!(fstype, "ext4" | "xfs"))
                    .then(|| target.to_owned())
            })
            .collect())
    }

    /// Starts containerd, kubelet and kube-proxy again after
    /// [`Self::power_off`], with the same flags; returns their PIDs (to
    /// record for `lab down`). kubelet restarts the node's Pods.
    pub async fn power_on(&mut self) -> anyhow::Result<Vec<u32>> {
        // The killed containerd's socket file is still there: gone, the
        // wait below sees the new one.
        let _ = std::fs::remove_file(&self.containerd_socket);
        self.containerd = Daemon::spawn_program(
            Path::new("nsenter"),
            &self.containerd_args,
            &self.containerd_log,
        );
        wait_for_socket(&self.containerd_socket, &self.containerd).await?;
        self.restart_kubelet().await?;
        self.kube_proxy = Daemon::spawn_program(
            Path::new("nsenter"),
            &self.kube_proxy_args,
            &self.kube_proxy_log,
        );
        Ok(self.pids())
    }

    /// containerd's socket (for `ctr`).
    pub fn containerd_socket(&self) -> &Path {
        &self.containerd_socket
    }

    /// Leaves containerd, kubelet, kube-proxy, sshd and the PID 1 stand-in
    /// running after this handle is dropped.
    pub fn detach(self) {
        self.containerd.detach();
        self.kube_proxy.detach();
        self.sshd.detach();
        self.proc_1.detach();
    }

    /// PIDs to record for `lab down`.
    pub fn pids(&self) -> Vec<u32> {
        [
            self.containerd.pid(),
            self.kube_proxy.pid(),
            self.sshd.pid(),
            self.proc_1.pid(),
        ]
        .into_iter()
        .chain(self.kubelet.main_pid())
        .collect()
    }
}

/// Where kubelet stages CSI volumes (in the node's mount namespace).
const STAGING: &str = "/var/lib/kubelet/plugins/kubernetes.io/csi/";

/// The containerd shims serving the containerd at `socket` (their
/// `-address` argument), by PID.
fn shims_of(socket: &Path) -> Vec<u32> {
    let socket = socket.as_os_str().as_encoded_bytes();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let mut args = cmdline.split(|b| *b == 0);
            let shim = args
                .next()
                .is_some_and(|a| a.ends_with(b"containerd-shim-runc-v2"));
            (shim && args.any(|a| a == socket)).then_some(pid)
        })
        .collect()
}

async fn wait_for_socket(sock: &Path, daemon: &Daemon) -> anyhow::Result<()> {
    for _ in 0..200 {
        if sock.exists() {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    anyhow::bail!("containerd did not start:\n{}", daemon.log())
}

/// The containerd socket of the lab node whose files are under `base`
/// (`<lab>/nodes/<name>`).
pub fn containerd_socket(base: &Path) -> PathBuf {
    base.join("runtime/containerd/containerd.sock")
}

/// `ctr` against the containerd at `socket`, in the CRI namespace.
pub fn ctr_at(socket: &Path, args: &[&str]) -> anyhow::Result<String> {
    let address = socket.display().to_string();
    let mut all = vec!["--address", address.as_str(), "-n", "k8s.io"];
    all.extend_from_slice(args);
    sh("ctr", &all)
}

/// `ctr`'s arguments (after its address and namespace) that import an
/// image archive, on host-side nodes and in guests alike.
pub const IMPORT_ARGS: [&str; 3] = ["images", "import", "--no-unpack"];

/// `ctr`'s arguments that tag `image` as `alias`, replacing an alias a
/// rerun on the same lab left (`tag` alone refuses an existing name).
pub fn tag_args<'a>(image: &'a str, alias: &'a str) -> [&'a str; 5] {
    ["images", "tag", "--force", image, alias]
}

/// Imports an image archive into the containerd at `socket` (the node's
/// "registry": there is none).
pub fn import_image(socket: &Path, archive: &Path) -> anyhow::Result<()> {
    let archive = archive.display().to_string();
    let mut args = IMPORT_ARGS.to_vec();
    args.push(&archive);
    ctr_at(socket, &args).map(|_| ())
}
