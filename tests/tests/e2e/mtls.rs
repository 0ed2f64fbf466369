//! The agent API accepts only the proxy, and the proxy only the node it
//! dialled; every refusal names its cause. Real agent process, real TLS.

use std::time::Duration;

use csi_scsi_daemon::agent_channel;
use csi_scsi_tests::patience::eventually;

use crate::support::{Env, check_channel, client_config, health_check, proxy_store};

#[tokio::test]
async fn proxy_reaches_the_agent_of_the_node_it_dials() {
    let env = Env::new();
    let agent = env.start_agent("node-a").await;
    let channel = agent_channel(
        &agent.api.to_string(),
        "node-a",
        proxy_store(&env),
        Duration::from_secs(5),
    )
    .expect("channel");
    check_channel(channel)
        .await
        .expect("health check over mTLS");
}

#[tokio::test]
async fn proxy_dialling_node_a_refuses_node_b() {
    let env = Env::new();
    // node-b's agent, with a perfectly valid certificate for node-b.
    let agent = env.start_agent("node-b").await;
    let channel = agent_channel(
        &agent.api.to_string(),
        "node-a",
        proxy_store(&env),
        Duration::from_secs(5),
    )
    .expect("channel");
    let err = check_channel(channel)
        .await
        .expect_err("must refuse node-b");
    assert!(
        err.contains(
            "dialled spiffe://csi-scsi.local/node/node-a but the peer's certificate names spiffe://csi-scsi.local/node/node-b"
        ),
        "{err}"
    );
}

#[tokio::test]
async fn client_without_a_certificate_is_refused() {
    let env = Env::new();
    let agent = env.start_agent("node-a").await;
    let (config, _) = client_config(&env.pki.ca_dir().join("ca.crt"), None);
    let err = health_check(agent.api, "node-a", config)
        .await
        .expect_err("refused");
    assert_refused(&agent.daemon, &err, "peer sent no certificates").await;
}

#[tokio::test]
async fn client_certificate_from_another_ca_is_refused() {
    let env = Env::new();
    let agent = env.start_agent("node-a").await;
    let other = Env::new();
    let foreign = other.pki.issue_proxy("proxy-tls");
    let (config, _) = client_config(&env.pki.ca_dir().join("ca.crt"), Some(&foreign));
    let err = health_check(agent.api, "node-a", config)
        .await
        .expect_err("refused");
    assert_refused(&agent.daemon, &err, "UnknownIssuer").await;
}

#[tokio::test]
async fn agent_certificate_presented_as_a_client_is_refused() {
    let env = Env::new();
    let agent = env.start_agent("node-a").await;
    let impostor = env.pki.issue_agent("node-b", "node-b-tls");
    let (config, _) = client_config(&env.pki.ca_dir().join("ca.crt"), Some(&impostor));
    let err = health_check(agent.api, "node-a", config)
        .await
        .expect_err("refused");
    assert_refused(
        &agent.daemon,
        &err,
        "client identity spiffe://csi-scsi.local/node/node-b is not the proxy",
    )
    .await;
}

#[tokio::test]
async fn expired_client_certificate_is_refused() {
    let env = Env::new();
    let agent = env.start_agent("node-a").await;
    // --days 0: valid from five minutes ago until the moment of issue.
    let out = std::process::Command::new(csi_scsi_tests::binaries::binary("csi-scsi-certs"))
        .args(["issue-proxy", "--days", "0", "--ca"])
        .arg(env.pki.ca_dir())
        .arg("--out")
        .arg(env.path("expired-tls"))
        .output()
        .expect("issue");
    assert!(out.status.success());
    let (config, _) = client_config(
        &env.pki.ca_dir().join("ca.crt"),
        Some(&env.path("expired-tls")),
    );
    let err = eventually("the certificate to expire", || {
        let config = config.clone();
        async move { health_check(agent.api, "node-a", config).await.err() }
    })
    .await;
    assert_refused(&agent.daemon, &err, "certificate expired").await;
}

#[tokio::test]
async fn plaintext_client_is_refused() {
    let env = Env::new();
    let agent = env.start_agent("node-a").await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", agent.api))
        .expect("uri")
        .connect_lazy();
    check_channel(channel)
        .await
        .expect_err("plaintext must fail");
    eventually("the agent to log the refused handshake", || async {
        agent
            .daemon
            .log()
            .contains("TLS handshake refused")
            .then_some(())
    })
    .await;
}

/// The call failed, and the agent logged why, naming `cause`.
async fn assert_refused(agent: &csi_scsi_tests::daemon::Daemon, client_err: &str, cause: &str) {
    assert!(!client_err.is_empty());
    let patience = tokio::time::Instant::now() + csi_scsi_tests::patience::patience();
    while tokio::time::Instant::now() < patience {
        if agent
            .log()
            .lines()
            .any(|l| l.contains("TLS handshake refused") && l.contains(cause))
        {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!(
        "agent log does not name {cause:?}; client saw {client_err}\n{}",
        agent.log()
    );
}
