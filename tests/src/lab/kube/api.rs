//! The lab's typed door to the API server: kubectl's JSON read into the
//! k8s-openapi types and the driver's own custom resources, and objects
//! written from them, as the driver itself talks to Kubernetes. Still
//! through the real kubectl, as a user runs it, under whichever identity
//! the step holds; nothing here walks JSON by key.

use anyhow::Context;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::kube::Kubectl;

/// A kind kubectl can get and the harness can read: every k8s-openapi
/// resource and every csi-scsi custom resource.
pub trait Object: kube::Resource<DynamicType = ()> + DeserializeOwned {}

impl<K: kube::Resource<DynamicType = ()> + DeserializeOwned> Object for K {}

/// What kubectl prints for `get <kind> -o json` without a name.
#[derive(serde::Deserialize)]
struct List<K> {
    #[serde(default = "Vec::new")]
    items: Vec<K>,
}

/// kubectl's name for kind `K`: `<plural>` in the core group,
/// `<plural>.<group>` elsewhere (no short name can be ambiguous).
pub fn resource<K: Object>() -> String {
    let (plural, group) = (K::plural(&()), K::group(&()));
    if group.is_empty() {
        plural.into_owned()
    } else {
        format!("{plural}.{group}")
    }
}

/// Typed reads and writes through kubectl.
pub trait Typed {
    /// The object `name` of kind `K`, in namespace `ns` (None: a
    /// cluster-scoped kind).
    fn object<K: Object>(&self, name: &str, ns: Option<&str>) -> anyhow::Result<K>;
    /// Every object of kind `K` that `kubectl get <kind> <args>` lists
    /// (`args`: `-n ns`, `-A`, `-l selector`, `--field-selector ...`).
    fn objects<K: Object>(&self, args: &[&str]) -> anyhow::Result<Vec<K>>;
    /// `kubectl apply` of `object`, serialised (apiVersion and kind
    /// included by its type).
    fn apply_object<K: Serialize>(&self, object: &K) -> anyhow::Result<String>;
}

impl Typed for Kubectl {
    fn object<K: Object>(&self, name: &str, ns: Option<&str>) -> anyhow::Result<K> {
        let kind = resource::<K>();
        let mut args = vec![kind.as_str(), name];
        if let Some(ns) = ns {
            args.extend_from_slice(&["-n", ns]);
        }
        let json = self.get_json(&args)?;
        serde_json::from_value(json).with_context(|| format!("reading {kind} {name}"))
    }

    fn objects<K: Object>(&self, args: &[&str]) -> anyhow::Result<Vec<K>> {
        let kind = resource::<K>();
        let mut all = vec![kind.as_str()];
        all.extend_from_slice(args);
        let json = self.get_json(&all)?;
        let list: List<K> =
            serde_json::from_value(json).with_context(|| format!("reading the {kind} list"))?;
        Ok(list.items)
    }

    fn apply_object<K: Serialize>(&self, object: &K) -> anyhow::Result<String> {
        self.apply(&serde_json::to_string(object)?)
    }
}

/// The object's name (empty when it has none).
pub fn name_of<K: kube::Resource>(object: &K) -> &str {
    object.meta().name.as_deref().unwrap_or_default()
}

/// The object's UID (empty when it has none).
pub fn uid_of<K: kube::Resource>(object: &K) -> &str {
    object.meta().uid.as_deref().unwrap_or_default()
}

/// Whether the object is being deleted.
pub fn deleting<K: kube::Resource>(object: &K) -> bool {
    object.meta().deletion_timestamp.is_some()
}

/// The kind of the object's first owner (empty when it has none).
pub fn owner_kind<K: kube::Resource>(object: &K) -> &str {
    object
        .meta()
        .owner_references
        .as_deref()
        .and_then(<[_]>::first)
        .map_or("", |o| o.kind.as_str())
}

/// Whether the Node's `Ready` condition is True.
pub fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The Pod's phase (empty before the kubelet reports one).
pub fn pod_phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

/// Whether the Pod's `Ready` condition is True.
pub fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The node the Pod is scheduled on (empty before it is).
pub fn pod_node(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default()
}

/// The node the Pod is scheduled on; an error before it is.
pub fn scheduled_on(pod: &Pod) -> anyhow::Result<&str> {
    Some(pod_node(pod))
        .filter(|n| !n.is_empty())
        .with_context(|| format!("Pod {} is on no node", name_of(pod)))
}

/// Who reported an Event (events.k8s.io: reportingComponent; core: source).
pub fn reporter(e: &Event) -> &str {
    e.reporting_component
        .as_deref()
        .filter(|s| !s.is_empty())
        .or_else(|| e.source.as_ref().and_then(|s| s.component.as_deref()))
        .unwrap_or_default()
}

/// An Event's message (empty when it has none).
pub fn message(e: &Event) -> &str {
    e.message.as_deref().unwrap_or_default()
}

/// An Event's reason (empty when it has none).
pub fn reason(e: &Event) -> &str {
    e.reason.as_deref().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    use k8s_openapi::api::storage::v1::VolumeAttachment;

    use super::*;
    use csi_scsi_proxy::resources::{PendingResizeRequest, SCSIDevice, SCSITarget};

    #[test]
    fn kubectl_names_each_kind_by_plural_and_group() {
        let cases = [
            (resource::<Pod>(), "pods"),
            (
                resource::<PersistentVolumeClaim>(),
                "persistentvolumeclaims",
            ),
            (resource::<Lease>(), "leases.coordination.k8s.io"),
            (
                resource::<VolumeAttachment>(),
                "volumeattachments.storage.k8s.io",
            ),
            (resource::<SCSIDevice>(), "scsidevices.csi-scsi.io"),
            (resource::<SCSITarget>(), "scsitargets.csi-scsi.io"),
            (
                resource::<PendingResizeRequest>(),
                "pendingresizerequests.csi-scsi.io",
            ),
        ];
        for (got, want) in cases {
            assert_eq!(got, want);
        }
    }

    #[test]
    fn a_list_as_kubectl_prints_it_reads_into_typed_items() {
        let json = serde_json::json!({
            "apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""},
            "items": [{
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "uid": "u1", "deletionTimestamp": "2026-01-01T00:00:00Z",
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "u2"}]},
                "spec": {"nodeName": "node-a", "containers": [{"name": "c"}]},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
            }]
        });
        let list: List<Pod> = serde_json::from_value(json).expect("a pod list");
        let pod = &list.items[0];
        assert_eq!(name_of(pod), "p");
        assert_eq!(uid_of(pod), "u1");
        assert!(deleting(pod));
        assert_eq!(owner_kind(pod), "DaemonSet");
        assert_eq!(pod_node(pod), "node-a");
        assert_eq!(pod_phase(pod), "Running");
        assert!(pod_ready(pod));
        let empty: List<Pod> =
            serde_json::from_value(serde_json::json!({"kind": "List"})).expect("no items");
        assert!(empty.items.is_empty());
    }

    #[test]
    fn an_event_names_its_reporter_from_either_api() {
        let read = |v: serde_json::Value| -> Event { serde_json::from_value(v).expect("an event") };
        let base = serde_json::json!({"apiVersion": "v1", "kind": "Event", "metadata": {},
            "involvedObject": {}});
        let mut new = base.clone();
        new["reportingComponent"] = "csi-scsi.io".into();
        new["source"] = serde_json::json!({"component": "other"});
        let mut old = base.clone();
        old["reportingComponent"] = "".into();
        old["source"] = serde_json::json!({"component": "persistentvolume-controller"});
        let cases = [
            (read(new), "csi-scsi.io"),
            (read(old), "persistentvolume-controller"),
            (read(base), ""),
        ];
        for (event, want) in cases {
            assert_eq!(reporter(&event), want);
        }
    }
}
