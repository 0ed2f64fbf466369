//! Every RBAC rule `deploy/` grants the controller is needed, and none is
//! missing: after the life cycle, the API server's audit log must show no
//! request of the controller's ServiceAccount refused (a removed rule
//! would be a 403 here), and, for every rule of each ClusterRole and Role,
//! a request its own component made under it (a rule nothing used is one
//! too many). A rule's spare verbs (`get` beside `list` and `watch`, the
//! upstream sidecars' Lease verbs) are not asked to be used one by one.
//! The components share the ServiceAccount, as in the Deployment; the
//! User-Agent tells them apart. Because they share it, a rule removed from
//! one component's ClusterRole would still be granted by another's, and no
//! 403 would show: so every request must also be covered by its own
//! component's ClusterRole (or, in the driver's namespace, the shared
//! Role), and removing any rule fails this check.

use std::collections::BTreeSet;

use anyhow::{Context, bail};

use super::KubeLab;

/// Rules the life cycle cannot reach, by (role, group, resource), and why.
/// Anything else unused fails.
const NOT_REACHED: &[(&str, &str, &str, &str)] = &[(
    "csi-scsi-provisioner",
    "snapshot.storage.k8s.io",
    "volumesnapshots",
    "read only for a PVC whose dataSource names a snapshot",
)];

/// One granted permission: API group, resource (with `/subresource`), verb.
type Grant = (String, String, String);

/// Checks the audit log against the rendered roles; returns a summary.
pub fn check(lab: &KubeLab) -> anyhow::Result<String> {
    let account = format!(
        "system:serviceaccount:{}:csi-scsi-controller",
        lab.namespace
    );
    let text = std::fs::read_to_string(lab.plane.audit_log()).context("the audit log")?;
    let mut used: BTreeSet<(String, Grant)> = BTreeSet::new();
    let mut uncovered = BTreeSet::new();
    let mut refused = Vec::new();
    for line in text.lines() {
        let Ok(e) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if e["stage"] != "ResponseComplete" || e["user"]["username"] != account.as_str() {
            continue;
        }
        let r = &e["objectRef"];
        let mut resource = r["resource"].as_str().unwrap_or_default().to_owned();
        if let Some(sub) = r["subresource"].as_str() {
            resource = format!("{resource}/{sub}");
        }
        let grant = (
            r["apiGroup"].as_str().unwrap_or_default().to_owned(),
            resource,
            e["verb"].as_str().unwrap_or_default().to_owned(),
        );
        let who = component(e["userAgent"].as_str().unwrap_or_default());
        if e["responseStatus"]["code"] == 403 {
            refused.push(format!("{who} {} {}/{}", grant.2, grant.0, grant.1));
        }
        let in_namespace = r["namespace"].as_str() == Some(lab.namespace.as_str());
        // Discovery (`/api`, `/version`) has no objectRef: the built-in
        // system:discovery role grants it to everyone, not ours.
        if !r.is_null() && !own_roles_cover(lab, who, in_namespace, &grant) {
            uncovered.insert(format!("{who} {} {}/{}", grant.2, grant.0, grant.1));
        }
        used.insert((who.to_owned(), grant));
    }
    if !uncovered.is_empty() {
        bail!(
            "granted only through another component's role (the ServiceAccount is shared; its own role lacks the rule): {}",
            uncovered.into_iter().collect::<Vec<_>>().join("; ")
        );
    }
    if !refused.is_empty() {
        refused.sort();
        refused.dedup();
        bail!("RBAC refused the controller: {}", refused.join("; "));
    }
    let mut unused = Vec::new();
    let mut checked = 0;
    for role in &lab.rendered.roles {
        let name = role["metadata"]["name"].as_str().unwrap_or_default();
        let owner = owner(role);
        for rule in role["rules"].as_array().into_iter().flatten() {
            let groups = strings(&rule["apiGroups"]);
            let resources = strings(&rule["resources"]);
            let verbs = strings(&rule["verbs"]);
            let exempt = NOT_REACHED.iter().any(|(r, g, res, _)| {
                *r == name && groups.iter().any(|x| x == g) && resources.iter().any(|x| x == res)
            });
            if exempt {
                continue;
            }
            checked += 1;
            let hit = used
                .iter()
                .any(|(who, grant)| (owner.is_empty() || who == owner) && grants(rule, grant));
            if !hit {
                unused.push(format!(
                    "{name}: {:?} on {:?}/{:?}",
                    verbs, groups, resources
                ));
            }
        }
    }
    if !unused.is_empty() {
        bail!(
            "RBAC grants nothing in the life cycle used ({}): {}",
            unused.len(),
            unused.join("; ")
        );
    }
    Ok(format!(
        "{checked} rules each used by their component; no request refused; not reached: {}",
        NOT_REACHED
            .iter()
            .map(|(role, _, r, why)| format!("{role} {r} ({why})"))
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// Whether `who`'s own ClusterRole, or the shared namespaced Role for a
/// request in the driver's namespace, grants `grant`.
fn own_roles_cover(lab: &KubeLab, who: &str, in_namespace: bool, grant: &Grant) -> bool {
    lab.rendered.roles.iter().any(|role| {
        let mine = match owner(role) {
            "" => in_namespace,
            component => component == who,
        };
        mine && role["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|rule| grants(rule, grant))
    })
}

/// The component a role is for: a ClusterRole's `csi-scsi-<component>`;
/// "" for the namespaced Role (Leases, Secrets, Pods) all of them share.
fn owner(role: &serde_json::Value) -> &str {
    let name = role["metadata"]["name"].as_str().unwrap_or_default();
    match role["kind"].as_str() {
        Some("ClusterRole") => name.strip_prefix("csi-scsi-").unwrap_or(name),
        _ => "",
    }
}

/// Whether `rule` grants `grant` (group, resource, verb).
fn grants(rule: &serde_json::Value, (group, resource, verb): &Grant) -> bool {
    strings(&rule["apiGroups"]).contains(group)
        && strings(&rule["resources"]).contains(resource)
        && strings(&rule["verbs"]).contains(verb)
}

/// The component a request came from, named as its ClusterRole is.
/// client-go names its program (the binary's file name, which carries the
/// tool cache's version suffix here) before the first `/`.
fn component(user_agent: &str) -> &'static str {
    let program = user_agent.split('/').next().unwrap_or_default();
    [
        ("csi-provisioner", "provisioner"),
        ("csi-attacher", "attacher"),
        ("csi-resizer", "resizer"),
    ]
    .iter()
    .find(|(prefix, _)| program.starts_with(prefix))
    .map_or("proxy", |(_, name)| name)
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
}
