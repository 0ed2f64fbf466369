//! The supply-chain policy in deny.toml refuses what it says it refuses.
//! Each case feeds the real `cargo deny` the workspace's real `cargo
//! metadata`, with one crate changed the way an attacker would change it
//! (its source a git fork or another registry, its license, a `*`
//! requirement), and expects the check to fail naming that crate; the
//! metadata unchanged must pass, so the failure is the change's.
//!
//! Needs `cargo deny` (CI installs it: .ci/run). Without it the test says
//! so and passes, unless CSI_SCSI_REQUIRE_CARGO_DENY is set (CI sets it).
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Whether `cargo deny` runs here.
fn have_cargo_deny() -> bool {
    let ok = cargo()
        .args(["deny", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("CSI_SCSI_REQUIRE_CARGO_DENY").is_none(),
            "cargo deny is not installed, and CSI_SCSI_REQUIRE_CARGO_DENY is set"
        );
        println!("skipped: cargo deny is not installed (cargo install --locked cargo-deny)");
    }
    ok
}

/// The workspace's metadata, as cargo-deny itself asks for it.
fn metadata() -> Value {
    let out = cargo()
        .current_dir(workspace())
        .args([
            "metadata",
            "--format-version",
            "1",
            "--all-features",
            "--frozen",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `cargo deny check <checks>` of the workspace's deny.toml over `metadata`.
fn deny(metadata: &Value, checks: &[&str], dir: &Path, name: &str) -> Output {
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, serde_json::to_vec(metadata).unwrap()).unwrap();
    let root = workspace();
    let mut args = vec![
        "deny".to_owned(),
        "--frozen".into(),
        "--color".into(),
        "never".into(),
        "--manifest-path".into(),
        root.join("Cargo.toml").display().to_string(),
        "--metadata-path".into(),
        path.display().to_string(),
        "--config".into(),
        root.join("deny.toml").display().to_string(),
        "check".into(),
    ];
    args.extend(checks.iter().map(|c| (*c).to_owned()));
    cargo().current_dir(&root).args(&args).output().unwrap()
}

/// The package `name@version` in `metadata`, to change.
fn package<'a>(metadata: &'a mut Value, name: &str, version: &str) -> &'a mut Value {
    metadata["packages"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|p| p["name"] == name && p["version"] == version)
        .unwrap_or_else(|| panic!("{name} {version} is not in the workspace's metadata"))
}

/// The first registry dependency of the workspace's crates, as
/// (package, dependency) indexes.
fn some_registry_dependency(metadata: &Value) -> (usize, usize) {
    let members: Vec<&Value> = metadata["workspace_members"]
        .as_array()
        .unwrap()
        .iter()
        .collect();
    for (p, pkg) in metadata["packages"].as_array().unwrap().iter().enumerate() {
        if !members.contains(&&pkg["id"]) {
            continue;
        }
        for (d, dep) in pkg["dependencies"].as_array().unwrap().iter().enumerate() {
            if dep["source"]
                .as_str()
                .is_some_and(|s| s.starts_with("registry+"))
                && dep["kind"].is_null()
            {
                return (p, d);
            }
        }
    }
    panic!("no registry dependency in the workspace");
}

/// `out` failed with diagnostic `code` (`error[code]`) on `crate_name`.
fn expect_failure(out: &Output, code: &str, crate_name: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{code}: passed\n{stderr}");
    assert!(
        stderr.contains(&format!("error[{code}]")) && stderr.contains(crate_name),
        "not error[{code}] on {crate_name}\n{stderr}"
    );
}

#[test]
fn cargo_deny_refuses_foreign_sources_licenses_and_wildcards() {
    if !have_cargo_deny() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let clean = metadata();
    let checks = ["licenses", "bans", "sources"];
    let out = deny(&clean, &checks, dir.path(), "clean");
    assert!(
        out.status.success(),
        "the workspace itself fails deny.toml:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A crate from a git fork instead of crates.io.
    let mut git = clean.clone();
    package(&mut git, "base64", "0.23.1")["source"] =
        "git+https://github.com/attacker/base64?rev=0123abc#0123abc0123abc0123abc0123abc0123abc012"
            .into();
    expect_failure(
        &deny(&git, &["sources"], dir.path(), "git"),
        "source-not-allowed",
        "base64",
    );

    // A crate from a registry other than crates.io.
    let mut registry = clean.clone();
    package(&mut registry, "base64", "0.23.1")["source"] =
        "registry+https://crates.attacker.example/index".into();
    expect_failure(
        &deny(&registry, &["sources"], dir.path(), "registry"),
        "source-not-allowed",
        "base64",
    );

    // A license nobody allowed.
    let mut license = clean.clone();
    package(&mut license, "base64", "0.23.1")["license"] = "GPL-3.0-only".into();
    expect_failure(
        &deny(&license, &["licenses"], dir.path(), "license"),
        "rejected",
        "base64",
    );

    // A `*` requirement: whatever version the registry serves.
    let mut wildcard = clean.clone();
    let (p, d) = some_registry_dependency(&wildcard);
    let dep = &mut wildcard["packages"][p]["dependencies"][d];
    let name = dep["name"].as_str().unwrap().to_owned();
    dep["req"] = "*".into();
    expect_failure(
        &deny(&wildcard, &["bans"], dir.path(), "wildcard"),
        "wildcard",
        &name,
    );
}
