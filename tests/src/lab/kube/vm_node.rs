//! The guests of `lab up --kubernetes --vm` as Kubernetes nodes: each qemu
//! guest of the VM lab ([`crate::vm`], Debian's kernel with the real
//! initiator, udev and dm-multipath) also runs containerd, runc, the CNI
//! plugins and the kubelet the lab built, registers its Node, and imports
//! the agent's image, so the driver's DaemonSet Pod runs on the guest's
//! real `/dev`, `/sys`, iscsid and multipathd. The files each guest needs
//! are made here and handed to it in its initramfs.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;

use super::api::Typed;
use super::node_config;
use crate::kube::{ControlPlane, GoTools};
use crate::lab::net::sh;
use crate::lab::{AGENT_PORT, AGENT_STATUS_PORT, Lab, LabNode, node_name};
use crate::vm;

/// Where a guest keeps its Kubernetes files (the init script reads them).
const GUEST_KUBE_DIR: &str = "/etc/csi-scsi/kube";
/// Where a guest finds the images it imports (relative to its root).
pub(super) const GUEST_IMAGES_DIR: &str = "var/lib/csi-scsi-images";

/// What booting the guests measured.
#[derive(Debug, Default)]
pub struct GuestFigures {
    /// Per node: seconds from the first boot to its Node Ready, and the
    /// qemu process's resident memory then (MiB).
    pub nodes: Vec<(String, f64, u64)>,
}

/// Boots every lab node as a guest that is a Kubernetes node, with the
/// Pod subnets `pod_subnets` (one per node, in order), and adds them to
/// `lab.nodes`. Returns once each guest's kubelet is up (the caller waits
/// for the Nodes to be Ready).
pub fn boot_guests(
    lab: &mut Lab,
    plane: &ControlPlane,
    tools: &GoTools,
    images: &[PathBuf],
    pod_subnets: &[String],
) -> anyhow::Result<()> {
    let dir = lab.config.dir.clone();
    let image = vm::Image::build(&dir.join("vm"), Some(tools.path("kubelet")))?;
    let images_cpio = dir.join("vm/images.cpio");
    write_images_cpio(images, &images_cpio, &dir.join("vm/images"))?;
    let second = lab.net.second_host_ip();
    for (i, pod_subnet) in pod_subnets.iter().enumerate().take(lab.config.nodes) {
        let name = node_name(i);
        let base = dir.join("nodes").join(&name);
        let address: Ipv4Addr = lab.net.guest_ip(i).parse()?;
        let files = base.join("kube-files");
        write_guest_files(&files, plane, &name, address, pod_subnet)?;
        let guest = vm::boot(
            &image,
            &lab.net,
            &vm::NodeSpec {
                name: &name,
                index: i,
                dir: &base,
                portal2: &second,
                enrolment: None,
                agent_port: AGENT_PORT,
                status_port: AGENT_STATUS_PORT,
                kube: Some(vm::KubeGuest {
                    address,
                    files: &files,
                    images: &images_cpio,
                }),
            },
        )?;
        // The private keys went into the guest's initramfs; the copies
        // here are not needed any more.
        std::fs::remove_dir_all(&files)?;
        lab.record_pids(&[guest.qemu.pid(), guest.relay.pid()])?;
        lab.nodes
            .push(LabNode::guest(&name, &lab.net.node_ip(i), address, guest)?);
    }
    Ok(())
}

/// Waits until every guest's kubelet has made its Node Ready; returns the
/// time each took from `booted` and its qemu's resident memory.
pub async fn wait_ready(
    lab: &Lab,
    kubectl: &crate::kube::Kubectl,
    booted: Instant,
    within: Duration,
) -> anyhow::Result<GuestFigures> {
    let mut figures = GuestFigures::default();
    for n in &lab.nodes {
        let guest = n.vm.as_ref().context("a VM node")?;
        kubectl
            .wait_for(&format!("Node {} Ready", n.name), within, |k| {
                let node = k.object::<k8s_openapi::api::core::v1::Node>(&n.name, None)?;
                Ok(super::api::node_ready(&node).then_some(()))
            })
            .await
            .with_context(|| {
                format!(
                    "{}'s console:\n{}\nits kubelet:\n{}",
                    n.name,
                    crate::tail::tail_file(&guest.console, 30),
                    crate::tail::tail_file(&guest.console.with_file_name("kubelet.log"), 30)
                )
            })?;
        figures.nodes.push((
            n.name.clone(),
            booted.elapsed().as_secs_f64(),
            crate::lab::rss_mib(guest.qemu.pid()),
        ));
    }
    Ok(figures)
}

/// Writes a guest node's Kubernetes files into `files`: the cluster CA,
/// its client certificate (`system:node:<name>` in `system:nodes`, so the
/// Node authorizer and NodeRestriction apply as on any cluster) and
/// serving certificate, a kubeconfig naming them where the guest keeps
/// them, its KubeletConfiguration, containerd's configuration and the
/// CNI network of its Pods.
fn write_guest_files(
    files: &Path,
    plane: &ControlPlane,
    name: &str,
    address: Ipv4Addr,
    pod_subnet: &str,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(files)?;
    let guest = |file: &str| Path::new(GUEST_KUBE_DIR).join(file);
    let copy = |from: &Path, to: &str| {
        std::fs::copy(from, files.join(to)).with_context(|| format!("copying {}", from.display()))
    };
    copy(&plane.pki.ca(), "ca.crt")?;
    let client = plane.pki.client(
        &format!("kubelet-{name}"),
        &format!("system:node:{name}"),
        &["system:nodes"],
    )?;
    copy(&client.cert, "kubelet.crt")?;
    copy(&client.key, "kubelet.key")?;
    let serving = plane.pki.serving(
        &format!("kubelet-serving-{name}"),
        &[name],
        &[IpAddr::V4(address)],
    )?;
    copy(&serving.cert, "serving.crt")?;
    copy(&serving.key, "serving.key")?;
    plane.pki.kubeconfig_elsewhere(
        &files.join("kubeconfig"),
        &plane.server,
        &guest("ca.crt"),
        (&guest("kubelet.crt"), &guest("kubelet.key")),
    )?;
    std::fs::write(
        files.join("kubelet.yaml"),
        node_config::kubelet(&node_config::KubeletSettings {
            address: IpAddr::V4(address),
            client_ca: &guest("ca.crt"),
            serving: (&guest("serving.crt"), &guest("serving.key")),
            runtime_socket: Path::new("/run/containerd/containerd.sock"),
            shared_host_cgroup_root: None,
        }),
    )?;
    std::fs::write(
        files.join("containerd.toml"),
        node_config::containerd(&node_config::ContainerdPaths {
            root: "/var/lib/containerd".into(),
            state: "/run/containerd".into(),
            socket: "/run/containerd/containerd.sock".into(),
            opt: "/var/lib/containerd-opt".into(),
            runc_root: "/run/runc".into(),
            cni_conf: "/etc/cni/net.d".into(),
            restrict_oom_score_adj: false,
        }),
    )?;
    std::fs::write(
        files.join("10-lab.conflist"),
        serde_json::to_vec_pretty(&node_config::cni_network(
            pod_subnet,
            Path::new("/var/lib/cni/ipam"),
        ))?,
    )?;
    Ok(())
}

/// A cpio (newc) holding `archives` under the guest's images directory,
/// staged in `stage`.
fn write_images_cpio(archives: &[PathBuf], out: &Path, stage: &Path) -> anyhow::Result<()> {
    let _ = std::fs::remove_dir_all(stage);
    let to = stage.join(GUEST_IMAGES_DIR);
    std::fs::create_dir_all(&to)?;
    for (n, archive) in archives.iter().enumerate() {
        // A hard link where it can be: the archives are large.
        let dest = to.join(format!("{n}.tar"));
        if std::fs::hard_link(archive, &dest).is_err() {
            std::fs::copy(archive, &dest)?;
        }
    }
    sh(
        "sh",
        &[
            "-c",
            &format!(
                "cd '{}' && find . | cpio -o -H newc --quiet > '{}'",
                stage.display(),
                out.display()
            ),
        ],
    )?;
    std::fs::remove_dir_all(stage)?;
    Ok(())
}
