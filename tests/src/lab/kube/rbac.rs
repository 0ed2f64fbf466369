//! Every RBAC rule `deploy/` grants the controller is needed, and none is
//! missing: after the life cycle, the API server's audit log must show no
//! request of the controller's ServiceAccount refused (a removed rule
//! would be a 403 here), and, for every rule of each ClusterRole and Role,
//! a request its own component made under it (a rule nothing used is one
//! too many). A rule's spare verbs (`get` beside `list` and `watch`, the
//! upstream sidecars' Lease verbs) are not asked to be used one by one.
//! The Pod has two identities: the proxy's ServiceAccount and the
//! sidecars' (a token mounted into the sidecars only); each request must
//! come under the identity of the component that sent it (the User-Agent
//! tells the components apart), so a sidecar holding the proxy's token
//! fails here. The three sidecars share their identity, so a rule removed
//! from one sidecar's ClusterRole could still be granted by another's, and
//! no 403 would show: every request must also be covered by its own
//! component's roles, and removing any rule fails this check.

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

/// The proxy's ServiceAccount: the controller Pod's own.
pub const PROXY_ACCOUNT: &str = "csi-scsi-proxy";
/// The sidecars' ServiceAccount: its token is mounted into them only.
pub const SIDECARS_ACCOUNT: &str = "csi-scsi-sidecars";

/// Checks the audit log against the rendered roles; returns a summary.
pub fn check(lab: &KubeLab) -> anyhow::Result<String> {
    let user = |account: &str| format!("system:serviceaccount:{}:{account}", lab.namespace);
    let (proxy_user, sidecars_user) = (user(PROXY_ACCOUNT), user(SIDECARS_ACCOUNT));
    let text = std::fs::read_to_string(lab.plane.audit_log()).context("the audit log")?;
    let mut used: BTreeSet<(String, Grant)> = BTreeSet::new();
    let mut uncovered = BTreeSet::new();
    let mut wrong_identity = BTreeSet::new();
    let mut refused = Vec::new();
    for line in text.lines() {
        let Ok(e) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let username = e["user"]["username"].as_str().unwrap_or_default();
        if e["stage"] != "ResponseComplete" || (username != proxy_user && username != sidecars_user)
        {
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
        let expected = if who == "proxy" {
            &proxy_user
        } else {
            &sidecars_user
        };
        if username != expected {
            wrong_identity.insert(format!("{who} as {username}"));
        }
        if e["responseStatus"]["code"] == 403 {
            refused.push(format!("{who} {} {}/{}", grant.2, grant.0, grant.1));
        }
        let namespace = r["namespace"].as_str();
        // Discovery (`/api`, `/version`) has no objectRef: the built-in
        // system:discovery role grants it to everyone, not ours.
        if !r.is_null() && !own_roles_cover(lab, who, namespace, &grant) {
            uncovered.insert(format!("{who} {} {}/{}", grant.2, grant.0, grant.1));
        }
        used.insert((who.to_owned(), grant));
    }
    if !wrong_identity.is_empty() {
        bail!(
            "a component used another's ServiceAccount (the sidecars must hold only their own token): {}",
            wrong_identity.into_iter().collect::<Vec<_>>().join("; ")
        );
    }
    if !uncovered.is_empty() {
        bail!(
            "granted only through another component's role (the sidecars share a ServiceAccount; its own role lacks the rule): {}",
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
        let owners = owners(role);
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
                .any(|(who, grant)| owners.contains(&who.as_str()) && grants(rule, grant));
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

/// Whether one of `who`'s own roles grants `grant`: a ClusterRole, or a
/// Role of the request's namespace.
fn own_roles_cover(lab: &KubeLab, who: &str, namespace: Option<&str>, grant: &Grant) -> bool {
    lab.rendered.roles.iter().any(|role| {
        let applies = role["kind"] == "ClusterRole"
            || (namespace.is_some() && role["metadata"]["namespace"].as_str() == namespace);
        applies
            && owners(role).contains(&who)
            && role["rules"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|rule| grants(rule, grant))
    })
}

/// The components a role is for: a ClusterRole's `csi-scsi-<component>`;
/// for a Role, the holders of the ServiceAccount it is bound to (as
/// deploy/rbac/controller.yaml binds them).
fn owners(role: &serde_json::Value) -> Vec<&str> {
    let name = role["metadata"]["name"].as_str().unwrap_or_default();
    match (role["kind"].as_str(), name) {
        (Some("ClusterRole"), _) => vec![name.strip_prefix("csi-scsi-").unwrap_or(name)],
        (_, "csi-scsi-proxy" | "csi-scsi-chap-secrets") => vec!["proxy"],
        (_, "csi-scsi-sidecars") => vec!["provisioner", "attacher", "resizer"],
        _ => Vec::new(),
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
