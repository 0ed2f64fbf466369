//! The files a lab node's runtime reads: containerd's configuration, the
//! CNI network and the KubeletConfiguration. One writer for both kinds of
//! node: the host-side nodes of the Kubernetes lab ([`super::node`]) and
//! the qemu guests of `lab up --kubernetes --vm` ([`super::vm_node`]),
//! which differ only in the paths and in what a node that shares its host
//! must leave alone.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use super::images::PAUSE;

/// Where one containerd keeps its state.
pub struct ContainerdPaths {
    /// Its root (images, snapshots).
    pub root: PathBuf,
    /// Its state directory.
    pub state: PathBuf,
    /// Its socket.
    pub socket: PathBuf,
    /// Its `opt` plugin directory.
    pub opt: PathBuf,
    /// runc's root.
    pub runc_root: PathBuf,
    /// The CNI configuration directory.
    pub cni_conf: PathBuf,
    /// Whether runc may only raise OOM scores (root without
    /// `CAP_SYS_RESOURCE`: the host-side nodes).
    pub restrict_oom_score_adj: bool,
}

/// containerd 1.6's configuration (version 2) for `paths`.
pub fn containerd(paths: &ContainerdPaths) -> String {
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[debug]
  address = "{sock}.debug"
[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE}"
  restrict_oom_score_adj = {restrict}
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{runc}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"#,
        root = paths.root.display(),
        state = paths.state.display(),
        sock = paths.socket.display(),
        opt = paths.opt.display(),
        runc = paths.runc_root.display(),
        cni = paths.cni_conf.display(),
        restrict = paths.restrict_oom_score_adj,
    )
}

/// The node's Pod network: a bridge with host-local addresses from
/// `pod_subnet`, the default route through the node.
pub fn cni_network(pod_subnet: &str, ipam_dir: &Path) -> serde_json::Value {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "lab",
        "plugins": [{
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": true,
            "ipMasq": false,
            // The default route through the node: Pods reach the API
            // server (the `kubernetes` Service) and other nodes.
            "ipam": {"type": "host-local", "ranges": [[{"subnet": pod_subnet}]],
                     "routes": [{"dst": "0.0.0.0/0"}],
                     "dataDir": ipam_dir.display().to_string()}
        }]
    })
}

/// What a kubelet's configuration names.
pub struct KubeletSettings<'a> {
    /// The address it serves on (the Node's InternalIP).
    pub address: IpAddr,
    /// The cluster CA (client certificates).
    pub client_ca: &'a Path,
    /// Its serving certificate and key.
    pub serving: (&'a Path, &'a Path),
    /// containerd's socket.
    pub runtime_socket: &'a Path,
    /// A cgroup root of its own, where several kubelets share one host
    /// (each removes Pod cgroups under its root that it does not know);
    /// `None` on a machine of its own.
    pub shared_host_cgroup_root: Option<&'a str>,
}

/// The KubeletConfiguration for `s`.
pub fn kubelet(s: &KubeletSettings<'_>) -> String {
    let shared_host = match s.shared_host_cgroup_root {
        Some(root) => format!(
            "# Several kubelets on one host: each removes pod cgroups under its root\n\
             # that it does not know, so each needs a root of its own.\n\
             cgroupRoot: {root}\n\
             # Root here cannot lower OOM scores (no CAP_SYS_RESOURCE).\n\
             oomScoreAdj: 0\n"
        ),
        None => String::new(),
    };
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {ip}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {ca}
authorization:
  mode: Webhook
tlsCertFile: {cert}
tlsPrivateKeyFile: {key}
containerRuntimeEndpoint: unix://{sock}
# cgroup v1 hosts: cgroupfs. From 1.35 the kubelet refuses to start on
# cgroup v1 unless failCgroupV1 is false (docs/kubernetes-lab.md); the
# guests run cgroup v2.
cgroupDriver: cgroupfs
failCgroupV1: false
{shared_host}cgroupsPerQOS: true
enforceNodeAllocatable: ["pods"]
failSwapOn: false
makeIPTablesUtilChains: false
# No evictions or image GC from the lab's use of its disk (the images
# cannot be pulled again: there is no registry).
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeStatusUpdateFrequency: 5s
# kubelet calls NodeExpandVolume for an online resize on a pod sync, whose
# default period (1m, plus up to 50% jitter) made the expand step ~80 s.
syncFrequency: 5s
resolvConf: ""
"#,
        ip = s.address,
        ca = s.client_ca.display(),
        cert = s.serving.0.display(),
        key = s.serving.1.display(),
        sock = s.runtime_socket.display(),
    )
}
