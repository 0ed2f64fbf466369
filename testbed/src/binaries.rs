//! Where the workspace's binaries are: next to the test executable's
//! target directory (`target/<profile>/`). Build them first with
//! `cargo build --workspace --bins` (the README's test command does).

use std::path::PathBuf;

/// Path of a workspace binary, e.g. `csi-scsi-agent`. Panics with a
/// build hint when it is missing, since no test can run without it.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> or target/<profile>/<bin> -> target/<profile>/<name>
    let mut dir = exe.parent().expect("target directory").to_path_buf();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} not found: run `cargo build --workspace --bins` first",
        path.display()
    );
    path
}
