//! The real kubectl against the lab's API server, as a user would run it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};

/// kubectl with one kubeconfig.
#[derive(Clone, Debug)]
pub struct Kubectl {
    program: PathBuf,
    kubeconfig: PathBuf,
}

impl Kubectl {
    /// kubectl at `program` using `kubeconfig`.
    pub fn new(program: &Path, kubeconfig: &Path) -> Self {
        Self {
            program: program.to_owned(),
            kubeconfig: kubeconfig.to_owned(),
        }
    }

    /// The kubeconfig it uses.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The same kubectl with another identity.
    pub fn with_kubeconfig(&self, kubeconfig: &Path) -> Self {
        Self::new(&self.program, kubeconfig)
    }

    /// Runs `kubectl args...`; its stdout, or an error with its stderr.
    pub fn run(&self, args: &[&str]) -> anyhow::Result<String> {
        self.run_with_input(args, None)
    }

    /// Runs kubectl with `input` on stdin (`apply -f -`).
    pub fn run_with_input(&self, args: &[&str], input: Option<&str>) -> anyhow::Result<String> {
        use std::io::Write;
        let mut child = Command::new(&self.program)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("spawning kubectl")?;
        if let Some(text) = input {
            child
                .stdin
                .take()
                .context("kubectl stdin")?
                .write_all(text.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8(out.stdout)?)
    }

    /// `kubectl get ... -o json`, parsed.
    pub fn get_json(&self, args: &[&str]) -> anyhow::Result<serde_json::Value> {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "json"]);
        Ok(serde_json::from_str(&self.run(&all)?)?)
    }

    /// `kubectl apply -f -` with `yaml`.
    pub fn apply(&self, yaml: &str) -> anyhow::Result<String> {
        self.run_with_input(&["apply", "-f", "-"], Some(yaml))
    }

    /// Polls until `check` returns `Some`, or fails after `timeout` with
    /// the last error and `what`.
    pub async fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut(&Self) -> anyhow::Result<Option<T>>,
    ) -> anyhow::Result<T> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last = String::new();
        loop {
            match check(self) {
                Ok(Some(v)) => return Ok(v),
                Ok(None) => {}
                Err(e) => last = format!("{e:#}"),
            }
            if tokio::time::Instant::now() > deadline {
                bail!("timed out after {timeout:?} waiting for {what} {last}");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}
