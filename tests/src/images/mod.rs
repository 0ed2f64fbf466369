//! The container images `deploy/` uses, built without Docker or a
//! registry: `lab images` turns each recipe in `deploy/images/` into a
//! docker-archive tarball (the `docker save` format, one uncompressed
//! layer) that `ctr images import` and `docker load` read.
//!
//! The root filesystems are made of files from this machine (Debian 12):
//! the workspace's binaries from `target/<profile>/` (stripped), the CSI
//! sidecars from `tools/build` (static Go), host tools and data files at
//! their Debian paths with every symlink on the way, and the shared
//! libraries each ELF file loads (`ldd`, to closure). [`recipe`] reads a
//! recipe, [`rootfs`] assembles the tree, [`archive`] writes the tarball.

pub mod archive;
pub mod recipe;
pub mod rootfs;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Deserialize;

use recipe::{ImageName, Recipe};
use rootfs::Rootfs;

/// What `lab images` was asked for.
#[derive(Clone, Debug)]
pub struct ImageOptions {
    /// Where the archives go (`$CSI_SCSI_CACHE/images` by default).
    pub out: PathBuf,
    /// The tag of the workspace's images (`dev` by default); the sidecars
    /// keep the tag deploy/ gives them.
    pub tag: String,
    /// The cargo profile directory the binaries come from (`target/<profile>/`).
    pub profile: String,
}

impl ImageOptions {
    /// `$CSI_SCSI_CACHE/images` (CSI_SCSI_CACHE defaults to /var/cache/csi-scsi).
    pub fn default_out() -> PathBuf {
        std::env::var_os("CSI_SCSI_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/cache/csi-scsi"))
            .join("images")
    }
}

impl Default for ImageOptions {
    fn default() -> Self {
        Self {
            out: Self::default_out(),
            tag: "dev".into(),
            profile: "debug".into(),
        }
    }
}

/// One image written.
#[derive(Clone, Debug)]
pub struct BuiltImage {
    /// Fully qualified, as containerd names it (`docker.io/csi-scsi/agent:dev`,
    /// `registry.k8s.io/sig-storage/csi-provisioner:v5.3.0`).
    pub reference: String,
    /// The docker-archive tarball.
    pub archive: PathBuf,
    /// The uncompressed layer's size.
    pub bytes: u64,
}

/// The repository root.
fn workspace() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::canonicalize(&root).unwrap_or(root)
}

/// `deploy/images/`, the recipes.
pub fn recipes_dir() -> PathBuf {
    workspace().join("deploy/images")
}

/// Every recipe file, sorted.
pub fn recipes() -> anyhow::Result<Vec<PathBuf>> {
    let dir = recipes_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|p| p.extension().is_some_and(|e| e == "yaml"));
    files.sort();
    if files.is_empty() {
        bail!("no recipes (*.yaml) in {}", dir.display());
    }
    Ok(files)
}

/// Builds every recipe in `deploy/images/`. Every missing cargo binary
/// is reported at once, before anything is built.
pub fn build(opts: &ImageOptions) -> anyhow::Result<Vec<BuiltImage>> {
    let files = recipes()?;
    let mut missing = Vec::new();
    for file in &files {
        for bin in Recipe::load(file)?.cargo {
            if cargo_binary(&opts.profile, &bin.package, bin.bin()).is_err() {
                missing.push(bin.package);
            }
        }
    }
    if !missing.is_empty() {
        let dir = target_dir().join(profile_dir(&opts.profile));
        bail!(
            "{} in {}: build first: cargo build{} -p {}",
            if missing.len() == 1 {
                "a binary is missing"
            } else {
                "binaries are missing"
            },
            dir.display(),
            profile_flag(&opts.profile),
            missing.join(" -p ")
        );
    }
    files.iter().map(|r| build_recipe(r, opts)).collect()
}

/// Builds the image of recipe file `path` into `opts.out`.
pub fn build_recipe(path: &Path, opts: &ImageOptions) -> anyhow::Result<BuiltImage> {
    let recipe = Recipe::load(path)?;
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .context("recipe file name")?;
    build_image(&recipe, stem, opts).with_context(|| format!("image {}", path.display()))
}

fn build_image(recipe: &Recipe, stem: &str, opts: &ImageOptions) -> anyhow::Result<BuiltImage> {
    let reference = match &recipe.image {
        ImageName::Name(name) => {
            check_tag(&opts.tag)?;
            format!("{name}:{}", opts.tag)
        }
        ImageName::ControllerContainer(container) => controller_image(container)?,
    };
    let tag = archive::tag(&reference)?;
    std::fs::create_dir_all(&opts.out)
        .with_context(|| format!("creating {}", opts.out.display()))?;
    let work = tempfile::Builder::new()
        .prefix(&format!(".build-{stem}-"))
        .tempdir_in(&opts.out)?;
    let mut rootfs = Rootfs::new(&work.path().join("rootfs"))?;

    // The workspace's binaries are looked for first (a missing one is the
    // likeliest failure) but placed after the host's files, so that a
    // destination under a host symlink (/sbin) fails as such.
    let cargo = recipe
        .cargo
        .iter()
        .map(|bin| {
            Ok((
                cargo_binary(&opts.profile, &bin.package, bin.bin())?,
                &bin.to,
            ))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    for path in &recipe.host {
        if std::fs::metadata(path).is_err() {
            bail!(
                "host: {} is not on this machine: is its Debian package installed? \
                 (.ci/packages lists them: bash .ci/install-packages)",
                path.display()
            );
        }
        rootfs
            .copy_host(path)
            .with_context(|| format!("host: {}", path.display()))?;
    }
    for (source, to) in cargo {
        rootfs.install(&source, to, true)?;
    }
    if !recipe.go.is_empty() {
        let names: Vec<&str> = recipe.go.iter().map(|g| g.tool.as_str()).collect();
        let tools = csi_scsi_testbed::kube::GoTools::build(&names)?;
        for go in &recipe.go {
            let built = tools.path(&go.tool);
            if let ImageName::ControllerContainer(container) = &recipe.image {
                check_go_version(&go.tool, built, container, &reference)?;
            }
            rootfs.install(built, &go.to, false)?;
        }
    }
    for dir in &recipe.dirs {
        rootfs.mkdir(&dir.path, dir.mode()?)?;
    }
    rootfs.resolve_libraries()?;

    let layer = archive::layer(rootfs.path(), &work.path().join("layer.tar"))?;
    let staging = work.path().join("archive");
    std::fs::create_dir(&staging)?;
    let file = opts.out.join(format!("{stem}-{tag}.tar"));
    let partial = work.path().join("image.tar");
    let image = archive::Image {
        references: vec![reference.clone()],
        config: archive::Config {
            entrypoint: recipe.entrypoint.clone(),
            user: recipe.user.clone(),
            env: recipe.env.clone(),
        },
    };
    archive::write(&partial, &staging, &layer, &[image])?;
    std::fs::rename(&partial, &file)
        .with_context(|| format!("moving the archive to {}", file.display()))?;
    Ok(BuiltImage {
        reference: archive::qualified(&reference)?,
        archive: file,
        bytes: layer.bytes,
    })
}

/// A docker tag: `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
fn check_tag(tag: &str) -> anyhow::Result<()> {
    let ok = !tag.is_empty()
        && tag.len() <= 128
        && !tag.starts_with(['.', '-'])
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if !ok {
        bail!("--tag {tag:?}: not a valid image tag ([A-Za-z0-9_][A-Za-z0-9_.-]*, at most 128)");
    }
    Ok(())
}

/// The cargo target directory: CARGO_TARGET_DIR when set, else `target/`.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"))
}

/// The directory of cargo profile `profile` under the target directory.
fn profile_dir(profile: &str) -> &str {
    if profile == "dev" { "debug" } else { profile }
}

/// The `cargo build` flag that selects `profile`.
fn profile_flag(profile: &str) -> String {
    match profile_dir(profile) {
        "debug" => String::new(),
        "release" => " --release".into(),
        other => format!(" --profile {other}"),
    }
}

/// `target/<profile>/<bin>` (under CARGO_TARGET_DIR when set), which must exist.
pub fn cargo_binary(profile: &str, package: &str, bin: &str) -> anyhow::Result<PathBuf> {
    let path = target_dir().join(profile_dir(profile)).join(bin);
    if !path.is_file() {
        bail!(
            "{} is missing: build it first: cargo build{} -p {package}",
            path.display(),
            profile_flag(profile)
        );
    }
    Ok(path)
}

/// The controller Deployment, as far as the image references go.
#[derive(Deserialize)]
struct Deployment {
    spec: DeploymentSpec,
}
#[derive(Deserialize)]
struct DeploymentSpec {
    template: PodTemplate,
}
#[derive(Deserialize)]
struct PodTemplate {
    spec: PodSpec,
}
#[derive(Deserialize)]
struct PodSpec {
    containers: Vec<Container>,
}
#[derive(Deserialize)]
struct Container {
    name: String,
    image: String,
}

/// deploy/base/controller.yaml.
fn controller_yaml() -> PathBuf {
    workspace().join("deploy/base/controller.yaml")
}

/// The images of the controller Deployment's containers, by container name.
pub fn controller_images() -> anyhow::Result<BTreeMap<String, String>> {
    let path = controller_yaml();
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let deployment: Deployment =
        serde_saphyr::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    Ok(deployment
        .spec
        .template
        .spec
        .containers
        .into_iter()
        .map(|c| (c.name, c.image))
        .collect())
}

/// The image deploy/base/controller.yaml gives container `name`.
fn controller_image(name: &str) -> anyhow::Result<String> {
    controller_images()?
        .remove(name)
        .with_context(|| format!("{} has no container {name:?}", controller_yaml().display()))
}

/// Fails unless the Go tool `tool` at `built` (`<tool>-<version>-<hash>`,
/// as tools/build names it) is the version `reference` is tagged with.
fn check_go_version(
    tool: &str,
    built: &Path,
    container: &str,
    reference: &str,
) -> anyhow::Result<()> {
    let file = built
        .file_name()
        .and_then(|f| f.to_str())
        .unwrap_or_default();
    let version = file
        .strip_prefix(&format!("{tool}-"))
        .and_then(|rest| rest.rsplit_once('-'))
        .map(|(version, _hash)| version)
        .with_context(|| {
            format!(
                "tools/build printed {}: not <tool>-<version>-<hash>",
                built.display()
            )
        })?;
    let tag = archive::tag(reference)?;
    if version != tag {
        bail!(
            "tools/build built {tool} {version}, but deploy/base/controller.yaml runs container \
             {container} as {reference}: the image would carry the wrong version; bump the \
             version in tools/ and the tag in deploy/ together (deploy/README.md, Pinned sidecars)"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::net::sh;

    #[test]
    fn every_recipe_parses_and_names_what_deploy_uses() -> anyhow::Result<()> {
        let kustomization =
            std::fs::read_to_string(workspace().join("deploy/base/kustomization.yaml"))?;
        let controller = controller_images()?;
        for path in recipes()? {
            let recipe = Recipe::load(&path)?;
            match &recipe.image {
                // The name the base's kustomization maps its image to.
                ImageName::Name(name) => assert!(
                    kustomization.contains(&format!("newName: {name}\n")),
                    "{}: {name} is not an image deploy/base/kustomization.yaml names",
                    path.display()
                ),
                ImageName::ControllerContainer(c) => assert!(
                    controller.contains_key(c),
                    "{}: no container {c} in controller.yaml",
                    path.display()
                ),
            }
        }
        Ok(())
    }

    #[test]
    fn a_go_tool_of_another_version_than_deploy_names_is_refused() -> anyhow::Result<()> {
        let reference = "registry.k8s.io/sig-storage/csi-provisioner:v5.3.0";
        let same = Path::new("/cache/bin/csi-provisioner-v5.3.0-eb9c34250090");
        check_go_version("csi-provisioner", same, "csi-provisioner", reference)?;
        let other = Path::new("/cache/bin/csi-provisioner-v5.4.0-eb9c34250090");
        let err = check_go_version("csi-provisioner", other, "csi-provisioner", reference)
            .expect_err("v5.4.0 accepted for v5.3.0")
            .to_string();
        assert!(err.contains("v5.4.0") && err.contains("v5.3.0"), "{err}");
        Ok(())
    }

    #[test]
    fn a_missing_binary_says_how_to_build_it() {
        let err = cargo_binary("no-such-profile", "csi-scsi-proxy", "csi-scsi-proxy")
            .expect_err("a binary in target/no-such-profile")
            .to_string();
        assert!(
            err.contains("cargo build --profile no-such-profile -p csi-scsi-proxy"),
            "{err}"
        );
        assert!(check_tag("0.1.0").is_ok());
        assert!(check_tag("-x").is_err() && check_tag("a:b").is_err());
    }

    /// Unpacks the single layer of docker-archive `archive` under `dir`
    /// and returns the root.
    fn unpack(archive: &Path, dir: &Path) -> anyhow::Result<PathBuf> {
        let outer = dir.join("archive");
        let root = dir.join("root");
        std::fs::create_dir_all(&outer)?;
        std::fs::create_dir_all(&root)?;
        let (outer_s, archive_s) = (outer.display().to_string(), archive.display().to_string());
        sh("tar", &["-C", &outer_s, "-xf", &archive_s])?;
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(outer.join("manifest.json"))?)?;
        let layers = manifest[0]["Layers"].as_array().context("Layers")?;
        assert_eq!(layers.len(), 1);
        let layer = outer.join(layers[0].as_str().context("a layer")?);
        let (root_s, layer_s) = (root.display().to_string(), layer.display().to_string());
        sh("tar", &["--numeric-owner", "-C", &root_s, "-xf", &layer_s])?;
        Ok(root)
    }

    /// Builds the image of recipe `name` from the debug binaries and
    /// unpacks it; `None` (the test skips) when `bin` was not built.
    fn unpacked(
        name: &str,
        bin: &str,
        dir: &Path,
    ) -> anyhow::Result<Option<(BuiltImage, PathBuf)>> {
        if cargo_binary("debug", bin, bin).is_err() {
            println!(
                "skipped: target/debug/{bin} is absent (the workspace test command builds it: \
                 cargo build --workspace --bins && cargo test --workspace)"
            );
            return Ok(None);
        }
        let opts = ImageOptions {
            out: dir.join("images"),
            tag: "test".into(),
            profile: "debug".into(),
        };
        let built = build_recipe(&recipes_dir().join(format!("{name}.yaml")), &opts)?;
        let root = unpack(&built.archive, dir)?;
        Ok(Some((built, root)))
    }

    /// Runs `args` chrooted into `root`.
    fn chroot(root: &Path, args: &[&str]) -> anyhow::Result<String> {
        let root = root.display().to_string();
        let mut all = vec![root.as_str()];
        all.extend(args);
        sh("chroot", &all).with_context(|| format!("chroot {root} {}", args.join(" ")))
    }

    /// The proxy image runs: its libraries are complete.
    #[test]
    fn proxy_image_runs_in_a_chroot() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let Some((built, root)) = unpacked("proxy", "csi-scsi-proxy", dir.path())? else {
            return Ok(());
        };
        assert_eq!(built.reference, "docker.io/csi-scsi/proxy:test");
        let help = chroot(&root, &["/usr/local/bin/csi-scsi-proxy", "--help"])?;
        assert!(help.contains("--csi-endpoint"), "{help}");
        assert!(root.join("etc/ssl/certs/ca-certificates.crt").is_file());
        assert_eq!(
            std::fs::read_link(root.join("lib64"))?,
            Path::new("usr/lib64")
        );
        Ok(())
    }

    /// The agent image runs, and so does every tool it spawns.
    #[test]
    fn agent_image_runs_in_a_chroot() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let Some((built, root)) = unpacked("agent", "csi-scsi-agent", dir.path())? else {
            return Ok(());
        };
        assert_eq!(built.reference, "docker.io/csi-scsi/agent:test");
        let help = chroot(&root, &["/usr/local/bin/csi-scsi-agent", "--help"])?;
        assert!(help.contains("--csi-endpoint"), "{help}");
        for cmd in [
            &["/usr/sbin/mkfs.ext4", "-V"][..],
            &["/usr/sbin/iscsiadm", "--version"],
            &["/usr/sbin/mkfs.xfs", "-V"],
            &["/usr/sbin/xfs_growfs", "-V"],
            &["/usr/sbin/e2fsck", "-V"],
            &["/usr/sbin/wipefs", "--version"],
            &["/usr/bin/mount", "--version"],
            &["/usr/bin/umount", "--version"],
            &["/usr/sbin/multipath", "-t"],
        ] {
            chroot(&root, cmd)?;
        }
        // resize2fs has no version flag, and multipath's checkers and
        // prioritizers are dlopen'ed: the loader resolves all their
        // libraries inside the image.
        let loader = "/lib64/ld-linux-x86-64.so.2";
        chroot(&root, &[loader, "--list", "/usr/sbin/resize2fs"])?;
        let mut plugins = Vec::new();
        for entry in std::fs::read_dir(root.join("usr/lib/multipath"))? {
            plugins.push(entry?.file_name().to_string_lossy().into_owned());
        }
        assert!(plugins.iter().any(|p| p == "libchecktur.so"), "{plugins:?}");
        for plugin in plugins {
            chroot(
                &root,
                &[loader, "--list", &format!("/usr/lib/multipath/{plugin}")],
            )?;
        }
        assert!(root.join("etc/mke2fs.conf").is_file());
        for d in ["tmp", "run", "etc/iscsi", "var/lib/csi-scsi-agent"] {
            assert!(root.join(d).is_dir(), "/{d}");
        }
        Ok(())
    }
}
