//! The crash suite, and proof that it can fail: the same workload against a
//! proxy built to skip the bind's compare-and-swap (the debug-only
//! `CSI_SCSI_FAULT=skip-cas`) must report violations.

use csi_scsi_tests::reliability::crash::{self, CrashOptions};
use csi_scsi_tests::reliability::{Scale, seed_from_env};

#[tokio::test]
async fn the_crash_suite_catches_a_proxy_that_skips_the_compare_and_swap() {
    csi_scsi_certs::install_crypto_provider();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut opts = CrashOptions::new(Scale::Quick, seed_from_env(), &dir.path().join("lab"));
    opts.proxy_env = vec![("CSI_SCSI_FAULT".into(), "skip-cas".into())];
    opts.chaos = false;
    opts.stop_on_violation = true;
    let report = crash::run_with(opts).await.expect("suite ran");
    println!("{}", report.render());
    assert!(
        !report.passed(),
        "a proxy without the CAS went unnoticed:\n{}",
        report.render()
    );
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.contains("also answered for live volume")
                || v.contains("is not bound in the store")
                || v.contains("repeated answered")),
        "the violation names a double binding or a lost volume:\n{}",
        report.render()
    );
}

/// The suite itself; CI runs it through `target/debug/reliability --quick`
/// (which prints its figures), so here it only runs on demand.
#[tokio::test]
#[ignore = "run by target/debug/reliability in CI"]
async fn the_crash_suite_finds_no_violation() {
    csi_scsi_certs::install_crypto_provider();
    let dir = tempfile::tempdir().expect("tempdir");
    let report = crash::run(Scale::Quick, seed_from_env(), &dir.path().join("lab"))
        .await
        .expect("suite ran");
    println!("{}", report.render());
    assert!(report.passed(), "{}", report.render());
}
