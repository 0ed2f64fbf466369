//! The steps of `lab up --kubernetes --vm`: the volume life cycle driven
//! only through the Kubernetes API, on nodes whose kubelet, agent Pod and
//! volumes sit on Debian's real kernel (initiator, udev, dm-multipath).
//! Each filesystem volume's staging mount is checked in the guest to be a
//! dm-multipath map over both portals' paths.

use anyhow::{Context, bail};
use csi_scsi_proxy::resources::{SCSIDevice, SCSITarget};

use super::KubeLab;
use super::api::Typed;
use super::scenario::{
    NS, WAIT, bound_pv, delete_workloads, exec, pod, pv_wwid, pvc, storage_class,
    wait_all_released, wait_running,
};
use crate::lab::node_name;
use crate::lab::scenario::Report;

/// Runs the steps; the first failure ends the run.
pub async fn run(lab: &mut KubeLab) -> anyhow::Result<Report> {
    let mut r = Report::default();
    let k = lab.kubectl.clone();
    let node_b = node_name(1);

    r.step(
        "targets: array-a's CHAP Secret and the SCSITargets (two portals each), created through the API; every guest's agent discovers through its real initiator",
        async {
            super::targets::create_targets(lab)?;
            let devices = k
                .wait_for("SCSIDevices discovered", WAIT, |k| {
                    let n = k.objects::<SCSIDevice>(&[])?.len();
                    Ok((n >= 4).then_some(n))
                })
                .await?;
            let nodes = k
                .wait_for("SCSITarget array-a seen by every guest", WAIT, |k| {
                    let status = k.object::<SCSITarget>("array-a", None)?.status.unwrap_or_default();
                    let nodes = status.nodes.len();
                    Ok((nodes == lab.lab.nodes.len()).then_some(nodes))
                })
                .await?;
            Ok(((), format!("{devices} SCSIDevices; array-a seen by {nodes} nodes")))
        },
    )
    .await?;

    r.step(
        "classes: ext4 and xfs on array-a (CHAP), raw block on array-b (its ACL refuses node-c)",
        async {
            k.run(&["create", "namespace", NS])?;
            k.apply_object(&storage_class("vm-ext4", "array=a", "ext4", "zero"))?;
            k.apply_object(&storage_class("vm-xfs", "array=a", "xfs", "zero"))?;
            k.apply_object(&storage_class("vm-block", "array=b", "ext4", "discard"))?;
            Ok(((), String::new()))
        },
    )
    .await?;

    r.step(
        "ext4: a PVC and a Pod on node-a that writes a marker (fsynced); staged on a dm-multipath map over both portals",
        marker_pod(lab, ("data", "vm-ext4", "400Mi"), ("writer", 0), "vm-marker-1"),
    )
    .await?;

    r.step(
        "xfs: a PVC and a Pod on node-c that writes a marker; its own map",
        marker_pod(
            lab,
            ("logs", "vm-xfs", "600Mi"),
            ("logger", 2),
            "vm-marker-2",
        ),
    )
    .await?;

    r.step(
        "raw block: a Block PVC on array-b and a Pod on node-b that writes and reads the device",
        async {
            k.apply_object(&pvc("raw", "vm-block", "Block", "600Mi"))?;
            k.apply_object(&pod(
                "raw",
                &node_b,
                "raw",
                true,
                "echo vm-block-marker | dd of=/dev/xvda bs=512 conv=fsync 2>/dev/null && sleep 100000",
            ))?;
            wait_running(&k, "raw").await?;
            let got = exec(
                &k,
                "raw",
                &["sh", "-c", "dd if=/dev/xvda bs=512 count=1 2>/dev/null | head -1"],
            )?;
            anyhow::ensure!(got.trim() == "vm-block-marker", "block marker read back as {got:?}");
            Ok(((), String::new()))
        },
    )
    .await?;

    r.step(
        "move: the ext4 Pod is deleted and recreated on node-b, which reads node-a's marker; node-a's map is gone",
        async {
            delete_workloads(&k, &["writer"], &[])?;
            k.apply_object(&pod("reader", &node_b, "data", false, "sleep 100000"))?;
            wait_running(&k, "reader").await?;
            let got = exec(&k, "reader", &["cat", "/data/marker"])?;
            anyhow::ensure!(got.trim() == "vm-marker-1", "marker on {node_b} read as {got:?}");
            let pv = bound_pv(&k, "data")?;
            let wwid = pv_wwid(&k, &pv)?;
            let map = staged_map(lab, 1, &wwid).await?;
            let left = maps_of(lab, 0, &wwid).await?;
            anyhow::ensure!(left.is_empty(), "node-a still holds {left:?} for {wwid}");
            Ok(((), format!("on {node_b}: {map}")))
        },
    )
    .await?;

    r.step(
        "delete: Pods and PVCs deleted; PVs go, the LUNs are wiped and offered again",
        async {
            delete_workloads(&k, &["reader", "logger", "raw"], &["data", "logs", "raw"])?;
            let available = wait_all_released(&k).await?;
            Ok(((), format!("{available} devices Available")))
        },
    )
    .await?;
    Ok(r)
}

/// A filesystem PVC `(claim, class, size)` and a Pod `(name, node index)`
/// writing `marker` (fsynced) to it; the marker is read back, and the
/// volume's staging mount in that guest stands on its dm-multipath map.
async fn marker_pod(
    lab: &KubeLab,
    (claim, class, size): (&str, &str, &str),
    (name, node): (&str, usize),
    marker: &str,
) -> anyhow::Result<((), String)> {
    let k = &lab.kubectl;
    let node_name = node_name(node);
    k.apply_object(&pvc(claim, class, "Filesystem", size))?;
    k.apply_object(&pod(
        name,
        &node_name,
        claim,
        false,
        &format!("echo {marker} > /data/marker && sync && sleep 100000"),
    ))?;
    wait_running(k, name).await?;
    let got = exec(k, name, &["cat", "/data/marker"])?;
    anyhow::ensure!(got.trim() == marker, "marker read back as {got:?}");
    let pv = bound_pv(k, claim).context("bound PV")?;
    let map = staged_map(lab, node, &pv_wwid(k, &pv)?).await?;
    Ok(((), format!("{pv} on {node_name}: {map}")))
}

/// The dm-multipath map of `wwid` on guest `i` that kubelet's staging
/// mount stands on, with its paths; fails unless there is exactly one
/// such map, it has at least two paths (one per portal), and a staging
/// mount's source is it.
async fn staged_map(lab: &KubeLab, i: usize, wwid: &str) -> anyhow::Result<String> {
    let maps = maps_of(lab, i, wwid).await?;
    let [(dm, paths)] = maps.as_slice() else {
        bail!(
            "{} holds {} maps for {wwid}: {maps:?}",
            node_name(i),
            maps.len()
        );
    };
    if *paths < 2 {
        bail!("{dm} for {wwid} has {paths} path(s), not one per portal");
    }
    let guest = &lab.lab.nodes[i].vm.as_ref().context("a VM node")?.guest;
    // The devices kubelet's CSI mounts stand on, links resolved.
    let sources = guest
        .run(&[
            "sh",
            "-c",
            "awk '$2 ~ /kubernetes.io\\/csi\\// {print $1}' /proc/mounts | while read -r s; do readlink -f \"$s\"; done",
        ])
        .await?;
    anyhow::ensure!(
        sources.lines().any(|s| s == format!("/dev/{dm}")),
        "no staging mount of /dev/{dm} on {} (mounted: {sources:?})",
        node_name(i)
    );
    Ok(format!("/dev/{dm} over {paths} paths"))
}

/// The dm-multipath maps on guest `i` whose uuid names `wwid`
/// (`mpath-3<naa>`), each with its number of paths, read from sysfs.
async fn maps_of(lab: &KubeLab, i: usize, wwid: &str) -> anyhow::Result<Vec<(String, usize)>> {
    let hex = wwid.trim_start_matches("naa.").to_ascii_lowercase();
    let guest = &lab.lab.nodes[i].vm.as_ref().context("a VM node")?.guest;
    let script = format!(
        "for d in /sys/block/dm-*; do [ -e \"$d/dm/uuid\" ] || continue; \
         case \"$(cat $d/dm/uuid)\" in mpath-*{hex}*) echo \"${{d##*/}} $(ls $d/slaves | wc -l)\";; esac; done"
    );
    let out = guest.run(&["sh", "-c", &script]).await?;
    out.lines()
        .map(|l| {
            let (dm, n) = l.split_once(' ').context("dm line")?;
            Ok((dm.to_owned(), n.trim().parse()?))
        })
        .collect()
}
