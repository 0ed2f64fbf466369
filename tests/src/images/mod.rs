//! The container images `deploy/` uses, built without Docker or a
//! registry: `lab images` turns each recipe in `deploy/images/` into an
//! image archive (an OCI layout with docker's manifest.json, one
//! uncompressed layer) that `ctr images import` and `docker load` read.
//!
//! The sidecars' references in deploy/ pin the manifest digest of the
//! image built here (`name:tag@sha256:...`); a build that gives another
//! digest fails until the pins are rewritten on purpose
//! (`lab images --write-digests`), so a changed input cannot slip in.
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
    /// What to do with the sidecars' pinned digests in deploy/.
    pub pins: Pins,
    /// Where the recipes are (`deploy/images/` by default; the storage e2e
    /// suite's images are in `tests/storage-e2e/images/`).
    pub recipes: Option<PathBuf>,
}

/// The sidecars' digests in deploy/ against the images built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pins {
    /// Fail when an image built has another digest than deploy/ pins.
    #[default]
    Check,
    /// Write the digests built into deploy/ (`lab images --write-digests`).
    Write,
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
            pins: Pins::Check,
            recipes: None,
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
    /// The manifest digest (`sha256:<hex>`): what a pinned reference names.
    pub digest: String,
    /// The controller container whose image this is, for a sidecar.
    pub controller_container: Option<String>,
}

/// The repository root.
pub(crate) fn workspace() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::canonicalize(&root).unwrap_or(root)
}

/// `deploy/images/`, the recipes.
pub fn recipes_dir() -> PathBuf {
    workspace().join("deploy/images")
}

/// Every recipe file in `deploy/images/`, sorted.
pub fn recipes() -> anyhow::Result<Vec<PathBuf>> {
    recipes_in(&recipes_dir())
}

/// Every recipe file in `dir`, sorted.
pub fn recipes_in(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
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
    let files = match &opts.recipes {
        Some(dir) => recipes_in(dir)?,
        None => recipes()?,
    };
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
    let built = files
        .iter()
        .map(|r| build_recipe(r, opts))
        .collect::<anyhow::Result<Vec<_>>>()?;
    match opts.pins {
        Pins::Check => check_pins(&controller_images()?, &built)?,
        Pins::Write => write_pins(&built)?,
    }
    Ok(built)
}

/// Fails, naming every sidecar at once, unless each image built for a
/// controller container has the digest its reference in `images` (by
/// container name, from deploy/base/controller.yaml) pins.
fn check_pins(images: &BTreeMap<String, String>, built: &[BuiltImage]) -> anyhow::Result<()> {
    let mut wrong = Vec::new();
    for b in built {
        let Some(container) = &b.controller_container else {
            continue;
        };
        let reference = images.get(container).with_context(|| {
            format!(
                "{} has no container {container:?}",
                controller_yaml().display()
            )
        })?;
        match archive::pinned_digest(reference)? {
            Some(pinned) if pinned == b.digest => {}
            Some(pinned) => wrong.push(format!(
                "container {container}: deploy/ pins {pinned}, the image built here is {}",
                b.digest
            )),
            None => wrong.push(format!(
                "container {container}: deploy/ runs {reference} without a digest; the image \
                 built here is {}",
                b.digest
            )),
        }
    }
    if !wrong.is_empty() {
        bail!(
            "the sidecar images built here are not the ones deploy/ pins:\n  {}\n\
             A pin is the digest of the image `lab images` builds from the Go modules pinned \
             in tools/external-*/go.sum, with this machine's Go (`go version`) and the recipe \
             in deploy/images/; one of those changed. If that change is intended, rewrite the \
             pins in deploy/base/controller.yaml and the chart's values.yaml with \
             `lab images --write-digests` and commit them (deploy/README.md, Pinned sidecars).",
            wrong.join("\n  ")
        );
    }
    Ok(())
}

/// The chart's values.yaml.
fn chart_values() -> PathBuf {
    workspace().join("deploy/chart/csi-scsi/values.yaml")
}

/// Rewrites every sidecar's pin in deploy/base/controller.yaml and the
/// chart's values.yaml to the digest built; only those lines change.
fn write_pins(built: &[BuiltImage]) -> anyhow::Result<()> {
    let images = controller_images()?;
    let (controller, values) = (controller_yaml(), chart_values());
    let mut controller_text = std::fs::read_to_string(&controller)
        .with_context(|| format!("reading {}", controller.display()))?;
    let mut values_text = std::fs::read_to_string(&values)
        .with_context(|| format!("reading {}", values.display()))?;
    for b in built {
        let Some(container) = &b.controller_container else {
            continue;
        };
        let reference = images
            .get(container)
            .with_context(|| format!("{} has no container {container:?}", controller.display()))?;
        controller_text = pin_controller_line(&controller_text, reference, &b.digest)
            .with_context(|| format!("{}, container {container}", controller.display()))?;
        values_text = pin_chart_digest(&values_text, reference, &b.digest)
            .with_context(|| format!("{}, container {container}", values.display()))?;
    }
    std::fs::write(&controller, controller_text)?;
    std::fs::write(&values, values_text)?;
    Ok(())
}

/// `text` (controller.yaml) with its one line `image: <reference>` pinned
/// to `digest`.
fn pin_controller_line(text: &str, reference: &str, digest: &str) -> anyhow::Result<String> {
    let old = format!("image: {reference}\n");
    if text.matches(&old).count() != 1 {
        bail!("not exactly one line `image: {reference}`");
    }
    Ok(text.replacen(
        &old,
        &format!("image: {}\n", archive::pin(reference, digest)?),
        1,
    ))
}

/// `text` (the chart's values.yaml) with the `digest:` of the image whose
/// `repository:` is `reference`'s repository set to `digest`: the first
/// `digest:` key among that map's lines (same indentation).
fn pin_chart_digest(text: &str, reference: &str, digest: &str) -> anyhow::Result<String> {
    let name = reference.split_once('@').map_or(reference, |(n, _)| n);
    let repository = name
        .rsplit_once(':')
        .filter(|(_, tag)| !tag.contains('/'))
        .map_or(name, |(repo, _)| repo);
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let wanted = format!("repository: {repository}");
    let at: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].trim() == wanted)
        .collect();
    let [at] = at[..] else {
        bail!("not exactly one line `{wanted}`");
    };
    let indent = lines[at].len() - lines[at].trim_start().len();
    let line = (at + 1..lines.len())
        .take_while(|&i| {
            let l = lines[i];
            l.trim().is_empty() || l.len() - l.trim_start().len() >= indent
        })
        .find(|&i| {
            let l = lines[i];
            l.len() - l.trim_start().len() == indent && l.trim_start().starts_with("digest:")
        })
        .with_context(|| format!("no `digest:` beside `{wanted}`"))?;
    let mut out = String::with_capacity(text.len());
    for (i, l) in lines.iter().enumerate() {
        if i == line {
            out.push_str(&format!("{}digest: {digest}\n", " ".repeat(indent)));
        } else {
            out.push_str(l);
        }
    }
    Ok(out)
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
    let (reference, controller_container) = match &recipe.image {
        ImageName::Name(name) => {
            check_tag(&opts.tag)?;
            (format!("{name}:{}", opts.tag), None)
        }
        // The image is named by tag; the digest deploy/ pins is checked
        // against the one built (`build`), and the archive gives the image
        // that name too.
        ImageName::Reference(reference) => (reference.clone(), None),
        ImageName::ControllerContainer(container) => {
            let pinned = controller_image(container)?;
            let by_tag = pinned
                .split_once('@')
                .map_or(&*pinned, |(n, _)| n)
                .to_owned();
            (by_tag, Some(container.clone()))
        }
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
    for copy in &recipe.copies {
        rootfs.install(&copy.from, &copy.to, false)?;
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
    let digest = archive::write(&partial, &staging, &layer, &[image])?
        .pop()
        .context("no manifest written")?;
    std::fs::rename(&partial, &file)
        .with_context(|| format!("moving the archive to {}", file.display()))?;
    Ok(BuiltImage {
        reference: archive::qualified(&reference)?,
        archive: file,
        bytes: layer.bytes,
        digest,
        controller_container,
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

    /// Every program the agent spawns (`host.tool("…")` in agent/src) is
    /// in its image: a missing one fails only on a real node, at the
    /// moment the agent needs it.
    #[test]
    fn the_agent_image_holds_every_tool_the_agent_spawns() -> anyhow::Result<()> {
        let recipe = Recipe::load(&recipes_dir().join("agent.yaml"))?;
        let in_image: std::collections::BTreeSet<String> = recipe
            .host
            .iter()
            .chain(recipe.copies.iter().map(|c| &c.to))
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        let mut spawned = std::collections::BTreeSet::new();
        let mut dirs = vec![workspace().join("agent/src")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir)? {
                let path = entry?.path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                let text = std::fs::read_to_string(&path)?;
                for rest in text.split(".tool(\"").skip(1) {
                    if let Some((name, _)) = rest.split_once('"') {
                        spawned.insert(name.to_owned());
                    }
                }
            }
        }
        anyhow::ensure!(
            spawned.contains("iscsiadm") && spawned.contains("multipathd"),
            "the scan of agent/src found too little: {spawned:?}"
        );
        let missing: Vec<_> = spawned.difference(&in_image).collect();
        anyhow::ensure!(
            missing.is_empty(),
            "deploy/images/agent.yaml lacks {missing:?} (the agent spawns them)"
        );
        Ok(())
    }

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
                // deploy/ names its images by name or container only.
                ImageName::Reference(r) => {
                    panic!(
                        "{}: deploy/ has no image by reference ({r})",
                        path.display()
                    )
                }
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

    fn sidecar(container: &str, digest: &str) -> BuiltImage {
        BuiltImage {
            reference: format!("registry.k8s.io/sig-storage/{container}:v1.0.0"),
            archive: PathBuf::from("/nowhere"),
            bytes: 0,
            digest: digest.into(),
            controller_container: Some(container.into()),
        }
    }

    #[test]
    fn a_sidecar_built_with_another_digest_than_deploy_pins_is_refused() -> anyhow::Result<()> {
        let (a, b) = (
            format!("sha256:{}", "a".repeat(64)),
            format!("sha256:{}", "b".repeat(64)),
        );
        let pinned = |d: &str| {
            BTreeMap::from([(
                "csi-attacher".to_owned(),
                format!("registry.k8s.io/sig-storage/csi-attacher:v1.0.0@{d}"),
            )])
        };
        check_pins(&pinned(&a), &[sidecar("csi-attacher", &a)])?;
        let err = check_pins(&pinned(&a), &[sidecar("csi-attacher", &b)])
            .expect_err("another digest accepted")
            .to_string();
        assert!(
            err.contains(&a) && err.contains(&b) && err.contains("--write-digests"),
            "{err}"
        );
        let unpinned = BTreeMap::from([(
            "csi-attacher".to_owned(),
            "registry.k8s.io/sig-storage/csi-attacher:v1.0.0".to_owned(),
        )]);
        let err = check_pins(&unpinned, &[sidecar("csi-attacher", &a)])
            .expect_err("an unpinned sidecar accepted")
            .to_string();
        assert!(err.contains("without a digest"), "{err}");
        Ok(())
    }

    /// The pins in deploy/base/controller.yaml and the chart's values.yaml
    /// are the same, and rewriting them touches only the pinned lines.
    #[test]
    fn the_chart_pins_what_controller_yaml_pins_and_rewrites_only_those_lines() -> anyhow::Result<()>
    {
        let controller = std::fs::read_to_string(controller_yaml())?;
        let values = std::fs::read_to_string(chart_values())?;
        let other = format!("sha256:{}", "c".repeat(64));
        for path in recipes()? {
            let ImageName::ControllerContainer(container) = Recipe::load(&path)?.image else {
                continue;
            };
            let reference = controller_image(&container)?;
            let pinned = archive::pinned_digest(&reference)?
                .with_context(|| format!("{container}: {reference} is not pinned"))?;
            // The chart's digest for this repository is the same.
            let same = pin_chart_digest(&values, &reference, &pinned)?;
            assert_eq!(same, values, "{container}: the chart pins another digest");
            let rewritten = pin_chart_digest(&values, &reference, &other)?;
            let changed: Vec<(&str, &str)> = values
                .lines()
                .zip(rewritten.lines())
                .filter(|(a, b)| a != b)
                .collect();
            assert_eq!(changed.len(), 1, "{changed:?}");
            assert_eq!(changed[0].1.trim(), format!("digest: {other}"));
            let line = pin_controller_line(&controller, &reference, &other)?;
            let changed: Vec<(&str, &str)> = controller
                .lines()
                .zip(line.lines())
                .filter(|(a, b)| a != b)
                .collect();
            assert_eq!(changed.len(), 1, "{changed:?}");
            assert!(
                changed[0].1.trim().ends_with(&format!("@{other}")),
                "{changed:?}"
            );
        }
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
            pins: Pins::Check,
            recipes: None,
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
