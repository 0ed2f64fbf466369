use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use super::*;
use crate::host::command::CommandRunner;

const IQN: &str = "iqn.2024-01.io.lab:target-a";

fn portal() -> Portal {
    Portal::parse("198.18.0.1:3260").expect("portal")
}

/// A stand-in `iscsiadm`: logs each argv as one line to `log`, then runs
/// `body` (a shell fragment that sees the arguments in `$*`).
struct FakeTool {
    dir: tempfile::TempDir,
}

impl FakeTool {
    fn new(body: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let script = dir.path().join("iscsiadm");
        let log = dir.path().join("log");
        std::fs::write(
            &script,
            format!("#!/bin/sh\necho \"$*\" >> '{}'\n{body}\n", log.display()),
        )
        .expect("script");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        Self { dir }
    }

    fn host(&self) -> Host {
        Host {
            sysfs: PathBuf::from("/nonexistent/sys"),
            dev: PathBuf::from("/nonexistent/dev"),
            mountinfo: PathBuf::from("/nonexistent/mountinfo"),
            kubelet_dir: PathBuf::from("/nonexistent/kubelet"),
            iscsi_nodes: self.dir.path().join("nodes"),
            tools: BTreeMap::from([("iscsiadm".to_owned(), self.dir.path().join("iscsiadm"))]),
            runner: CommandRunner::new(Duration::from_secs(5)),
        }
    }

    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("log"))
            .map(|s| s.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }
}

#[tokio::test]
async fn node_create_and_delete_argv() {
    let tool = FakeTool::new("case \"$*\" in *delete*) exit 21;; esac");
    create_node(&tool.host(), IQN, &portal())
        .await
        .expect("create");
    delete_node(&tool.host(), IQN, &portal())
        .await
        .expect("delete of a missing record is success");
    assert_eq!(
        tool.calls(),
        [
            format!("-m node -T {IQN} -p 198.18.0.1:3260 -o new"),
            // Only the agent logs in; never iscsid at boot.
            format!("-m node -T {IQN} -p 198.18.0.1:3260 -o update -n node.startup -v manual"),
            format!("-m node -T {IQN} -p 198.18.0.1:3260 -o delete"),
        ]
    );
}

#[tokio::test]
async fn chap_is_written_into_the_node_record_never_onto_a_command_line() {
    let tool = FakeTool::new("exit 0");
    let host = tool.host();
    // The record as `iscsiadm -o new` leaves it, with an old CHAP setting.
    let record = host.iscsi_nodes.join(IQN).join("198.18.0.1,3260,1/default");
    std::fs::create_dir_all(record.parent().expect("dir")).expect("mkdir");
    std::fs::write(
        &record,
        "node.name = x\nnode.session.auth.authmethod = None\nnode.session.auth.password = old\nnode.conn[0].port = 3260\n",
    )
    .expect("record");
    let chap = Chap {
        username: "node-a".to_owned(),
        password: Secret::new("initiator-secret"),
        mutual: Some(MutualChap {
            username: "array".to_owned(),
            password: Secret::new("target-secret!"),
        }),
    };
    set_chap(&host, IQN, &portal(), &chap).await.expect("chap");
    assert!(tool.calls().is_empty(), "no tool run: {:?}", tool.calls());
    let text = std::fs::read_to_string(&record).expect("read");
    for line in [
        "node.name = x",
        "node.conn[0].port = 3260",
        "node.session.auth.authmethod = CHAP",
        "node.session.auth.username = node-a",
        "node.session.auth.password = initiator-secret",
        "node.session.auth.username_in = array",
        "node.session.auth.password_in = target-secret!",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line:?} missing from:\n{text}"
        );
    }
    assert!(!text.contains("= old"), "the old secret is gone:\n{text}");
    let mode = std::fs::metadata(&record)
        .expect("stat")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "a record holding a secret is the owner's only");
    let shown = format!("{chap:?}");
    assert!(
        !shown.contains("initiator-secret") && !shown.contains("target-secret"),
        "{shown}"
    );
    assert!(shown.contains("<redacted>"));
    clear_chap(&host, IQN, &portal()).await.expect("clear");
    let text = std::fs::read_to_string(&record).expect("read");
    assert!(
        text.contains("node.session.auth.authmethod = None"),
        "{text}"
    );
    assert!(
        !text.contains("secret") && !text.contains("username"),
        "{text}"
    );
}

#[tokio::test]
async fn chap_secrets_never_reach_errors() {
    let tool = FakeTool::new("exit 0");
    let chap = Chap {
        username: "node-a".to_owned(),
        password: Secret::new("hunter2hunter2"),
        mutual: None,
    };
    // No record to write into (create_node was not run).
    let err = set_chap(&tool.host(), IQN, &portal(), &chap)
        .await
        .expect_err("no record");
    let shown = format!("{err} / {err:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(matches!(err, IscsiError::NoNodeRecord { .. }), "{err:?}");
    // The argv as the runner logs it is redacted too.
    let args = [Arg::from("-v"), Arg::secret(chap.password.expose())];
    assert!(!format!("{args:?}").contains("hunter2"));
}

#[tokio::test]
async fn bad_chap_and_target_names_are_refused_before_running_the_tool() {
    let tool = FakeTool::new("exit 0");
    let host = tool.host();
    for target in [
        "",
        "-o delete",
        "iqn.a b",
        "iqn.a\nnode.startup = automatic",
        &"x".repeat(224),
    ] {
        let err = create_node(&host, target, &portal())
            .await
            .expect_err("refused");
        assert!(
            matches!(
                err,
                IscsiError::InvalidArgument {
                    field: "target name",
                    ..
                }
            ),
            "{target:?}: {err:?}"
        );
    }
    let chap = Chap {
        username: "node-a".to_owned(),
        password: Secret::new("line\nnode.startup = automatic"),
        mutual: None,
    };
    let err = set_chap(&host, IQN, &portal(), &chap)
        .await
        .expect_err("refused");
    assert!(
        matches!(
            err,
            IscsiError::InvalidArgument {
                field: "CHAP password",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(!format!("{err}").contains("automatic"));
    assert!(tool.calls().is_empty(), "{:?}", tool.calls());
}

#[tokio::test]
async fn login_sets_a_single_attempt_timeout_then_logs_in() {
    let tool = FakeTool::new("exit 0");
    let outcome = login(&tool.host(), IQN, &portal(), Duration::from_secs(7))
        .await
        .expect("login");
    assert_eq!(outcome, LoginOutcome::LoggedIn);
    let base = format!("-m node -T {IQN} -p 198.18.0.1:3260");
    assert_eq!(
        tool.calls(),
        [
            format!("{base} -o update -n node.conn[0].timeo.login_timeout -v 7"),
            format!("{base} -o update -n node.session.initial_login_retry_max -v 1"),
            format!("{base} --login"),
        ]
    );
}

#[tokio::test]
async fn login_exit_codes_become_typed_outcomes() {
    async fn login_with(code: i32) -> Result<LoginOutcome, IscsiError> {
        let tool = FakeTool::new(&format!(
            "case \"$*\" in *--login*) echo 'iscsiadm: Could not login to [iface: default, target: x, portal: 198.18.0.1,3260].' >&2; exit {code};; esac"
        ));
        login(&tool.host(), IQN, &portal(), Duration::from_secs(5)).await
    }
    assert_eq!(
        login_with(15).await.expect("exists"),
        LoginOutcome::AlreadyLoggedIn
    );
    assert!(
        matches!(login_with(24).await, Err(IscsiError::AuthFailed { ref target, .. }) if target == IQN)
    );
    assert!(matches!(
        login_with(8).await,
        Err(IscsiError::Timeout {
            operation: "login",
            ..
        })
    ));
    assert!(
        matches!(login_with(4).await, Err(IscsiError::PortalUnreachable { ref portal, .. }) if portal == "198.18.0.1:3260")
    );
    assert!(matches!(
        login_with(19).await,
        Err(IscsiError::LoginRefused { code: 19, .. })
    ));
    assert!(matches!(
        login_with(5).await,
        Err(IscsiError::LoginRefused { code: 5, .. })
    ));
    assert!(matches!(
        login_with(21).await,
        Err(IscsiError::NoNodeRecord { .. })
    ));
    assert!(matches!(
        login_with(20).await,
        Err(IscsiError::DaemonUnavailable { code: 20, .. })
    ));
    let err = login_with(99).await.expect_err("unknown code");
    assert!(
        matches!(err, IscsiError::Failed { code: 99, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("Could not login"), "{err}");
}

#[tokio::test]
async fn a_login_that_hangs_is_cut_at_its_timeout() {
    let tool = FakeTool::new("case \"$*\" in *--login*) exec sleep 30;; esac");
    let start = tokio::time::Instant::now();
    let err = login(&tool.host(), IQN, &portal(), Duration::from_millis(300))
        .await
        .expect_err("hangs");
    assert!(
        matches!(
            err,
            IscsiError::Timeout {
                operation: "login",
                ..
            }
        ),
        "{err:?}"
    );
    // One second of login timeout plus the slack, not the runner's default.
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn logout_and_rescan_exit_codes() {
    let tool = FakeTool::new("exit 21");
    assert_eq!(
        logout(&tool.host(), IQN, &portal()).await.expect("none"),
        LogoutOutcome::NotLoggedIn
    );
    assert!(matches!(
        rescan_session(&tool.host(), 3).await,
        Err(IscsiError::SessionNotFound { sid: 3 })
    ));
    assert_eq!(
        tool.calls(),
        [
            format!("-m node -T {IQN} -p 198.18.0.1:3260 --logout"),
            "-m session -r 3 --rescan".to_owned()
        ]
    );
    let busy = FakeTool::new("echo 'iscsiadm: Could not logout: device busy' >&2; exit 28");
    assert!(matches!(
        logout(&busy.host(), IQN, &portal()).await,
        Err(IscsiError::SessionBusy { .. })
    ));
    let ok = FakeTool::new("exit 0");
    assert_eq!(
        logout(&ok.host(), IQN, &portal()).await.expect("out"),
        LogoutOutcome::LoggedOut
    );
    rescan_session(&ok.host(), 3).await.expect("rescan");
}

#[tokio::test]
async fn a_missing_tool_is_a_tool_error() {
    let mut host = FakeTool::new("exit 0").host();
    host.tools.insert(
        "iscsiadm".to_owned(),
        PathBuf::from("/nonexistent/iscsiadm"),
    );
    let err = rescan_session(&host, 3).await.expect_err("missing");
    assert!(
        matches!(err, IscsiError::Tool(CommandError::Spawn { .. })),
        "{err:?}"
    );
}
