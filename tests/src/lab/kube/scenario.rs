//! The volume life cycle driven only through the Kubernetes API, as a user
//! would: StorageClasses, PVCs, busybox Pods that write a marker and read
//! it back (filesystem and raw block), an online resize seen with `df`
//! inside the Pod, a Pod moved to another node that reads the first one's
//! marker, and PVCs deleted with their cleanup modes. kubelet calls the
//! Node service; the sidecars call the Controller service; nothing here
//! calls CSI.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, bail};
use csi_scsi_proxy::device::Phase;
use csi_scsi_proxy::resources::{PendingResizeRequest, SCSIDevice, SCSITarget};
use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, StatefulSet, StatefulSetSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Event, Node, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, Pod, PodSpec, PodTemplateSpec,
    Volume, VolumeDevice, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::jiff::Timestamp;

use super::KubeLab;
use super::api::{
    Typed, deleting, message, name_of, node_ready, pod_phase, pod_ready, reason, reporter,
    scheduled_on, uid_of,
};
use super::images::BUSYBOX;
use super::install::Via;
use crate::kube::Kubectl;
use crate::lab::node_name;
use crate::lab::scenario::{Report, lun_file};

/// The namespace the workloads run in.
pub(super) const NS: &str = "lab";
/// How long a step waits for the cluster. A success is never this slow on
/// host-side nodes; on VM nodes under TCG a stage (login, udev, multipath,
/// mkfs) takes a minute or two.
pub(super) const WAIT: Duration = Duration::from_secs(240);

/// Runs the life cycle; every step's result is printed as it finishes.
pub async fn run(lab: &mut KubeLab) -> anyhow::Result<Report> {
    let mut r = Report::default();
    let k = lab.kubectl.clone();
    // Under `--via helm` the chart renders the overlay's very objects
    // (.ci/deploy-check's parity), so the steps that try kubelet, node
    // loss and the proxy's leadership, not the install, run under
    // kustomize only; helm gets the install, the life cycle, enrolment,
    // upgrade, rollback, reinstall, the RBAC and identity checks and the
    // CA rotation (CI runs both: the helm run is kept short).
    let every_step = lab.installer.via == Via::Kustomize;
    if !every_step {
        println!(
            "  (--via helm: node labels, unbindable claims, capacity, wrong CHAP, kubelet restart, node NotReady and deleted, two replicas, agent crash, drain, stale leader, cleanup modes and out of service run under kustomize only: the chart renders the overlay's objects)"
        );
    }

    r.step("targets: a CHAP Secret and three SCSITargets, created through the API", async {
        super::targets::create_targets(lab, super::targets::Pool::Now)?;
        let devices = k
            .wait_for("SCSIDevices discovered", WAIT, |k| {
                let n = k.objects::<SCSIDevice>(&[])?.len();
                Ok((n >= 6).then_some(n))
            })
            .await?;
        // The proxy's best-effort status write (RBAC: scsitargets/status).
        let (phase, answered) = k
            .wait_for("SCSITarget array-a status (phase, nodes)", WAIT, |k| {
                let status = k.object::<SCSITarget>("array-a", None)?.status.unwrap_or_default();
                let phase = status.phase.unwrap_or_default();
                let nodes = status.nodes.len();
                Ok((!phase.is_empty() && nodes == lab.nodes.len()).then_some((phase, nodes)))
            })
            .await?;
        Ok(((), format!("{devices} SCSIDevices; SCSITarget array-a status: phase {phase}, {answered} nodes")))
    })
    .await?;

    if every_step {
        r.step(
            "a node labelling itself gets nothing: node-c's kubelet labels its Node with the key a CHAP target selects on; the target is Refused, nothing discovered through it; the protected key is refused to the kubelet",
            async { Ok(((), super::node_labels::a_node_labelling_itself_gets_nothing(lab, &node_name(2)).await?)) },
        )
        .await?;
    }

    r.step(
        "classes: StorageClasses (xfs on array-a with CHAP; raw block on the pool; one that matches no LUN and one of the pool, bound at once)",
        async {
            k.run(&["create", "namespace", NS])?;
            k.apply_object(&storage_class("lab-xfs", "array=a", "xfs", "zero"))?;
            k.apply_object(&storage_class("lab-pool", "tier=pool", "ext4", "discard"))?;
            k.apply_object(&bound_at_once(storage_class("lab-none", "tier=none", "ext4", "none")))?;
            k.apply_object(&bound_at_once(storage_class("lab-pool-now", "tier=pool", "ext4", "discard")))?;
            k.apply_object(&storage_class("lab-chap", "array=a", "ext4", "discard"))?;
            Ok(((), String::new()))
        },
    )
    .await?;

    // Before the steps that use array-a's LUNs: it leaves every LUN wiped
    // and Available, as it found them, and the class deleted.
    r.step(
        "quick start: docs/quick-start.md's StorageClass, PVC and Pod (deploy/examples) applied as written with kubectl; the PVC binds a tier=fast LUN (array-a), the Pod writes its line, prints it and reads it back; both deleted, the LUN is wiped and Available again",
        async { Ok(((), super::quick_start::quick_start(lab).await?)) },
    )
    .await?;

    let node_a = node_name(0);
    let node_b = node_name(1);
    let node_c = node_name(2);

    if every_step {
        r.step(
            "unbindable: PVCs no LUN can take (a selector matching none; 50 GiB), bound at once, carry Events that say why",
            async { Ok(((), unbindable(&k).await?)) },
        )
        .await?;

        r.step(
            "capacity: a CSIStorageCapacity per node with the largest free LUN of the class; a Pod whose 400 MiB claim fits only the Fibre Channel LUN (node-b, node-c) goes to node-b, not node-a it prefers, at the first try",
            async { Ok(((), super::capacity::steers_the_scheduler(lab).await?)) },
        )
        .await?;

        r.step(
            "wrong CHAP: the Secret's password is wrong; the attach fails on the VolumeAttachment and the Pod; fixing the Secret lets it start",
            async { Ok(((), wrong_chap(&mut *lab, &node_c).await?)) },
        )
        .await?;
    }
    r.step(
        "provision + stage + publish: a PVC and a Pod on node-a that writes a marker",
        async {
            k.apply_object(&pvc("data", "lab-xfs", "Filesystem", "400Mi"))?;
            k.apply_object(&pod(
                "writer",
                &node_a,
                "data",
                false,
                "echo lab-marker-1 > /data/marker && sync && sleep 100000",
            ))?;
            wait_running(&k, "writer").await?;
            let got = exec(&k, "writer", &["cat", "/data/marker"])?;
            anyhow::ensure!(got.trim() == "lab-marker-1", "marker read back as {got:?}");
            let pv = bound_pv(&k, "data").context("bound PV")?;
            Ok(((), format!("{pv} mounted on {node_a}")))
        },
    )
    .await?;

    r.step(
        "raw block: a Block PVC on the pool, a Pod that writes and reads the device",
        async {
            k.apply_object(&pvc("raw", "lab-pool", "Block", "32Mi"))?;
            k.apply_object(&pod(
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

    r.step("expand: the PVC asks for 256 MiB more; the proxy records a PendingResizeRequest beside it and an Event; the array grows the LUN; resizer and kubelet grow the filesystem online (df in the Pod)", async {
        Ok(((), expand(&mut *lab).await?))
    })
    .await?;

    if every_step {
        r.step(
            "kubelet restart: node-a's kubelet stopped and started over SSH, as the e2e suite does, under a running Pod; the volume stays mounted, no NodeUnstage",
            async { Ok(((), kubelet_restart(&mut *lab, 0).await?)) },
        )
        .await?;

        r.step(
            "node NotReady: node-c's kubelet stops; the Node goes NotReady, the proxy keeps its views and its attachment (unreachable is not gone); kubelet back, Ready",
            async { Ok(((), node_not_ready(&mut *lab, 2).await?)) },
        )
        .await?;

        r.step(
            "node deleted: node-c's Node is deleted (kubelet stopped); its agent Pod is garbage-collected; the proxy prunes it from the SCSIDevice views; kubelet re-registers it, CSINode and views return",
            async { Ok(((), node_deleted(&mut *lab, 2).await?)) },
        )
        .await?;
    }

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
            k.apply_object(&pod("reader", &node_b, "data", false, "sleep 100000"))?;
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

    if every_step {
        r.step(
            "two replicas: the Deployment's two replicas; 6 PVCs with Pods on the pool; every container of the leading Pod is frozen mid-batch; the other replica takes every Lease, all bind; thawed, the old leader steps down",
            async { Ok(((), two_replicas(&mut *lab).await?)) },
        )
        .await?;

        r.step(
            "agent crash: the agent's container is SIGKILLed as a new volume's NodeStage comes; kubelet restarts it and retries; the volume is formatted once",
            async { Ok(((), super::operations::agent_crash(&mut *lab, &node_b).await?)) },
        )
        .await?;

        r.step(
            "drain: kubectl drain the node of a Deployment's Pod with a volume; it runs again on another node with its data",
            async { Ok(((), super::operations::drain(&mut *lab, "lab-pool").await?)) },
        )
        .await?;
    }

    r.step(
        "enrolment: every agent enrolled with its projected token and renewed during the run; Pods posing as node-b's agent (node-a's agent token, another ServiceAccount's, a Pod not of the DaemonSet) are refused",
        async { Ok(((), super::enrolment::enrolment(&mut *lab, every_step).await?)) },
    )
    .await?;

    if every_step {
        r.step(
            "stale leader: the leader reads a deleted volume's LUN and is frozen before its Wipe; the other replica takes the Lease, wipes the LUN, a new claim binds it and its Pod writes a marker; thawed, the old leader's Wipe (its own check bypassed) is refused by the agent's epoch fence; the marker stays",
            async { Ok(((), super::stale_leader::stale_leader(lab).await?)) },
        )
        .await?;
    }

    r.step(
        "upgrade under load: Pods on every node write and verify while the DaemonSet and the Deployment roll to rebuilt images (another tag) and back",
        async { Ok(((), super::operations::upgrade(&mut *lab).await?)) },
    )
    .await?;

    r.step(
        "uninstall and reinstall: the driver removed as docs/kubernetes.md says and applied again; the inventory and the volumes' data stay; the new driver serves the existing PV",
        async { Ok(((), super::operations::reinstall(&mut *lab).await?)) },
    )
    .await?;

    if every_step {
        r.step(
            "cleanup modes: a pool PVC of class cleanup=none and one of cleanup=random-1, each written and deleted; the LUN keeps its data (none) or holds random bytes in its place (random-1), and is offered again",
            async { Ok(((), cleanup_modes(&mut *lab, &node_a).await?)) },
        )
        .await?;

        r.step(
            "out of service: a StatefulSet's Pod on a node that loses its power; NotReady, its volume stays published there; tainted node.kubernetes.io/out-of-service, the Pod and its volume move with the data; the node back, untainted, its agent listed again",
            async { Ok(((), super::shutdown::out_of_service(&mut *lab).await?)) },
        )
        .await?;
    }

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
            let available = wait_all_released(&k).await?;
            Ok(((), format!("{available} devices Available")))
        },
    )
    .await?;

    r.step(
        "rbac: the audit log shows no request of the controller refused, every request under its component's own ServiceAccount, and every rule deploy/ grants used by its component",
        async { Ok(((), super::rbac::check(lab)?)) },
    )
    .await?;
    r.step(
        "identities: the sidecars' token (what a compromised sidecar holds) is refused the CA key and the CHAP Secret",
        async { Ok(((), super::identities::sidecar_token_reads_no_secret(lab)?)) },
    )
    .await?;
    // Last: it leaves the lab's own CA (lab.pki) behind.
    r.step(
        "ca rotation: a new CA beside the old, the new one signing, the old dropped; every agent renewed at each step, no agent call failed",
        async { Ok(((), super::ca_rotation::ca_rotation(lab).await?)) },
    )
    .await?;
    Ok(r)
}

/// `class`, bound when its claim is created (Immediate), not where the
/// first Pod lands.
fn bound_at_once(class: StorageClass) -> StorageClass {
    StorageClass {
        volume_binding_mode: Some("Immediate".into()),
        ..class
    }
}

/// A StorageClass of the driver: devices matching `selector`, filesystem
/// `fs`, `cleanup` on delete; bound where the first Pod lands, growable.
pub(super) fn storage_class(name: &str, selector: &str, fs: &str, cleanup: &str) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        provisioner: "csi-scsi.io".into(),
        volume_binding_mode: Some("WaitForFirstConsumer".into()),
        allow_volume_expansion: Some(true),
        reclaim_policy: Some("Delete".into()),
        parameters: Some(BTreeMap::from([
            ("deviceSelector".into(), selector.into()),
            ("cleanup".into(), cleanup.into()),
            ("csi.storage.k8s.io/fstype".into(), fs.into()),
        ])),
        ..StorageClass::default()
    }
}

/// A ReadWriteOnce claim in [`NS`] of class `class`, volume mode `mode`
/// (`Filesystem` or `Block`), asking for `size`.
pub(super) fn pvc(name: &str, class: &str, mode: &str, size: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: in_lab(name),
        spec: Some(PersistentVolumeClaimSpec {
            storage_class_name: Some(class.into()),
            volume_mode: Some(mode.into()),
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".into(), Quantity(size.into()))])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    }
}

/// A busybox Pod on `node` running `script`, with claim `claim` mounted
/// at `/data`, or as the device `/dev/xvda` when `block`.
pub(super) fn pod(name: &str, node: &str, claim: &str, block: bool, script: &str) -> Pod {
    let mut spec = busybox(claim, script, block);
    spec.node_selector = Some(BTreeMap::from([(
        "kubernetes.io/hostname".into(),
        node.into(),
    )]));
    Pod {
        metadata: in_lab(name),
        spec: Some(spec),
        ..Pod::default()
    }
}

/// Object metadata: `name` in [`NS`].
fn in_lab(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(NS.into()),
        ..ObjectMeta::default()
    }
}

/// The workloads' Pod spec: one busybox container running `script`, the
/// claim as volume `v`, no service account token, quick to stop.
fn busybox(claim: &str, script: &str, block: bool) -> PodSpec {
    let (volume_devices, volume_mounts) = if block {
        let device = VolumeDevice {
            name: "v".into(),
            device_path: "/dev/xvda".into(),
        };
        (Some(vec![device]), None)
    } else {
        let mount = VolumeMount {
            name: "v".into(),
            mount_path: "/data".into(),
            ..VolumeMount::default()
        };
        (None, Some(vec![mount]))
    };
    PodSpec {
        termination_grace_period_seconds: Some(1),
        automount_service_account_token: Some(false),
        containers: vec![Container {
            name: "c".into(),
            image: Some(BUSYBOX.into()),
            image_pull_policy: Some("Never".into()),
            command: Some(vec!["sh".into(), "-c".into(), script.into()]),
            volume_devices,
            volume_mounts,
            ..Container::default()
        }],
        volumes: Some(vec![Volume {
            name: "v".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.into(),
                ..PersistentVolumeClaimVolumeSource::default()
            }),
            ..Volume::default()
        }]),
        ..PodSpec::default()
    }
}

/// The workload kinds [`one_replica`] writes.
#[derive(Clone, Copy, Debug)]
pub(super) enum Workload {
    /// A Deployment (strategy Recreate: a ReadWriteOnce volume has one user).
    Deployment,
    /// A StatefulSet (its Pod keeps its name, `<name>-0`).
    StatefulSet,
}

/// A one-replica workload `name` whose Pods (label `app=<name>`) run
/// `script` with claim `claim` at `/data`, on any node; as JSON, for
/// `kubectl apply`.
pub(super) fn one_replica(
    kind: Workload,
    name: &str,
    claim: &str,
    script: &str,
) -> anyhow::Result<String> {
    let labels = BTreeMap::from([("app".to_owned(), name.to_owned())]);
    let selector = LabelSelector {
        match_labels: Some(labels.clone()),
        ..LabelSelector::default()
    };
    let template = PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels),
            ..ObjectMeta::default()
        }),
        spec: Some(busybox(claim, script, false)),
    };
    let json = match kind {
        Workload::Deployment => serde_json::to_string(&Deployment {
            metadata: in_lab(name),
            spec: Some(DeploymentSpec {
                replicas: Some(1),
                selector,
                strategy: Some(DeploymentStrategy {
                    type_: Some("Recreate".into()),
                    ..DeploymentStrategy::default()
                }),
                template,
                ..DeploymentSpec::default()
            }),
            ..Deployment::default()
        })?,
        Workload::StatefulSet => serde_json::to_string(&StatefulSet {
            metadata: in_lab(name),
            spec: Some(StatefulSetSpec {
                replicas: Some(1),
                selector,
                service_name: Some(name.into()),
                template,
                ..StatefulSetSpec::default()
            }),
            ..StatefulSet::default()
        })?,
    };
    Ok(json)
}

pub(super) async fn wait_running(k: &Kubectl, pod: &str) -> anyhow::Result<()> {
    let waited = k
        .wait_for(&format!("Pod {pod} Running"), WAIT, |k| {
            let p = k.object::<Pod>(pod, Some(NS))?;
            if pod_phase(&p) == "Failed" {
                bail!("Pod {pod} failed: {}", serde_json::to_string(&p.status)?);
            }
            Ok((pod_phase(&p) == "Running" && pod_ready(&p)).then_some(()))
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

pub(super) fn exec(k: &Kubectl, pod: &str, cmd: &[&str]) -> anyhow::Result<String> {
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

/// The Events about `name` in [`NS`] (core and events.k8s.io alike).
fn events_of(k: &Kubectl, name: &str) -> anyhow::Result<Vec<Event>> {
    let selector = format!("involvedObject.name={name}");
    k.objects(&["-n", NS, "--field-selector", &selector])
}

/// The device's phase (None before the proxy wrote its status).
/// Waits until every PV is gone and every SCSIDevice is Available again
/// (wiped and offered); returns how many devices there are.
pub(super) async fn wait_all_released(k: &Kubectl) -> anyhow::Result<usize> {
    k.wait_for("every PV gone", WAIT, |k| {
        Ok(k.objects::<PersistentVolume>(&[])?.is_empty().then_some(()))
    })
    .await?;
    k.wait_for("every SCSIDevice Available", WAIT, |k| {
        let items = k.objects::<SCSIDevice>(&[])?;
        let all = items.iter().all(|d| phase(d) == Some(Phase::Available));
        Ok(all.then_some(items.len()))
    })
    .await
}

pub(super) fn phase(d: &SCSIDevice) -> Option<Phase> {
    d.status.as_ref().map(|s| s.phase)
}

/// Deletes Pods then PVCs by name and waits for them to go.
pub(super) fn delete_workloads(k: &Kubectl, pods: &[&str], pvcs: &[&str]) -> anyhow::Result<()> {
    for (kind, names) in [("pod", pods), ("pvc", pvcs)] {
        if names.is_empty() {
            continue;
        }
        let mut args = vec!["delete", kind, "-n", NS, "--wait=true", "--timeout=120s"];
        args.extend_from_slice(names);
        k.run(&args)?;
    }
    Ok(())
}

/// The first `n` characters of a message's gRPC description (after
/// `desc = `), or of the message.
pub(super) fn excerpt(s: &str, n: usize) -> String {
    let s = s.rsplit("desc = ").next().unwrap_or(s).replace('\n', " ");
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s,
    }
}

/// PVCs that cannot bind: the Event on each says why. Their classes bind
/// at once: under WaitForFirstConsumer the scheduler, which knows the
/// free LUNs per node (storage capacity), never places their Pods, so
/// CreateVolume, whose refusal this shows, would never be asked.
async fn unbindable(k: &Kubectl) -> anyhow::Result<String> {
    let cases = [
        ("nofit", "lab-none", "32Mi", "no available device fits"),
        (
            "huge",
            "lab-pool-now",
            "50Gi",
            "no device of the requested size exists",
        ),
    ];
    for (name, class, size, _) in cases {
        k.apply_object(&pvc(name, class, "Filesystem", size))?;
    }
    let mut out = Vec::new();
    for (name, _, _, why) in cases {
        let (reason, by, message) = k
            .wait_for(
                &format!("an Event on PVC {name} saying {why:?}"),
                WAIT,
                |k| {
                    let events = events_of(k, name)?;
                    Ok(events
                        .iter()
                        .find(|e| e.type_.as_deref() == Some("Warning") && message(e).contains(why))
                        .map(|e| {
                            (
                                reason(e).to_owned(),
                                reporter(e).to_owned(),
                                message(e).to_owned(),
                            )
                        }))
                },
            )
            .await?;
        let claim = k.object::<PersistentVolumeClaim>(name, Some(NS))?;
        let phase = claim.status.and_then(|s| s.phase).unwrap_or_default();
        anyhow::ensure!(phase == "Pending", "PVC {name} is {phase:?}, not Pending");
        // The driver's own Event (events.rs NoDeviceFits): a missing
        // events.k8s.io RBAC rule fails here, not only in a log line.
        k.wait_for(
            &format!("a NoDeviceFits Event from csi-scsi.io on PVC {name}"),
            WAIT,
            |k| {
                Ok(events_of(k, name)?
                    .iter()
                    .any(|e| {
                        reporter(e) == "csi-scsi.io" && super::api::reason(e) == "NoDeviceFits"
                    })
                    .then_some(()))
            },
        )
        .await?;
        out.push(format!(
            "{name}: {reason} from {}: {:?}; NoDeviceFits from csi-scsi.io",
            by.split('_').next().unwrap_or(&by),
            excerpt(&message, 120),
        ));
    }
    delete_workloads(k, &[], &["nofit", "huge"])?;
    Ok(out.join("\n      "))
}

/// The VolumeAttachment of PV `pv` on `node`, if any.
pub(super) fn attachment(
    k: &Kubectl,
    pv: &str,
    node: &str,
) -> anyhow::Result<Option<VolumeAttachment>> {
    Ok(k.objects::<VolumeAttachment>(&[])?.into_iter().find(|va| {
        va.spec.source.persistent_volume_name.as_deref() == Some(pv) && va.spec.node_name == node
    }))
}

/// Whether the VolumeAttachment says attached.
pub(super) fn attached(va: &VolumeAttachment) -> bool {
    va.status.as_ref().is_some_and(|s| s.attached)
}

/// The VolumeAttachment's status as JSON, for a message.
pub(super) fn attachment_status(va: &VolumeAttachment) -> String {
    serde_json::to_string(&va.status).unwrap_or_default()
}

/// The PV claim `claim` in [`NS`] is bound to.
pub(super) fn bound_pv(k: &Kubectl, claim: &str) -> anyhow::Result<String> {
    k.object::<PersistentVolumeClaim>(claim, Some(NS))?
        .spec
        .and_then(|s| s.volume_name)
        .filter(|s| !s.is_empty())
        .with_context(|| format!("PVC {claim} is not bound"))
}

/// PV `pv`'s CSI source: its volume handle and attributes.
pub(super) fn csi_source(
    k: &Kubectl,
    pv: &str,
) -> anyhow::Result<k8s_openapi::api::core::v1::CSIPersistentVolumeSource> {
    k.object::<PersistentVolume>(pv, None)?
        .spec
        .and_then(|s| s.csi)
        .with_context(|| format!("PV {pv} has no CSI source"))
}

/// PV `pv`'s CSI volume handle (the volume ID).
pub(super) fn volume_handle(k: &Kubectl, pv: &str) -> anyhow::Result<String> {
    Ok(csi_source(k, pv)?.volume_handle)
}

/// PV `pv`'s `wwid` volume attribute.
pub(super) fn pv_wwid(k: &Kubectl, pv: &str) -> anyhow::Result<String> {
    csi_source(k, pv)?
        .volume_attributes
        .and_then(|mut a| a.remove("wwid"))
        .context("the PV's wwid attribute")
}

/// Sets the CHAP password in the Secret object: the proxy reads it through
/// the API at each login, so nothing restarts.
fn set_chap_password(lab: &KubeLab, password: &str) -> anyhow::Result<()> {
    let patch = serde_json::json!({"stringData": {"password": password}}).to_string();
    lab.kubectl.run(&[
        "patch",
        "secret",
        super::targets::CHAP_SECRET,
        "-n",
        &lab.namespace,
        "--type=merge",
        "-p",
        &patch,
    ])?;
    Ok(())
}

/// A wrong CHAP password: the attach fails where users look; the right one
/// lets the same Pod start, with no restart of anything.
async fn wrong_chap(lab: &mut KubeLab, node: &str) -> anyhow::Result<String> {
    let k = lab.kubectl.clone();
    let index = lab
        .nodes
        .iter()
        .position(|n| n.name == node)
        .context("the node")?;
    set_chap_password(lab, "wrong-chap-password")?;
    let failed = async {
        // The node must log in again to meet the password: log it out of
        // array-a (no volume of array-a is attached there).
        lab.lab.logout_iscsi(index, "array-a")?;
        k.apply_object(&pvc("chap", "lab-chap", "Filesystem", "100Mi"))?;
        k.apply_object(&pod("chap", node, "chap", false, "sleep 100000"))?;
        let pv = k
            .wait_for("PVC chap bound", WAIT, |k| Ok(bound_pv(k, "chap").ok()))
            .await?;
        let error = k
            .wait_for("the VolumeAttachment's attachError", WAIT, |k| {
                Ok(attachment(k, &pv, node)?.and_then(|va| va.status?.attach_error?.message))
            })
            .await?;
        let event = k
            .wait_for("FailedAttachVolume on the Pod", WAIT, |k| {
                Ok(events_of(k, "chap")?
                    .iter()
                    .find(|e| reason(e) == "FailedAttachVolume")
                    .map(|e| message(e).to_owned()))
            })
            .await?;
        anyhow::Ok((error, event))
    }
    .await;
    // Put the right password back whatever happened.
    set_chap_password(lab, crate::lab::chap_secret_for_lab())?;
    let (error, event) = failed?;
    anyhow::ensure!(
        error.to_lowercase().contains("chap")
            || error.to_lowercase().contains("auth")
            || error.to_lowercase().contains("login"),
        "attachError does not name the login failure: {error}"
    );
    let fixed = std::time::Instant::now();
    wait_running(&k, "chap").await?;
    let took = fixed.elapsed();
    delete_workloads(&k, &["chap"], &["chap"])?;
    Ok(format!(
        "attachError: {:?}\n      Pod event FailedAttachVolume: {:?}\n      Secret fixed: Pod Running {:.1}s later, nothing restarted",
        excerpt(&error, 150),
        excerpt(&event, 80),
        took.as_secs_f64()
    ))
}

fn pvc_events_from_driver(k: &Kubectl, claim: &str) -> anyhow::Result<Vec<String>> {
    Ok(events_of(k, claim)?
        .iter()
        .filter(|e| reporter(e) == "csi-scsi.io")
        .filter_map(|e| e.reason.clone())
        .collect())
}

/// The two cleanup modes the rest of the life cycle does not delete with:
/// `none` leaves the tenant's bytes (the operator asked for that), and
/// `random-1` leaves none of them, and no filesystem either. Read from
/// the LUN's backing file on the array, as the next tenant would see it.
async fn cleanup_modes(lab: &mut KubeLab, node: &str) -> anyhow::Result<String> {
    let k = lab.kubectl.clone();
    let mut seen = Vec::new();
    for mode in ["none", "random-1"] {
        let class = format!("lab-cleanup-{mode}");
        let name = format!("cleanup-{mode}");
        let marker = format!("tenant data kept or shredded: cleanup {mode}");
        k.apply_object(&storage_class(&class, "tier=pool", "ext4", mode))?;
        k.apply_object(&pvc(&name, &class, "Filesystem", "32Mi"))?;
        k.apply_object(&pod(
            &name,
            node,
            &name,
            false,
            &format!("echo '{marker}' > /data/m && sync && sleep 100000"),
        ))?;
        wait_running(&k, &name).await?;
        let pv = bound_pv(&k, &name)?;
        let wwid = pv_wwid(&k, &pv)?;
        let (lun, file) =
            lun_file(&lab.lab, &wwid).with_context(|| format!("no lab LUN has {wwid}"))?;
        for (kind, object) in [("pod", &name), ("pvc", &name)] {
            k.run(&[
                "delete",
                kind,
                object,
                "-n",
                NS,
                "--wait=true",
                "--timeout=120s",
            ])?;
        }
        let device = wwid.strip_prefix("naa.").unwrap_or(&wwid).to_owned();
        k.wait_for(&format!("PV {pv} gone and {lun} Available"), WAIT, |k| {
            let pv_left = k
                .run(&["get", "pv", &pv, "--ignore-not-found", "-o", "name"])?
                .trim()
                .to_owned();
            let available = k
                .objects::<SCSIDevice>(&[])?
                .iter()
                .any(|d| d.spec.wwid.contains(&device) && phase(d) == Some(Phase::Available));
            Ok((pv_left.is_empty() && available).then_some(()))
        })
        .await?;
        let bytes = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
        let kept = bytes.windows(marker.len()).any(|w| w == marker.as_bytes());
        // ext4's superblock magic 0xEF53 at byte 1080.
        let ext4 = bytes.get(1080..1082) == Some(&[0x53, 0xef][..]);
        // Which MiBs read all zero: random-1 zeroes the first and the last
        // (the agent's probe areas, so the next stage sees a blank LUN)
        // and leaves random bytes everywhere else.
        let zero: Vec<usize> = bytes
            .chunks(1 << 20)
            .enumerate()
            .filter(|(_, c)| c.iter().all(|b| *b == 0))
            .map(|(i, _)| i)
            .collect();
        let last = (bytes.len() >> 20).saturating_sub(1);
        match mode {
            "none" => anyhow::ensure!(
                kept && ext4,
                "cleanup none on {lun}: the tenant's data should stay (marker found: {kept}, ext4: {ext4})"
            ),
            _ => anyhow::ensure!(
                !kept && !ext4 && zero == [0, last],
                "cleanup random-1 on {lun}: marker found: {kept}, ext4 left: {ext4}, all-zero MiBs {zero:?} (want the first and the last only)"
            ),
        }
        seen.push(format!(
            "{mode}: {lun} Available again, marker {}, ext4 {}",
            if kept { "kept" } else { "gone" },
            if ext4 { "kept" } else { "gone" }
        ));
    }
    Ok(seen.join("; "))
}

/// Expansion as a storage administrator sees it: the claim asks first, the
/// driver records the request beside the PVC, the array grows the LUN.
pub(super) async fn expand(lab: &mut KubeLab) -> anyhow::Result<String> {
    let k = lab.kubectl.clone();
    let before = df_kib(&k, "writer")?;
    let pv = bound_pv(&k, "data")?;
    let wwid = pv_wwid(&k, &pv)?;
    let (lun, _) = lun_file(&lab.lab, &wwid).with_context(|| format!("no lab LUN has {wwid}"))?;
    let now = std::fs::metadata(&lab.lab.luns[&lun])?.len();
    let want = (now + (256 << 20)) >> 20;
    let patch =
        serde_json::json!({"spec": {"resources": {"requests": {"storage": format!("{want}Mi")}}}})
            .to_string();
    k.run(&[
        "patch",
        "pvc",
        "data",
        "-n",
        NS,
        "--type=merge",
        "-p",
        &patch,
    ])?;
    // The proxy's best-effort writes: the request beside the PVC (no other
    // namespace), and an Event on the PVC.
    let request = k
        .wait_for("a PendingResizeRequest in the PVC's namespace", WAIT, |k| {
            let items = k.objects::<PendingResizeRequest>(&["-A"])?;
            if let Some(elsewhere) = items
                .iter()
                .find(|r| r.metadata.namespace.as_deref() != Some(NS))
            {
                bail!(
                    "PendingResizeRequest {} in namespace {:?}, not {NS}",
                    name_of(elsewhere),
                    elsewhere.metadata.namespace
                );
            }
            let Some(r) = items.first() else {
                return Ok(None);
            };
            // Owned by its claim, so it goes with the PVC.
            let owner = r
                .metadata
                .owner_references
                .as_deref()
                .and_then(<[_]>::first);
            if !owner.is_some_and(|o| o.kind == "PersistentVolumeClaim" && o.name == "data") {
                bail!("PendingResizeRequest owned by {owner:?}, not PVC data");
            }
            Ok(r.metadata.name.clone())
        })
        .await?;
    k.wait_for(
        "a ResizePending Event from csi-scsi.io on the PVC",
        WAIT,
        |k| {
            Ok(pvc_events_from_driver(k, "data")?
                .iter()
                .any(|r| r == "ResizePending")
                .then_some(()))
        },
    )
    .await?;
    let grown = std::time::Instant::now();
    let (_, new) = lab.lab.grow_lun(&lun, 256 << 20).await?;
    anyhow::ensure!(new >> 20 == want, "LUN grew to {new} bytes, not {want} MiB");
    let after = k
        .wait_for("the filesystem to grow", WAIT, |k| {
            let now = df_kib(k, "writer")?;
            Ok((now > before).then_some(now))
        })
        .await?;
    let capacity = k
        .wait_for("the PVC's capacity", WAIT, |k| {
            let cap = k
                .object::<PersistentVolumeClaim>("data", Some(NS))?
                .status
                .and_then(|s| s.capacity)
                .and_then(|mut c| c.remove("storage"))
                .map(|q| q.0)
                .unwrap_or_default();
            Ok((cap == format!("{want}Mi")).then_some(cap))
        })
        .await?;
    let took = grown.elapsed();
    let reasons = k
        .wait_for(
            "a ResizeCompleted Event from csi-scsi.io on the PVC",
            WAIT,
            |k| {
                let r = pvc_events_from_driver(k, "data")?;
                Ok(r.iter().any(|r| r == "ResizeCompleted").then_some(r))
            },
        )
        .await?;
    // Done requests are deleted by the proxy.
    k.wait_for("the done PendingResizeRequest deleted", WAIT, |k| {
        let left = k.objects::<PendingResizeRequest>(&["-n", NS])?;
        Ok(left.is_empty().then_some(()))
    })
    .await?;
    Ok(format!(
        "PendingResizeRequest {NS}/{request} (owned by PVC data; deleted once done); csi-scsi.io Events on the PVC: {}\n      LUN {lun} -> {want} MiB; df {before} KiB -> {after} KiB {:.1}s after the array grew it; PVC capacity {capacity}",
        reasons.join(", "),
        took.as_secs_f64()
    ))
}

/// How many times the node's agent log shows `method` called.
pub(super) fn agent_calls(lab: &KubeLab, node: &str, method: &str) -> anyhow::Result<usize> {
    let log = lab.agent_log(node)?;
    let needle = format!("rpc{{method={method} ");
    Ok(log.matches(&needle).count())
}

/// How many Detach calls (distinct request IDs) the node's agent served.
pub(super) fn agent_detaches(lab: &KubeLab, node: &str) -> anyhow::Result<usize> {
    let log = lab.agent_log(node)?;
    Ok(log
        .lines()
        .filter_map(|l| l.split_once(r#"agent_api{method="Detach" "#))
        .filter_map(|(_, rest)| rest.split("request_id=").nth(1))
        .filter_map(|r| r.split(['}', ' ']).next())
        .collect::<std::collections::BTreeSet<_>>()
        .len())
}

/// Waits for kubelet on `node` to renew its node Lease after `since`
/// (server time, RFC 3339): a kubelet that is up again, not a Ready
/// condition left over from before it stopped.
pub(super) async fn wait_lease_renewed(
    k: &Kubectl,
    node: &str,
    since: Timestamp,
) -> anyhow::Result<()> {
    k.wait_for(
        &format!("kubelet on {node} to renew its Lease"),
        WAIT,
        |k| {
            let lease = k.object::<Lease>(node, Some("kube-node-lease"))?;
            Ok(renewed_after(&lease, since).then_some(()))
        },
    )
    .await
}

/// Whether the Lease was renewed after `since`, at second precision
/// (renewTime has microseconds, the server's clock reads seconds).
pub(super) fn renewed_after(lease: &Lease, since: Timestamp) -> bool {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.renew_time.as_ref())
        .is_some_and(|t| t.0.as_second() > since.as_second())
}

pub(super) async fn wait_node_ready(k: &Kubectl, node: &str, ready: bool) -> anyhow::Result<()> {
    let what = if ready { "Ready" } else { "NotReady" };
    k.wait_for(&format!("Node {node} {what}"), WAIT, |k| {
        let n = k.object::<Node>(node, None)?;
        Ok((node_ready(&n) == ready).then_some(()))
    })
    .await
}

async fn restart_kubelet(lab: &mut KubeLab, i: usize) -> anyhow::Result<()> {
    let pid = lab.nodes[i].restart_kubelet().await?;
    lab.lab.record_pids(&[pid])
}

/// kubelet restarts under a running Pod: it reconstructs the volume. The
/// restart goes through the node's shell as Kubernetes' disruptive e2e
/// specs do it (SSH to the Node's address, `sudo systemctl stop|start
/// kubelet`, the Pod's mount looked up on the node meanwhile).
async fn kubelet_restart(lab: &mut KubeLab, i: usize) -> anyhow::Result<String> {
    let k = lab.kubectl.clone();
    let node = lab.nodes[i].name.clone();
    let ip: std::net::IpAddr = lab.lab.nodes[i].ip.parse()?;
    let unstage = agent_calls(lab, &node, "NodeUnstageVolume")?;
    let unpublish = agent_calls(lab, &node, "NodeUnpublishVolume")?;
    let stage = agent_calls(lab, &node, "NodeStageVolume")?;
    anyhow::ensure!(
        stage > 0,
        "no NodeStageVolume in {node}'s agent log: wrong log format?"
    );
    let uid = uid_of(&k.object::<Pod>("writer", Some(NS))?).to_owned();
    let shell = lab.shell.clone();
    let show = "systemctl show kubelet --property ActiveState --value";
    let before = lab.nodes[i].kubelet.main_pid();
    shell.run(ip, "sudo systemctl stop kubelet")?;
    let stopped = chrono_now(&k)?;
    let state = shell.run(ip, show)?;
    anyhow::ensure!(
        state.trim() == "inactive" && lab.nodes[i].kubelet.main_pid().is_none(),
        "after `systemctl stop kubelet` on {node}: ActiveState {state:?}, kubelet PID {:?}",
        lab.nodes[i].kubelet.main_pid()
    );
    // The node's own view: its mount namespace, where kubelet mounted the
    // Pod's volume (the host's has no such mount).
    let mounts = shell.run(ip, &format!("mount | grep {uid} | grep -v volume-subpaths"))?;
    shell.run(ip, "sudo systemctl start kubelet")?;
    let after = lab.nodes[i].kubelet.main_pid();
    let state = shell.run(ip, show)?;
    anyhow::ensure!(
        state.trim() == "active" && after.is_some() && after != before,
        "after `systemctl start kubelet` on {node}: ActiveState {state:?}, kubelet PID {before:?} -> {after:?}"
    );
    lab.lab
        .record_pids(&after.into_iter().collect::<Vec<_>>())?;
    let t = std::time::Instant::now();
    wait_lease_renewed(&k, &node, stopped).await?;
    wait_node_ready(&k, &node, true).await?;
    let ready = t.elapsed();
    wait_running(&k, "writer").await?;
    let p = k.object::<Pod>("writer", Some(NS))?;
    anyhow::ensure!(uid_of(&p) == uid, "the Pod was replaced");
    // The Node and Pod still say Ready from before the restart; exec
    // answers once the new kubelet has found its Pods again.
    let got = k
        .wait_for("kubectl exec through the restarted kubelet", WAIT, |k| {
            Ok(exec(k, "writer", &["cat", "/data/marker"]).ok())
        })
        .await?;
    anyhow::ensure!(got.trim() == "lab-marker-1", "marker read back as {got:?}");
    // A few syncs, so a wrong teardown would have happened.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (u2, p2) = (
        agent_calls(lab, &node, "NodeUnstageVolume")?,
        agent_calls(lab, &node, "NodeUnpublishVolume")?,
    );
    anyhow::ensure!(
        u2 == unstage && p2 == unpublish,
        "kubelet tore the volume down after its restart: NodeUnstageVolume {unstage} -> {u2}, NodeUnpublishVolume {unpublish} -> {p2}"
    );
    let restarts = super::pods::restarts(&p, "c");
    let restaged = agent_calls(lab, &node, "NodeStageVolume")?.saturating_sub(stage);
    Ok(format!(
        "{node}'s kubelet stopped and started over SSH (`sudo systemctl stop|start kubelet`, PID {} -> {}; the Pod's {} mounts seen on the node meanwhile), back (Lease renewed, Ready) {:.1}s after the start; Pod writer still Running (same UID, restarts {restarts}), marker read; NodeUnstageVolume/NodeUnpublishVolume calls unchanged ({unstage}/{unpublish}); {restaged} idempotent NodeStageVolume on reconstruction",
        before.unwrap_or(0),
        after.unwrap_or(0),
        mounts.lines().count(),
        ready.as_secs_f64()
    ))
}

/// Devices of array-c (the pool, which every node sees).
pub(super) fn pool_devices(k: &Kubectl) -> anyhow::Result<Vec<SCSIDevice>> {
    let mut devices = k.objects::<SCSIDevice>(&[])?;
    devices.retain(|d| d.spec.target == "array-c");
    Ok(devices)
}

/// Whether `node` is among the nodes that see the device.
fn sees(d: &SCSIDevice, node: &str) -> bool {
    d.status
        .as_ref()
        .is_some_and(|s| s.node_names.iter().any(|n| n == node))
}

/// A node whose kubelet stops is unreachable, not gone.
async fn node_not_ready(lab: &mut KubeLab, i: usize) -> anyhow::Result<String> {
    let k = lab.kubectl.clone();
    let node = lab.nodes[i].name.clone();
    k.apply_object(&pvc("cvol", "lab-pool", "Filesystem", "32Mi"))?;
    k.apply_object(&pod(
        "cpod",
        &node,
        "cvol",
        false,
        "echo on-c > /data/m && sleep 100000",
    ))?;
    wait_running(&k, "cpod").await?;
    let pv = bound_pv(&k, "cvol")?;
    let detaches = agent_detaches(lab, &node)?;
    let stopped = chrono_now(&k)?;
    lab.nodes[i].stop_kubelet().await;
    let t = std::time::Instant::now();
    let checked = async {
        wait_node_ready(&k, &node, false).await?;
        let not_ready = t.elapsed();
        // A discovery pass since the kubelet stopped.
        k.wait_for("a discovery pass after the kubelet stopped", WAIT, |k| {
            let target = k.object::<SCSITarget>("array-c", None)?;
            let last = target.status.and_then(|s| s.last_discovery);
            Ok(last.is_some_and(|t| t.0 > stopped).then_some(()))
        })
        .await?;
        let devices = pool_devices(&k)?;
        let missing: Vec<_> = devices.iter().filter(|d| !sees(d, &node)).collect();
        anyhow::ensure!(
            !devices.is_empty() && missing.is_empty(),
            "{} of {} pool devices lost {node} from their views while it was only NotReady",
            missing.len(),
            devices.len()
        );
        let va = attachment(&k, &pv, &node)?.context("the VolumeAttachment went")?;
        anyhow::ensure!(
            attached(&va) && !deleting(&va),
            "the VolumeAttachment on {node} is being detached: {}",
            attachment_status(&va)
        );
        anyhow::Ok((not_ready, devices.len()))
    }
    .await;
    // Read before kubelet is back; checked after it is (an error must not
    // leave the node down).
    let detached = agent_detaches(lab, &node).map(|d| d.saturating_sub(detaches));
    let restarted = chrono_now(&k)?;
    restart_kubelet(lab, i).await?;
    let (not_ready, n) = checked?;
    let detached = detached?;
    anyhow::ensure!(
        detached == 0,
        "{detached} Detach calls on {node} while it was NotReady"
    );
    wait_lease_renewed(&k, &node, restarted).await?;
    wait_node_ready(&k, &node, true).await?;
    wait_running(&k, "cpod").await?;
    let back = t.elapsed();
    let got = exec(&k, "cpod", &["cat", "/data/m"])?;
    anyhow::ensure!(got.trim() == "on-c", "marker on {node} read as {got:?}");
    delete_workloads(&k, &["cpod"], &["cvol"])?;
    Ok(format!(
        "{node} NotReady {:.1}s after kubelet stopped; after a discovery pass {n} pool devices still list it, its VolumeAttachment still attached, no Detach on its agent; Ready again at {:.1}s, the Pod's data intact",
        not_ready.as_secs_f64(),
        back.as_secs_f64()
    ))
}

/// The API server's clock (seconds), as the proxy writes it.
pub(super) fn chrono_now(k: &Kubectl) -> anyhow::Result<Timestamp> {
    // A fresh object's creationTimestamp is the server's time.
    let name = "lab-clock";
    let _ = k.run(&["delete", "configmap", name, "-n", NS, "--ignore-not-found"]);
    k.run(&["create", "configmap", name, "-n", NS])?;
    let cm = k.object::<ConfigMap>(name, Some(NS))?;
    let _ = k.run(&["delete", "configmap", name, "-n", NS]);
    cm.metadata
        .creation_timestamp
        .map(|t| t.0)
        .context("creationTimestamp")
}

/// A deleted Node is gone: its views go; re-registered, they return.
async fn node_deleted(lab: &mut KubeLab, i: usize) -> anyhow::Result<String> {
    let k = lab.kubectl.clone();
    let node = lab.nodes[i].name.clone();
    lab.nodes[i].stop_kubelet().await;
    k.run(&["delete", "node", &node, "--wait=true", "--timeout=60s"])?;
    let t = std::time::Instant::now();
    // The controller manager's Pod GC deletes the Pods of a Node that is
    // gone, the agent's too: the proxy's directory loses it.
    k.wait_for(&format!("the agent Pod of {node} deleted"), WAIT, |k| {
        Ok(super::pods::agent_on(k, &lab.namespace, &node)
            .is_err()
            .then_some(()))
    })
    .await?;
    let pruned = k
        .wait_for(
            &format!("{node} pruned from the SCSIDevice views"),
            WAIT,
            |k| {
                let items = k.objects::<SCSIDevice>(&[])?;
                Ok((!items.is_empty() && items.iter().all(|d| !sees(d, &node)))
                    .then_some(items.len()))
            },
        )
        .await;
    restart_kubelet(lab, i).await?;
    let pruned = pruned?;
    let pruned_at = t.elapsed();
    wait_node_ready(&k, &node, true).await?;
    k.wait_for(&format!("CSINode {node} with csi-scsi.io"), WAIT, |k| {
        Ok(has_driver(&k.object::<CSINode>(&node, None)?).then_some(()))
    })
    .await?;
    let registered = t.elapsed();
    let n = wait_back_in_views(&k, &node).await?;
    Ok(format!(
        "Node {node} deleted, its agent Pod garbage-collected: gone from all {pruned} SCSIDevice views {:.1}s later; re-registered (Node Ready, CSINode) at {:.1}s; back in {n} pool devices' views at {:.1}s",
        pruned_at.as_secs_f64(),
        registered.as_secs_f64(),
        t.elapsed().as_secs_f64()
    ))
}

/// Waits for every pool device's views to list `node` (its agent answers
/// discovery again); returns how many pool devices there are.
pub(super) async fn wait_back_in_views(k: &Kubectl, node: &str) -> anyhow::Result<usize> {
    k.wait_for(
        &format!("{node} back in the pool devices' views"),
        WAIT,
        |k| {
            let devices = pool_devices(k)?;
            Ok(
                (!devices.is_empty() && devices.iter().all(|d| sees(d, node)))
                    .then_some(devices.len()),
            )
        },
    )
    .await
}

/// Each of `containers`' restarts in `pod` since the counts `before`.
fn restarts_since(pod: &Pod, containers: &[String], before: &[u64]) -> Vec<(String, u64)> {
    containers
        .iter()
        .zip(before)
        .map(|(c, b)| (c.clone(), super::pods::restarts(pod, c).saturating_sub(*b)))
        .collect()
}

/// The containers of `restarts` restarted more than `limit` times, as
/// "name count, ..." (empty when none).
fn restarted_over(restarts: &[(String, u64)], limit: u64) -> String {
    restarts
        .iter()
        .filter(|(_, n)| *n > limit)
        .map(|(c, n)| format!("{c} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The node Pod `pod` in `ns` is scheduled on.
pub(super) fn node_of(k: &Kubectl, pod: &str, ns: &str) -> anyhow::Result<String> {
    Ok(scheduled_on(&k.object::<Pod>(pod, Some(ns))?)?.to_owned())
}

/// The SCSIDevice whose status holds volume `handle`.
pub(super) fn device_of_volume(k: &Kubectl, handle: &str) -> anyhow::Result<SCSIDevice> {
    k.objects::<SCSIDevice>(&[])?
        .into_iter()
        .find(|d| {
            d.status
                .as_ref()
                .is_some_and(|s| s.volume_id.as_deref() == Some(handle))
        })
        .with_context(|| format!("no SCSIDevice holds volume {handle}"))
}

/// Whether the CSINode lists the csi-scsi.io driver (it registered).
pub(super) fn has_driver(csinode: &CSINode) -> bool {
    csinode.spec.drivers.iter().any(|d| d.name == "csi-scsi.io")
}

/// Who holds Lease `lease` in `ns`.
pub(super) fn lease_holder(k: &Kubectl, ns: &str, lease: &str) -> anyhow::Result<String> {
    holder(&k.object::<Lease>(lease, Some(ns))?).context("no holder")
}

/// The Lease's holder identity, if held.
fn holder(lease: &Lease) -> Option<String> {
    lease.spec.as_ref()?.holder_identity.clone()
}

/// Two controller replicas; the leader dies in the middle of a batch.
async fn two_replicas(lab: &mut KubeLab) -> anyhow::Result<String> {
    const BATCH: usize = 6;
    let k = lab.kubectl.clone();
    let ns = lab.namespace.clone();
    let replicas = super::pods::list(&k, &ns, super::pods::CONTROLLER_SELECTOR)?;
    anyhow::ensure!(
        replicas.len() == 2,
        "the lab overlay runs 2 controller replicas, found {}",
        replicas.len()
    );
    let nodes: Vec<String> = lab.nodes.iter().map(|n| n.name.clone()).collect();
    let name = |i: usize| format!("batch-{i}");
    let create = |i: usize| -> anyhow::Result<()> {
        k.apply_object(&pvc(&name(i), "lab-pool", "Filesystem", "32Mi"))?;
        k.apply_object(&pod(
            &name(i),
            &nodes[i % nodes.len()],
            &name(i),
            false,
            "echo batch > /data/m && sleep 100000",
        ))?;
        Ok(())
    };
    for i in 0..BATCH / 2 {
        create(i)?;
    }
    let leader = lease_holder(&k, &ns, "csi-scsi-proxy")?;
    let victim = replicas
        .iter()
        .find(|p| super::pods::name(p) == leader)
        .with_context(|| format!("the proxy Lease is held by {leader}, no controller Pod"))?;
    let survivor = replicas
        .iter()
        .find(|p| super::pods::name(p) != leader)
        .context("a second replica")?;
    let survivor_name = super::pods::name(survivor);
    let containers: Vec<String> = std::iter::once("csi-scsi-proxy")
        .chain(super::SIDECARS.iter().copied())
        .map(str::to_owned)
        .collect();
    let survivor_restarts: Vec<u64> = containers
        .iter()
        .map(|c| super::pods::restarts(survivor, c))
        .collect();
    let bound_at_freeze = (0..BATCH / 2)
        .filter(|i| bound_pv(&k, &name(*i)).is_ok())
        .count();
    let running_at_freeze = (0..BATCH / 2)
        .filter(|i| {
            k.object::<Pod>(&name(*i), Some(NS))
                .is_ok_and(|p| pod_phase(&p) == "Running")
        })
        .count();
    // Freeze every container of the leading Pod through its node's
    // containerd: alive, holding its Leases, but silent, as on a stalled
    // node. A SIGKILL would not do: kubelet restarts the containers under
    // the same Pod name, the Lease identity, and they may lead again.
    let victim_node = scheduled_on(victim)
        .context("the leader's node")?
        .to_owned();
    // The Pod as it is now: a container may have been restarted since the
    // list (its ID changed).
    let victim = k.object::<Pod>(&leader, Some(&ns))?;
    let victim_restarts: Vec<u64> = containers
        .iter()
        .map(|c| super::pods::restarts(&victim, c))
        .collect();
    let ids = containers
        .iter()
        .map(|c| super::pods::container_id(&victim, c))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let (frozen, froze) = lab.freeze_containers(&victim_node, &ids);
    let frozen_since = std::time::Instant::now();
    // Thawed whatever happens: a frozen replica left behind would stall
    // the steps after this one.
    let takeover = async {
        froze?;
        for i in BATCH / 2..BATCH {
            create(i)?;
        }
        // The server's clock once all is frozen: a Lease renewed after it
        // was renewed by a live replica. (The provisioner's Lease identity
        // is its own random one, not the Pod name, so the holder's name
        // alone cannot say whose it is.)
        let frozen_at = chrono_now(&k)?;
        let all_renewed = |k: &Kubectl| -> anyhow::Result<Option<Vec<String>>> {
            let items = k.objects::<Lease>(&["-n", &ns])?;
            let renewed = items.iter().all(|l| renewed_after(l, frozen_at));
            // The proxy's and each sidecar's Lease.
            Ok((items.len() > super::SIDECARS.len() && renewed).then(|| {
                items
                    .iter()
                    .map(|l| format!("{}={}", name_of(l), holder(l).unwrap_or_default()))
                    .collect()
            }))
        };
        let proxy_at = k
            .wait_for("the proxy Lease taken by the other replica", WAIT, |k| {
                Ok((lease_holder(k, &ns, "csi-scsi-proxy")? == survivor_name)
                    .then(|| frozen_since.elapsed()))
            })
            .await?;
        let leases = k
            .wait_for(
                "every Lease renewed after the freeze (by the other replica)",
                WAIT,
                all_renewed,
            )
            .await?;
        anyhow::Ok((proxy_at, leases))
    }
    .await;
    let thawed = lab.thaw_containers(&victim_node, &frozen);
    let (took_over, sidecar_leaders) = takeover?;
    anyhow::ensure!(thawed.is_empty(), "thawing {leader}: {}", thawed.join("; "));
    let thawed_at = frozen_since.elapsed();
    for i in 0..BATCH {
        wait_running(&k, &name(i)).await?;
    }
    let all_up = frozen_since.elapsed();
    // One LUN per volume: no device bound twice, no volume on two devices.
    let mut ids = std::collections::BTreeSet::new();
    for d in k.objects::<SCSIDevice>(&[])? {
        let volume = d.status.and_then(|s| s.volume_id);
        if let Some(id) = volume.as_deref().filter(|s| !s.is_empty()) {
            anyhow::ensure!(
                ids.insert(id.to_owned()),
                "volume {id} bound on two SCSIDevices"
            );
        }
    }
    let mut wwids = std::collections::BTreeSet::new();
    for i in 0..BATCH {
        let pv = bound_pv(&k, &name(i))?;
        let handle = volume_handle(&k, &pv)?;
        anyhow::ensure!(
            ids.contains(&handle),
            "{pv}'s volume {handle} is on no SCSIDevice"
        );
        let wwid = handle.split(':').next().unwrap_or_default().to_owned();
        anyhow::ensure!(wwids.insert(wwid.clone()), "two PVs on LUN {wwid}");
    }
    let now = k.object::<Pod>(&survivor_name, Some(&ns))?;
    let restarted = restarted_over(&restarts_since(&now, &containers, &survivor_restarts), 0);
    anyhow::ensure!(
        restarted.is_empty(),
        "the surviving replica's containers restarted: {restarted}"
    );
    // The thawed replica stepped down: it did not take the Leases back,
    // and its containers came back Ready (an exit on the lost Lease, or on
    // the proxy's socket going away, is a restart each; more is a loop).
    let lease_stays = |after: &str| -> anyhow::Result<()> {
        let holder = lease_holder(&k, &ns, "csi-scsi-proxy")?;
        anyhow::ensure!(
            holder == survivor_name,
            "{leader}, {after}, took the proxy Lease back from {survivor_name}: {holder} holds it"
        );
        Ok(())
    };
    lease_stays("thawed")?;
    let victim_restarted = k
        .wait_for(&format!("{leader} Ready again after the thaw"), WAIT, |k| {
            let p = k.object::<Pod>(&leader, Some(&ns))?;
            // Each container by name: a status not reported yet is not Ready.
            let ready = containers
                .iter()
                .all(|c| super::pods::status_of(&p, c).is_some_and(|s| s.ready));
            Ok(ready.then(|| restarts_since(&p, &containers, &victim_restarts)))
        })
        .await?;
    let excess = restarted_over(&victim_restarted, 2);
    anyhow::ensure!(
        excess.is_empty(),
        "{leader}'s containers restarted more than twice after the thaw: {excess}"
    );
    lease_stays("restarted")?;
    let stepped_down = lab
        .proxy_log_of(&victim_node, &leader)?
        .contains("leadership lost");
    anyhow::ensure!(
        stepped_down,
        "no proxy log says leadership lost: the thawed leader never noticed"
    );
    Ok(format!(
        "froze every container of {leader} (proxy + {} sidecars) after {} of {BATCH} PVCs ({bound_at_freeze} Bound, {running_at_freeze} Pods Running by then); {survivor_name} holds csi-scsi-proxy {:.1}s later\n      Leases: {}; thawed at {:.1}s: {leader} logged leadership lost and came back Ready (restarts: {}), the proxy Lease stays {survivor_name}'s\n      all {BATCH} Bound on {} distinct LUNs and Running {:.1}s after the freeze; {survivor_name}'s containers never restarted",
        super::SIDECARS.len(),
        BATCH / 2,
        took_over.as_secs_f64(),
        sidecar_leaders.join(", "),
        thawed_at.as_secs_f64(),
        restarted_over(&victim_restarted, 0),
        wwids.len(),
        all_up.as_secs_f64()
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn as_json<T: serde::Serialize>(object: &T) -> Value {
        serde_json::to_value(object).expect("serialises")
    }

    /// The typed manifests are the objects the lab applied when it wrote
    /// them as JSON text.
    #[test]
    fn the_workload_manifests_are_the_objects_the_lab_always_applied() {
        let container = |attach: (&str, Value)| {
            let mut c = json!({"name": "c", "image": BUSYBOX, "imagePullPolicy": "Never",
                "command": ["sh", "-c", "echo \"x\" > /data/m"]});
            c[attach.0] = attach.1;
            c
        };
        let mounted = ("volumeMounts", json!([{"name": "v", "mountPath": "/data"}]));
        let device = (
            "volumeDevices",
            json!([{"name": "v", "devicePath": "/dev/xvda"}]),
        );
        let volumes = json!([{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]);
        let pod_of = |c: Value| {
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w", "namespace": NS},
                "spec": {"nodeSelector": {"kubernetes.io/hostname": "node-a"},
                    "terminationGracePeriodSeconds": 1, "automountServiceAccountToken": false,
                    "containers": [c], "volumes": volumes}})
        };
        let template = json!({"metadata": {"labels": {"app": "m"}}, "spec": {
            "terminationGracePeriodSeconds": 1, "automountServiceAccountToken": false,
            "containers": [container(mounted.clone())], "volumes": volumes}});
        let script = "echo \"x\" > /data/m";
        let cases: [(&str, Value, Value); 6] = [
            (
                "storage class",
                as_json(&storage_class("lab-xfs", "array=a", "xfs", "zero")),
                json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                    "metadata": {"name": "lab-xfs"}, "provisioner": "csi-scsi.io",
                    "volumeBindingMode": "WaitForFirstConsumer", "allowVolumeExpansion": true,
                    "reclaimPolicy": "Delete", "parameters": {"deviceSelector": "array=a",
                        "cleanup": "zero", "csi.storage.k8s.io/fstype": "xfs"}}),
            ),
            (
                "claim",
                as_json(&pvc("data", "lab-pool", "Block", "32Mi")),
                json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": "data", "namespace": NS},
                    "spec": {"storageClassName": "lab-pool", "volumeMode": "Block",
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "32Mi"}}}}),
            ),
            (
                "filesystem pod",
                as_json(&pod("w", "node-a", "data", false, script)),
                pod_of(container(mounted.clone())),
            ),
            (
                "block pod",
                as_json(&pod("w", "node-a", "data", true, script)),
                pod_of(container(device)),
            ),
            (
                "deployment",
                serde_json::from_str(
                    &one_replica(Workload::Deployment, "m", "data", script).expect("json"),
                )
                .expect("parses"),
                json!({"apiVersion": "apps/v1", "kind": "Deployment",
                    "metadata": {"name": "m", "namespace": NS},
                    "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "m"}},
                        "strategy": {"type": "Recreate"}, "template": template}}),
            ),
            (
                "stateful set",
                serde_json::from_str(
                    &one_replica(Workload::StatefulSet, "m", "data", script).expect("json"),
                )
                .expect("parses"),
                json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
                    "metadata": {"name": "m", "namespace": NS},
                    "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "m"}},
                        "serviceName": "m", "template": template}}),
            ),
        ];
        for (what, got, want) in cases {
            assert_eq!(got, want, "{what}");
        }
    }
}
