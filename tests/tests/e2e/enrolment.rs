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
use csi_scsi_tests::binaries::binary;
use csi_scsi_tests::daemon::Daemon;
use csi_scsi_tests::patience::eventually;

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
    let list: String = agents
        .iter()
        .map(|(node, a)| format!("{node} {}\n", a.api))
        .collect();
    std::fs::write(env.path("agents.txt"), list).expect("agents file");
    let tls = env.pki.issue_proxy("proxy-tls");
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
        &env.pki.ca_dir().display().to_string(),
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
