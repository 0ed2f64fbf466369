//! The image archive: an OCI image layout (`oci-layout`, `index.json`,
//! `blobs/sha256/...`) that also holds docker's `manifest.json`, as
//! `docker save` writes it since Docker 25. `ctr images import` reads the
//! OCI layout (it prefers it), older `docker load` the `manifest.json`.
//!
//! The OCI manifest is written here, not by the importer, so its digest
//! (what a `name:tag@sha256:...` reference pins) is known before any
//! import: containerd would otherwise write its own manifest over a
//! gzip of the layer, whose bytes depend on its Go version. Everything is
//! reproducible: GNU tar with sorted names, owner 0:0 and mtime 0, a config
//! with a fixed creation time, and JSON from structs (field order fixed
//! whatever serde_json's features), so the same root filesystem gives the
//! same layer, config and manifest digests.

use std::path::{Path, PathBuf};

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use serde::Serialize;

use crate::lab::net::sh;

/// The creation time every config carries (reproducible image IDs).
const EPOCH: &str = "1970-01-01T00:00:00Z";

/// OCI media types of what the archive holds.
const MEDIA_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const MEDIA_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const MEDIA_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// An uncompressed layer: the digest is of the tar itself, no compressor
/// (and its version) in between.
const MEDIA_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
/// The annotation containerd names an imported image by.
const ANNOTATION_NAME: &str = "io.containerd.image.name";
/// The OCI annotation for the tag.
const ANNOTATION_REF: &str = "org.opencontainers.image.ref.name";

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

/// A content descriptor (OCI).
#[derive(Serialize)]
struct Descriptor<'a> {
    #[serde(rename = "mediaType")]
    media_type: &'a str,
    digest: String,
    size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    platform: Option<Platform>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<&'a str, String>,
}

#[derive(Serialize)]
struct Platform {
    architecture: &'static str,
    os: &'static str,
}

/// The image manifest (OCI): the bytes whose sha256 a pin names.
#[derive(Serialize)]
struct Manifest<'a> {
    #[serde(rename = "schemaVersion")]
    schema_version: u32,
    #[serde(rename = "mediaType")]
    media_type: &'a str,
    config: Descriptor<'a>,
    layers: Vec<Descriptor<'a>>,
}

#[derive(Serialize)]
struct Index<'a> {
    #[serde(rename = "schemaVersion")]
    schema_version: u32,
    #[serde(rename = "mediaType")]
    media_type: &'a str,
    manifests: Vec<Descriptor<'a>>,
}

/// `docker save`'s manifest.json entry.
#[derive(Serialize)]
struct DockerEntry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "RepoTags")]
    repo_tags: Vec<String>,
    #[serde(rename = "Layers")]
    layers: Vec<String>,
}

/// Writes the image archive `archive`: every image in `images` over the
/// single layer `layer`. `work` is an empty scratch directory. Returns
/// each image's manifest digest (`sha256:<hex>`), in order. Each image is
/// named in the index by its references (`repo:tag`) and by its digest
/// (`repo@sha256:...`), the two names a registry pull gives it, so a Pod
/// spec may use either.
pub fn write(
    archive: &Path,
    work: &Path,
    layer: &Layer,
    images: &[Image],
) -> anyhow::Result<Vec<String>> {
    let blobs = work.join("blobs/sha256");
    std::fs::create_dir_all(&blobs)?;
    let layer_name = format!("blobs/sha256/{}", layer.diff_id);
    std::fs::hard_link(&layer.tar, work.join(&layer_name))
        .or_else(|_| std::fs::copy(&layer.tar, work.join(&layer_name)).map(|_| ()))
        .context("placing the layer in the archive")?;
    let mut members = vec![
        "oci-layout".to_owned(),
        "index.json".to_owned(),
        "manifest.json".to_owned(),
        layer_name.clone(),
    ];
    let mut blob = |bytes: &[u8]| -> anyhow::Result<(String, u64)> {
        let hex = sha256_bytes(bytes, work)?;
        let name = format!("blobs/sha256/{hex}");
        std::fs::write(work.join(&name), bytes)?;
        if !members.contains(&name) {
            members.push(name);
        }
        Ok((hex, bytes.len() as u64))
    };
    let mut docker = Vec::new();
    let mut index = Vec::new();
    let mut digests = Vec::new();
    for image in images {
        let config = serde_json::to_vec(&config_json(&image.config, &layer.diff_id))?;
        let (config_hex, config_size) = blob(&config)?;
        let manifest = Manifest {
            schema_version: 2,
            media_type: MEDIA_MANIFEST,
            config: descriptor(MEDIA_CONFIG, &config_hex, config_size),
            layers: vec![descriptor(MEDIA_LAYER, &layer.diff_id, layer.bytes)],
        };
        let (manifest_hex, manifest_size) = blob(&serde_json::to_vec(&manifest)?)?;
        let digest = format!("sha256:{manifest_hex}");
        for reference in &image.references {
            let p = parse(reference)?;
            for (name, tag) in [
                (
                    format!("{}/{}:{}", p.domain, p.path, p.tag),
                    Some(p.tag.clone()),
                ),
                (format!("{}/{}@{digest}", p.domain, p.path), None),
            ] {
                let mut entry = descriptor(MEDIA_MANIFEST, &manifest_hex, manifest_size);
                entry.platform = Some(Platform {
                    architecture: "amd64",
                    os: "linux",
                });
                entry.annotations.insert(ANNOTATION_NAME, name);
                if let Some(tag) = tag {
                    entry.annotations.insert(ANNOTATION_REF, tag);
                }
                index.push(entry);
            }
        }
        docker.push(DockerEntry {
            config: format!("blobs/sha256/{config_hex}"),
            repo_tags: image
                .references
                .iter()
                .map(|r| familiar(r))
                .collect::<anyhow::Result<_>>()?,
            layers: vec![layer_name.clone()],
        });
        digests.push(digest);
    }
    let index = Index {
        schema_version: 2,
        media_type: MEDIA_INDEX,
        manifests: index,
    };
    std::fs::write(work.join("index.json"), serde_json::to_vec(&index)?)?;
    std::fs::write(work.join("manifest.json"), serde_json::to_vec(&docker)?)?;
    std::fs::write(
        work.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    let mut args: Vec<String> = REPRODUCIBLE.iter().map(|a| (*a).to_owned()).collect();
    args.push("-C".into());
    args.push(work.display().to_string());
    args.push("-cf".into());
    args.push(archive.display().to_string());
    args.extend(members);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    sh("tar", &args).context("tar of the image archive")?;
    Ok(digests)
}

fn descriptor<'a>(media_type: &'a str, hex: &str, size: u64) -> Descriptor<'a> {
    Descriptor {
        media_type,
        digest: format!("sha256:{hex}"),
        size,
        platform: None,
        annotations: BTreeMap::new(),
    }
}

/// The image config (OCI/docker), field order fixed: its bytes are
/// hashed into the manifest.
#[derive(Serialize)]
struct ImageConfig<'a> {
    architecture: &'static str,
    os: &'static str,
    created: &'static str,
    config: RuntimeConfig<'a>,
    rootfs: RootFs,
}

#[derive(Serialize)]
struct RuntimeConfig<'a> {
    #[serde(rename = "Entrypoint", skip_serializing_if = "<[String]>::is_empty")]
    entrypoint: &'a [String],
    #[serde(rename = "Env", skip_serializing_if = "<[String]>::is_empty")]
    env: &'a [String],
    #[serde(rename = "User", skip_serializing_if = "Option::is_none")]
    user: Option<&'a str>,
    #[serde(rename = "WorkingDir")]
    working_dir: &'static str,
}

#[derive(Serialize)]
struct RootFs {
    #[serde(rename = "type")]
    kind: &'static str,
    diff_ids: Vec<String>,
}

/// The image config of `config` over the layer `diff_id`.
fn config_json<'a>(config: &'a Config, diff_id: &str) -> ImageConfig<'a> {
    ImageConfig {
        architecture: "amd64",
        os: "linux",
        created: EPOCH,
        config: RuntimeConfig {
            entrypoint: &config.entrypoint,
            env: &config.env,
            user: config.user.as_deref(),
            working_dir: "/",
        },
        rootfs: RootFs {
            kind: "layers",
            diff_ids: vec![format!("sha256:{diff_id}")],
        },
    }
}

/// A reference split the way docker's reference grammar does.
struct Parsed {
    domain: String,
    path: String,
    tag: String,
    /// `sha256:<hex>` when the reference pins one.
    digest: Option<String>,
}

/// A manifest digest as a reference pins it: `sha256:` and 64 lower-case hex.
fn check_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

fn parse(reference: &str) -> anyhow::Result<Parsed> {
    let (reference, digest) = match reference.split_once('@') {
        Some((name, digest)) if check_digest(digest) => (name, Some(digest.to_owned())),
        Some(_) => {
            bail!("image reference {reference:?}: the digest is not sha256:<64 lower-case hex>")
        }
        None => (reference, None),
    };
    let (name, tag) = match reference.rsplit_once(':') {
        Some((n, t)) if !t.contains('/') => (n, t),
        _ => (reference, "latest"),
    };
    if name.is_empty() || tag.is_empty() || name.chars().any(char::is_whitespace) {
        bail!("image reference {reference:?} is not name[:tag][@sha256:...]");
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
        digest,
    })
}

/// The manifest digest a reference pins (`...@sha256:<hex>`), if any.
pub fn pinned_digest(reference: &str) -> anyhow::Result<Option<String>> {
    Ok(parse(reference)?.digest)
}

/// `reference` (as written) with its digest replaced by `digest`, or
/// `digest` added: `name:tag@sha256:...`.
pub fn pin(reference: &str, digest: &str) -> anyhow::Result<String> {
    if !check_digest(digest) {
        bail!("{digest:?} is not sha256:<64 lower-case hex>");
    }
    parse(reference)?;
    let name = reference.split_once('@').map_or(reference, |(n, _)| n);
    Ok(format!("{name}@{digest}"))
}

/// The fully qualified reference by tag, as containerd names the image
/// (`csi-scsi/agent:dev` -> `docker.io/csi-scsi/agent:dev`,
/// `busybox` -> `docker.io/library/busybox:latest`); a pinned digest is
/// left out (the image also gets that name: [`write`]).
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
        // A pinned reference: the tag and the digest both kept apart.
        let hex = "0123456789abcdef".repeat(4);
        let pinned = format!("registry.k8s.io/a/b:v1.2.3@sha256:{hex}");
        assert_eq!(qualified(&pinned)?, "registry.k8s.io/a/b:v1.2.3");
        assert_eq!(tag(&pinned)?, "v1.2.3");
        assert_eq!(pinned_digest(&pinned)?, Some(format!("sha256:{hex}")));
        assert_eq!(pinned_digest("registry.k8s.io/a/b:v1.2.3")?, None);
        assert!(qualified(&pinned.to_uppercase()).is_err());
        let other = format!("sha256:{}", "f".repeat(64));
        assert_eq!(
            pin(&pinned, &other)?,
            format!("registry.k8s.io/a/b:v1.2.3@{other}")
        );
        assert_eq!(pin("a/b:v1", &other)?, format!("a/b:v1@{other}"));
        assert!(pin("a/b:v1", "sha256:00").is_err());
        Ok(())
    }

    #[test]
    fn archive_is_an_oci_layout_with_docker_manifest() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let rootfs = dir.path().join("rootfs");
        std::fs::create_dir_all(rootfs.join("etc"))?;
        std::fs::write(rootfs.join("etc/hello"), "hi\n")?;
        let layer = layer(&rootfs, &dir.path().join("layer.tar"))?;
        // Reproducible: the same tree gives the same digest.
        let again = super::layer(&rootfs, &dir.path().join("again.tar"))?;
        assert_eq!(layer.diff_id, again.diff_id);
        let image = Image {
            references: vec!["docker.io/csi-scsi/agent:dev".into()],
            config: Config {
                entrypoint: vec!["/bin/x".into()],
                user: Some("0".into()),
                env: vec!["PATH=/bin".into()],
            },
        };
        let mut written = Vec::new();
        for run in ["work", "work-again"] {
            let work = dir.path().join(run);
            std::fs::create_dir(&work)?;
            let archive = dir.path().join(format!("{run}.tar"));
            let digests = write(&archive, &work, &layer, std::slice::from_ref(&image))?;
            written.push((work, archive, digests));
        }
        let (work, archive, digests) = &written[0];
        // The same image, written twice, has the same manifest digest.
        assert_eq!(digests, &written[1].2);
        let digest = &digests[0];
        let hex = digest.strip_prefix("sha256:").context("sha256:")?;
        let listing = sh("tar", &["-tf", &archive.display().to_string()])?;
        let layer_name = format!("blobs/sha256/{}", layer.diff_id);
        for member in ["oci-layout", "index.json", "manifest.json", &layer_name] {
            assert!(listing.lines().any(|l| l == member), "{member}: {listing}");
        }
        let read = |name: &str| -> anyhow::Result<serde_json::Value> {
            Ok(serde_json::from_slice(&std::fs::read(work.join(name))?)?)
        };
        // The manifest blob is named by its own sha256: the digest a pin names.
        let manifest_blob = format!("blobs/sha256/{hex}");
        assert_eq!(sha256(&work.join(&manifest_blob))?, hex);
        let manifest = read(&manifest_blob)?;
        assert_eq!(manifest["layers"][0]["mediaType"], MEDIA_LAYER);
        assert_eq!(
            manifest["layers"][0]["digest"],
            format!("sha256:{}", layer.diff_id)
        );
        let config_blob = manifest["config"]["digest"]
            .as_str()
            .and_then(|d| d.strip_prefix("sha256:"))
            .context("config digest")?;
        let config = read(&format!("blobs/sha256/{config_blob}"))?;
        assert_eq!(config["config"]["User"], "0");
        assert_eq!(
            config["config"]["Entrypoint"],
            serde_json::json!(["/bin/x"])
        );
        assert_eq!(
            config["rootfs"]["diff_ids"],
            serde_json::json!([format!("sha256:{}", layer.diff_id)])
        );
        // The index names the image by tag and by digest, as a pull does.
        let index = read("index.json")?;
        let names: Vec<&str> = index["manifests"]
            .as_array()
            .context("manifests")?
            .iter()
            .map(|m| {
                assert_eq!(m["digest"], digest.as_str());
                m["annotations"][ANNOTATION_NAME]
                    .as_str()
                    .unwrap_or_default()
            })
            .collect();
        assert_eq!(
            names,
            [
                "docker.io/csi-scsi/agent:dev".to_owned(),
                format!("docker.io/csi-scsi/agent@{digest}")
            ]
        );
        // docker load's view of the same blobs.
        let docker = read("manifest.json")?;
        assert_eq!(
            docker[0]["RepoTags"],
            serde_json::json!(["csi-scsi/agent:dev"])
        );
        assert_eq!(docker[0]["Layers"], serde_json::json!([layer_name]));
        assert_eq!(docker[0]["Config"], format!("blobs/sha256/{config_blob}"));
        Ok(())
    }
}
