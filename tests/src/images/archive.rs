//! The docker-archive format (`docker save`): an outer tar holding
//! `manifest.json` (one entry per image: `Config`, `RepoTags`, `Layers`),
//! each image's config JSON and its layers as uncompressed tars. Both
//! `ctr images import` and `docker load` read it. Everything here is
//! reproducible: GNU tar with sorted names, owner 0:0 and mtime 0, and a
//! config with a fixed creation time, so the same root filesystem gives the
//! same layer digest and the same image ID.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde_json::json;

use crate::lab::net::sh;

/// The creation time every config carries (reproducible image IDs).
const EPOCH: &str = "1970-01-01T00:00:00Z";

/// One layer tar, made from a root filesystem directory.
#[derive(Clone, Debug)]
pub struct Layer {
    /// The uncompressed tar.
    pub tar: PathBuf,
    /// sha256 of the uncompressed tar, hex (the config's diff_id).
    pub diff_id: String,
    /// Its size in bytes.
    pub bytes: u64,
}

/// The runtime part of an image config (`config` in the JSON).
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// `Entrypoint`: the command the container runs.
    pub entrypoint: Vec<String>,
    /// `User` (`uid[:gid]`); `None` leaves it unset (root).
    pub user: Option<String>,
    /// `Env`, as `NAME=value`.
    pub env: Vec<String>,
}

/// One image of an archive: its names and config, over the archive's layer.
#[derive(Clone, Debug)]
pub struct Image {
    /// References as written anywhere (`csi-scsi/agent:dev`,
    /// `docker.io/local/pause:1`, `registry.k8s.io/x/y:v1`); RepoTags gets
    /// their familiar form, as `docker save` writes it.
    pub references: Vec<String>,
    pub config: Config,
}

/// GNU tar's flags for a reproducible archive: sorted, numeric owner 0:0,
/// mtime 0 (the same files give the same digest).
const REPRODUCIBLE: &[&str] = &[
    "--numeric-owner",
    "--owner=0",
    "--group=0",
    "--sort=name",
    "--mtime=@0",
];

/// Tars `rootfs` into `tar` (reproducibly) and digests it.
pub fn layer(rootfs: &Path, tar: &Path) -> anyhow::Result<Layer> {
    let (root, out) = (rootfs.display().to_string(), tar.display().to_string());
    let mut args = REPRODUCIBLE.to_vec();
    args.extend(["-C", &root, "-cf", &out, "."]);
    sh("tar", &args).context("tar of the root filesystem")?;
    let bytes = std::fs::metadata(tar)?.len();
    Ok(Layer {
        tar: tar.to_owned(),
        diff_id: sha256(tar)?,
        bytes,
    })
}

/// Writes the docker-archive `archive`: every image in `images` over the
/// single layer `layer`. `work` is an empty scratch directory.
pub fn write(archive: &Path, work: &Path, layer: &Layer, images: &[Image]) -> anyhow::Result<()> {
    let layer_name = format!("{}/layer.tar", layer.diff_id);
    std::fs::create_dir_all(work.join(&layer.diff_id))?;
    std::fs::hard_link(&layer.tar, work.join(&layer_name))
        .or_else(|_| std::fs::copy(&layer.tar, work.join(&layer_name)).map(|_| ()))
        .context("placing the layer in the archive")?;
    let mut members = vec!["manifest.json".to_owned(), layer_name.clone()];
    let mut manifest = Vec::new();
    for image in images {
        let config = serde_json::to_vec(&config_json(&image.config, &layer.diff_id))?;
        let file = format!("{}.json", sha256_bytes(&config, work)?);
        std::fs::write(work.join(&file), &config)?;
        let tags = image
            .references
            .iter()
            .map(|r| familiar(r))
            .collect::<anyhow::Result<Vec<_>>>()?;
        manifest.push(json!({"Config": file, "RepoTags": tags, "Layers": [layer_name]}));
        if !members.contains(&file) {
            members.push(file);
        }
    }
    std::fs::write(work.join("manifest.json"), serde_json::to_vec(&manifest)?)?;
    let mut args: Vec<String> = REPRODUCIBLE.iter().map(|a| (*a).to_owned()).collect();
    args.push("-C".into());
    args.push(work.display().to_string());
    args.push("-cf".into());
    args.push(archive.display().to_string());
    args.extend(members);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    sh("tar", &args).context("tar of the image archive")?;
    Ok(())
}

/// The image config JSON (the OCI/docker image config).
fn config_json(config: &Config, diff_id: &str) -> serde_json::Value {
    let mut runtime = json!({"WorkingDir": "/"});
    if !config.entrypoint.is_empty() {
        runtime["Entrypoint"] = json!(config.entrypoint);
    }
    if let Some(user) = &config.user {
        runtime["User"] = json!(user);
    }
    if !config.env.is_empty() {
        runtime["Env"] = json!(config.env);
    }
    json!({
        "architecture": "amd64",
        "os": "linux",
        "created": EPOCH,
        "config": runtime,
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]},
    })
}

/// A reference split the way docker's reference grammar does.
struct Parsed {
    domain: String,
    path: String,
    tag: String,
}

fn parse(reference: &str) -> anyhow::Result<Parsed> {
    if reference.contains('@') {
        bail!("image reference {reference:?}: digests are not supported, only name:tag");
    }
    let (name, tag) = match reference.rsplit_once(':') {
        Some((n, t)) if !t.contains('/') => (n, t),
        _ => (reference, "latest"),
    };
    if name.is_empty() || tag.is_empty() || name.chars().any(char::is_whitespace) {
        bail!("image reference {reference:?} is not name[:tag]");
    }
    let (domain, path) = match name.split_once('/') {
        Some((first, rest))
            if first.contains('.') || first.contains(':') || first == "localhost" =>
        {
            (first, rest.to_owned())
        }
        _ => ("docker.io", name.to_owned()),
    };
    let domain = if domain == "index.docker.io" {
        "docker.io"
    } else {
        domain
    };
    let path = if domain == "docker.io" && !path.contains('/') {
        format!("library/{path}")
    } else {
        path
    };
    if path.to_lowercase() != path {
        bail!("image reference {reference:?}: the repository must be lower case");
    }
    Ok(Parsed {
        domain: domain.to_owned(),
        path,
        tag: tag.to_owned(),
    })
}

/// The fully qualified reference, as containerd names the image
/// (`csi-scsi/agent:dev` -> `docker.io/csi-scsi/agent:dev`,
/// `busybox` -> `docker.io/library/busybox:latest`).
pub fn qualified(reference: &str) -> anyhow::Result<String> {
    let p = parse(reference)?;
    Ok(format!("{}/{}:{}", p.domain, p.path, p.tag))
}

/// The familiar form, as `docker save` writes RepoTags
/// (`docker.io/csi-scsi/agent:dev` -> `csi-scsi/agent:dev`,
/// `docker.io/library/busybox:1` -> `busybox:1`); other registries keep
/// their domain.
pub fn familiar(reference: &str) -> anyhow::Result<String> {
    let p = parse(reference)?;
    Ok(match p.domain.as_str() {
        "docker.io" => match p.path.strip_prefix("library/") {
            Some(short) if !short.contains('/') => format!("{short}:{}", p.tag),
            _ => format!("{}:{}", p.path, p.tag),
        },
        domain => format!("{domain}/{}:{}", p.path, p.tag),
    })
}

/// The tag of a reference (`latest` when it has none).
pub fn tag(reference: &str) -> anyhow::Result<String> {
    Ok(parse(reference)?.tag)
}

/// sha256 of a file, hex.
pub fn sha256(path: &Path) -> anyhow::Result<String> {
    let out = sh("sha256sum", &["--", &path.display().to_string()])?;
    Ok(out
        .split_whitespace()
        .next()
        .context("sha256sum printed nothing")?
        .to_owned())
}

/// sha256 of bytes, hex (through a scratch file in `work`: one module
/// spawns processes, and it takes arguments, not input).
fn sha256_bytes(bytes: &[u8], work: &Path) -> anyhow::Result<String> {
    let scratch = work.join(".digest");
    std::fs::write(&scratch, bytes)?;
    let digest = sha256(&scratch);
    std::fs::remove_file(&scratch)?;
    digest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_normalise_as_docker_and_containerd_do() -> anyhow::Result<()> {
        let cases = [
            // (as written, familiar / RepoTags, qualified / containerd)
            (
                "csi-scsi/agent:dev",
                "csi-scsi/agent:dev",
                "docker.io/csi-scsi/agent:dev",
            ),
            (
                "docker.io/csi-scsi/agent:dev",
                "csi-scsi/agent:dev",
                "docker.io/csi-scsi/agent:dev",
            ),
            (
                "busybox",
                "busybox:latest",
                "docker.io/library/busybox:latest",
            ),
            (
                "docker.io/library/busybox:1",
                "busybox:1",
                "docker.io/library/busybox:1",
            ),
            (
                "registry.k8s.io/sig-storage/csi-provisioner:v5.3.0",
                "registry.k8s.io/sig-storage/csi-provisioner:v5.3.0",
                "registry.k8s.io/sig-storage/csi-provisioner:v5.3.0",
            ),
            (
                "localhost:5000/csi-scsi/proxy",
                "localhost:5000/csi-scsi/proxy:latest",
                "localhost:5000/csi-scsi/proxy:latest",
            ),
        ];
        for (written, fam, qual) in cases {
            assert_eq!(familiar(written)?, fam, "{written}");
            assert_eq!(qualified(written)?, qual, "{written}");
        }
        assert!(qualified("x/y@sha256:00").is_err());
        assert!(qualified("CSI/agent:1").is_err());
        assert_eq!(tag("registry.k8s.io/a/b:v1.2.3")?, "v1.2.3");
        Ok(())
    }

    #[test]
    fn archive_has_manifest_config_and_layer() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let rootfs = dir.path().join("rootfs");
        std::fs::create_dir_all(rootfs.join("etc"))?;
        std::fs::write(rootfs.join("etc/hello"), "hi\n")?;
        let layer = layer(&rootfs, &dir.path().join("layer.tar"))?;
        // Reproducible: the same tree gives the same digest.
        let again = super::layer(&rootfs, &dir.path().join("again.tar"))?;
        assert_eq!(layer.diff_id, again.diff_id);
        let work = dir.path().join("work");
        std::fs::create_dir(&work)?;
        let archive = dir.path().join("image.tar");
        let image = Image {
            references: vec!["docker.io/csi-scsi/agent:dev".into()],
            config: Config {
                entrypoint: vec!["/bin/x".into()],
                user: Some("0".into()),
                env: vec!["PATH=/bin".into()],
            },
        };
        write(&archive, &work, &layer, &[image])?;
        let listing = sh("tar", &["-tf", &archive.display().to_string()])?;
        assert!(listing.lines().any(|l| l == "manifest.json"), "{listing}");
        let layer_name = format!("{}/layer.tar", layer.diff_id);
        assert!(listing.lines().any(|l| l == layer_name), "{listing}");
        let read = |name: &str| -> anyhow::Result<serde_json::Value> {
            Ok(serde_json::from_slice(&std::fs::read(work.join(name))?)?)
        };
        let manifest = read("manifest.json")?;
        assert_eq!(manifest[0]["RepoTags"], json!(["csi-scsi/agent:dev"]));
        assert_eq!(manifest[0]["Layers"], json!([layer_name]));
        let config_file = manifest[0]["Config"].as_str().context("Config")?;
        let config = read(config_file)?;
        assert_eq!(config["config"]["User"], "0");
        assert_eq!(config["config"]["Entrypoint"], json!(["/bin/x"]));
        assert_eq!(
            config["rootfs"]["diff_ids"],
            json!([format!("sha256:{}", layer.diff_id)])
        );
        // Content-addressed, as docker save names it.
        assert_eq!(
            format!("{}.json", sha256(&work.join(config_file))?),
            config_file
        );
        Ok(())
    }
}
