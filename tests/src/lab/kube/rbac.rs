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
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use kube::core::DynamicObject;

use super::KubeLab;
use super::audit::AuditEvent;

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

/// A role the install grants: cluster-wide, or in one namespace.
#[derive(Clone, Debug)]
pub enum GrantingRole {
    /// A ClusterRole.
    Cluster(ClusterRole),
    /// A Role.
    Namespaced(Role),
}

impl GrantingRole {
    /// The role a rendered object is, if it is one.
    pub fn from_object(object: &DynamicObject) -> anyhow::Result<Option<Self>> {
        let kind = object.types.as_ref().map_or("", |t| t.kind.as_str());
        Ok(match kind {
            "ClusterRole" => Some(Self::Cluster(object.clone().try_parse()?)),
            "Role" => Some(Self::Namespaced(object.clone().try_parse()?)),
            _ => None,
        })
    }

    fn name(&self) -> &str {
        match self {
            Self::Cluster(r) => r.metadata.name.as_deref(),
            Self::Namespaced(r) => r.metadata.name.as_deref(),
        }
        .unwrap_or_default()
    }

    fn rules(&self) -> &[PolicyRule] {
        match self {
            Self::Cluster(r) => r.rules.as_deref(),
            Self::Namespaced(r) => r.rules.as_deref(),
        }
        .unwrap_or_default()
    }

    /// Whether it applies to a request in `namespace` (None: cluster-scoped).
    fn applies_in(&self, namespace: Option<&str>) -> bool {
        match self {
            Self::Cluster(_) => true,
            Self::Namespaced(r) => {
                namespace.is_some() && r.metadata.namespace.as_deref() == namespace
            }
        }
    }
}

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
        let Some(e) = AuditEvent::parse(line) else {
            continue;
        };
        let username = e.user.username.as_str();
        if e.stage != "ResponseComplete" || (username != proxy_user && username != sidecars_user) {
            continue;
        }
        let r = e.object_ref.as_ref();
        let mut resource = r.map(|r| r.resource.clone()).unwrap_or_default();
        if let Some(sub) = r.and_then(|r| r.subresource.as_deref()) {
            resource = format!("{resource}/{sub}");
        }
        let grant = (
            r.map(|r| r.api_group.clone()).unwrap_or_default(),
            resource,
            e.verb.clone(),
        );
        let who = component(&e.user_agent);
        let expected = if who == "proxy" {
            &proxy_user
        } else {
            &sidecars_user
        };
        if username != expected {
            wrong_identity.insert(format!("{who} as {username}"));
        }
        if e.response_status.code == 403 {
            refused.push(format!("{who} {} {}/{}", grant.2, grant.0, grant.1));
        }
        let namespace = r.and_then(|r| r.namespace.as_deref());
        // Discovery (`/api`, `/version`) has no objectRef: the built-in
        // system:discovery role grants it to everyone, not ours.
        if r.is_some() && !own_roles_cover(lab, who, namespace, &grant) {
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
        let name = role.name();
        let owners = owners(role);
        for rule in role.rules() {
            let groups = rule.api_groups.clone().unwrap_or_default();
            let resources = rule.resources.clone().unwrap_or_default();
            let verbs = &rule.verbs;
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
        role.applies_in(namespace)
            && owners(role).contains(&who)
            && role.rules().iter().any(|rule| grants(rule, grant))
    })
}

/// The components a role is for: a ClusterRole's `csi-scsi-<component>`;
/// for a Role, the holders of the ServiceAccount it is bound to (as
/// deploy/rbac/controller.yaml binds them).
fn owners(role: &GrantingRole) -> Vec<&str> {
    let name = role.name();
    match (role, name) {
        (GrantingRole::Cluster(_), _) => vec![name.strip_prefix("csi-scsi-").unwrap_or(name)],
        (_, "csi-scsi-proxy" | "csi-scsi-chap-secrets") => vec!["proxy"],
        (_, "csi-scsi-sidecars") => vec!["provisioner", "attacher", "resizer"],
        (_, "csi-scsi-provisioner-capacity") => vec!["provisioner"],
        _ => Vec::new(),
    }
}

/// Whether `rule` grants `grant` (group, resource, verb).
fn grants(rule: &PolicyRule, (group, resource, verb): &Grant) -> bool {
    let has = |list: &Option<Vec<String>>, x: &String| list.as_ref().is_some_and(|l| l.contains(x));
    has(&rule.api_groups, group) && has(&rule.resources, resource) && rule.verbs.contains(verb)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_grants_only_its_groups_resources_and_verbs() {
        let rule = PolicyRule {
            api_groups: Some(vec!["".into()]),
            resources: Some(vec!["events".into()]),
            verbs: vec!["create".into(), "patch".into()],
            ..PolicyRule::default()
        };
        let grant = |g: &str, r: &str, v: &str| (g.to_owned(), r.to_owned(), v.to_owned());
        let cases = [
            (grant("", "events", "create"), true),
            (grant("", "events", "patch"), true),
            (grant("", "events", "delete"), false),
            (grant("", "pods", "create"), false),
            (grant("events.k8s.io", "events", "create"), false),
        ];
        for (g, want) in cases {
            assert_eq!(grants(&rule, &g), want, "{g:?}");
        }
    }
}
