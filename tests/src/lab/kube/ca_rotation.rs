//! The CA rotation of docs/certificates.md, as an operator runs it on a
//! live cluster with enrolled agents: `csi-scsi-certs` output applied with
//! kubectl, three times (the new CA trusted beside the old; the new CA
//! signing and the proxy's certificate from it; the old CA dropped). After
//! each step the leading proxy has reloaded its signer and renewed every
//! agent onto the new bundle (`csi_scsi_enrolment_agents_on_other_trust`
//! back at 0), and every proxy and agent shows the step's bundle
//! (`csi_scsi_trust_bundle_info`); across the whole rotation no agent call the proxies
//! made failed (`csi_scsi_agent_client_handling_seconds_count` by code),
//! while discovery kept calling every agent. The last step of the lab: the
//! lab's own CA (`lab.pki`) is left behind.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use csi_scsi_certs::CertificateAuthority;

use super::KubeLab;
use super::scenario::lease_holder;
use crate::binaries::binary;

/// Long enough for kubelet to update three Secret volumes (its sync is 5 s
/// here) and the leader's passes (every 10 s) to renew every agent.
const STEP: Duration = Duration::from_secs(120);

/// Runs the rotation; returns a summary.
pub async fn ca_rotation(lab: &KubeLab) -> anyhow::Result<String> {
    let ns = lab.namespace.clone();
    let old = lab.lab.pki.ca_dir();
    let new = lab.lab.config.dir.join("pki-rotated/ca");
    certs(&["init-ca", "--out", &new.display().to_string(), "--force"])?;
    let (old_crt, new_crt) = (old.join("ca.crt"), new.join("ca.crt"));
    let before = agent_calls(lab, &ns)?;
    let marks = log_marks(lab, &ns)?;
    let steps: [(&str, &Path, Option<&Path>); 3] = [
        ("the new CA trusted beside the old", &old, Some(&new_crt)),
        (
            "the new CA signs; the proxy's certificate from it",
            &new,
            Some(&old_crt),
        ),
        ("the old CA dropped", &new, None),
    ];
    let mut done = Vec::new();
    for (i, (what, signer, also)) in steps.into_iter().enumerate() {
        let started = std::time::Instant::now();
        let expected = bundle_digest(signer, also)?;
        apply_step(lab, &ns, signer, also)?;
        let signer_line = format!("trust={expected}");
        let leader = lab
            .kubectl
            .wait_for(
                &format!("step {}: the leader reloads its signer", i + 1),
                STEP,
                |k| {
                    let leader = lease_holder(k, &ns, "csi-scsi-proxy")?;
                    let log = proxy_log(lab, &leader)?;
                    let reloaded = log
                        .lines()
                        .any(|l| l.contains("the signer's CA changed") && l.contains(&signer_line));
                    Ok(reloaded.then_some(leader))
                },
            )
            .await?;
        let bundle = format!("csi_scsi_trust_bundle_info{{sha256=\"{expected}\"}} 1");
        lab.kubectl
            .wait_for(
                &format!(
                    "step {}: every proxy and agent trusts the new bundle, no agent left behind",
                    i + 1
                ),
                STEP,
                |k| {
                    let metrics = pod_metrics(k, &ns, &leader, PROXY_PORT)?;
                    if sample(&metrics, "csi_scsi_enrolment_agents_on_other_trust")? != 0.0 {
                        return Ok(None);
                    }
                    for (selector, port) in [
                        (super::pods::CONTROLLER_SELECTOR, PROXY_PORT),
                        (super::pods::AGENT_SELECTOR, AGENT_PORT),
                    ] {
                        for pod in super::pods::list(k, &ns, selector)? {
                            let name = super::pods::name(&pod);
                            if !pod_metrics(k, &ns, &name, port)?.contains(&bundle) {
                                return Ok(None);
                            }
                        }
                    }
                    Ok(Some(()))
                },
            )
            .await?;
        done.push(format!(
            "{} ({:.0} s)",
            what,
            started.elapsed().as_secs_f64()
        ));
    }
    let after = agent_calls(lab, &ns)?;
    // Any refusal between the proxies and the agents in the logs since the
    // first step: a handshake refused, a certificate not verified, a
    // proxy certificate the agent no longer trusts.
    let refusals = tls_refusals(lab, &ns, &marks)?;
    if !refusals.is_empty() {
        bail!("TLS refusals during the rotation: {}", refusals.join(" | "));
    }
    // The agent probe's Status calls have no other reason to fail than the
    // connection (Discover may fail for the array's own reasons: a login
    // the lab's array refuses on every pass).
    if after.failed_status != before.failed_status {
        bail!(
            "the proxies' Status calls to agents failed during the rotation: {:?} before, {:?} after",
            before.by_labels,
            after.by_labels
        );
    }
    if after.total <= before.total {
        bail!("no agent call during the rotation: it proves nothing");
    }
    Ok(format!(
        "{}; {} agent calls during it, no TLS refusal in any proxy's or agent's log, no Status call failed",
        done.join("; "),
        after.total - before.total
    ))
}

/// One step: the signer's Secret and the agents' enrolment ConfigMap
/// (`ca-manifests`), then the proxy's Secret (`issue-proxy`), each with
/// the other CA's certificate when `also` names it.
fn apply_step(lab: &KubeLab, ns: &str, signer: &Path, also: Option<&Path>) -> anyhow::Result<()> {
    let signer = signer.display().to_string();
    let also: Vec<String> = also
        .map(|p| vec!["--also-trust".to_owned(), p.display().to_string()])
        .unwrap_or_default();
    let also: Vec<&str> = also.iter().map(String::as_str).collect();
    let mut manifests = vec!["ca-manifests", "--ca", &signer, "--namespace", ns];
    manifests.extend(&also);
    lab.kubectl.apply(&certs(&manifests)?)?;
    let mut proxy = vec![
        "issue-proxy",
        "--ca",
        &signer,
        "--format",
        "secret",
        "--namespace",
        ns,
        "--out",
        "-",
    ];
    proxy.extend(&also);
    lab.kubectl.apply(&certs(&proxy)?)?;
    Ok(())
}

/// The digest of the bundle the signer hands out at a step.
fn bundle_digest(signer: &Path, also: Option<&Path>) -> anyhow::Result<String> {
    let mut ca = CertificateAuthority::load(&signer.join("ca.crt"), &signer.join("ca.key"))?;
    if let Some(path) = also {
        ca = ca.also_trusting(&std::fs::read_to_string(path)?, path)?;
    }
    Ok(ca.trust_digest())
}

fn certs(args: &[&str]) -> anyhow::Result<String> {
    super::super::net::sh(&binary("csi-scsi-certs").display().to_string(), args)
}

/// The log of the proxy in Pod `pod`.
fn proxy_log(lab: &KubeLab, pod: &str) -> anyhow::Result<String> {
    let node =
        super::scenario::node_of(&lab.kubectl, pod, &lab.namespace).context("the Pod's node")?;
    lab.proxy_log_of(&node, pod)
}

/// The proxy's and the agents' status ports (deploy/base).
const PROXY_PORT: u16 = 9812;
const AGENT_PORT: u16 = 9811;

/// `/metrics` of Pod `pod` on `port`, through the API server's proxy.
fn pod_metrics(k: &crate::kube::Kubectl, ns: &str, pod: &str, port: u16) -> anyhow::Result<String> {
    k.run(&[
        "get",
        "--raw",
        &format!("/api/v1/namespaces/{ns}/pods/{pod}:{port}/proxy/metrics"),
    ])
}

/// The value of the unlabelled series `name`.
fn sample(metrics: &str, name: &str) -> anyhow::Result<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .with_context(|| format!("no {name} in /metrics"))?
        .trim()
        .parse()
        .with_context(|| format!("{name} is not a number"))
}

/// Agent calls the proxies made, all and failed (any code but OK).
struct Calls {
    total: u64,
    /// Failed calls of the agent probe (`Status`).
    failed_status: u64,
    /// Failed calls by their labels (method, code), for the message.
    by_labels: std::collections::BTreeMap<String, u64>,
}

fn agent_calls(lab: &KubeLab, ns: &str) -> anyhow::Result<Calls> {
    let mut calls = Calls {
        total: 0,
        failed_status: 0,
        by_labels: std::collections::BTreeMap::new(),
    };
    for pod in super::pods::list(&lab.kubectl, ns, super::pods::CONTROLLER_SELECTOR)? {
        let metrics = pod_metrics(&lab.kubectl, ns, &super::pods::name(&pod), PROXY_PORT)?;
        for line in metrics.lines() {
            let Some(rest) = line.strip_prefix("csi_scsi_agent_client_handling_seconds_count{")
            else {
                continue;
            };
            let (labels, value) = rest.split_once("} ").context("a sample")?;
            let n: f64 = value.trim().parse().context("a count")?;
            calls.total += n as u64;
            if !labels.contains("code=\"OK\"") {
                if labels.contains("method=\"Status\"") {
                    calls.failed_status += n as u64;
                }
                *calls.by_labels.entry(labels.to_owned()).or_default() += n as u64;
            }
        }
    }
    Ok(calls)
}

/// What a refusal between a proxy and an agent logs (daemon's agent
/// transport, the agent's per-request check, rustls through the proxy).
const TLS_REFUSALS: &[&str] = &[
    "TLS handshake refused",
    "no longer verifies against this agent's trust material",
    "invalid peer certificate",
    "but the peer's certificate names",
];

/// How many lines each driver container's log has now, by Pod.
fn log_marks(lab: &KubeLab, ns: &str) -> anyhow::Result<Vec<(String, usize)>> {
    Ok(driver_logs(lab, ns)?
        .into_iter()
        .map(|(pod, log)| (pod, log.lines().count()))
        .collect())
}

/// Lines past `marks` naming a TLS refusal.
fn tls_refusals(lab: &KubeLab, ns: &str, marks: &[(String, usize)]) -> anyhow::Result<Vec<String>> {
    let mut found = Vec::new();
    for (pod, log) in driver_logs(lab, ns)? {
        let from = marks.iter().find(|(p, _)| *p == pod).map_or(0, |(_, n)| *n);
        for line in log.lines().skip(from) {
            if TLS_REFUSALS.iter().any(|r| line.contains(r)) {
                found.push(format!(
                    "{pod}: {}",
                    line.chars().take(300).collect::<String>()
                ));
            }
        }
    }
    Ok(found)
}

/// The logs of every proxy and agent container, by Pod.
fn driver_logs(lab: &KubeLab, ns: &str) -> anyhow::Result<Vec<(String, String)>> {
    let mut logs = Vec::new();
    for pod in super::pods::list(&lab.kubectl, ns, super::pods::CONTROLLER_SELECTOR)? {
        let node = super::api::scheduled_on(&pod).context("the Pod's node")?;
        let name = super::pods::name(&pod);
        logs.push((name.clone(), lab.proxy_log_of(node, &name)?));
    }
    for node in &lab.nodes {
        logs.push((
            format!("agent on {}", node.name),
            lab.agent_log(&node.name)?,
        ));
    }
    Ok(logs)
}
