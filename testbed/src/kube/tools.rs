//! The Kubernetes binaries, built from the project's pinned Go modules by
//! `tools/build` (cached outside the repo, so this is instant once built).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// Paths of the Go tools, by name (`kube-apiserver`, `kubectl`, ...).
#[derive(Clone, Debug)]
pub struct GoTools(HashMap<String, PathBuf>);

impl GoTools {
    /// Builds (or finds in the cache) each named tool.
    pub fn build(names: &[&str]) -> anyhow::Result<Self> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/build");
        let out = Command::new("bash")
            .arg(&script)
            .args(names)
            .output()
            .with_context(|| format!("running {}", script.display()))?;
        if !out.status.success() {
            bail!(
                "tools/build {} failed:\n{}",
                names.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let paths: Vec<PathBuf> = String::from_utf8(out.stdout)?
            .lines()
            .map(PathBuf::from)
            .collect();
        if paths.len() != names.len() {
            bail!(
                "tools/build printed {} paths for {} tools",
                paths.len(),
                names.len()
            );
        }
        Ok(Self(
            names.iter().map(|n| (*n).to_owned()).zip(paths).collect(),
        ))
    }

    /// The path of tool `name`; panics if it was not asked for (a bug in the caller).
    pub fn path(&self, name: &str) -> &Path {
        self.0
            .get(name)
            .unwrap_or_else(|| panic!("GoTools: {name} was not built"))
    }
}
