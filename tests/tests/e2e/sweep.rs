//! The bad-input sweep through a real lab: every CSI and agent-API RPC sent
//! malformed requests, each answer's code checked against the spec's
//! tables, and no device touched.

use csi_scsi_tests::reliability::{Scale, seed_from_env, sweep};

#[tokio::test]
#[ignore = "CI runs it through target/debug/reliability --quick, which prints its figures"]
async fn every_malformed_request_gets_the_spec_code_and_touches_no_device() {
    csi_scsi_certs::install_crypto_provider();
    let dir = tempfile::tempdir().expect("tempdir");
    let report = sweep::run(Scale::Quick, seed_from_env(), &dir.path().join("lab"))
        .await
        .expect("sweep ran");
    println!("{}", report.render());
    // Every RPC of four services, each with a table of cases: far more
    // than a sweep that stopped early or skipped a service would send.
    assert!(
        report.operations >= 600,
        "only {} requests:\n{}",
        report.operations,
        report.render()
    );
    assert!(
        report.invariants >= 2 * report.operations,
        "too few checks per request:\n{}",
        report.render()
    );
    for service in ["identity", "controller", "node", "agent-api", "wire"] {
        assert!(
            report
                .notes
                .iter()
                .any(|n| n.starts_with(&format!("{service} codes:"))),
            "no request reached {service}:\n{}",
            report.render()
        );
    }
    assert!(report.passed(), "{}", report.render());
}
