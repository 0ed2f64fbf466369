//! Readiness: named checks that together decide CSI `Probe` (and later
//! `/readyz`). Each check looks at real state, never a constant.

use std::path::PathBuf;
use std::sync::Arc;

use csi_scsi_certs::MaterialStore;

/// One condition the process needs to do its work.
pub trait Check: Send + Sync {
    /// Short name for logs and status output.
    fn name(&self) -> &str;
    /// `Err(reason)` when the condition does not hold now.
    fn check(&self) -> Result<(), String>;
    /// What an operator should know while the check passes (`/readyz`
    /// prints it after `ready`).
    fn note(&self) -> Option<String> {
        None
    }
}

/// Every check of one process.
#[derive(Clone, Default)]
pub struct Readiness {
    checks: Vec<Arc<dyn Check>>,
}

/// TLS material is loaded and our certificate has not expired.
pub struct TlsMaterialCheck(pub Arc<MaterialStore>);

/// Host tools the process runs are present and executable.
pub struct ToolsCheck {
    tools: Vec<PathBuf>,
}

// A check chosen at run time (one backend or another).
impl<C: Check + ?Sized> Check for Box<C> {
    fn name(&self) -> &str {
        (**self).name()
    }

    fn check(&self) -> Result<(), String> {
        (**self).check()
    }
}

// === impl Readiness ===

impl Readiness {
    /// No checks: always ready.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a check.
    pub fn with(mut self, check: impl Check + 'static) -> Self {
        self.checks.push(Arc::new(check));
        self
    }

    /// The failing checks with their reasons; empty when ready.
    pub fn failures(&self) -> Vec<(String, String)> {
        self.checks
            .iter()
            .filter_map(|c| c.check().err().map(|why| (c.name().to_owned(), why)))
            .collect()
    }

    /// The notes of the passing checks: `(name, note)`.
    pub fn notes(&self) -> Vec<(String, String)> {
        self.checks
            .iter()
            .filter(|c| c.check().is_ok())
            .filter_map(|c| c.note().map(|n| (c.name().to_owned(), n)))
            .collect()
    }

    /// Whether every check passes now.
    pub fn is_ready(&self) -> bool {
        self.failures().is_empty()
    }
}

impl std::fmt::Debug for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.checks.iter().map(|c| c.name().to_owned()))
            .finish()
    }
}

// === impl TlsMaterialCheck ===

impl Check for TlsMaterialCheck {
    fn name(&self) -> &str {
        "tls"
    }

    fn note(&self) -> Option<String> {
        let left = self.0.current().remaining().as_secs();
        Some(format!(
            "certificate expires in {}h{:02}m",
            left / 3600,
            (left % 3600) / 60
        ))
    }

    fn check(&self) -> Result<(), String> {
        let material = self.0.current();
        if !material.is_enrolled() {
            return Err(format!(
                "no certificate yet: waiting for the proxy to enrol {} ({} holds none that is usable)",
                material.identity(),
                self.0.paths().cert.display()
            ));
        }
        if material.remaining().is_zero() {
            return Err(format!(
                "certificate {} (serial {}) has expired",
                self.0.paths().cert.display(),
                material.serial()
            ));
        }
        // The files may have been removed since the last load.
        for path in [
            &self.0.paths().cert,
            &self.0.paths().key,
            &self.0.paths().ca,
        ] {
            if !path.exists() {
                return Err(format!("{} is missing", path.display()));
            }
        }
        Ok(())
    }
}

// === impl ToolsCheck ===

impl ToolsCheck {
    /// Checks each tool: an absolute path as given, a bare name on `$PATH`.
    pub fn new(tools: impl IntoIterator<Item = PathBuf>) -> Self {
        Self {
            tools: tools.into_iter().collect(),
        }
    }
}

impl Check for ToolsCheck {
    fn name(&self) -> &str {
        "host-tools"
    }

    fn check(&self) -> Result<(), String> {
        let missing: Vec<String> = self
            .tools
            .iter()
            .filter(|t| !is_executable(t))
            .map(|t| t.display().to_string())
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("missing host tools: {}", missing.join(", ")))
        }
    }
}

fn is_executable(tool: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &std::path::Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if tool.is_absolute() {
        return runnable(tool);
    }
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| runnable(&dir.join(tool))))
        .unwrap_or(false)
}
