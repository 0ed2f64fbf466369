//! The enrolment step: what the agents' certificates are (each enrolled by
//! the proxy with its projected token, naming its node and its Node's UID,
//! renewed during the run), and what the proxy refuses: Pods that try to
//! enrol as node-b's agent with node-a's agent token, with another
//! ServiceAccount's token, or as a Pod that is not the DaemonSet's. The
//! impostors run the real agent image as Pods, labelled like the agents
//! so the proxy's directory sees them, and owned by a ConfigMap so the
//! DaemonSet does not adopt them.

use std::time::Duration;

use anyhow::Context;
use csi_scsi_certs::{Identity, TrustDomain, identity_of, node_uid_of};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use super::{KubeLab, LAB_TAG, pods};
use crate::kube::Kubectl;

/// The enrolment audience of deploy/'s projected token.
const AUDIENCE: &str = "csi-scsi-enrolment";
/// Owns the impostor Pods (their deletion removes them).
const OWNER: &str = "lab-impostors";

/// An impostor: its name, its ServiceAccount, and the token it presents
/// (`None`: its own projected one).
struct Impostor {
    name: &'static str,
    service_account: &'static str,
    borrowed: bool,
    /// What the proxy must log.
    refusal: String,
}

/// Runs the step; returns its detail line.
pub async fn enrolment(lab: &mut KubeLab) -> anyhow::Result<String> {
    let k = lab.kubectl.clone();
    let ns = lab.namespace.clone();
    let certs = certificates(lab)?;

    let (node_a, node_b) = (lab.nodes[0].name.clone(), lab.nodes[1].name.clone());
    let agent_a = pods::name(&pods::agent_on(&k, &ns, &node_a)?);
    k.apply(&format!(
        r#"{{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {{"name": "{OWNER}", "namespace": "{ns}"}}}}"#
    ))?;
    let owner_uid = k.get_json(&["configmap", OWNER, "-n", &ns])?["metadata"]["uid"]
        .as_str()
        .context("ConfigMap uid")?
        .to_owned();
    k.apply(&format!(
        r#"{{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {{"name": "lab-impostor", "namespace": "{ns}"}}}}"#
    ))?;
    // node-a's agent Pod's token, as a stolen one would be carried over.
    let stolen = k.run(&[
        "create",
        "token",
        "csi-scsi-node",
        "-n",
        &ns,
        "--audience",
        AUDIENCE,
        "--bound-object-kind",
        "Pod",
        "--bound-object-name",
        &agent_a,
    ])?;
    k.apply(
        &serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "lab-stolen-token", "namespace": ns},
            "stringData": {"token": stolen.trim()},
        })
        .to_string(),
    )?;

    let impostors = [
        Impostor {
            name: "lab-impostor-stolen",
            service_account: "csi-scsi-node",
            borrowed: true,
            refusal: format!(
                "enrolment of {node_b} refused: the token's Pod runs on node {node_a}, but the agent asks for node {node_b}"
            ),
        },
        Impostor {
            name: "lab-impostor-other-sa",
            service_account: "lab-impostor",
            borrowed: false,
            refusal: format!(
                "enrolment of {node_b} refused: the token is system:serviceaccount:{ns}:lab-impostor's, not the agent's ServiceAccount"
            ),
        },
        Impostor {
            name: "lab-impostor-not-ds",
            service_account: "csi-scsi-node",
            borrowed: false,
            refusal: format!(
                "enrolment of {node_b} refused: the token's Pod {ns}/lab-impostor-not-ds is not a Pod of DaemonSet csi-scsi-node on node {node_b}: its controller is not that DaemonSet"
            ),
        },
    ];
    for i in &impostors {
        k.apply(&impostor_pod(i, &ns, &node_b, &owner_uid))?;
    }
    let t = std::time::Instant::now();
    let logs = k
        .wait_for(
            "the proxy's three refusals",
            Duration::from_secs(90),
            |_| {
                let logs = lab.proxy_logs()?;
                Ok(impostors
                    .iter()
                    .all(|i| logs.contains(&i.refusal))
                    .then_some(logs))
            },
        )
        .await?;
    let refused_in = t.elapsed();
    // Nothing was signed for them: none became Ready (an agent is Ready
    // only with a certificate), and the real node-b agent still is.
    for i in &impostors {
        let pod = k.get_json(&["pod", i.name, "-n", &ns])?;
        anyhow::ensure!(
            !super::condition_true(&pod, "Ready"),
            "{} is Ready: it has a certificate",
            i.name
        );
    }
    let real_b = pods::agent_on(&k, &ns, &node_b)?;
    anyhow::ensure!(
        super::condition_true(&real_b, "Ready"),
        "node-b's agent is no longer Ready"
    );
    k.run(&["delete", "configmap", OWNER, "-n", &ns])?;
    k.run(&["delete", "secret", "lab-stolen-token", "-n", &ns])?;
    for i in &impostors {
        k.run(&[
            "delete",
            "pod",
            i.name,
            "-n",
            &ns,
            "--wait=true",
            "--timeout=60s",
            "--ignore-not-found",
        ])?;
    }
    // Step "node deleted": node-c's Node came back with a new UID, and
    // node-c's certificate names that UID (checked above): it enrolled
    // afresh. The proxy's log says why the old one was refused, if the
    // container that saw it is still the one logging (kubelet keeps the
    // logs of a Pod's current and last container only).
    let node_c = lab.nodes[2].name.clone();
    let stale = logs.contains(&format!(
        "the certificate of {node_c} was issued to Node UID"
    ));
    let enrolled = logs.matches("enrolled the agent").count();
    let renewed = logs.matches("renewed the agent's certificate").count();
    // 120 s certificates renewed with 40 s left (the lab overlay): each
    // agent about every 80 s, so the logs of a proxy container that has run
    // a minute or more show renewals (every node's certificate being
    // current, checked above, says the rest were renewed too).
    anyhow::ensure!(renewed >= 1, "no renewal in the proxy's logs");
    Ok(format!(
        "{certs}\n      {node_c} enrolled again after its Node was re-created ({}); the current proxy containers' logs: {enrolled} enrolments, {renewed} renewals; impostors on {node_b} refused within {:.1}s, none Ready:\n      {}",
        if stale {
            "its old certificate, naming the deleted Node's UID, refused, as the proxy's log says"
        } else {
            "its certificate names the new Node's UID"
        },
        refused_in.as_secs_f64(),
        impostors
            .iter()
            .map(|i| i.refusal.as_str())
            .collect::<Vec<_>>()
            .join("\n      ")
    ))
}

/// Each node's agent certificate as its hostPath holds it: names the
/// node and its Node's UID now; from the CA, not made by hand.
fn certificates(lab: &KubeLab) -> anyhow::Result<String> {
    let domain = TrustDomain::new("csi-scsi.local")?;
    let mut out = Vec::new();
    for n in &lab.nodes {
        let path = lab
            .lab
            .config
            .dir
            .join("nodes")
            .join(&n.name)
            .join("host/var/lib/csi-scsi-agent/tls/tls.crt");
        let pem = std::fs::read(&path).with_context(|| format!("{} not enrolled", n.name))?;
        let der = CertificateDer::from_pem_slice(&pem).context("certificate PEM")?;
        anyhow::ensure!(
            identity_of(&der, &domain) == Some(Identity::Node(n.name.clone())),
            "{}'s certificate names another identity",
            n.name
        );
        let uid = node_uid(&lab.kubectl, &n.name)?;
        anyhow::ensure!(
            node_uid_of(&der).as_deref() == Some(uid.as_str()),
            "{}'s certificate names Node UID {:?}, the Node is {uid}",
            n.name,
            node_uid_of(&der)
        );
        let (_, cert) = x509_parser::parse_x509_certificate(&der).context("x509")?;
        // notBefore is set back 5 minutes for clock skew.
        let life = cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp();
        out.push(format!("{} ({} s)", n.name, life - 300));
    }
    Ok(format!(
        "every agent enrolled with its projected token; certificates name the node and its Node UID, lifetime: {}",
        out.join(", ")
    ))
}

fn node_uid(k: &Kubectl, node: &str) -> anyhow::Result<String> {
    k.get_json(&["node", node])?["metadata"]["uid"]
        .as_str()
        .map(str::to_owned)
        .context("Node uid")
}

/// The agent image, as node-b's agent claims to be, with the impostor's
/// token; labelled like the agents, owned by the ConfigMap.
fn impostor_pod(i: &Impostor, ns: &str, node: &str, owner_uid: &str) -> String {
    let token_volume = if i.borrowed {
        serde_json::json!({"name": "token", "secret": {"secretName": "lab-stolen-token"}})
    } else {
        serde_json::json!({"name": "token", "projected": {"sources": [
            {"serviceAccountToken": {"audience": AUDIENCE, "expirationSeconds": 3600, "path": "token"}}
        ]}})
    };
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": i.name, "namespace": ns,
            "labels": {"app.kubernetes.io/name": "csi-scsi-node", "lab": "impostor"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": OWNER,
                                 "uid": owner_uid, "controller": true}],
        },
        "spec": {
            "nodeName": node,
            "serviceAccountName": i.service_account,
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "csi-scsi-agent",
                "image": format!("csi-scsi/agent:{LAB_TAG}"),
                "imagePullPolicy": "IfNotPresent",
                "args": [
                    format!("--node-name={node}"),
                    "--csi-endpoint=unix:///run/csi/csi.sock",
                    "--kubelet-registration=off",
                    "--kubelet-dir=/run/kubelet",
                    "--agent-listen=$(POD_IP):9810",
                    "--status-listen=$(POD_IP):9811",
                    "--tls-dir=/run/tls",
                    "--state-dir=/run/state",
                    "--enrol-token-file=/run/token/token",
                    "--enrol-ca-file=/etc/csi-scsi/ca/ca.crt",
                ],
                "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                "ports": [{"name": "agent-api", "containerPort": 9810}],
                "readinessProbe": {"httpGet": {"path": "/readyz", "port": 9811}, "periodSeconds": 5},
                "volumeMounts": [
                    {"name": "scratch", "mountPath": "/run"},
                    {"name": "token", "mountPath": "/run/token", "readOnly": true},
                    {"name": "ca", "mountPath": "/etc/csi-scsi/ca", "readOnly": true},
                ],
            }],
            "volumes": [
                {"name": "scratch", "emptyDir": {}},
                token_volume,
                {"name": "ca", "configMap": {"name": "csi-scsi-ca"}},
            ],
        },
    })
    .to_string()
}
