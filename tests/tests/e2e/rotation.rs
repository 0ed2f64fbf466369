//! Certificates rotate the way a Secret volume rotates them, with no
//! restart: new handshakes see the new certificate, open connections keep
//! working, and bad new files are refused while the old ones stay in use.

use std::time::Duration;

use csi_scsi_certs::{MaterialPaths, MaterialStore, Role, TrustDomain};
use csi_scsi_daemon::agent_channel;
use csi_scsi_tests::patience::eventually;
use csi_scsi_tests::pki::{as_secret_volume, rotate_secret_volume};

use crate::support::{Env, cert_der, check_channel, client_config, health_check};

#[tokio::test]
async fn rotated_agent_certificate_is_presented_and_open_channels_keep_working() {
    let env = Env::new();
    let tls = env.pki.issue_agent("node-a", "node-a-tls");
    as_secret_volume(&tls);
    let original = cert_der(&tls.join("tls.crt")).to_vec();
    let agent = env.start_agent_with("node-a", &tls, &[]).await;
    let proxy_tls = env.pki.issue_proxy("proxy-tls");
    let store = MaterialStore::load(
        MaterialPaths::in_dir(&proxy_tls),
        Role::Proxy,
        TrustDomain::new("csi-scsi.local").expect("domain"),
    )
    .expect("proxy material");

    // A channel opened (and used) before the rotation.
    let open = agent_channel(
        &agent.api.to_string(),
        "node-a",
        store,
        Duration::from_secs(5),
    )
    .expect("channel");
    check_channel(open.clone()).await.expect("before rotation");
    let (config, seen) = client_config(&env.pki.ca_dir().join("ca.crt"), Some(&proxy_tls));
    health_check(agent.api, "node-a", config.clone())
        .await
        .expect("handshake");
    assert_eq!(seen.last_leaf(), Some(original.clone()));

    let fresh = env.pki.issue_agent("node-a", "node-a-next");
    let rotated = cert_der(&fresh.join("tls.crt")).to_vec();
    assert_ne!(rotated, original);
    rotate_secret_volume(&tls, &fresh, 1);

    let log_on_fail = scopeguard_log(&agent.daemon);
    eventually("a new handshake to present the rotated certificate", || {
        let (config, seen) = (config.clone(), seen.clone());
        let rotated = rotated.clone();
        async move {
            health_check(agent.api, "node-a", config).await.ok()?;
            (seen.last_leaf()? == rotated).then_some(())
        }
    })
    .await;
    drop(log_on_fail);
    check_channel(open)
        .await
        .expect("the channel opened before rotation still works");
    assert!(agent.daemon.log().contains("loaded rotated TLS material"));
}

#[tokio::test]
async fn bad_rotated_files_are_refused_and_the_old_certificate_stays() {
    let env = Env::new();
    let tls = env.pki.issue_agent("node-a", "node-a-tls");
    as_secret_volume(&tls);
    let original = cert_der(&tls.join("tls.crt")).to_vec();
    let agent = env.start_agent_with("node-a", &tls, &[]).await;

    let broken = env.path("broken");
    std::fs::create_dir(&broken).expect("mkdir");
    std::fs::write(
        broken.join("tls.crt"),
        "-----BEGIN CERTIFICATE-----\nnot base64\n",
    )
    .expect("write");
    std::fs::copy(tls.join("tls.key"), broken.join("tls.key")).expect("copy");
    std::fs::copy(tls.join("ca.crt"), broken.join("ca.crt")).expect("copy");
    rotate_secret_volume(&tls, &broken, 1);

    eventually("the agent to reject the new files", || async {
        agent
            .daemon
            .log()
            .contains("new TLS material rejected; keeping the current one")
            .then_some(())
    })
    .await;
    let proxy_tls = env.pki.issue_proxy("proxy-tls");
    let (config, seen) = client_config(&env.pki.ca_dir().join("ca.crt"), Some(&proxy_tls));
    health_check(agent.api, "node-a", config)
        .await
        .expect("still serving");
    assert_eq!(seen.last_leaf(), Some(original));
}

fn scopeguard_log(d: &csi_scsi_tests::daemon::Daemon) -> impl Drop + '_ {
    struct G<'a>(&'a csi_scsi_tests::daemon::Daemon);
    impl Drop for G<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                eprintln!("AGENT LOG:\n{}", self.0.log());
            }
        }
    }
    G(d)
}

#[tokio::test]
async fn a_proxy_certificate_rotated_out_stops_working_on_a_connection_opened_before() {
    use csi_scsi_proto::agent::DiscoverRequest;
    use csi_scsi_proto::agent::agent_client::AgentClient;
    let env = Env::new();
    let tls = env.pki.issue_agent("node-a", "node-a-tls");
    as_secret_volume(&tls);
    let agent = env.start_agent_with("node-a", &tls, &[]).await;
    let store = crate::support::proxy_store(&env);
    let mut api = AgentClient::new(
        agent_channel(
            &agent.api.to_string(),
            "node-a",
            store,
            Duration::from_secs(5),
        )
        .expect("channel"),
    );
    // Authorised: the request itself is then judged (no targets: invalid).
    let code = |r: Result<tonic::Response<_>, tonic::Status>| r.err().map(|s| s.code());
    assert_eq!(
        code(api.discover(DiscoverRequest::default()).await),
        Some(tonic::Code::InvalidArgument)
    );
    // The cluster moves to a new CA: the agent's files now trust only it,
    // and the proxy's certificate is from the old one.
    let new_ca = csi_scsi_tests::pki::Pki::init(&env.dir.path().join("new-pki"));
    let moved = new_ca.issue_agent("node-a", "node-a-new-ca");
    rotate_secret_volume(&tls, &moved, 1);
    let log_on_fail = scopeguard_log(&agent.daemon);
    eventually("the open connection's next call to be refused", || {
        let mut api = api.clone();
        async move {
            (code(api.discover(DiscoverRequest::default()).await)
                == Some(tonic::Code::Unauthenticated))
            .then_some(())
        }
    })
    .await;
    drop(log_on_fail);
}
