//! CSI Identity on both binaries, and the CSI socket's life cycle.

use csi_scsi_proto::csi::identity_client::IdentityClient;
use csi_scsi_proto::csi::plugin_capability::Type as CapabilityType;
use csi_scsi_proto::csi::plugin_capability::service::Type as Service;
use csi_scsi_proto::csi::{GetPluginCapabilitiesRequest, GetPluginInfoRequest, ProbeRequest};
use csi_scsi_tests::csi_client::csi_channel;
use csi_scsi_tests::daemon::{Daemon, free_port};
use csi_scsi_tests::patience::eventually;

use crate::support::Env;

async fn identity(path: &std::path::Path) -> IdentityClient<tonic::transport::Channel> {
    IdentityClient::new(csi_channel(path).await.expect("connect CSI socket"))
}

async fn services(path: &std::path::Path) -> Vec<Service> {
    let caps = identity(path)
        .await
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .expect("capabilities")
        .into_inner()
        .capabilities;
    caps.into_iter()
        .filter_map(|c| match c.r#type {
            Some(CapabilityType::Service(s)) => Service::try_from(s.r#type).ok(),
            _ => None,
        })
        .collect()
}

async fn probe(path: &std::path::Path) -> Option<bool> {
    identity(path)
        .await
        .probe(ProbeRequest {})
        .await
        .expect("probe")
        .into_inner()
        .ready
}

#[tokio::test]
async fn both_binaries_answer_identity_with_name_and_version() {
    let env = Env::new();
    let agent = env.start_agent("node-a").await;
    let proxy = env.start_proxy().await;
    for path in [&agent.csi, &proxy.csi] {
        let info = identity(path)
            .await
            .get_plugin_info(GetPluginInfoRequest {})
            .await
            .expect("plugin info")
            .into_inner();
        assert_eq!(info.name, "csi-scsi.io");
        assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));
        assert_eq!(probe(path).await, Some(true), "ready");
    }
    assert_eq!(
        services(&proxy.csi).await,
        vec![
            Service::ControllerService,
            Service::VolumeAccessibilityConstraints
        ]
    );
    // The agent reports topology in NodeGetInfo, which needs this capability.
    assert_eq!(
        services(&agent.csi).await,
        vec![Service::VolumeAccessibilityConstraints]
    );
}

#[tokio::test]
async fn probe_is_not_ready_while_a_host_tool_is_missing() {
    let env = Env::new();
    let tls = env.pki.issue_agent("node-a", "node-a-tls");
    let agent = env
        .start_agent_with(
            "node-a",
            &tls,
            &["--required-tools", "sh,/nonexistent/mkfs.csi-scsi-test"],
        )
        .await;
    assert_eq!(probe(&agent.csi).await, Some(false));
    assert!(
        agent
            .daemon
            .log()
            .contains("missing host tools: /nonexistent/mkfs.csi-scsi-test")
    );
}

#[tokio::test]
async fn probe_is_not_ready_once_the_certificate_files_are_gone() {
    let env = Env::new();
    let agent = env.start_agent("node-a").await;
    assert_eq!(probe(&agent.csi).await, Some(true));
    std::fs::remove_file(env.path("node-a-tls/tls.key")).expect("remove key");
    assert_eq!(probe(&agent.csi).await, Some(false));
}

#[tokio::test]
async fn second_instance_on_the_same_socket_refuses_to_start() {
    let env = Env::new();
    let first = env.start_agent("node-a").await;
    let tls = env.path("node-a-tls");
    let args = env.agent_args("node-a", &tls, &first.csi, free_port());
    let mut second = Daemon::spawn("csi-scsi-agent", &args, &env.path("second.log"));
    let status = eventually("second agent to exit", || {
        let s = second.try_exit();
        async move { s }
    })
    .await;
    assert!(!status.success());
    assert!(
        second
            .log()
            .contains("is in use: another process is listening on it"),
        "{}",
        second.log()
    );
    // The first instance still serves, on a socket file that still exists.
    assert_eq!(probe(&first.csi).await, Some(true));
}

#[tokio::test]
async fn stale_socket_file_is_reclaimed() {
    let env = Env::new();
    let csi = env.path("node-a/csi.sock");
    std::fs::create_dir_all(csi.parent().expect("dir")).expect("mkdir");
    // Left behind by a process that died: a socket file nobody listens on.
    drop(std::os::unix::net::UnixListener::bind(&csi).expect("bind"));
    let tls = env.pki.issue_agent("node-a", "node-a-tls");
    let agent = env.start_agent_with("node-a", &tls, &[]).await;
    assert_eq!(agent.csi, csi);
    assert_eq!(probe(&csi).await, Some(true));
    assert!(agent.daemon.log().contains("removing stale CSI socket"));
}

#[tokio::test]
async fn sigterm_exits_cleanly_and_removes_the_socket() {
    let env = Env::new();
    let mut agent = env.start_agent("node-a").await;
    let mut proxy = env.start_proxy().await;
    assert!(
        agent.daemon.terminate().await.success(),
        "{}",
        agent.daemon.log()
    );
    assert!(
        proxy.daemon.terminate().await.success(),
        "{}",
        proxy.daemon.log()
    );
    assert!(!agent.csi.exists(), "agent socket removed");
    assert!(!proxy.csi.exists(), "proxy socket removed");
}

#[tokio::test]
async fn bad_configuration_exits_64_naming_the_flag() {
    let env = Env::new();
    let tls = env.pki.issue_agent("node-a", "node-a-tls");
    for (bin, args) in [
        (
            "csi-scsi-agent",
            vec![
                "--node-name",
                "node-a",
                "--csi-endpoint",
                "tcp://127.0.0.1:1",
            ],
        ),
        (
            "csi-scsi-proxy",
            vec![
                "--agents-file",
                "/dev/null",
                "--csi-endpoint",
                "relative.sock",
            ],
        ),
        (
            "csi-scsi-proxy",
            vec![
                "--agents-file",
                "/dev/null",
                "--trust-domain",
                "Not A Domain",
            ],
        ),
        ("csi-scsi-proxy", vec!["--no-such-flag"]),
    ] {
        let mut args: Vec<String> = args.into_iter().map(String::from).collect();
        args.extend(["--tls-dir".into(), tls.display().to_string()]);
        let mut d = Daemon::spawn(bin, &args, &env.path("bad.log"));
        let status = eventually("exit", || {
            let s = d.try_exit();
            async move { s }
        })
        .await;
        assert_eq!(status.code(), Some(64), "{bin} {args:?}: {}", d.log());
        assert!(d.log().contains("--"), "names the flag: {}", d.log());
    }
}

#[tokio::test]
async fn agent_refuses_to_start_with_another_nodes_certificate() {
    let env = Env::new();
    let tls = env.pki.issue_agent("node-b", "node-b-tls");
    let csi = env.path("node-a/csi.sock");
    let args = env.agent_args("node-a", &tls, &csi, free_port());
    let mut d = Daemon::spawn("csi-scsi-agent", &args, &env.path("wrong.log"));
    let status = eventually("exit", || {
        let s = d.try_exit();
        async move { s }
    })
    .await;
    assert!(!status.success());
    assert!(
        d.log().contains("names spiffe://csi-scsi.local/node/node-b, expected spiffe://csi-scsi.local/node/node-a"),
        "{}",
        d.log()
    );
}
