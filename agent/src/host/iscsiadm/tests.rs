use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::*;
use crate::host::command::CommandRunner;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

fn read_fixture(rel: &str) -> String {
    std::fs::read_to_string(fixture(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

const IQN: &str = "iqn.2024-01.io.lab:target-a";

fn portal() -> Portal {
    Portal::parse("10.0.0.1:3260").expect("portal")
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
            format!("-m node -T {IQN} -p 10.0.0.1:3260 -o new"),
            // Only the agent logs in; never iscsid at boot.
            format!("-m node -T {IQN} -p 10.0.0.1:3260 -o update -n node.startup -v manual"),
            format!("-m node -T {IQN} -p 10.0.0.1:3260 -o delete"),
        ]
    );
}

#[tokio::test]
async fn chap_is_written_into_the_node_record_never_onto_a_command_line() {
    let tool = FakeTool::new("exit 0");
    let host = tool.host();
    // The record as `iscsiadm -o new` leaves it, with an old CHAP setting.
    let record = host.iscsi_nodes.join(IQN).join("10.0.0.1,3260,1/default");
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
    let base = format!("-m node -T {IQN} -p 10.0.0.1:3260");
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
            "case \"$*\" in *--login*) echo 'iscsiadm: Could not login to [iface: default, target: x, portal: 10.0.0.1,3260].' >&2; exit {code};; esac"
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
        matches!(login_with(4).await, Err(IscsiError::PortalUnreachable { ref portal, .. }) if portal == "10.0.0.1:3260")
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
            format!("-m node -T {IQN} -p 10.0.0.1:3260 --logout"),
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
async fn discovery_and_listings_run_and_parse() {
    let file = fixture("tools/iscsiadm/discovery-st/netapp-two-portals-os-brick.txt");
    let tool = FakeTool::new(&format!("cat '{}'", file.display()));
    let found = discover_sendtargets(&tool.host(), &portal(), Duration::from_secs(5))
        .await
        .expect("discover");
    assert_eq!(found.len(), 2);
    assert_eq!(
        tool.calls(),
        ["-m discovery -t sendtargets -p 10.0.0.1:3260"]
    );
    let none = FakeTool::new("exit 21");
    assert_eq!(
        discover_sendtargets(&none.host(), &portal(), Duration::from_secs(5))
            .await
            .expect("none"),
        []
    );
    assert_eq!(sessions(&none.host()).await.expect("none"), []);
    assert_eq!(nodes(&none.host()).await.expect("none"), []);
    let refused = FakeTool::new("echo 'iscsiadm: connect to 10.0.0.1 timed out' >&2; exit 4");
    assert!(matches!(
        discover_sendtargets(&refused.host(), &portal(), Duration::from_secs(5)).await,
        Err(IscsiError::PortalUnreachable { .. })
    ));
    let file = fixture("tools/iscsiadm/session/P0-ontap-two-sessions-trident.txt");
    let listing = FakeTool::new(&format!("cat '{}'", file.display()));
    assert_eq!(sessions(&listing.host()).await.expect("sessions").len(), 2);
    let no_daemon =
        FakeTool::new("echo 'iscsiadm: can not connect to iSCSI daemon (111)!' >&2; exit 20");
    assert!(matches!(
        sessions(&no_daemon.host()).await,
        Err(IscsiError::DaemonUnavailable { code: 20, .. })
    ));
}

#[tokio::test]
async fn a_missing_tool_is_a_tool_error() {
    let mut host = FakeTool::new("exit 0").host();
    host.tools.insert(
        "iscsiadm".to_owned(),
        PathBuf::from("/nonexistent/iscsiadm"),
    );
    let err = sessions(&host).await.expect_err("missing");
    assert!(
        matches!(err, IscsiError::Tool(CommandError::Spawn { .. })),
        "{err:?}"
    );
    assert_eq!(err.metric_label(), "tool");
}

#[test]
fn session_listings_from_the_fixtures() {
    let ontap = parse_session_list(&read_fixture(
        "tools/iscsiadm/session/P0-ontap-two-sessions-trident.txt",
    ));
    assert_eq!(
        ontap,
        [
            SessionEntry {
                transport: "tcp".to_owned(),
                sid: 3,
                portal: Portal::parse("127.0.0.1:3260").expect("portal"),
                tpgt: 1028,
                target: "iqn.2016-04.com.open-iscsi:ef9f41e2ffa7:vs.3".to_owned(),
            },
            SessionEntry {
                transport: "tcp".to_owned(),
                sid: 4,
                portal: Portal::parse("127.0.0.1:3260").expect("portal"),
                tpgt: 1029,
                target: "iqn.2016-04.com.open-iscsi:ef9f41e2ffa7:vs.3".to_owned(),
            },
        ]
    );
    let insights = parse_session_list(&read_fixture("tools/iscsiadm/session/P0-insights.txt"));
    assert_eq!(
        insights
            .iter()
            .map(|s| (s.sid, s.target.as_str()))
            .collect::<Vec<_>>(),
        [
            (1, "iqn.2017-06.com.example:server1"),
            (2, "iqn.2017-06.com.example:server2")
        ]
    );
    // Old open-iscsi (no colon, no flash marker), IPv6, and junk lines.
    let mixed = parse_session_list(
        "tcp [7] 10.1.1.1:3260,1 iqn.2001-05.com.equallogic:vol1\n\
         iser: [8] [fd00::5]:3260,-1 iqn.2003-01.org.linux-iscsi.rheln1 (non-flash)\n\
         iscsiadm: No active sessions.\n\
         tcp: [x] 10.1.1.1:3260,1 iqn.bad-sid\n\
         tcp: [9] 10.1.1.1:3260 iqn.no-tpgt\n\
         tcp: [10] 10.1.1.1:3260,1 iqn.x (non-flash) trailing\n",
    );
    assert_eq!(mixed.len(), 2);
    assert_eq!(mixed[0].sid, 7);
    assert_eq!(mixed[1].transport, "iser");
    assert_eq!(mixed[1].tpgt, -1);
    assert_eq!(mixed[1].portal.to_string(), "[fd00::5]:3260");
}

#[test]
fn node_and_discovery_listings_from_the_fixtures() {
    for (file, portals, target, tpgts) in [
        (
            "tools/iscsiadm/node/node-ontap-trident.txt",
            ["127.0.0.1:3260", "127.0.0.1:3260"],
            "iqn.2016-04.com.open-iscsi:ef9f41e2ffa7:vs.25",
            [1042, 1043],
        ),
        (
            "tools/iscsiadm/discovery-st/ontap-two-lifs-trident.txt",
            ["127.0.0.1:3260", "127.0.0.1:3260"],
            "iqn.2016-04.com.open-iscsi:ef9f41e2ffa7:vs.3",
            [1042, 1043],
        ),
        (
            "tools/iscsiadm/discovery-st/netapp-two-portals-os-brick.txt",
            ["10.15.84.19:3260", "10.15.85.19:3260"],
            "iqn.1992-08.com.netapp:sn.33615311",
            [1, 2],
        ),
        (
            "tools/iscsiadm/discovery-st/azure-storsimple.txt",
            ["10.126.162.25:3260", "10.126.162.26:3260"],
            "iqn.1991-05.com.microsoft:storsimple8100-shx0991003g44mt-target",
            [1, 1],
        ),
    ] {
        let records = parse_node_list(&read_fixture(file));
        assert_eq!(records.len(), 2, "{file}");
        for (i, r) in records.iter().enumerate() {
            assert_eq!(r.portal.to_string(), portals[i], "{file}");
            assert_eq!(r.target, target, "{file}");
            assert_eq!(r.tpgt, tpgts[i], "{file}");
        }
    }
    let odd = parse_node_list(
        "[2001:db8::7]:3260,1 iqn.2001-04.com.example:v6\n\
         sg1.example.com:3260,-1 iqn.2010-01.com.solidfire:abc.vol.1\n\
         10.0.0.1:3260 iqn.no-tag\n\
         10.0.0.1:3260,1\n\
         garbage line with words\n",
    );
    assert_eq!(odd.len(), 2);
    assert_eq!(odd[0].portal.address(), "2001:db8::7");
    assert_eq!(odd[1].tpgt, -1);
    assert_eq!(odd[1].portal.address(), "sg1.example.com");
}

#[test]
fn p3_detail_from_the_fixture() {
    let sessions = parse_session_detail(&read_fixture(
        "tools/iscsiadm/session/P3-jiva-single-path-openebs.txt",
    ));
    assert_eq!(sessions.len(), 1);
    let s = &sessions[0];
    assert_eq!(
        s.target,
        "iqn.2016-09.com.openebs.jiva:pvc-25e8f6f1-eb2d-11e9-b8d1-42010a800093"
    );
    assert_eq!(s.current_portal.to_string(), "10.20.23.99:3260");
    assert_eq!(
        s.persistent_portal
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("10.20.23.99:3260")
    );
    assert_eq!(s.tpgt, 1);
    assert_eq!(s.sid, 1);
    assert_eq!(s.iface.as_deref(), Some("default"));
    assert_eq!(
        s.initiator.as_deref(),
        Some("iqn.1993-08.org.debian:01:f6771fccb5af")
    );
    assert_eq!(s.connection_state.as_deref(), Some("Unknown"));
    assert_eq!(s.session_state.as_deref(), Some("LOGGED_IN"));
    assert_eq!(s.scsi_host, Some(1));
    assert_eq!(
        s.disks,
        [AttachedDisk {
            hctl: Hctl::parse("1:0:0:0").expect("hctl"),
            kernel_name: "sdb".to_owned(),
            state: Some("running".to_owned()),
        }]
    );
}

#[test]
fn p1_detail_with_two_portals_and_malformed_sessions() {
    // -P 1 layout (no CHAP, params or devices), one target over two
    // portals, then a session whose portal and SID are unreadable.
    let text = "Target: iqn.2003-01.org.linux-iscsi.lab:t1 (non-flash)\n\
\tCurrent Portal: 10.0.0.1:3260,1\n\
\tPersistent Portal: 10.0.0.1:3260,1\n\
\t\t**********\n\t\tInterface:\n\t\t**********\n\
\t\tIface Name: default\n\t\tIface Transport: tcp\n\
\t\tSID: 4\n\t\tiSCSI Connection State: LOGGED IN\n\t\tiSCSI Session State: LOGGED_IN\n\
\tCurrent Portal: 10.0.0.2:3260,2\n\
\tPersistent Portal: 10.0.0.2:3260,2\n\
\t\tSID: 5\n\t\tiSCSI Connection State: TRANSPORT WAIT\n\t\tiSCSI Session State: FAILED\n\
Target: iqn.2003-01.org.linux-iscsi.lab:t2 (non-flash)\n\
\tCurrent Portal: not a portal\n\t\tSID: 6\n\
\tCurrent Portal: 10.0.0.3:3260,1\n\t\tSID: many\n\
Target: bad name with blanks\n\
\tCurrent Portal: 10.0.0.4:3260,1\n\t\tSID: 7\n";
    let sessions = parse_session_detail(text);
    let got: Vec<(&str, String, u32, Option<&str>)> = sessions
        .iter()
        .map(|s| {
            (
                s.target.as_str(),
                s.current_portal.to_string(),
                s.sid,
                s.session_state.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                "iqn.2003-01.org.linux-iscsi.lab:t1",
                "10.0.0.1:3260".to_owned(),
                4,
                Some("LOGGED_IN")
            ),
            (
                "iqn.2003-01.org.linux-iscsi.lab:t1",
                "10.0.0.2:3260".to_owned(),
                5,
                Some("FAILED")
            ),
        ]
    );
    assert_eq!(sessions[1].tpgt, 2);
    assert_eq!(sessions[0].connection_state.as_deref(), Some("LOGGED IN"));
}

#[test]
fn portal_spellings() {
    for (input, shown) in [
        ("10.0.0.1:3260", "10.0.0.1:3260"),
        ("10.0.0.1", "10.0.0.1:3260"),
        (" 10.0.0.1:3261 ", "10.0.0.1:3261"),
        ("[fd00::1]:3260", "[fd00::1]:3260"),
        ("[fd00::1]", "[fd00::1]:3260"),
        ("fd00::1", "[fd00::1]:3260"),
        ("array.example.com:860", "array.example.com:860"),
    ] {
        assert_eq!(
            Portal::parse(input).map(|p| p.to_string()),
            Ok(shown.to_owned()),
            "{input:?}"
        );
    }
    for bad in [
        "",
        ":3260",
        "10.0.0.1:",
        "10.0.0.1:0",
        "10.0.0.1:70000",
        "[fd00::1",
        "[fd00::1]x",
        "-p:3260",
        "a b:3260",
        "10.0.0.1:32a",
    ] {
        assert!(Portal::parse(bad).is_err(), "{bad:?}");
    }
    assert_eq!(Portal::new("fd00::1", 3260).map(|p| p.port()), Ok(3260));
}
