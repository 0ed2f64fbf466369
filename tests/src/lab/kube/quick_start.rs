//! The quick start (docs/quick-start.md) as an adopter runs it: its
//! StorageClass (`deploy/examples/storageclass.yaml`), claim and Pod
//! (`deploy/examples/quick-start/pvc.yaml` and `pod.yaml`) applied as
//! committed, with the real kubectl (`kubectl apply -f <file>`), the two
//! namespaced ones in the lab's workload namespace. The claim must bind,
//! the Pod must write its line, print it and read it back, and once both
//! are deleted the LUN must be wiped and Available again, as every later
//! step expects.
//!
//! Two things differ from a cluster, and neither is in the files:
//!
//! - the SCSITarget is the lab's array-a (targets.rs), not
//!   `deploy/examples/scsitarget-iscsi.yaml`, whose portals and IQN are
//!   documentation values no lab reaches; array-a's `deviceLabels` carry
//!   `tier=fast`, which the class's `deviceSelector` selects, as it selects
//!   the example target's (a unit test below holds the files together);
//! - the Pod's image is the lab's busybox (there is no registry), tagged in
//!   every node's containerd under the name the file gives.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail, ensure};
use csi_scsi_proxy::device::Phase;
use csi_scsi_proxy::parameters::{ClassParameters, fs_type};
use csi_scsi_proxy::resources::SCSIDevice;
use csi_scsi_proxy::selector::Selector;
use k8s_openapi::api::core::v1::{Container, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use serde::de::DeserializeOwned;

use super::KubeLab;
use super::api::{Typed, name_of};
use super::images::BUSYBOX;
use super::scenario::{
    NS, WAIT, bound_pv, device_of_volume, exec, node_of, phase, volume_handle, wait_all_released,
    wait_running,
};
use crate::images::archive::qualified;
use crate::kube::Kubectl;

/// The quick start's StorageClass, under `deploy/examples`.
const CLASS_FILE: &str = "storageclass.yaml";
/// Its claim.
const CLAIM_FILE: &str = "quick-start/pvc.yaml";
/// Its Pod.
const POD_FILE: &str = "quick-start/pod.yaml";
/// The file the Pod writes.
const WRITTEN: &str = "/data/hello.txt";
/// The line it writes there and prints, up to its node's name.
const LINE: &str = "csi-scsi quick start: written on ";
/// The environment variable that holds the node's name in the Pod.
const NODE_ENV: &str = "NODE_NAME";
/// The provisioner name every class of the driver names.
const PROVISIONER: &str = "csi-scsi.io";

/// `deploy/examples/<file>` in this repository.
fn example(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/examples")
        .join(file)
}

/// The one object of `deploy/examples/<file>`, which must be a `kind`.
fn read_one<K: DeserializeOwned>(file: &str, kind: &str) -> anyhow::Result<K> {
    let path = example(file);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&text).with_context(|| format!("parsing {file}"))?;
    let mut docs: Vec<_> = docs.into_iter().filter(|d| !d.is_null()).collect();
    ensure!(
        docs.len() == 1,
        "deploy/examples/{file} holds {} objects, not one {kind}",
        docs.len()
    );
    let doc = docs.remove(0);
    ensure!(
        doc["kind"] == kind,
        "deploy/examples/{file} is a {}, not a {kind}",
        doc["kind"]
    );
    serde_json::from_value(doc).with_context(|| format!("reading deploy/examples/{file}"))
}

/// The quick start's objects, as committed.
#[derive(Clone, Debug)]
struct Manifests {
    class: StorageClass,
    claim: PersistentVolumeClaim,
    pod: Pod,
}

impl Manifests {
    fn read() -> anyhow::Result<Self> {
        Ok(Self {
            class: read_one(CLASS_FILE, "StorageClass")?,
            claim: read_one(CLAIM_FILE, "PersistentVolumeClaim")?,
            pod: read_one(POD_FILE, "Pod")?,
        })
    }

    /// The class's `deviceSelector`, parsed as the proxy parses it.
    fn selector(&self) -> anyhow::Result<Selector> {
        let text = self
            .class
            .parameters
            .as_ref()
            .and_then(|p| p.get("deviceSelector"))
            .context("the StorageClass sets no deviceSelector")?;
        Ok(Selector::parse(text)?)
    }

    /// The Pod's one container.
    fn container(&self) -> anyhow::Result<&Container> {
        let containers = &self
            .pod
            .spec
            .as_ref()
            .context("the Pod has no spec")?
            .containers;
        match containers.as_slice() {
            [c] => Ok(c),
            _ => bail!("the Pod has {} containers, not one", containers.len()),
        }
    }

    /// The Pod's image, as written.
    fn image(&self) -> anyhow::Result<&str> {
        self.container()?
            .image
            .as_deref()
            .context("the Pod's container names no image")
    }

    /// What the step relies on: the class is the driver's and its
    /// parameters are ones the proxy accepts; the claim and the Pod carry
    /// no namespace (kubectl's `-n` places them); the claim names the
    /// class; the Pod, placed by the scheduler, mounts the claim where it
    /// writes [`LINE`] and its node's name into [`WRITTEN`] and prints it;
    /// its image is a busybox a node may hold without a registry.
    fn check(&self) -> anyhow::Result<()> {
        let class = name_of(&self.class);
        ensure!(
            self.class.provisioner == PROVISIONER,
            "StorageClass {class} is {:?}'s, not {PROVISIONER}'s",
            self.class.provisioner
        );
        let params: HashMap<String, String> = self
            .class
            .parameters
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        ClassParameters::parse(&params)
            .with_context(|| format!("StorageClass {class}'s parameters"))?;
        if let Some(fs) = params.get("csi.storage.k8s.io/fstype") {
            fs_type(fs).with_context(|| format!("StorageClass {class}'s filesystem"))?;
        }
        self.selector()?;

        let claim = name_of(&self.claim);
        ensure!(!claim.is_empty(), "the claim has no name");
        ensure!(
            self.claim.metadata.namespace.is_none() && self.pod.metadata.namespace.is_none(),
            "the claim and the Pod must name no namespace (`kubectl -n` places them)"
        );
        let spec = self.claim.spec.as_ref().context("the claim has no spec")?;
        ensure!(
            spec.storage_class_name.as_deref() == Some(class),
            "the claim's storageClassName is {:?}, not the quick start's class {class}",
            spec.storage_class_name
        );
        ensure!(
            spec.volume_mode.as_deref().unwrap_or("Filesystem") == "Filesystem",
            "the claim is not a filesystem volume: the Pod writes a file"
        );

        let pod = self.pod.spec.as_ref().context("the Pod has no spec")?;
        ensure!(
            pod.node_name.is_none() && pod.node_selector.is_none(),
            "the Pod is pinned to a node: the quick start lets the scheduler place it"
        );
        let volume = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| {
                v.persistent_volume_claim
                    .as_ref()
                    .is_some_and(|c| c.claim_name == claim)
            })
            .with_context(|| format!("the Pod mounts no volume of claim {claim}"))?;
        let c = self.container()?;
        let dir = Path::new(WRITTEN)
            .parent()
            .and_then(Path::to_str)
            .context("the written file's directory")?;
        ensure!(
            c.volume_mounts
                .iter()
                .flatten()
                .any(|m| m.name == volume.name && m.mount_path == dir),
            "the Pod does not mount claim {claim} at {dir}"
        );
        let node_env = c
            .env
            .iter()
            .flatten()
            .find(|e| e.name == NODE_ENV)
            .and_then(|e| e.value_from.as_ref())
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str());
        ensure!(
            node_env == Some("spec.nodeName"),
            "the Pod's {NODE_ENV} is not its node's name (fieldRef spec.nodeName): {node_env:?}"
        );
        let script = c
            .command
            .iter()
            .flatten()
            .cloned()
            .collect::<Vec<_>>()
            .join(" ");
        for part in [
            format!("echo \"{LINE}${NODE_ENV}\" > {WRITTEN}"),
            format!("cat {WRITTEN}"),
        ] {
            ensure!(
                script.contains(&part),
                "the Pod's command does not run `{part}`: {script:?}"
            );
        }
        let image = self.image()?;
        let repository = qualified(image)?
            .rsplit_once(':')
            .map(|(r, _)| r.to_owned())
            .unwrap_or_default();
        ensure!(
            repository.ends_with("/busybox"),
            "the Pod's image {image} is no busybox: the lab serves its own busybox under that name"
        );
        ensure!(
            c.image_pull_policy.as_deref() == Some("IfNotPresent"),
            "the Pod's imagePullPolicy is {:?}, not IfNotPresent: a node that holds the image must not pull it",
            c.image_pull_policy
        );
        Ok(())
    }
}

/// `kubectl get events` in [`NS`], for a wait that failed.
fn events(k: &Kubectl) -> String {
    k.run(&["get", "events", "-n", NS, "--sort-by=.lastTimestamp"])
        .unwrap_or_default()
}

/// The step: applies the quick start's files as committed, waits for the
/// claim Bound and the Pod's line in its file and its log, deletes both
/// and waits until every LUN is Available again.
pub(super) async fn quick_start(lab: &KubeLab) -> anyhow::Result<String> {
    let k = &lab.kubectl;
    let m = Manifests::read()?;
    m.check()?;
    let selector = m.selector()?;
    let (class, claim, pod) = (name_of(&m.class), name_of(&m.claim), name_of(&m.pod));

    // A LUN the class selects (array-a's): without one the claim could
    // never bind, and that would be the lab's fault, not the files'.
    k.wait_for(
        &format!("an Available SCSIDevice that {class}'s deviceSelector selects"),
        WAIT,
        |k| {
            Ok(k.objects::<SCSIDevice>(&[])?
                .iter()
                .any(|d| selector.matches(&d.spec.labels) && phase(d) == Some(Phase::Available))
                .then_some(()))
        },
    )
    .await
    .with_context(|| {
        format!("deploy/examples/{CLASS_FILE} selects no LUN of the lab: a lab target's deviceLabels (targets.rs) must match it")
    })?;

    // The Pod's image: the lab's busybox under the file's name.
    let image = qualified(m.image()?)?;
    let busybox = qualified(BUSYBOX)?;
    for n in &lab.nodes {
        lab.ctr(&n.name, &super::node::tag_args(&busybox, &image))
            .with_context(|| format!("tagging {busybox} as {image} on {}", n.name))?;
    }

    let path = |file: &str| example(file).display().to_string();
    let had_class = !k
        .run(&[
            "get",
            "storageclass",
            class,
            "--ignore-not-found",
            "-o",
            "name",
        ])?
        .trim()
        .is_empty();
    k.run(&["apply", "-f", &path(CLASS_FILE)])?;
    k.run(&["apply", "-n", NS, "-f", &path(CLAIM_FILE)])?;
    k.run(&["apply", "-n", NS, "-f", &path(POD_FILE)])?;

    k.wait_for(&format!("PVC {claim} Bound"), WAIT, |k| {
        let c = k.object::<PersistentVolumeClaim>(claim, Some(NS))?;
        Ok((c.status.and_then(|s| s.phase).as_deref() == Some("Bound")).then_some(()))
    })
    .await
    .with_context(|| format!("events in {NS}:\n{}", events(k)))?;
    wait_running(k, pod).await?;
    let node = node_of(k, pod, NS)?;
    let want = format!("{LINE}{node}");
    k.wait_for(
        &format!("{want:?} in {WRITTEN} of Pod {pod} and in its log"),
        WAIT,
        |k| {
            let file = exec(k, pod, &["cat", WRITTEN])?;
            let log = k.run(&["logs", pod, "-n", NS])?;
            Ok((file.trim_end() == want && log.lines().any(|l| l == want)).then_some(()))
        },
    )
    .await?;

    let pv = bound_pv(k, claim)?;
    let device = device_of_volume(k, &volume_handle(k, &pv)?)?;
    ensure!(
        selector.matches(&device.spec.labels),
        "PV {pv} is on SCSIDevice {}, whose labels {:?} {class}'s deviceSelector does not match",
        device.spec.wwid,
        device.spec.labels
    );

    // As the quick start's clean-up says, then the wipe every later step
    // expects to be over.
    k.run(&[
        "delete",
        "-n",
        NS,
        "-f",
        &path(POD_FILE),
        "-f",
        &path(CLAIM_FILE),
        "--wait=true",
        "--timeout=120s",
    ])?;
    let available = wait_all_released(k).await?;
    if !had_class {
        k.run(&["delete", "-f", &path(CLASS_FILE), "--wait=true"])?;
    }
    Ok(format!(
        "PVC {claim} Bound to {pv}: LUN {} of {} ({} MiB); Pod {pod} on {node} wrote, printed and read back {want:?}; deleted, the LUN wiped: {available} SCSIDevices Available",
        device.spec.wwid,
        device.spec.target,
        device.spec.size_bytes >> 20
    ))
}

#[cfg(test)]
mod tests {
    use csi_scsi_proxy::resources::SCSITarget;

    use super::*;

    /// The names docs/quick-start.md's commands use.
    const DOC: &str = "docs/quick-start.md";
    const DOC_CLASS: &str = "csi-scsi-fast";
    const DOC_CLAIM: &str = "quick-start";
    const DOC_POD: &str = "quick-start";

    fn manifests() -> Manifests {
        Manifests::read().expect("the quick start's files parse")
    }

    fn resources(kustomization: &str) -> Vec<String> {
        let text = std::fs::read_to_string(example(kustomization)).expect("reads");
        let doc: serde_json::Value = serde_saphyr::from_str(&text).expect("parses");
        doc["resources"]
            .as_array()
            .expect("a resources list")
            .iter()
            .map(|r| r.as_str().expect("a path").to_owned())
            .collect()
    }

    #[test]
    fn the_quick_start_files_are_the_objects_the_step_applies() {
        let m = manifests();
        m.check().expect("the step's expectations hold");
        assert_eq!(name_of(&m.class), DOC_CLASS);
        assert_eq!(name_of(&m.claim), DOC_CLAIM);
        assert_eq!(name_of(&m.pod), DOC_POD);
        assert_eq!(
            m.claim
                .spec
                .as_ref()
                .and_then(|s| s.storage_class_name.as_deref()),
            Some(DOC_CLASS)
        );
        // Bound where the Pod lands, among the LUNs its node sees.
        assert_eq!(
            m.class.volume_binding_mode.as_deref(),
            Some("WaitForFirstConsumer")
        );
    }

    #[test]
    fn the_class_selects_the_luns_of_the_quick_starts_target() {
        let m = manifests();
        let target: SCSITarget =
            read_one("scsitarget-iscsi.yaml", "SCSITarget").expect("the example target");
        let selector = m.selector().expect("the selector parses");
        assert!(
            selector.matches(&target.spec.device_labels),
            "{DOC_CLASS} selects none of {:?}",
            target.spec.device_labels
        );
        // And not everything: a LUN of another tier stays out.
        let other = std::collections::BTreeMap::from([("tier".to_owned(), "capacity".to_owned())]);
        assert!(!selector.matches(&other));
    }

    #[test]
    fn the_workload_stays_out_of_the_examples_the_lab_installs() {
        assert_eq!(
            resources("quick-start/kustomization.yaml"),
            ["pvc.yaml", "pod.yaml"]
        );
        let listed = resources("kustomization.yaml");
        assert!(
            listed.iter().all(|r| !r.starts_with("quick-start")),
            "deploy/examples/kustomization.yaml lists the quick start's workload: {listed:?}"
        );
        assert!(listed.iter().any(|r| r == CLASS_FILE));
    }

    #[test]
    fn the_doc_applies_these_files_and_names_these_objects() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(DOC);
        let doc = std::fs::read_to_string(&path).expect("docs/quick-start.md");
        for needle in [
            format!("apply -f deploy/examples/{CLASS_FILE}"),
            format!("apply -f deploy/examples/{CLAIM_FILE}"),
            format!("apply -f deploy/examples/{POD_FILE}"),
            format!("get pvc {DOC_CLAIM}"),
            format!("logs {DOC_POD}"),
            LINE.trim_end().to_owned(),
        ] {
            assert!(doc.contains(&needle), "{DOC} does not say `{needle}`");
        }
    }

    /// Each expectation of [`Manifests::check`] fails on a file that
    /// breaks it.
    #[test]
    fn the_check_refuses_files_the_step_could_not_use() {
        type Break = fn(&mut Manifests);
        let cases: [(&str, Break); 8] = [
            ("another class", |m| {
                m.claim.spec.as_mut().expect("spec").storage_class_name = Some("other".into());
            }),
            ("another claim", |m| {
                for v in m
                    .pod
                    .spec
                    .as_mut()
                    .expect("spec")
                    .volumes
                    .iter_mut()
                    .flatten()
                {
                    if let Some(c) = v.persistent_volume_claim.as_mut() {
                        c.claim_name = "other".into();
                    }
                }
            }),
            ("a namespace", |m| {
                m.pod.metadata.namespace = Some("default".into());
            }),
            ("a pinned node", |m| {
                m.pod.spec.as_mut().expect("spec").node_name = Some("node-a".into());
            }),
            ("a pull on every start", |m| {
                m.pod.spec.as_mut().expect("spec").containers[0].image_pull_policy =
                    Some("Always".into());
            }),
            ("another file", |m| {
                for arg in m.pod.spec.as_mut().expect("spec").containers[0]
                    .command
                    .iter_mut()
                    .flatten()
                {
                    *arg = arg.replace(WRITTEN, "/data/other.txt");
                }
            }),
            ("an unknown parameter", |m| {
                m.class
                    .parameters
                    .get_or_insert_default()
                    .insert("mkfsOptions".into(), "-E nodiscard".into());
            }),
            ("another provisioner", |m| {
                m.class.provisioner = "example.com".into();
            }),
        ];
        for (what, break_it) in cases {
            let mut m = manifests();
            break_it(&mut m);
            assert!(m.check().is_err(), "{what}: accepted");
        }
    }
}
