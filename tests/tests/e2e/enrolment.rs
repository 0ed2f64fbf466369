//! Agents get their certificates from the proxy (embedded mode: one-time
//! join tokens): real processes, the real `csi-scsi-certs join-token`, real
//! handshakes. An agent started with no certificate enrols and serves; a
//! reused, another node's or an expired token is refused and nothing is
//! signed; renewals under continuous calls drop none.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use csi_scsi_certs::{MaterialPaths, MaterialStore, Role, TrustDomain, identity_of};
use csi_scsi_daemon::agent_channel;
use csi_scsi_proto::agent::CertificateStatusRequest;
use csi_scsi_proto::agent::enrolment_client::EnrolmentClient;
use csi_scsi_tests::binaries::binary;
use csi_scsi_tests::daemon::Daemon;
use csi_scsi_tests::patience::eventually;

use crate::observability::{scrape, status_addr};
use crate::support::{Agent, Env, cert_der, check_channel, client_config, health_check};

/// `csi-scsi-certs join-token`: the token, written to a 0600 file.
fn join_token(env: &Env, node: &str, ttl_minutes: u64, file: &str) -> (PathBuf, String) {
    let out = Command::new(binary("csi-scsi-certs"))
        .args(["join-token", "--node", node, "--ttl-minutes"])
        .arg(ttl_minutes.to_string())
        .arg("--dir")
        .arg(env.path("join-tokens"))
        .output()
        .expect("csi-scsi-certs join-token");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8(out.stdout)
        .expect("utf-8")
        .trim()
        .to_owned();
    let path = env.path(file);
    csi_scsi_certs::write_private_file(&path, &token).expect("token file");
    (path, token)
}

/// An agent with an empty --tls-dir that enrols with `token_file`.
async fn enrolling_agent(env: &Env, node: &str, token_file: &Path) -> (Agent, PathBuf) {
    let tls = env.path(&format!("{node}-enrolled-tls"));
    std::fs::create_dir_all(&tls).expect("tls dir");
    let ca = env.pki.ca_dir().join("ca.crt");
    let agent = env
        .start_agent_with(
            node,
            &tls,
            &[
                "--join-token-file",
                &token_file.display().to_string(),
                "--enrol-ca-file",
                &ca.display().to_string(),
            ],
        )
        .await;
    (agent, tls)
}

/// The proxy with the CA as its signer, the join tokens, and `agents`.
fn signing_proxy(env: &Env, agents: &[(&str, &Agent)], lifetime: u64) -> Daemon {
    let tls = env.pki.issue_proxy("proxy-tls");
    signing_proxy_at(env, agents, lifetime, &env.pki.ca_dir(), &tls)
}

/// [`signing_proxy`] with the signer's files in `signer` and the proxy's
/// own in `tls`, both re-read within a second of a change.
fn signing_proxy_at(
    env: &Env,
    agents: &[(&str, &Agent)],
    lifetime: u64,
    signer: &Path,
    tls: &Path,
) -> Daemon {
    let list: String = agents
        .iter()
        .map(|(node, a)| format!("{node} {}\n", a.api))
        .collect();
    std::fs::write(env.path("agents.txt"), list).expect("agents file");
    let args: Vec<String> = [
        "--csi-endpoint",
        &env.path("proxy.sock").display().to_string(),
        "--tls-dir",
        &tls.display().to_string(),
        "--store",
        &env.path("inventory.db").display().to_string(),
        "--agents-file",
        &env.path("agents.txt").display().to_string(),
        "--status-listen",
        "127.0.0.1:0",
        "--signer-ca-dir",
        &signer.display().to_string(),
        "--tls-poll-interval",
        "1",
        // Its agent probe: calls over the pooled connections every second.
        "--agent-probe-interval",
        "1",
        "--join-tokens-dir",
        &env.path("join-tokens").display().to_string(),
        "--enrol-interval",
        "1",
        "--agent-cert-lifetime",
        &lifetime.to_string(),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    Daemon::spawn("csi-scsi-proxy", &args, &env.path("proxy.log"))
}

fn proxy_store(env: &Env) -> std::sync::Arc<MaterialStore> {
    MaterialStore::load(
        MaterialPaths::in_dir(&env.path("proxy-tls")),
        Role::Proxy,
        TrustDomain::new("csi-scsi.local").expect("domain"),
    )
    .expect("proxy material")
}

#[tokio::test]
async fn an_agent_without_a_certificate_enrols_with_its_join_token_and_serves() {
    let env = Env::new();
    let (token_file, token) = join_token(&env, "node-a", 60, "node-a.token");
    let (agent, tls) = enrolling_agent(&env, "node-a", &token_file).await;
    // Before: no certificate, and /readyz would say so; the agent API
    // presents nothing a proxy trusts.
    assert!(!tls.join("tls.crt").exists());
    let proxy = signing_proxy(&env, &[("node-a", &agent)], 3600);

    eventually("the agent's certificate, signed by the proxy", || async {
        tls.join("tls.crt").exists().then_some(())
    })
    .await;
    let leaf = cert_der(&tls.join("tls.crt"));
    assert_eq!(
        identity_of(&leaf, &TrustDomain::new("csi-scsi.local").expect("domain")),
        Some(csi_scsi_certs::Identity::Node("node-a".into()))
    );
    // A verified mutual-TLS handshake, as every proxy call makes.
    let (config, _) = client_config(
        &env.pki.ca_dir().join("ca.crt"),
        Some(&env.path("proxy-tls")),
    );
    eventually("a verified handshake with the enrolled agent", || {
        let config = config.clone();
        async move { health_check(agent.api, "node-a", config).await.ok() }
    })
    .await;
    let log = proxy.log();
    assert!(log.contains("enrolled the agent"), "{log}");
    // The key never left the agent, and the token is in no log.
    assert!(tls.join("tls.key").exists());
    assert!(!log.contains(&token), "the proxy logged the join token");
    assert!(
        !agent.daemon.log().contains(&token),
        "the agent logged its token"
    );
}

#[tokio::test]
async fn a_reused_another_nodes_or_an_expired_join_token_is_refused_and_nothing_is_signed() {
    let env = Env::new();
    let (token_a, _) = join_token(&env, "node-a", 60, "node-a.token");
    let (for_a, _) = join_token(&env, "node-a", 60, "for-a.token");
    let (expired, _) = join_token(&env, "node-d", 0, "node-d.token");
    let (a, a_tls) = enrolling_agent(&env, "node-a", &token_a).await;
    let proxy = signing_proxy(&env, &[("node-a", &a)], 3600);
    eventually("node-a enrolled", || async {
        a_tls.join("tls.crt").exists().then_some(())
    })
    .await;
    // Then node-b presents node-a's used token, node-c a token made for
    // node-a, node-d its own, expired (the agents file changes under the
    // running proxy).
    let (b, b_tls) = enrolling_agent(&env, "node-b", &token_a).await;
    let (c, c_tls) = enrolling_agent(&env, "node-c", &for_a).await;
    let (d, d_tls) = enrolling_agent(&env, "node-d", &expired).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let list: String = [
        ("node-a", &a),
        ("node-b", &b),
        ("node-c", &c),
        ("node-d", &d),
    ]
    .iter()
    .map(|(node, agent)| format!("{node} {}\n", agent.api))
    .collect();
    std::fs::write(env.path("agents.txt"), list).expect("agents file");
    eventually("the three refusals in the proxy's log", || async {
        let log = proxy.log();
        (log.contains("enrolment of node-b refused: unknown join token, or one used already")
            && log.contains(
                "enrolment of node-c refused: the join token was made for node node-a, not node-c",
            )
            && log.contains("enrolment of node-d refused: the join token for node node-d expired"))
        .then_some(())
    })
    .await;
    // A few more passes: still nothing signed for them.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for tls in [&b_tls, &c_tls, &d_tls] {
        assert!(
            !tls.join("tls.crt").exists(),
            "{} got a certificate",
            tls.display()
        );
    }
}

#[tokio::test]
async fn certificates_renew_under_continuous_calls_and_none_fails() {
    let env = Env::new();
    let (token_file, _) = join_token(&env, "node-a", 60, "node-a.token");
    let (agent, tls) = enrolling_agent(&env, "node-a", &token_file).await;
    // 6 s certificates, renewed with 2 s left, passes every second.
    let proxy = signing_proxy(&env, &[("node-a", &agent)], 6);
    eventually("enrolled", || async {
        tls.join("tls.crt").exists().then_some(())
    })
    .await;
    let first = std::fs::read(tls.join("tls.crt")).expect("cert");
    let mut seen = vec![first];
    let start = tokio::time::Instant::now();
    let mut calls = 0u32;
    let mut failures = Vec::new();
    // New channels (new handshakes) and one kept open, all the time.
    let open = agent_channel(
        &agent.api.to_string(),
        "node-a",
        proxy_store(&env),
        Duration::from_secs(5),
    )
    .expect("channel");
    while start.elapsed() < Duration::from_secs(14) {
        let fresh = agent_channel(
            &agent.api.to_string(),
            "node-a",
            proxy_store(&env),
            Duration::from_secs(5),
        )
        .expect("channel");
        for channel in [fresh, open.clone()] {
            calls += 1;
            if let Err(e) = check_channel(channel).await {
                failures.push(e);
            }
        }
        let now = std::fs::read(tls.join("tls.crt")).expect("cert");
        if seen.last() != Some(&now) {
            seen.push(now);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        failures.is_empty(),
        "{} of {calls} calls failed: {failures:?}",
        failures.len()
    );
    assert!(
        seen.len() >= 3,
        "only {} certificates in 14 s of 6 s certificates:\n{}",
        seen.len(),
        proxy.log()
    );
    assert!(proxy.log().contains("renewed the agent's certificate"));
}

/// Publishes `files` into `dir` as kubelet updates a Secret volume: a new
/// `..v<version>` directory, then `..data` swapped onto it in one rename,
/// each file a symlink through `..data`.
fn publish(dir: &Path, version: u32, files: &[(&str, String)]) {
    std::fs::create_dir_all(dir).expect("dir");
    let stamp = format!("..v{version}");
    std::fs::create_dir(dir.join(&stamp)).expect("version dir");
    for (name, text) in files {
        std::fs::write(dir.join(&stamp).join(name), text).expect("file");
    }
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(&stamp, &tmp).expect("symlink");
    std::fs::rename(&tmp, dir.join("..data")).expect("swap ..data");
    for (name, _) in files {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{name}"), &link).expect("link");
        }
    }
}

/// The files of `csi-scsi-certs issue-proxy --ca <ca> [--also-trust ..]`.
fn proxy_files(
    env: &Env,
    ca: &Path,
    also_trust: &[&Path],
    out: &str,
) -> Vec<(&'static str, String)> {
    let dir = env.path(out);
    let mut cmd = Command::new(binary("csi-scsi-certs"));
    cmd.args(["issue-proxy", "--ca"])
        .arg(ca)
        .arg("--out")
        .arg(&dir);
    for t in also_trust {
        cmd.arg("--also-trust").arg(t);
    }
    let out = cmd.output().expect("csi-scsi-certs issue-proxy");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ["tls.crt", "tls.key", "ca.crt"]
        .into_iter()
        .map(|f| {
            (
                f,
                std::fs::read_to_string(dir.join(f)).expect("issued file"),
            )
        })
        .collect()
}

/// The signer's files: `ca`'s key, its certificate first, then `also`.
fn signer_files(ca: &Path, also: &[&Path]) -> Vec<(&'static str, String)> {
    let mut authority =
        csi_scsi_certs::CertificateAuthority::load(&ca.join("ca.crt"), &ca.join("ca.key"))
            .expect("CA");
    for other in also {
        let pem = std::fs::read_to_string(other).expect("other CA");
        authority = authority.also_trusting(&pem, other).expect("bundle");
    }
    vec![
        ("ca.crt", authority.cert_pem().to_owned()),
        ("ca.key", authority.key_pem().to_owned()),
    ]
}

/// The digest of the bundle in `pem`.
fn digest(pem: &str) -> String {
    csi_scsi_certs::trust_digest(pem.as_bytes()).expect("a bundle")
}

/// The whole procedure of docs/certificates.md ("CA rotation"), with two
/// enrolled agents called without pause through it: a new CA trusted beside
/// the old, the signer and the proxy moved to the new one, the old one
/// dropped. The proxy re-enrols every agent at each step by itself; no call
/// fails, and at the end a proxy certificate from the old CA is refused.
#[tokio::test]
async fn a_ca_rotation_reaches_every_agent_and_no_call_fails() {
    let env = Env::new();
    let nodes = ["node-a", "node-b"];
    let mut agents = Vec::new();
    for node in nodes {
        let (token, _) = join_token(&env, node, 60, &format!("{node}.token"));
        agents.push(enrolling_agent(&env, node, &token).await);
    }
    let old = env.pki.ca_dir();
    let new = env.path("new-ca");
    let init = Command::new(binary("csi-scsi-certs"))
        .args(["init-ca", "--out"])
        .arg(&new)
        .output()
        .expect("init-ca");
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    let (old_crt, new_crt) = (old.join("ca.crt"), new.join("ca.crt"));
    let (signer, tls) = (env.path("signer"), env.path("proxy-tls"));
    publish(&signer, 0, &signer_files(&old, &[]));
    publish(&tls, 0, &proxy_files(&env, &old, &[], "proxy-issued-0"));
    let listed: Vec<(&str, &Agent)> = nodes
        .iter()
        .copied()
        .zip(agents.iter().map(|(a, _)| a))
        .collect();
    // Hour-long certificates: every renewal below is the rotation's.
    let proxy = signing_proxy_at(&env, &listed, 3600, &signer, &tls);
    let trusted = |node_tls: &Path| {
        std::fs::read_to_string(node_tls.join("ca.crt"))
            .ok()
            .map(|pem| digest(&pem))
    };
    let all_trust = |want: String| {
        let dirs: Vec<PathBuf> = agents.iter().map(|(_, t)| t.clone()).collect();
        async move {
            dirs.iter()
                .all(|d| trusted(d).as_deref() == Some(want.as_str()))
                .then_some(())
        }
    };
    let only_old = digest(&std::fs::read_to_string(&old_crt).expect("old CA"));
    eventually("both agents enrolled under the old CA", || {
        all_trust(only_old.clone())
    })
    .await;
    // An agent writes its files before it serves them: wait until both
    // present what the old CA signed, or the first calls would meet an
    // agent's bootstrap certificate.
    let (old_only, _) = client_config(&old_crt, Some(&env.path("proxy-issued-0")));
    for (node, (agent, _)) in nodes.iter().zip(&agents) {
        let config = old_only.clone();
        eventually("the agent serves its certificate from the old CA", || {
            let config = config.clone();
            async move { health_check(agent.api, node, config).await.ok() }
        })
        .await;
    }

    // Calls of the agent API (its proxy-only Enrolment service) without
    // pause, each on a fresh connection with the proxy's files as they are
    // at that moment (a watcher of its own would lag the proxy's and see an
    // agent renewed by a CA it has not yet read). A call is a failure unless
    // the files moved between its load and its answer: then it is redone
    // on the new ones. The proxy's own calls (its agent probe, every second,
    // over its pooled connections) are counted from its /metrics at the end.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut callers = Vec::new();
    for (node, (agent, _)) in nodes.iter().zip(&agents) {
        let (node, api, tls, stop) = (
            node.to_string(),
            agent.api.to_string(),
            tls.clone(),
            stop.clone(),
        );
        callers.push(tokio::spawn(async move {
            let (mut calls, mut failures) = (0u32, Vec::new());
            // The link is swapped by a rename: never missing.
            let version =
                |dir: &Path| std::fs::read_link(dir.join("..data")).expect("the ..data link");
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let loaded = version(&tls);
                let store = MaterialStore::load(
                    MaterialPaths::in_dir(&tls),
                    Role::Proxy,
                    TrustDomain::new("csi-scsi.local").expect("domain"),
                )
                .expect("proxy material");
                let fresh =
                    agent_channel(&api, &node, store, Duration::from_secs(5)).expect("channel");
                let mut client = EnrolmentClient::new(fresh);
                let answer = client.certificate_status(CertificateStatusRequest {}).await;
                match answer {
                    Ok(_) => calls += 1,
                    Err(_) if version(&tls) != loaded => continue,
                    Err(s) => {
                        calls += 1;
                        failures.push(format!("{node}: {:?} {}", s.code(), s.message()));
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (calls, failures)
        }));
    }

    // 1. The new CA trusted beside the old, by the signer (so by every
    //    agent it renews). The proxy's own Secret lags: kubelet updates
    //    each Secret volume in its own time.
    publish(&signer, 1, &signer_files(&old, &[&new_crt]));
    let step1 = digest(&signer_files(&old, &[&new_crt])[0].1);
    eventually("step 1: every agent trusts old and new", || {
        all_trust(step1.clone())
    })
    .await;

    // 2. The new CA signs, while the proxy does not trust it yet: signing
    //    now would give agents certificates the proxy cannot verify, so
    //    every renewal is held until the proxy's own files catch up.
    publish(&signer, 2, &signer_files(&new, &[&old_crt]));
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        proxy.log().contains("holding every enrolment and renewal"),
        "{}",
        proxy.log()
    );
    for (_, node_tls) in &agents {
        assert_eq!(
            trusted(node_tls),
            Some(step1.clone()),
            "renewed before the proxy trusts the new CA"
        );
    }
    // The proxy's own certificate from the new CA, trusting both.
    publish(
        &tls,
        2,
        &proxy_files(&env, &new, &[&old_crt], "proxy-issued-2"),
    );
    let step2 = digest(&signer_files(&new, &[&old_crt])[0].1);
    eventually("step 2: every agent renewed by the new CA", || {
        all_trust(step2.clone())
    })
    .await;
    let (new_only, _) = client_config(&new_crt, Some(&env.path("proxy-issued-2")));
    for (node, (agent, _)) in nodes.iter().zip(&agents) {
        let config = new_only.clone();
        eventually(
            "the agent's certificate verifies against the new CA alone",
            || {
                let config = config.clone();
                async move { health_check(agent.api, node, config).await.ok() }
            },
        )
        .await;
    }

    // 3. The old CA dropped everywhere.
    publish(&signer, 3, &signer_files(&new, &[]));
    publish(&tls, 3, &proxy_files(&env, &new, &[], "proxy-issued-3"));
    let step3 = digest(&std::fs::read_to_string(&new_crt).expect("new CA"));
    eventually("step 3: every agent trusts the new CA alone", || {
        all_trust(step3.clone())
    })
    .await;
    // A little more calling on the final material, then the tally.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut calls, mut failures) = (0, Vec::new());
    for caller in callers {
        let (c, f) = caller.await.expect("caller");
        calls += c;
        failures.extend(f);
    }
    assert!(
        failures.is_empty(),
        "{} of {calls} calls failed during the rotation: {failures:?}\n{}",
        failures.len(),
        proxy.log()
    );
    assert!(calls > 20, "only {calls} calls");
    // The proxy's own calls: over pooled connections, which must follow
    // its reloaded certificate (an agent that dropped the old CA refuses
    // a connection still presenting it).
    let exposition = scrape(status_addr(&proxy).await).await;
    let proxy_calls: Vec<(String, f64)> = exposition
        .samples
        .iter()
        .filter(|s| s.name == "csi_scsi_agent_client_handling_seconds_count")
        .map(|s| (format!("{:?}", s.labels), s.value))
        .collect();
    let (ok, failed): (Vec<_>, Vec<_>) = proxy_calls
        .iter()
        .partition(|(labels, _)| labels.contains("\"code\": \"OK\""));
    assert!(
        failed.is_empty(),
        "the proxy's agent calls failed during the rotation: {failed:?}\n{}",
        proxy.log()
    );
    assert!(
        ok.iter().map(|(_, n)| n).sum::<f64>() >= 10.0,
        "the proxy hardly called the agents: {ok:?}"
    );
    let log = proxy.log();
    assert!(log.contains("the signer's CA changed"), "{log}");
    assert!(!log.contains("new signer CA files refused"), "{log}");

    // What an operator watches: the signer's CA is the new one, no agent
    // is left behind, and every series the shipped alerts name exists.
    let proxy_metrics = scrape(status_addr(&proxy).await).await;
    let new_ca =
        csi_scsi_certs::CertificateAuthority::load(&new_crt, &new.join("ca.key")).expect("new CA");
    let expiry = new_ca
        .not_after()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs() as f64;
    assert_eq!(
        proxy_metrics.value("csi_scsi_signer_ca_expiry_timestamp_seconds", &[]),
        Some(expiry)
    );
    assert_eq!(
        proxy_metrics.value("csi_scsi_enrolment_agents_on_other_trust", &[]),
        Some(0.0)
    );
    let agent_metrics = scrape(status_addr(&agents[0].0.daemon).await).await;
    // Both show the final bundle: how an operator sees a step arrive.
    for exposition in [&proxy_metrics, &agent_metrics] {
        assert_eq!(
            exposition.value("csi_scsi_trust_bundle_info", &[("sha256", step3.as_str())]),
            Some(1.0)
        );
    }
    let trusted = agent_metrics
        .value("csi_scsi_trusted_ca_expiry_seconds", &[])
        .expect("the agent's trusted CA expiry");
    assert!((trusted - (expiry - now_secs())).abs() < 120.0, "{trusted}");
    let rules = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring/prometheus-rules.yaml"),
    )
    .expect("the shipped rules");
    let exported: std::collections::BTreeSet<&str> = proxy_metrics
        .samples
        .iter()
        .chain(&agent_metrics.samples)
        .map(|s| s.name.as_str())
        .collect();
    let named = series_named(&rules);
    assert!(named.len() >= 4, "{named:?}");
    for name in &named {
        assert!(
            exported.contains(name.as_str()),
            "the shipped rules name {name}, which neither the proxy nor an agent exports"
        );
    }

    // The old CA's proxy certificate no longer opens an agent.
    let old_proxy = env.pki.issue_proxy("old-ca-proxy");
    let (with_old, _) = client_config(&new_crt, Some(&old_proxy));
    for (node, (agent, _)) in nodes.iter().zip(&agents) {
        let refused = health_check(agent.api, node, with_old.clone()).await;
        assert!(
            refused.is_err(),
            "{node} still accepts the old CA's proxy certificate"
        );
    }
}

/// Every `csi_scsi_*` series the `expr:` lines of a rules file name.
fn series_named(rules: &str) -> std::collections::BTreeSet<String> {
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr:"))
        .flat_map(|expr| {
            expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("csi_scsi_"))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

fn now_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64()
}

/// In front of `to`: the first connection is accepted and held, never
/// forwarded (a node too starved to finish a handshake in time); every
/// later one is relayed. Returns its address.
async fn hold_first_connection(to: std::net::SocketAddr) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut conn, _)) = listener.accept().await {
            if held.is_empty() {
                held.push(conn);
                continue;
            }
            tokio::spawn(async move {
                if let Ok(mut agent) = tokio::net::TcpStream::connect(to).await {
                    let _ = tokio::io::copy_bidirectional(&mut conn, &mut agent).await;
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_handshake_that_times_out_is_not_a_refused_certificate_and_nothing_is_re_enrolled() {
    use csi_scsi_proxy::enrolment::{EnrolError, Enroller, JoinTokenCheck, Outcome};
    let env = Env::new();
    let (token_file, _) = join_token(&env, "node-a", 60, "node-a.token");
    let (agent, tls) = enrolling_agent(&env, "node-a", &token_file).await;
    let proxy = signing_proxy(&env, &[("node-a", &agent)], 3600);
    eventually("the agent's first certificate", || async {
        tls.join("tls.crt").exists().then_some(())
    })
    .await;
    drop(proxy);
    let first = std::fs::read(tls.join("tls.crt")).expect("certificate");
    // Without the rule the proxy would go to the node's credential (here
    // a used join token, so Refused; in a cluster a ServiceAccount token,
    // so a new certificate): the outcome tells.

    let ca = env.pki.ca_dir();
    let directory = csi_scsi_proxy::directory::FileDirectory::load(&env.path("agents.txt"))
        .expect("agents file");
    let enroller = Enroller::new(
        directory,
        proxy_store(&env),
        csi_scsi_certs::CertificateAuthority::load(&ca.join("ca.crt"), &ca.join("ca.key"))
            .expect("signer"),
        Duration::from_secs(3600),
        std::sync::Arc::new(JoinTokenCheck(csi_scsi_certs::JoinTokens::new(
            &env.path("join-tokens"),
        ))),
    );
    let node: csi_scsi_contract::NodeName = "node-a".parse().expect("node name");
    let gate = hold_first_connection(agent.api).await.to_string();
    let started = std::time::Instant::now();
    match enroller.visit(&node, &gate, None).await {
        Err(EnrolError::Unreachable { reason, .. }) => {
            assert!(!reason.is_empty(), "an unreachable agent without a reason");
        }
        other => panic!("a held handshake gave {other:?}, not Unreachable"),
    }
    assert!(
        started.elapsed() >= Duration::from_secs(5),
        "the held connection was not the one that failed"
    );
    assert_eq!(
        std::fs::read(tls.join("tls.crt")).expect("certificate"),
        first,
        "the agent's certificate was replaced after a timeout"
    );
    // The next look goes through: the same certificate, verified, current.
    assert_eq!(
        enroller.visit(&node, &gate, None).await.expect("visit"),
        Outcome::Current
    );
    assert_eq!(
        std::fs::read(tls.join("tls.crt")).expect("certificate"),
        first
    );
}
