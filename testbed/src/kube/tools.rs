//! The Kubernetes binaries, built from the project's pinned Go modules by
//! `tools/build` (cached outside the repo, so this is instant once built).

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;

use anyhow::{Context, bail};

/// The variable that picks the Kubernetes minor of the shared test control
/// plane (`1.35`); unset, the newest supported minor.
pub const MINOR_ENV: &str = "CSI_SCSI_KUBERNETES_MINOR";

/// A Kubernetes minor release (`1.37`); `tools/kubernetes-<minor>/` pins it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KubeMinor {
    major: u32,
    minor: u32,
}

impl FromStr for KubeMinor {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<Self> {
        let parsed = s.split_once('.').and_then(|(major, minor)| {
            Some(Self {
                major: major.parse().ok()?,
                minor: minor.parse().ok()?,
            })
        });
        parsed.with_context(|| format!("{s:?} is not a Kubernetes minor such as 1.35"))
    }
}

impl fmt::Display for KubeMinor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl KubeMinor {
    /// The supported minors, newest first (`tools/build --kubernetes-minors`).
    pub fn supported() -> anyhow::Result<Vec<Self>> {
        run_build(&["--kubernetes-minors".to_owned()])?
            .lines()
            .map(str::parse)
            .collect()
    }

    /// The minor `CSI_SCSI_KUBERNETES_MINOR` names, if set.
    pub fn from_env() -> anyhow::Result<Option<Self>> {
        match std::env::var(MINOR_ENV) {
            Ok(v) => v
                .parse()
                .map(Some)
                .with_context(|| format!("{MINOR_ENV}={v}")),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(e) => Err(e).context(MINOR_ENV),
        }
    }

    /// Whether `git_version` (`v1.37.2`) is a release of this minor.
    pub fn matches(&self, git_version: &str) -> bool {
        git_version.starts_with(&format!("v{self}."))
    }
}

/// Paths of the Go tools, by name (`kube-apiserver`, `kubectl`, ...).
#[derive(Clone, Debug)]
pub struct GoTools {
    paths: HashMap<String, PathBuf>,
    kubernetes: KubeMinor,
}

impl GoTools {
    /// Builds (or finds in the cache) each named tool, Kubernetes at the
    /// newest supported minor.
    pub fn build(names: &[&str]) -> anyhow::Result<Self> {
        Self::build_at(None, names)
    }

    /// As `build`, Kubernetes at `minor` (`None`: the newest supported).
    pub fn build_at(minor: Option<KubeMinor>, names: &[&str]) -> anyhow::Result<Self> {
        let kubernetes = match minor {
            Some(m) => m,
            None => *KubeMinor::supported()?
                .first()
                .context("tools/ holds no kubernetes-<minor> folder")?,
        };
        let mut args = vec!["--kubernetes".to_owned(), kubernetes.to_string()];
        args.extend(names.iter().map(|n| (*n).to_owned()));
        let paths: Vec<PathBuf> = run_build(&args)?.lines().map(PathBuf::from).collect();
        if paths.len() != names.len() {
            bail!(
                "tools/build printed {} paths for {} tools",
                paths.len(),
                names.len()
            );
        }
        Ok(Self {
            paths: names.iter().map(|n| (*n).to_owned()).zip(paths).collect(),
            kubernetes,
        })
    }

    /// The Kubernetes minor the Kubernetes tools are built at.
    pub fn kubernetes(&self) -> KubeMinor {
        self.kubernetes
    }

    /// The path of tool `name`; panics if it was not asked for (a bug in the caller).
    pub fn path(&self, name: &str) -> &Path {
        self.paths
            .get(name)
            .unwrap_or_else(|| panic!("GoTools: {name} was not built"))
    }
}

/// Runs `tools/build ARGS` and returns its standard output.
fn run_build(args: &[String]) -> anyhow::Result<String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/build");
    let out = Command::new("bash")
        .arg(&script)
        .args(args)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "tools/build {} failed:\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minor_parses_prints_and_orders() {
        let m: KubeMinor = "1.35".parse().expect("parses");
        assert_eq!(m.to_string(), "1.35");
        assert!(m < "1.37".parse().expect("parses"));
        assert!("1.9".parse::<KubeMinor>().expect("parses") < m);
        for bad in ["1", "1.x", "v1.35", "", "1.35.2"] {
            assert!(bad.parse::<KubeMinor>().is_err(), "{bad}");
        }
        assert!(m.matches("v1.35.4"));
        assert!(!m.matches("v1.350.0"));
        assert!(!m.matches("v1.3"));
    }

    #[test]
    fn the_supported_minors_are_the_tools_folders_newest_first() {
        let minors = KubeMinor::supported().expect("tools/build --kubernetes-minors");
        assert!(minors.len() >= 2, "{minors:?}");
        assert!(minors.windows(2).all(|w| w[0] > w[1]), "{minors:?}");
        for m in &minors {
            let dir =
                Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../tools/kubernetes-{m}"));
            assert!(dir.join("go.mod").is_file(), "{}", dir.display());
        }
    }
}
