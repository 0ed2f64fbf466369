//! One image recipe (`deploy/images/<image>.yaml`): what goes into the
//! image's root filesystem and how it runs. Unknown fields are refused, so
//! a misspelt key is an error rather than a silently missing file.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Deserialize;

/// A parsed recipe.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    /// The image's name.
    pub image: ImageName,
    /// The image config's `Entrypoint`.
    pub entrypoint: Vec<String>,
    /// The image config's `User` (`uid[:gid]`, numeric: the image has no
    /// /etc/passwd); unset is root.
    #[serde(default)]
    pub user: Option<String>,
    /// The image config's `Env` (`NAME=value`).
    #[serde(default)]
    pub env: Vec<String>,
    /// Binaries of this workspace, from `target/<profile>/`, stripped.
    #[serde(default)]
    pub cargo: Vec<CargoBinary>,
    /// Go tools built by `tools/build` (static: CGO_ENABLED=0).
    #[serde(default)]
    pub go: Vec<GoBinary>,
    /// Files and directories of this machine, each copied to the same path
    /// with every symlink on the way; ELF files bring their libraries.
    #[serde(default)]
    pub host: Vec<PathBuf>,
    /// Empty directories to create.
    #[serde(default)]
    pub dirs: Vec<Dir>,
    /// Files of this machine copied to another path (`/bin/bash` as the
    /// image's `/usr/bin/sh`), with their libraries.
    #[serde(default)]
    pub copies: Vec<Copy>,
}

/// A host file placed at another path in the image.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Copy {
    /// The file on this machine.
    pub from: PathBuf,
    /// Its path in the image.
    pub to: PathBuf,
}

/// Where the image's reference comes from.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ImageName {
    /// The name as deploy/ writes it (`csi-scsi/agent`); the tag is
    /// `lab images --tag`.
    Name(String),
    /// The whole reference (`registry.k8s.io/sig-storage/csi-provisioner:v5.3.0`)
    /// is the image of this container of the controller Deployment in
    /// deploy/base/controller.yaml; `--tag` does not apply.
    ControllerContainer(String),
    /// The whole reference, as written (`local/e2e/busybox:1.36.1-1`): an
    /// image a test suite asks for by name; `--tag` does not apply.
    Reference(String),
}

/// A binary of this workspace.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CargoBinary {
    /// The package that builds it (`cargo build -p <package>`).
    pub package: String,
    /// The binary's name (default: the package's name).
    #[serde(default)]
    pub bin: Option<String>,
    /// Its path in the image.
    pub to: PathBuf,
}

impl CargoBinary {
    /// The binary's file name under `target/<profile>/`.
    pub fn bin(&self) -> &str {
        self.bin.as_deref().unwrap_or(&self.package)
    }
}

/// A Go tool from `tools/build`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GoBinary {
    /// Its name in `tools/build`'s table.
    pub tool: String,
    /// Its path in the image.
    pub to: PathBuf,
}

/// An empty directory.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dir {
    pub path: PathBuf,
    /// Octal permission bits as a string (`"1777"`); default `"755"`.
    #[serde(default)]
    pub mode: Option<String>,
}

impl Dir {
    /// The permission bits.
    pub fn mode(&self) -> anyhow::Result<u32> {
        let text = self.mode.as_deref().unwrap_or("755");
        let mode = u32::from_str_radix(text, 8)
            .ok()
            .filter(|m| *m <= 0o7777)
            .with_context(|| {
                format!("dirs: {}: mode {text:?} is not octal", self.path.display())
            })?;
        Ok(mode)
    }
}

impl Recipe {
    /// Reads and checks recipe file `path`.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("recipe {}", path.display()))
    }

    /// Parses and checks a recipe.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let recipe: Recipe = serde_saphyr::from_str(text)?;
        recipe.check()?;
        Ok(recipe)
    }

    fn check(&self) -> anyhow::Result<()> {
        match &self.image {
            ImageName::Name(name) => {
                let last = name.rsplit('/').next().unwrap_or_default();
                if name.is_empty() || last.contains(':') || name.contains('@') {
                    bail!("image.name {name:?}: a name without tag (the tag is --tag)");
                }
            }
            ImageName::ControllerContainer(c) if c.is_empty() => {
                bail!("image.controller_container is empty")
            }
            ImageName::ControllerContainer(_) => {}
            // Checked where it is used: the archive's tag must parse.
            ImageName::Reference(r) => {
                crate::images::archive::tag(r).with_context(|| format!("image.reference {r:?}"))?;
            }
        }
        if self.entrypoint.is_empty() {
            bail!("entrypoint is empty");
        }
        if let Some(user) = &self.user {
            let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            let ok = match user.split_once(':') {
                Some((u, g)) => numeric(u) && numeric(g),
                None => numeric(user),
            };
            if !ok {
                bail!("user {user:?}: uid or uid:gid, numeric (the image has no /etc/passwd)");
            }
        }
        if let Some(bad) = self.env.iter().find(|e| !e.contains('=')) {
            bail!("env {bad:?}: not NAME=value");
        }
        let paths = self
            .cargo
            .iter()
            .map(|c| &c.to)
            .chain(self.go.iter().map(|g| &g.to))
            .chain(self.host.iter())
            .chain(self.dirs.iter().map(|d| &d.path));
        for path in paths {
            if !path.is_absolute() {
                bail!("{}: paths must be absolute", path.display());
            }
        }
        for dir in &self.dirs {
            dir.mode()?;
        }
        if self.cargo.is_empty() && self.go.is_empty() && self.host.is_empty() {
            bail!("the image would be empty: no cargo, go or host entries");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "
image:
  name: csi-scsi/proxy
entrypoint: [/usr/local/bin/csi-scsi-proxy]
user: \"65532:65532\"
cargo:
  - package: csi-scsi-proxy
    to: /usr/local/bin/csi-scsi-proxy
host:
  - /etc/ssl/certs/ca-certificates.crt
dirs:
  - path: /tmp
    mode: \"1777\"
";

    #[test]
    fn parses_a_recipe() -> anyhow::Result<()> {
        let r = Recipe::parse(GOOD)?;
        assert!(matches!(&r.image, ImageName::Name(n) if n == "csi-scsi/proxy"));
        assert_eq!(r.user.as_deref(), Some("65532:65532"));
        assert_eq!(r.cargo[0].bin(), "csi-scsi-proxy");
        assert_eq!(r.dirs[0].mode()?, 0o1777);
        let sidecar = Recipe::parse(
            "image: {controller_container: csi-provisioner}\n\
             entrypoint: [/csi-provisioner]\n\
             go: [{tool: csi-provisioner, to: /csi-provisioner}]\n",
        )?;
        assert!(
            matches!(sidecar.image, ImageName::ControllerContainer(c) if c == "csi-provisioner")
        );
        Ok(())
    }

    #[test]
    fn rejects_unknown_fields() {
        let top = format!("{GOOD}labels: {{a: b}}\n");
        let err = format!("{:#}", Recipe::parse(&top).expect_err("labels accepted"));
        assert!(err.contains("labels"), "{err}");
        let nested = GOOD.replace("    to: /usr/local/bin/csi-scsi-proxy", "    dest: /x");
        let err = format!("{:#}", Recipe::parse(&nested).expect_err("dest accepted"));
        assert!(err.contains("dest"), "{err}");
        let variant = GOOD.replace("  name: csi-scsi/proxy", "  ref: csi-scsi/proxy");
        assert!(Recipe::parse(&variant).is_err());
    }

    #[test]
    fn rejects_bad_values() {
        for (from, to) in [
            ("name: csi-scsi/proxy", "name: csi-scsi/proxy:1"),
            ("\"65532:65532\"", "nonroot"),
            ("- /etc/ssl/certs/ca-certificates.crt", "- etc/ssl"),
            ("\"1777\"", "\"rwx\""),
            ("[/usr/local/bin/csi-scsi-proxy]", "[]"),
        ] {
            let text = GOOD.replace(from, to);
            assert_ne!(text, GOOD);
            assert!(Recipe::parse(&text).is_err(), "{to} accepted");
        }
    }
}
