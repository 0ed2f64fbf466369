//! The volume life cycle driven only through the Kubernetes API, as a user
//! would: StorageClasses, PVCs, busybox Pods that write a marker and read
//! it back (filesystem and raw block), an online resize seen with `df`
//! inside the Pod, a Pod moved to another node that reads the first one's
//! marker, and PVCs deleted with their cleanup modes. kubelet calls the
//! Node service; the sidecars call the Controller service; nothing here
//! calls CSI.

use std::time::Duration;

use anyhow::{Context, bail};

use super::images::BUSYBOX;
use super::{KubeLab, condition_true};
use crate::kube::Kubectl;
use crate::lab::scenario::{Report, lun_file};
use crate::lab::{CHAP_USER, node_name};

/// The namespace the workloads run in.
const NS: &str = "lab";
const WAIT: Duration = Duration::from_secs(120);

/// Runs the life cycle; every step's result is printed as it finishes.
pub async fn run(lab: &mut KubeLab) -> anyhow::Result<Report> {
    let mut r = Report::default();
    let k = lab.kubectl.clone();
    let driver_ns = lab.namespace.clone();
    let portal = format!("{}:3260", lab.lab.net.host_ip());

    r.step("targets: a CHAP Secret and three SCSITargets, created through the API", async {
        k.apply(&format!(
            r#"{{"apiVersion":"v1","kind":"Secret","metadata":{{"name":"chap-array-a","namespace":"{driver_ns}"}},
                "stringData":{{"username":"{CHAP_USER}","password":"{secret}"}}}}"#,
            secret = crate::lab::chap_secret_for_lab()
        ))?;
        for (name, iqn, chap, labels) in [
            ("array-a", "array-a", true, r#"{"array":"a","tier":"fast"}"#),
            ("array-b", "array-b", false, r#"{"array":"b","tier":"capacity"}"#),
            ("array-c", "array-c", false, r#"{"array":"c","tier":"pool"}"#),
        ] {
            let chap_ref = if chap {
                format!(r#","chapSecretRef":{{"name":"chap-array-a","namespace":"{driver_ns}"}}"#)
            } else {
                String::new()
            };
            k.apply(&format!(
                r#"{{"apiVersion":"csi-scsi.io/v1alpha1","kind":"SCSITarget","metadata":{{"name":"{name}"}},
                    "spec":{{"iscsi":{{"portals":["{portal}"],"iqn":"iqn.2026-11.io.csi-scsi.lab:{iqn}"{chap_ref}}},
                    "deviceLabels":{labels}}}}}"#
            ))?;
        }
        let devices = k
            .wait_for("SCSIDevices discovered", WAIT, |k| {
                let list = k.get_json(&["scsidevices"])?;
                let n = list["items"].as_array().map_or(0, Vec::len);
                Ok((n >= 6).then_some(n))
            })
            .await?;
        Ok(((), format!("{devices} SCSIDevices")))
    })
    .await?;

    r.step(
        "classes: StorageClasses (xfs on array-a with CHAP; raw block on the pool)",
        async {
            k.run(&["create", "namespace", NS])?;
            k.apply(&storage_class("lab-xfs", "array=a", "xfs", "zero"))?;
            k.apply(&storage_class("lab-pool", "tier=pool", "ext4", "discard"))?;
            Ok(((), String::new()))
        },
    )
    .await?;

    let node_a = node_name(0);
    let node_b = node_name(1);
    r.step(
        "provision + stage + publish: a PVC and a Pod on node-a that writes a marker",
        async {
            k.apply(&pvc("data", "lab-xfs", "Filesystem", "400Mi"))?;
            k.apply(&pod(
                "writer",
                &node_a,
                "data",
                false,
                "echo lab-marker-1 > /data/marker && sync && sleep 100000",
            ))?;
            wait_running(&k, "writer").await?;
            let got = exec(&k, "writer", &["cat", "/data/marker"])?;
            anyhow::ensure!(got.trim() == "lab-marker-1", "marker read back as {got:?}");
            let pv = k.get_json(&["pvc", "data", "-n", NS])?["spec"]["volumeName"]
                .as_str()
                .context("bound PV")?
                .to_owned();
            Ok(((), format!("{pv} mounted on {node_a}")))
        },
    )
    .await?;

    r.step(
        "raw block: a Block PVC on the pool, a Pod that writes and reads the device",
        async {
            k.apply(&pvc("raw", "lab-pool", "Block", "32Mi"))?;
            k.apply(&pod(
            "raw",
            &node_a,
            "raw",
            true,
            "echo lab-block-marker | dd of=/dev/xvda bs=512 conv=fsync 2>/dev/null && sleep 100000",
        ))?;
            wait_running(&k, "raw").await?;
            let got = exec(
                &k,
                "raw",
                &[
                    "sh",
                    "-c",
                    "dd if=/dev/xvda bs=512 count=1 2>/dev/null | head -1",
                ],
            )?;
            anyhow::ensure!(
                got.trim() == "lab-block-marker",
                "block marker read back as {got:?}"
            );
            Ok(((), String::new()))
        },
    )
    .await?;

    r.step("expand: the array grows the LUN by 256 MiB, the PVC asks for it; resizer and kubelet grow the filesystem online (df in the Pod)", async {
        let before = df_kib(&k, "writer")?;
        let pv = k.get_json(&["pvc", "data", "-n", NS])?["spec"]["volumeName"]
            .as_str()
            .context("bound PV")?
            .to_owned();
        let wwid = k.get_json(&["pv", &pv])?["spec"]["csi"]["volumeAttributes"]["wwid"]
            .as_str()
            .context("the PV's wwid attribute")?
            .to_owned();
        let (lun, _) = lun_file(&lab.lab, &wwid).with_context(|| format!("no lab LUN has {wwid}"))?;
        let (_, new) = lab.lab.grow_lun(&lun, 256 << 20).await?;
        let patch = format!(r#"{{"spec":{{"resources":{{"requests":{{"storage":"{}Mi"}}}}}}}}"#, new >> 20);
        k.run(&["patch", "pvc", "data", "-n", NS, "--type=merge", "-p", &patch])?;
        let after = k
            .wait_for("the filesystem to grow", WAIT, |k| {
                let now = df_kib(k, "writer")?;
                Ok((now > before).then_some(now))
            })
            .await?;
        let capacity = k
            .wait_for("the PVC's capacity", WAIT, |k| {
                let pvc = k.get_json(&["pvc", "data", "-n", NS])?;
                let cap = pvc["status"]["capacity"]["storage"].as_str().unwrap_or_default().to_owned();
                Ok((cap == format!("{}Mi", new >> 20)).then_some(cap))
            })
            .await?;
        Ok(((), format!("LUN {lun} -> {} MiB; df {before} KiB -> {after} KiB; PVC capacity {capacity}", new >> 20)))
    })
    .await?;

    r.step(
        "move: the Pod is deleted and recreated on node-b, which reads node-a's marker",
        async {
            k.run(&[
                "delete",
                "pod",
                "writer",
                "-n",
                NS,
                "--wait=true",
                "--timeout=120s",
            ])?;
            k.apply(&pod("reader", &node_b, "data", false, "sleep 100000"))?;
            wait_running(&k, "reader").await?;
            let got = exec(&k, "reader", &["cat", "/data/marker"])?;
            anyhow::ensure!(
                got.trim() == "lab-marker-1",
                "marker on {node_b} read as {got:?}"
            );
            Ok(((), String::new()))
        },
    )
    .await?;

    r.step(
        "delete: Pods and PVCs deleted; PVs go, the LUNs are wiped and offered again",
        async {
            k.run(&[
                "delete",
                "pod",
                "--all",
                "-n",
                NS,
                "--wait=true",
                "--timeout=120s",
            ])?;
            k.run(&[
                "delete",
                "pvc",
                "--all",
                "-n",
                NS,
                "--wait=true",
                "--timeout=120s",
            ])?;
            k.wait_for("every PV gone", WAIT, |k| {
                let pvs = k.get_json(&["pv"])?;
                Ok(pvs["items"]
                    .as_array()
                    .is_some_and(Vec::is_empty)
                    .then_some(()))
            })
            .await?;
            let available = k
                .wait_for("every SCSIDevice Available", WAIT, |k| {
                    let list = k.get_json(&["scsidevices"])?;
                    let items = list["items"].as_array().context("items")?;
                    let all = items.iter().all(|d| d["status"]["phase"] == "Available");
                    Ok(all.then_some(items.len()))
                })
                .await?;
            Ok(((), format!("{available} devices Available")))
        },
    )
    .await?;
    Ok(r)
}

fn storage_class(name: &str, selector: &str, fs: &str, cleanup: &str) -> String {
    format!(
        r#"{{"apiVersion":"storage.k8s.io/v1","kind":"StorageClass","metadata":{{"name":"{name}"}},
            "provisioner":"csi-scsi.io","volumeBindingMode":"WaitForFirstConsumer","allowVolumeExpansion":true,
            "reclaimPolicy":"Delete",
            "parameters":{{"deviceSelector":"{selector}","cleanup":"{cleanup}","csi.storage.k8s.io/fstype":"{fs}"}}}}"#
    )
}

fn pvc(name: &str, class: &str, mode: &str, size: &str) -> String {
    format!(
        r#"{{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{{"name":"{name}","namespace":"{NS}"}},
            "spec":{{"storageClassName":"{class}","volumeMode":"{mode}","accessModes":["ReadWriteOnce"],
            "resources":{{"requests":{{"storage":"{size}"}}}}}}}}"#
    )
}

fn pod(name: &str, node: &str, claim: &str, block: bool, script: &str) -> String {
    let attach = if block {
        r#""volumeDevices":[{"name":"v","devicePath":"/dev/xvda"}]"#.to_owned()
    } else {
        r#""volumeMounts":[{"name":"v","mountPath":"/data"}]"#.to_owned()
    };
    let script = serde_json::to_string(script).unwrap_or_default();
    format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","namespace":"{NS}"}},
            "spec":{{"nodeSelector":{{"kubernetes.io/hostname":"{node}"}},"terminationGracePeriodSeconds":1,
            "automountServiceAccountToken":false,
            "containers":[{{"name":"c","image":"{BUSYBOX}","imagePullPolicy":"Never","command":["sh","-c",{script}],{attach}}}],
            "volumes":[{{"name":"v","persistentVolumeClaim":{{"claimName":"{claim}"}}}}]}}}}"#
    )
}

async fn wait_running(k: &Kubectl, pod: &str) -> anyhow::Result<()> {
    let waited = k
        .wait_for(&format!("Pod {pod} Running"), WAIT, |k| {
            let p = k.get_json(&["pod", pod, "-n", NS])?;
            if p["status"]["phase"] == "Failed" {
                bail!("Pod {pod} failed: {}", p["status"]);
            }
            Ok((p["status"]["phase"] == "Running" && condition_true(&p, "Ready")).then_some(()))
        })
        .await;
    if waited.is_err() {
        let events = k
            .run(&["get", "events", "-n", NS, "--sort-by=.lastTimestamp"])
            .unwrap_or_default();
        return waited.with_context(|| format!("events in {NS}:\n{events}"));
    }
    Ok(())
}

fn exec(k: &Kubectl, pod: &str, cmd: &[&str]) -> anyhow::Result<String> {
    let mut args = vec!["exec", pod, "-n", NS, "--"];
    args.extend_from_slice(cmd);
    k.run(&args)
}

fn df_kib(k: &Kubectl, pod: &str) -> anyhow::Result<u64> {
    let out = exec(k, pod, &["df", "-kP", "/data"])?;
    out.lines()
        .nth(1)
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("df output {out:?}"))
}
