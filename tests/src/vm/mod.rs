//! Lab nodes with a real kernel (`lab up --vm`): each node is a qemu guest
//! booting Debian's own kernel from an initramfs the lab builds from Debian
//! packages (`tests/vm/build-image`), with the kernel iSCSI initiator,
//! udev and dm-multipath, and the agent running with its production
//! defaults. The guest's qemu runs inside the node's network namespace:
//! its user networks reach tgtd's two portals from the node's own address
//! (so initiator ACLs see the node), and qemu forwards the node's agent,
//! status and helper ports to the guest. See docs/lab.md, "VM nodes".
//! With [`KubeGuest`] the guest is a Kubernetes node as well
//! (`lab up --kubernetes --vm`, docs/kubernetes-lab.md): containerd and
//! kubelet run inside, on a third NIC that carries the Node's address.

pub mod checks;
pub mod guest;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};

use crate::binaries::binary;
use crate::daemon::Daemon;
use crate::lab::net::{Network, sh};

/// The guest helper's port (forwarded from the node's lab address).
pub const GUEST_PORT: u16 = 9813;
/// Memory of each guest, in MiB.
pub const GUEST_MEMORY_MIB: u32 = 512;
/// Memory of a guest that is a Kubernetes node: containerd, kubelet and
/// the images (in the guest's tmpfs root) besides the storage stack.
pub const KUBE_GUEST_MEMORY_MIB: u32 = 2048;
/// The guest's first user network (eth0: the default route, portal 1).
const NET0: &str = "198.19.0";
/// The guest's second user network (eth1: portal 2).
const NET1: &str = "198.19.1";

/// The node image: Debian's kernel and the initramfs every node shares.
#[derive(Clone, Debug)]
pub struct Image {
    /// The kernel.
    pub kernel: PathBuf,
    /// The shared initramfs (uncompressed newc cpio).
    pub base: PathBuf,
}

impl Image {
    /// Builds the image into `dir` from the Debian packages and this
    /// build's agent and guest helper; with `kubelet`, for guests that are
    /// Kubernetes nodes (containerd, runc, CNI plugins and that kubelet).
    pub fn build(dir: &Path, kubelet: Option<&Path>) -> anyhow::Result<Self> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("vm/build-image");
        let mut args = vec![
            script.display().to_string(),
            dir.display().to_string(),
            binary("csi-scsi-agent").display().to_string(),
            binary("csi-scsi-lab-guest").display().to_string(),
        ];
        args.extend(kubelet.map(|k| k.display().to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = sh("bash", &args).context("building the VM node image (tests/vm/build-image)")?;
        print!("{out}");
        Ok(Self {
            kernel: dir.join("vmlinuz"),
            base: dir.join("base.cpio"),
        })
    }
}

/// What one VM node needs to boot.
pub struct NodeSpec<'a> {
    /// Node name.
    pub name: &'a str,
    /// Its index in the lab.
    pub index: usize,
    /// Its directory (`nodes/<name>`).
    pub dir: &'a Path,
    /// The second portal's address (the first is the default route's).
    pub portal2: &'a str,
    /// The agent's one-time join token file and the CA it trusts while
    /// enrolling, when the lab runs the agent in the guest (on a
    /// Kubernetes node the DaemonSet's agent enrols with its Pod's token).
    pub enrolment: Option<(&'a Path, &'a Path)>,
    /// The agent API's port.
    pub agent_port: u16,
    /// The agent's status port.
    pub status_port: u16,
    /// Set when the guest is a Kubernetes node.
    pub kube: Option<KubeGuest<'a>>,
}

/// What makes a guest a Kubernetes node.
pub struct KubeGuest<'a> {
    /// Its address on the cluster network: the Node's InternalIP, where
    /// the kubelet and the agent Pod serve.
    pub address: Ipv4Addr,
    /// Files for the guest's `/etc/csi-scsi/kube` (kubeconfig,
    /// certificates, the kubelet's and containerd's configuration).
    pub files: &'a Path,
    /// A cpio of the images it imports (`/var/lib/csi-scsi-images`).
    pub images: &'a Path,
}

/// A running guest.
pub struct Vm {
    /// The qemu process.
    pub qemu: Daemon,
    /// The host's end of its CSI socket (a relay to the guest).
    pub relay: Daemon,
    /// The relay's socket, where kubelet's CSI socket would be.
    pub csi: PathBuf,
    /// The guest helper.
    pub guest: guest::Guest,
    /// qemu's monitor socket (links are cut and restored through it).
    pub monitor: PathBuf,
    /// The guest's serial console, as a file.
    pub console: PathBuf,
}

/// Boots node `spec` from `image` inside namespace `i` of `net`.
pub fn boot(image: &Image, net: &Network, spec: &NodeSpec<'_>) -> anyhow::Result<Vm> {
    let dir = spec.dir;
    std::fs::create_dir_all(dir.join("initrd/etc/csi-scsi"))?;
    let etc = dir.join("initrd/etc/csi-scsi");
    std::fs::write(
        etc.join("node.env"),
        format!(
            "NODE_NAME={name}\nINITIATOR=iqn.2026-11.io.csi-scsi.lab:{name}\n\
             ADDR0={NET0}.15/24\nGW0={NET0}.2\nADDR1={NET1}.15/24\nGW1={NET1}.2\n\
             PORTAL1={portal2}\nGUEST_PORT={GUEST_PORT}\nSTATUS_PORT={status}\n{kube}",
            name = spec.name,
            portal2 = spec.portal2,
            status = spec.status_port,
            kube = match &spec.kube {
                Some(k) => format!("KUBE=1\nCLUSTER_ADDR={}\n", k.address),
                None => String::new(),
            },
        ),
    )?;
    if let Some(k) = &spec.kube {
        let to = etc.join("kube");
        std::fs::create_dir_all(&to)?;
        for entry in std::fs::read_dir(k.files)? {
            let entry = entry?;
            std::fs::copy(entry.path(), to.join(entry.file_name()))?;
        }
    }
    if let Some((join_token, ca)) = spec.enrolment {
        csi_scsi_certs::write_private_file(
            &etc.join("join-token"),
            std::fs::read_to_string(join_token)?.trim(),
        )?;
        std::fs::copy(ca, etc.join("ca.crt"))?;
    }
    // The node's files, appended to the shared image: the kernel unpacks
    // concatenated archives in order.
    let initrd = dir.join("initrd.cpio");
    std::fs::copy(&image.base, &initrd)?;
    sh(
        "sh",
        &[
            "-c",
            &format!(
                "cd '{}' && find . | cpio -o -H newc --quiet >> '{}'",
                dir.join("initrd").display(),
                initrd.display()
            ),
        ],
    )?;
    std::fs::remove_dir_all(dir.join("initrd"))?;
    if let Some(k) = &spec.kube {
        sh(
            "sh",
            &[
                "-c",
                &format!("cat '{}' >> '{}'", k.images.display(), initrd.display()),
            ],
        )?;
    }

    let ip = net.node_ip(spec.index);
    let fwd = |port: u16| format!("hostfwd=tcp:{ip}:{port}-{NET0}.15:{port}");
    // A Kubernetes node serves on its cluster address (the third NIC), so
    // nothing is forwarded from the node's namespace.
    let forwards = match &spec.kube {
        Some(_) => String::new(),
        None => format!(
            ",{},{},{}",
            fwd(spec.agent_port),
            fwd(spec.status_port),
            fwd(GUEST_PORT)
        ),
    };
    let cluster_nic = match &spec.kube {
        Some(k) => Some(add_cluster_nic(net, spec.index, k.address)?),
        None => None,
    };
    let (memory, second_log) = match &spec.kube {
        Some(_) => (KUBE_GUEST_MEMORY_MIB, "kubelet.log"),
        None => (GUEST_MEMORY_MIB, "agent.log"),
    };
    let monitor = dir.join("monitor.sock");
    let console = dir.join("console.log");
    let accel = if kvm_usable() {
        "kvm"
    } else {
        "tcg,tb-size=64"
    };
    let mut args: Vec<String> = [
        "netns",
        "exec",
        &net.netns(spec.index),
        "qemu-system-x86_64",
        "-name",
        spec.name,
        "-accel",
        accel,
        "-m",
        &memory.to_string(),
        "-smp",
        "1",
        "-display",
        "none",
        // A plain VM node ends with its guest (a panic or a poweroff is
        // seen at once); a Kubernetes node reboots on a reset, as a
        // machine does (the hard-reset step, lab/kube/vm_reset.rs).
        "-action",
        if spec.kube.is_some() {
            "reboot=reset"
        } else {
            "reboot=shutdown"
        },
        "-kernel",
        &image.kernel.display().to_string(),
        "-initrd",
        &initrd.display().to_string(),
        "-append",
        "console=ttyS0 panic=-1 quiet loglevel=4",
        "-serial",
        &format!("file:{}", console.display()),
        "-serial",
        &format!("file:{}", dir.join(second_log).display()),
        "-monitor",
        &format!("unix:{},server=on,wait=off", monitor.display()),
        "-netdev",
        &format!(
            "user,id=net0,net={NET0}.0/24,host={NET0}.2,dns={NET0}.3,dhcpstart={NET0}.15{forwards}"
        ),
        "-device",
        "virtio-net-pci,netdev=net0",
        "-netdev",
        &format!("user,id=net1,net={NET1}.0/24,host={NET1}.2,dns={NET1}.3,dhcpstart={NET1}.15"),
        "-device",
        "virtio-net-pci,netdev=net1",
        "-device",
        "virtio-rng-pci",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Some(tap) = &cluster_nic {
        args.extend([
            "-netdev".to_owned(),
            format!("tap,id=net2,ifname={tap},script=no,downscript=no"),
            "-device".to_owned(),
            "virtio-net-pci,netdev=net2".to_owned(),
            // containerd's log on a third serial port.
            "-serial".to_owned(),
            format!("file:{}", dir.join("containerd.log").display()),
        ]);
    }
    let qemu = Daemon::spawn_program(Path::new("ip"), &args, &dir.join("qemu.log"));
    let helper: SocketAddr = match &spec.kube {
        Some(k) => SocketAddr::from((k.address, GUEST_PORT)),
        None => format!("{ip}:{GUEST_PORT}").parse()?,
    };
    let csi = dir.join("kubelet/plugins/csi-scsi.io/csi.sock");
    let relay = Daemon::spawn_program(
        &binary("csi-scsi-lab-guest"),
        &[
            "relay".into(),
            "--listen".into(),
            csi.display().to_string(),
            "--to".into(),
            helper.to_string(),
        ],
        &dir.join("relay.log"),
    );
    Ok(Vm {
        qemu,
        relay,
        csi,
        guest: guest::Guest { addr: helper },
        monitor,
        console,
    })
}

impl Vm {
    /// Waits until the guest's helper answers and its agent serves CSI.
    pub async fn wait_ready(&mut self, within: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Ok((0, _)) = self
                .guest
                .exec(&[
                    "test",
                    "-S",
                    "/var/lib/kubelet/plugins/csi-scsi.io/csi.sock",
                ])
                .await
            {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline || self.qemu.try_exit().is_some() {
                bail!(
                    "the VM node did not come up within {within:?}; its console ({}):\n{}",
                    self.console.display(),
                    crate::tail::tail_file(&self.console, 40)
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Cuts (`up` false) or restores the guest's NIC `nic` (0 or 1), as a
    /// pulled cable would: qemu's `set_link`.
    pub async fn set_link(&self, nic: usize, up: bool) -> anyhow::Result<()> {
        self.monitor_command(&format!(
            "set_link net{nic} {}",
            if up { "on" } else { "off" }
        ))
        .await
    }

    /// Resets the guest as a power loss would: qemu's `system_reset`, no
    /// shutdown, no sync; its memory (and its root, a tmpfs) is gone and
    /// it boots again from the same kernel and initramfs.
    pub async fn system_reset(&self) -> anyhow::Result<()> {
        self.monitor_command("system_reset").await
    }

    /// Sends one command to qemu's monitor.
    async fn monitor_command(&self, command: &str) -> anyhow::Result<()> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut m = tokio::net::UnixStream::connect(&self.monitor).await?;
        m.write_all(format!("{command}\n").as_bytes()).await?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut buf = vec![0u8; 4096];
        let _ = tokio::time::timeout(Duration::from_millis(200), m.read(&mut buf)).await;
        Ok(())
    }
}

/// The guest's third NIC, the cluster network: a tap in node `i`'s
/// namespace, routed to `address`. The namespace answers ARP for the
/// address on the lab's bridge (proxy ARP) and forwards to the tap, so the
/// guest is reachable at it from the host and every other node as if it
/// sat on the bridge itself. Returns the tap's name.
fn add_cluster_nic(net: &Network, i: usize, address: Ipv4Addr) -> anyhow::Result<String> {
    let ns = net.netns(i);
    let tap = format!("{}g{i}", net.prefix);
    let veth = format!("{}c{i}", net.prefix);
    sh(
        "ip",
        &["-n", &ns, "tuntap", "add", "mode", "tap", "name", &tap],
    )?;
    sh("ip", &["-n", &ns, "link", "set", &tap, "up"])?;
    sh(
        "ip",
        &[
            "-n",
            &ns,
            "route",
            "add",
            &format!("{address}/32"),
            "dev",
            &tap,
        ],
    )?;
    for setting in [
        "net.ipv4.ip_forward=1".to_owned(),
        format!("net.ipv4.conf.{veth}.proxy_arp=1"),
        format!("net.ipv4.conf.{tap}.proxy_arp=1"),
    ] {
        sh("ip", &["netns", "exec", &ns, "sysctl", "-qw", &setting])?;
    }
    Ok(tap)
}

/// Whether `/dev/kvm` is a KVM that boots a stock kernel. The PVM
/// software KVM of these machines is not (docs/lab.md), so it is used
/// only when `CSI_SCSI_VM_KVM=1` says so.
fn kvm_usable() -> bool {
    std::env::var("CSI_SCSI_VM_KVM").as_deref() == Ok("1") && Path::new("/dev/kvm").exists()
}
