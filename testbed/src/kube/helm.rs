//! The real helm against the lab's API server, as a user would run it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

/// helm with one kubeconfig, and its own cache, config and data homes
/// (so a lab never writes into the caller's `~/.cache/helm`).
#[derive(Clone, Debug)]
pub struct Helm {
    program: PathBuf,
    kubeconfig: PathBuf,
    home: PathBuf,
}

impl Helm {
    /// helm at `program` using `kubeconfig`, keeping its files under `home`.
    pub fn new(program: &Path, kubeconfig: &Path, home: &Path) -> Self {
        Self {
            program: program.to_owned(),
            kubeconfig: kubeconfig.to_owned(),
            home: home.to_owned(),
        }
    }

    /// Runs `helm args...`; its stdout, or an error with its stderr.
    pub fn run(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(&self.program)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .env("HELM_CACHE_HOME", self.home.join("cache"))
            .env("HELM_CONFIG_HOME", self.home.join("config"))
            .env("HELM_DATA_HOME", self.home.join("data"))
            .stdin(Stdio::null())
            .output()
            .context("spawning helm")?;
        if !out.status.success() {
            bail!(
                "helm {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8(out.stdout)?)
    }
}
