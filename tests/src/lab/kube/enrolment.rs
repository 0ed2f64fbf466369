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

use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar,
    EnvVarSource, HTTPGetAction, Node, ObjectFieldSelector, Pod, PodSpec, Probe,
    ProjectedVolumeSource, Secret, SecretVolumeSource, ServiceAccount,
    ServiceAccountTokenProjection, Volume, VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;

use super::api::{Typed, pod_ready, uid_of};
use super::{KubeLab, LAB_TAG, pods};
use crate::kube::Kubectl;

/// The enrolment audience of deploy/'s projected token.
const AUDIENCE: &str = "csi-scsi-enrolment";
/// Owns the impostor Pods (their deletion removes them).
const OWNER: &str = "lab-impostors";
/// The Secret holding node-a's agent token, as a thief would carry it.
const STOLEN: &str = "lab-stolen-token";

/// An impostor: its name, its ServiceAccount, and the token it presents
/// (`None`: its own projected one).
struct Impostor {
    name: &'static str,
    service_account: &'static str,
    borrowed: bool,
    /// What the proxy must log.
    refusal: String,
}

/// Runs the step; returns its detail line. `full_run`: the steps before
/// it deleted and re-created node-c's Node and ran long enough for a
/// renewal (the short helm run has neither; its CA rotation step renews).
pub async fn enrolment(lab: &mut KubeLab, full_run: bool) -> anyhow::Result<String> {
    let k = lab.kubectl.clone();
    let ns = lab.namespace.clone();
    let certs = certificates(lab)?;

    let (node_a, node_b) = (lab.nodes[0].name.clone(), lab.nodes[1].name.clone());
    let agent_a = pods::name(&pods::agent_on(&k, &ns, &node_a)?);
    let meta = |name: &str| ObjectMeta {
        name: Some(name.into()),
        namespace: Some(ns.clone()),
        ..ObjectMeta::default()
    };
    k.apply_object(&ConfigMap {
        metadata: meta(OWNER),
        ..ConfigMap::default()
    })?;
    let owner_uid = Some(uid_of(&k.object::<ConfigMap>(OWNER, Some(&ns))?).to_owned())
        .filter(|u| !u.is_empty())
        .context("ConfigMap uid")?;
    k.apply_object(&ServiceAccount {
        metadata: meta("lab-impostor"),
        ..ServiceAccount::default()
    })?;
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
    k.apply_object(&Secret {
        metadata: meta(STOLEN),
        string_data: Some(BTreeMap::from([(
            "token".to_owned(),
            stolen.trim().to_owned(),
        )])),
        ..Secret::default()
    })?;

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
        k.apply_object(&impostor_pod(i, &ns, &node_b, &owner_uid))?;
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
        let pod = k.object::<Pod>(i.name, Some(&ns))?;
        anyhow::ensure!(
            !pod_ready(&pod),
            "{} is Ready: it has a certificate",
            i.name
        );
    }
    let real_b = pods::agent_on(&k, &ns, &node_b)?;
    anyhow::ensure!(pod_ready(&real_b), "node-b's agent is no longer Ready");
    k.run(&["delete", "configmap", OWNER, "-n", &ns])?;
    k.run(&["delete", "secret", STOLEN, "-n", &ns])?;
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
    let enrolled = logs.matches("enrolled the agent").count();
    let renewed = logs.matches("renewed the agent's certificate").count();
    let (recreated, renewals) = if full_run {
        // Step "node deleted": node-c's Node came back with a new UID, and
        // node-c's certificate names that UID (checked above): it enrolled
        // afresh. The proxy's log says why the old one was refused, if the
        // container that saw it is still the one logging (kubelet keeps the
        // logs of a Pod's current and last container only).
        let node_c = lab.nodes[2].name.clone();
        let stale = logs.contains(&format!(
            "the certificate of {node_c} was issued to Node UID"
        ));
        // 120 s certificates renewed with 40 s left (the lab overlay): each
        // agent about every 80 s, so the logs of a proxy container that has
        // run a minute or more show renewals (every node's certificate
        // being current, checked above, says the rest were renewed too).
        anyhow::ensure!(renewed >= 1, "no renewal in the proxy's logs");
        let why = if stale {
            "its old certificate, naming the deleted Node's UID, refused, as the proxy's log says"
        } else {
            "its certificate names the new Node's UID"
        };
        (
            format!("{node_c} enrolled again after its Node was re-created ({why}); "),
            "",
        )
    } else {
        (String::new(), " (renewal is the CA rotation step's)")
    };
    Ok(format!(
        "{certs}\n      {recreated}the current proxy containers' logs: {enrolled} enrolments, {renewed} renewals{renewals}; impostors on {node_b} refused within {:.1}s, none Ready:\n      {}",
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
    Some(uid_of(&k.object::<Node>(node, None)?).to_owned())
        .filter(|u| !u.is_empty())
        .context("Node uid")
}

/// The agent image, as node-b's agent claims to be, with the impostor's
/// token; labelled like the agents, owned by the ConfigMap.
fn impostor_pod(i: &Impostor, ns: &str, node: &str, owner_uid: &str) -> Pod {
    let token_volume = if i.borrowed {
        Volume {
            name: "token".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(STOLEN.into()),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        }
    } else {
        Volume {
            name: "token".into(),
            projected: Some(ProjectedVolumeSource {
                sources: Some(vec![VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        audience: Some(AUDIENCE.into()),
                        expiration_seconds: Some(3600),
                        path: "token".into(),
                    }),
                    ..VolumeProjection::default()
                }]),
                ..ProjectedVolumeSource::default()
            }),
            ..Volume::default()
        }
    };
    let mount = |name: &str, path: &str, read_only: bool| VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    };
    let args = [
        format!("--node-name={node}"),
        "--csi-endpoint=unix:///run/csi/csi.sock".into(),
        "--kubelet-registration=off".into(),
        "--kubelet-dir=/run/kubelet".into(),
        "--agent-listen=$(POD_IP):9810".into(),
        "--status-listen=$(POD_IP):9811".into(),
        "--tls-dir=/run/tls".into(),
        "--state-dir=/run/state".into(),
        "--enrol-token-file=/run/token/token".into(),
        "--enrol-ca-file=/etc/csi-scsi/ca/ca.crt".into(),
    ];
    let container = Container {
        name: "csi-scsi-agent".into(),
        image: Some(format!("csi-scsi/agent:{LAB_TAG}")),
        image_pull_policy: Some("IfNotPresent".into()),
        args: Some(args.into()),
        env: Some(vec![EnvVar {
            name: "POD_IP".into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "status.podIP".into(),
                    ..ObjectFieldSelector::default()
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        }]),
        ports: Some(vec![ContainerPort {
            name: Some("agent-api".into()),
            container_port: 9810,
            ..ContainerPort::default()
        }]),
        readiness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/readyz".into()),
                port: IntOrString::Int(9811),
                ..HTTPGetAction::default()
            }),
            period_seconds: Some(5),
            ..Probe::default()
        }),
        volume_mounts: Some(vec![
            mount("scratch", "/run", false),
            mount("token", "/run/token", true),
            mount("ca", "/etc/csi-scsi/ca", true),
        ]),
        ..Container::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(i.name.into()),
            namespace: Some(ns.into()),
            labels: Some(BTreeMap::from([
                ("app.kubernetes.io/name".into(), "csi-scsi-node".into()),
                ("lab".into(), "impostor".into()),
            ])),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                name: OWNER.into(),
                uid: owner_uid.into(),
                controller: Some(true),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            service_account_name: Some(i.service_account.into()),
            automount_service_account_token: Some(false),
            containers: vec![container],
            volumes: Some(vec![
                Volume {
                    name: "scratch".into(),
                    empty_dir: Some(EmptyDirVolumeSource::default()),
                    ..Volume::default()
                },
                token_volume,
                Volume {
                    name: "ca".into(),
                    config_map: Some(ConfigMapVolumeSource {
                        name: "csi-scsi-ca".into(),
                        ..ConfigMapVolumeSource::default()
                    }),
                    ..Volume::default()
                },
            ]),
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}
