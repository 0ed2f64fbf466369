//! Row 6, Kubernetes mode: N PVCs and N Pods created at once in the
//! Kubernetes lab (real API server, scheduler, kubelets, sidecars), timed
//! from creation to every Pod Running with its volume mounted, against the
//! floor of the embedded lab publishing the same N volumes directly over
//! CSI (CreateVolume, ControllerPublish, NodeStage, NodePublish, all N at
//! once). With it: the proxy's peak memory and its API requests per
//! volume, counted in the API server's audit log.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use csi_scsi_proxy::device::Phase;
use csi_scsi_proxy::resources::SCSIDevice;
use k8s_openapi::api::core::v1::Pod;

use super::Options;
use super::proc::rss_mib;
use super::table::{Row, Unit};
use crate::lab::kube::KubeLab;
use crate::lab::kube::api::{Typed, pod_phase};
use crate::lab::kube::audit::AuditEvent;
use crate::lab::kube::install::Via;
use crate::lab::scenario::{Clients, attach_and_mount_fs, capability, capacity, prefer};
use crate::lab::{Lab, LabConfig, node_name};

const SECTION: u8 = 6;
const NAME: &str = "Kubernetes: N PVCs + Pods to Running";

/// Runs the row on a runtime of its own (the labs' progress callbacks are
/// not `Send`, so it cannot be a spawned task); a failure becomes an error row.
pub fn run(opts: Options, dir: PathBuf) -> Vec<Row> {
    let n = opts.pick(50, 3);
    super::on_own_runtime(SECTION, NAME, "needs root (the labs)", measure(n, &dir))
}

async fn measure(n: usize, dir: &Path) -> anyhow::Result<Vec<Row>> {
    let floor = embedded_floor(n, &dir.join("embedded")).await?;
    let kube = kube_batch(n, &dir.join("kube")).await?;
    Ok(vec![
        Row::new(
            SECTION,
            format!("{n} PVCs + Pods Running (kube) vs {n} volumes published over CSI (embedded)"),
            Unit::Millis,
            kube.elapsed.as_secs_f64() * 1000.0,
        )
        .baseline(floor.as_secs_f64() * 1000.0)
        .note("3 nodes; ext4 on 64 MiB pool LUNs; the Pods use the host network (no CNI address limit); everything created in one apply"),
        Row::new(
            SECTION,
            format!("proxy peak memory (VmHWM) after {n} volumes (kube backend)"),
            Unit::Mebibytes,
            kube.proxy_hwm_mib,
        ),
        Row::new(
            SECTION,
            "proxy API requests per volume (audit log)".to_owned(),
            Unit::Requests,
            kube.proxy_requests as f64 / n as f64,
        )
        .note(format!(
            "{} requests by csi-scsi-proxy during the batch; sidecars: {} ({:.1} per volume)",
            kube.proxy_requests,
            kube.sidecar_requests,
            kube.sidecar_requests as f64 / n as f64
        )),
    ])
}

/// The floor: the same volumes published directly, all at once.
async fn embedded_floor(n: usize, dir: &Path) -> anyhow::Result<Duration> {
    let mut config = LabConfig::for_test(dir);
    config.pool_luns = n;
    let lab = Lab::up(config, &mut |_| {}).await?;
    let mut clients = Clients::connect(&lab).await?;
    // Every pool LUN discovered (seen by all three nodes) before the clock starts.
    let deadline = Instant::now() + Duration::from_secs(120);
    while capacity(&mut clients.controller, Some(&node_name(2)), "tier=pool").await?
        < (n as i64) * (crate::lab::POOL_LUN_BYTES as i64)
    {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the pool was not discovered in 120 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let started = Instant::now();
    let publishes = (0..n).map(|i| {
        let mut cl = Clients {
            controller: clients.controller.clone(),
            nodes: clients.nodes.clone(),
        };
        let lab = &lab;
        async move {
            let node = node_name(i % 3);
            let vol = cl
                .controller
                .create_volume(csi_scsi_proto::csi::CreateVolumeRequest {
                    name: format!("bench-{i}"),
                    capacity_range: Some(csi_scsi_proto::csi::CapacityRange {
                        required_bytes: 32 << 20,
                        limit_bytes: 0,
                    }),
                    volume_capabilities: vec![capability(
                        false,
                        "ext4",
                        csi_scsi_proto::csi::volume_capability::access_mode::Mode::SingleNodeWriter,
                    )],
                    parameters: [("deviceSelector".to_owned(), "tier=pool".to_owned())].into(),
                    accessibility_requirements: Some(prefer(&node)),
                    ..Default::default()
                })
                .await
                .context("CreateVolume")?
                .into_inner()
                .volume
                .context("no volume")?;
            attach_and_mount_fs(
                lab,
                &mut cl,
                &vol,
                &node,
                false,
                "ext4",
                &format!("pod-{i}"),
                false,
            )
            .await
        }
    });
    for r in futures::future::join_all(publishes).await {
        r?;
    }
    Ok(started.elapsed())
}

struct KubeFigures {
    elapsed: Duration,
    proxy_hwm_mib: f64,
    proxy_requests: usize,
    sidecar_requests: usize,
}

async fn kube_batch(n: usize, dir: &Path) -> anyhow::Result<KubeFigures> {
    let mut config = LabConfig::for_test(dir);
    config.pool_luns = n;
    let lab = KubeLab::up(config, Via::Kustomize, None, &mut |_| {}).await?;
    let k = lab.kubectl.clone();
    k.run(&["create", "namespace", "bench"])?;
    k.apply(
        r#"{"apiVersion":"storage.k8s.io/v1","kind":"StorageClass","metadata":{"name":"bench"},
            "provisioner":"csi-scsi.io","volumeBindingMode":"WaitForFirstConsumer","reclaimPolicy":"Delete",
            "parameters":{"deviceSelector":"tier=pool","cleanup":"none","csi.storage.k8s.io/fstype":"ext4"}}"#,
    )?;
    // The targets, as in the lab's scenario; wait until the pool is in the inventory.
    crate::lab::kube::targets::create_targets(&lab, crate::lab::kube::targets::Pool::Now)?;
    k.wait_for("the pool LUNs discovered", Duration::from_secs(120), |k| {
        let devices = k.objects::<SCSIDevice>(&[])?;
        let pool = devices
            .iter()
            .filter(|d| {
                d.spec.labels.get("tier").map(String::as_str) == Some("pool")
                    && d.status.as_ref().map(|s| s.phase) == Some(Phase::Available)
            })
            .count();
        Ok((pool >= n).then_some(()))
    })
    .await?;
    let mut items = Vec::new();
    for i in 0..n {
        items.push(serde_json::json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": format!("v{i}"), "namespace": "bench"},
            "spec": {"storageClassName": "bench", "accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "32Mi"}}}
        }));
        items.push(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("p{i}"), "namespace": "bench"},
            "spec": {
                "hostNetwork": true,
                "nodeSelector": {"kubernetes.io/hostname": node_name(i % 3)},
                "terminationGracePeriodSeconds": 1,
                "automountServiceAccountToken": false,
                "containers": [{"name": "c", "image": crate::lab::kube::images::BUSYBOX,
                                "imagePullPolicy": "Never", "command": ["sleep", "100000"],
                                "volumeMounts": [{"name": "v", "mountPath": "/data"}]}],
                "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": format!("v{i}")}}]
            }
        }));
    }
    let audit = lab.plane.audit_log();
    let audit_start = std::fs::metadata(&audit).map(|m| m.len()).unwrap_or(0);
    let started = Instant::now();
    k.apply(&serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string())?;
    k.wait_for("every Pod Running", Duration::from_secs(600), |k| {
        let pods = k.objects::<Pod>(&["-n", "bench"])?;
        let running = pods.iter().filter(|p| pod_phase(p) == "Running").count();
        Ok((running == n).then_some(()))
    })
    .await?;
    let elapsed = started.elapsed();
    let proxy_hwm_mib = proxy_hwm_mib(&lab)?;
    let (proxy_requests, sidecar_requests) = count_requests(&audit, audit_start)?;
    Ok(KubeFigures {
        elapsed,
        proxy_hwm_mib,
        proxy_requests,
        sidecar_requests,
    })
}

/// Requests completed since byte `from` of the audit log by the
/// controller Pod's two ServiceAccounts: (the proxy's, the sidecars').
fn count_requests(audit: &Path, from: u64) -> anyhow::Result<(usize, usize)> {
    let text = std::fs::read(audit).with_context(|| format!("reading {}", audit.display()))?;
    let text = String::from_utf8_lossy(&text[from as usize..]);
    let (mut proxy, mut sidecars) = (0, 0);
    for line in text.lines() {
        let Some(event) = AuditEvent::parse(line) else {
            continue;
        };
        if event.stage != "ResponseComplete" {
            continue;
        }
        match event.user.username.as_str() {
            "system:serviceaccount:csi-scsi:csi-scsi-proxy" => proxy += 1,
            "system:serviceaccount:csi-scsi:csi-scsi-sidecars" => sidecars += 1,
            _ => {}
        }
    }
    Ok((proxy, sidecars))
}

/// The highest VmHWM of the proxy containers (the leader did the work).
fn proxy_hwm_mib(lab: &KubeLab) -> anyhow::Result<f64> {
    use crate::lab::kube::pods;
    let mut most = 0.0f64;
    for p in pods::list(&lab.kubectl, &lab.namespace, pods::CONTROLLER_SELECTOR)? {
        let node = crate::lab::kube::api::scheduled_on(&p).context("nodeName")?;
        let id = pods::container_id(&p, "csi-scsi-proxy")?;
        let (_, hwm) = rss_mib(lab.container_pid(node, &id)?)?;
        most = most.max(hwm);
    }
    Ok(most)
}
