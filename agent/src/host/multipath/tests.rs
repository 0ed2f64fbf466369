use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

use super::*;
use crate::host::command::CommandRunner;

/// A stand-in `multipath` printing `stderr` and exiting with `code`.
fn fake_multipath(code: i32, stderr: &str) -> (tempfile::TempDir, Host) {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("multipath");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"$*\" > '{}/argv'\necho '{stderr}' >&2\nexit {code}\n",
            dir.path().display()
        ),
    )
    .expect("script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let host = Host {
        sysfs: dir.path().join("sys"),
        dev: PathBuf::from("/nonexistent/dev"),
        mountinfo: PathBuf::from("/nonexistent/mountinfo"),
        kubelet_dir: PathBuf::from("/nonexistent/kubelet"),
        iscsi_nodes: std::path::PathBuf::from("/nonexistent/iscsi/nodes"),
        tools: BTreeMap::from([("multipath".to_owned(), script)]),
        runner: CommandRunner::new(Duration::from_secs(5)),
    };
    (dir, host)
}

#[tokio::test]
async fn flush_outcomes() {
    let (dir, host) = fake_multipath(0, "");
    assert_eq!(
        flush(&host, "mpathb").await.expect("flush"),
        FlushOutcome::Flushed
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("argv")).expect("argv"),
        "-f mpathb\n"
    );
    let (_d, host) = fake_multipath(1, "Jun 21 04:39:26 | mpathb: map in use");
    assert!(matches!(
        flush(&host, "mpathb").await,
        Err(MultipathError::MapInUse { .. })
    ));
    let (_d, host) = fake_multipath(1, "Jun 21 04:39:26 | mpathq: not a multipath device");
    assert_eq!(
        flush(&host, "mpathq").await.expect("gone"),
        FlushOutcome::NotPresent
    );
    let (_d, host) = fake_multipath(1, "something else");
    flush(&host, "mpathb").await.expect_err("failed");
    for bad in ["", "-F", "a b"] {
        assert!(
            matches!(
                flush(&host, bad).await,
                Err(MultipathError::InvalidMapName(_))
            ),
            "{bad:?}"
        );
    }
}

#[test]
fn configured_when_the_tool_is_named_or_the_kernel_module_is_loaded() {
    let (dir, mut host) = fake_multipath(0, "");
    assert!(is_configured(&host));
    host.tools.clear();
    assert!(!is_configured(&host));
    std::fs::create_dir_all(dir.path().join("sys/module/dm_multipath")).expect("mkdir");
    assert!(is_configured(&host));
}

/// A stand-in `multipathd` client answering `reply` with exit `code`.
fn fake_multipathd(code: i32, reply: &str) -> (tempfile::TempDir, Host) {
    let (dir, mut host) = fake_multipath(0, "");
    let script = dir.path().join("multipathd");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"$*\" > '{}/argv'\necho '{reply}'\nexit {code}\n",
            dir.path().display()
        ),
    )
    .expect("script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    host.tools.insert("multipathd".to_owned(), script);
    (dir, host)
}

#[tokio::test]
async fn resize_asks_multipathd_and_takes_only_ok_for_done() {
    let (dir, host) = fake_multipathd(0, "ok");
    resize(&host, "3600140500").await.expect("resized");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("argv")).expect("argv"),
        "resize map 3600140500\n"
    );
    // multipathd's client says "fail" (and exits 1) when the map cannot
    // follow its paths; an exit 0 without "ok" is no proof either.
    for (code, reply) in [(1, "fail"), (0, "timeout")] {
        let (_d, host) = fake_multipathd(code, reply);
        assert!(
            matches!(
                resize(&host, "3600140500").await,
                Err(MultipathError::Failed {
                    operation: "resize",
                    ..
                })
            ),
            "{code} {reply}"
        );
    }
    let (_d, host) = fake_multipathd(0, "ok");
    assert!(matches!(
        resize(&host, "--all").await,
        Err(MultipathError::InvalidMapName(_))
    ));
}
