//! The API server's audit log (audit.k8s.io/v1 Events, one JSON object a
//! line), as much of each event as the lab's checks and the bench read.

use serde::Deserialize;

/// One line of the API server's audit log (audit.k8s.io/v1 Event), as
/// much of it as the check reads; absent fields read empty.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct AuditEvent {
    /// The stage (`ResponseComplete` once answered).
    pub stage: String,
    /// Who made the request.
    pub user: AuditUser,
    /// The verb.
    pub verb: String,
    /// The client's User-Agent.
    pub user_agent: String,
    /// Absent for discovery (`/api`, `/version`).
    pub object_ref: Option<AuditObject>,
    /// How the API server answered.
    pub response_status: AuditStatus,
}

/// Who made the request.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct AuditUser {
    /// The user name (`system:serviceaccount:<ns>:<name>`).
    pub username: String,
}

/// What the request was about.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct AuditObject {
    /// The API group (empty: core).
    pub api_group: String,
    /// The resource (plural).
    pub resource: String,
    /// The subresource, if any.
    pub subresource: Option<String>,
    /// The namespace (None: cluster-scoped).
    pub namespace: Option<String>,
}

/// How the API server answered.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct AuditStatus {
    /// The HTTP status code.
    pub code: i32,
}

impl AuditEvent {
    /// The event on one line of the log; None for a line that is not one.
    pub fn parse(line: &str) -> Option<Self> {
        serde_json::from_str(line).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_audit_line_reads_as_the_event_it_records() {
        let line = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","stage":"ResponseComplete",
            "verb":"patch","user":{"username":"system:serviceaccount:ns:csi-scsi-proxy","groups":["a"]},
            "userAgent":"csi-scsi-proxy/0.1","objectRef":{"resource":"scsitargets","subresource":"status",
            "apiGroup":"csi-scsi.io","apiVersion":"v1alpha1","name":"array-a"},"responseStatus":{"metadata":{},"code":403}}"#;
        let e = AuditEvent::parse(line).expect("an audit event");
        assert_eq!(e.stage, "ResponseComplete");
        assert_eq!(e.user.username, "system:serviceaccount:ns:csi-scsi-proxy");
        assert_eq!(e.response_status.code, 403);
        let r = e.object_ref.expect("objectRef");
        assert_eq!(
            (
                r.api_group.as_str(),
                r.resource.as_str(),
                r.subresource.as_deref(),
                r.namespace
            ),
            ("csi-scsi.io", "scsitargets", Some("status"), None)
        );
        let discovery: AuditEvent =
            serde_json::from_str(r#"{"stage":"ResponseComplete","verb":"get"}"#)
                .expect("discovery");
        assert!(discovery.object_ref.is_none());
        assert_eq!(discovery.user_agent, "");
    }
}
