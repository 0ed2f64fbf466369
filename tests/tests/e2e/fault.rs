//! The fault suite (`csi_scsi_tests::reliability::fault`) in its quick
//! form: a node's link cut, certificates rotated under load, the proxy's
//! store full and unwritable. Replay a failure with `CSI_SCSI_SEED=<seed>`.

use csi_scsi_tests::reliability::{Scale, fault, seed_from_env};

// Several threads: the rotation's load loops and its checks run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "CI runs it through target/debug/reliability --quick, which prints its figures"]
async fn the_fault_suite_finds_no_violation() {
    let seed = seed_from_env();
    let dir = tempfile::tempdir().expect("tempdir");
    let report = fault::run(Scale::Quick, seed, &dir.path().join("lab"))
        .await
        .unwrap_or_else(|e| panic!("fault suite (seed {seed}): {e:#}"));
    println!("{}", report.render());
    assert!(report.passed(), "{}", report.render());
    // One cut, two rotations of four certificates, a full and an
    // unwritable store; the load alone makes hundreds of calls.
    assert!(report.faults >= 11, "faults injected:\n{}", report.render());
    assert!(report.operations >= 200, "operations:\n{}", report.render());
    assert!(report.invariants >= 50, "invariants:\n{}", report.render());
}
