//! Which Node label keys a node can give itself. A target's `nodeSelector`
//! decides which nodes get its CHAP credentials and its LUNs, so it must
//! rest on keys only an administrator can set. The API server's
//! NodeRestriction admission plugin lets a kubelet edit its own Node's
//! labels, except under `node-restriction.kubernetes.io/` and under the
//! `kubernetes.io/` and `k8s.io/` namespaces outside the list of labels
//! kubelets set themselves. This mirrors that rule (the plugin's
//! `getForbiddenLabels` and the kubelet's `IsKubeletLabel`, the same from Kubernetes 1.33 to 1.37).

/// Labels a kubelet sets on its own Node (`IsKubeletLabel`'s list).
const KUBELET_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
];

/// Label namespaces (and their subdomains) a kubelet may set any key in.
const KUBELET_NAMESPACES: &[&str] = &["kubelet.kubernetes.io", "node.kubernetes.io"];

/// The namespace NodeRestriction keeps from kubelets altogether.
pub const PROTECTED_NAMESPACE: &str = "node-restriction.kubernetes.io";

/// Who can put a label key on a Node under NodeRestriction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelSetter {
    /// The node's own kubelet can (as can an administrator): the key says
    /// nothing a node's root could not claim.
    Kubelet,
    /// Only an administrator (or a controller with `update` on Nodes) can.
    AdminOnly,
}

impl LabelSetter {
    /// Who can set `key` on a Node.
    pub fn of(key: &str) -> Self {
        // A key without a prefix has the empty namespace: anybody's.
        let namespace = key.split_once('/').map_or("", |(ns, _)| ns);
        if in_namespace(namespace, PROTECTED_NAMESPACE) {
            return Self::AdminOnly;
        }
        let reserved =
            in_namespace(namespace, "kubernetes.io") || in_namespace(namespace, "k8s.io");
        let kubelets = KUBELET_LABELS.contains(&key)
            || KUBELET_NAMESPACES
                .iter()
                .any(|ns| in_namespace(namespace, ns));
        if reserved && !kubelets {
            Self::AdminOnly
        } else {
            Self::Kubelet
        }
    }
}

/// Which Node label keys a target's `nodeSelector` may rest on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SelectorKeys {
    /// Only keys a kubelet cannot set on its own Node; a selector on any
    /// other selects no node. Node labels read from the Node objects.
    #[default]
    AdminOnly,
    /// Any key: the labels come from the operator's agents file, or the
    /// operator trusts every node's kubelet
    /// (`--allow-kubelet-settable-selectors`).
    Any,
}

/// A `nodeSelector` resting on keys a node's kubelet can set on itself.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "target {target}'s nodeSelector uses {keys:?}, which a node's kubelet can set on its own Node: \
     the target selects no node (nothing discovered, attached or sent to any node through it, \
     CHAP included; records kept). Use keys under {PROTECTED_NAMESPACE}/ or list the nodes in \
     `nodes`, or start the proxy with --allow-kubelet-settable-selectors"
)]
pub struct KubeletSettableSelector {
    /// The target.
    pub target: String,
    /// Its selector's keys a kubelet can set.
    pub keys: Vec<String>,
}

/// Whether `namespace` is `parent` or a subdomain of it.
fn in_namespace(namespace: &str, parent: &str) -> bool {
    namespace == parent
        || namespace
            .strip_suffix(parent)
            .is_some_and(|head| head.ends_with('.'))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::LabelSetter::{self, AdminOnly, Kubelet};
    use super::SelectorKeys;
    use crate::device::{IscsiTarget, NewLuns, Target, Transport};

    fn target(selector: &[(&str, &str)], nodes: &[&str]) -> Target {
        Target {
            name: "t".into(),
            transport: Transport::Iscsi(IscsiTarget {
                portals: vec!["198.18.0.9:3260".into()],
                iqn: "iqn.2026-01.test:t".into(),
                chap_secret_ref: None,
            }),
            node_selector: selector
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
            device_labels: BTreeMap::new(),
            array: None,
            new_luns: NewLuns::default(),
        }
    }

    #[test]
    fn a_selector_on_a_key_a_kubelet_can_set_selects_no_node_unless_allowed() {
        let labelled: BTreeMap<String, String> = [
            ("storage.example.com/array1", "true"),
            ("node-restriction.kubernetes.io/array1", "true"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        let bare: BTreeMap<String, String> = BTreeMap::new();
        let settable = [("storage.example.com/array1", "true")];
        let protected = [("node-restriction.kubernetes.io/array1", "true")];
        let mixed = [settable[0], protected[0]];
        use SelectorKeys::{AdminOnly as Admin, Any};
        // One row: a target's selector and nodes, the keys allowed, node-a's
        // labels; whether it selects node-a, whether it is refused.
        type Row<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str], SelectorKeys);
        let (l, b) = (&labelled, &bare);
        let table: &[(Row<'_>, &BTreeMap<String, String>, bool, bool)] = &[
            ((&settable, &[], Admin), l, false, true),
            ((&settable, &["node-a"], Admin), l, false, true),
            ((&mixed, &[], Admin), l, false, true),
            ((&settable, &[], Any), l, true, false),
            ((&settable, &[], Any), b, false, false),
            ((&protected, &[], Admin), l, true, false),
            ((&protected, &[], Admin), b, false, false),
            ((&[], &["node-a"], Admin), b, true, false),
            ((&[], &["node-b"], Admin), l, false, false),
            ((&[], &[], Admin), b, true, false),
        ];
        for (i, ((selector, nodes, keys), labels, selects, refused)) in table.iter().enumerate() {
            let t = target(selector, nodes);
            assert_eq!(
                t.selects(&crate::node("node-a"), labels, *keys),
                *selects,
                "row {i}"
            );
            let check = t.check_selector(*keys);
            assert_eq!(check.is_err(), *refused, "row {i}: {check:?}");
            if let Err(e) = check {
                assert_eq!(e.keys, ["storage.example.com/array1"], "row {i}");
                assert!(e.to_string().contains("kubelet can set"), "row {i}: {e}");
            }
        }
    }

    #[test]
    fn who_can_set_a_node_label_key() {
        let table: &[(&str, LabelSetter)] = &[
            // The protected namespace and its subdomains: admins only.
            ("node-restriction.kubernetes.io/array1", AdminOnly),
            ("storage.node-restriction.kubernetes.io/array1", AdminOnly),
            // Any other prefix, or none, is the kubelet's to set.
            ("storage.example.com/array1", Kubelet),
            ("array1", Kubelet),
            ("example.com/node-restriction.kubernetes.io", Kubelet),
            ("node-restriction.kubernetes.io.example.com/x", Kubelet),
            ("notkubernetes.io/x", Kubelet),
            ("notk8s.io/x", Kubelet),
            // The labels kubelets set on themselves, and their namespaces.
            ("kubernetes.io/hostname", Kubelet),
            ("kubernetes.io/arch", Kubelet),
            ("kubernetes.io/os", Kubelet),
            ("beta.kubernetes.io/arch", Kubelet),
            ("beta.kubernetes.io/os", Kubelet),
            ("beta.kubernetes.io/instance-type", Kubelet),
            ("node.kubernetes.io/instance-type", Kubelet),
            ("topology.kubernetes.io/zone", Kubelet),
            ("topology.kubernetes.io/region", Kubelet),
            ("failure-domain.beta.kubernetes.io/zone", Kubelet),
            ("failure-domain.beta.kubernetes.io/region", Kubelet),
            ("node.kubernetes.io/anything", Kubelet),
            ("x.node.kubernetes.io/anything", Kubelet),
            ("kubelet.kubernetes.io/anything", Kubelet),
            ("x.kubelet.kubernetes.io/anything", Kubelet),
            // Other kubernetes.io and k8s.io keys: refused to kubelets.
            ("node-role.kubernetes.io/storage", AdminOnly),
            ("kubernetes.io/storage", AdminOnly),
            ("kubernetes.io/zone", AdminOnly),
            ("topology.kubernetes.io/rack", AdminOnly),
            ("k8s.io/array1", AdminOnly),
            ("storage.k8s.io/array1", AdminOnly),
        ];
        for (key, want) in table {
            assert_eq!(LabelSetter::of(key), *want, "{key}");
        }
    }
}
