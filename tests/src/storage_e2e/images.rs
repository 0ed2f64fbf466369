//! The images the suite's Pods run: built from `tests/storage-e2e/images/`
//! and imported into every node's containerd of a kept lab, under the names
//! `KUBE_TEST_REPO_LIST` gives them.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};

use crate::images::{BuiltImage, ImageOptions, Pins};
use crate::lab::kube::KubeManifest;
use crate::lab::kube::node::{containerd_socket, ctr_at, import_image, tag_args};

/// Repositories the suite names that one of ours serves as is: the
/// multi-volume specs start their Pods from `glibc-dns-testing` (before
/// Kubernetes 1.37, `jessie-dnsutils`) but run in them only the shell
/// checks they run in `busybox` (`test/e2e/storage/testsuites/multivolume.go`).
const SERVED_BY: &[(&str, &str)] = &[
    ("glibc-dns-testing", "busybox"),
    ("jessie-dnsutils", "busybox"),
];

/// The registry `tests/storage-e2e/repo-list.yaml` maps every one of the
/// suite's registries to: only its names are ours to serve (the suite also
/// lists fixed upstream names, such as the hostpath driver's sidecars).
const REGISTRY: &str = "local/e2e/";

/// The images of ours every storage pass needs, by repository name.
const NEEDED: &[&str] = &["busybox", "agnhost", "nginx", "pause"];

/// The image references the suite in `e2e` runs its Pods from, with
/// `repo_list` as `KUBE_TEST_REPO_LIST` (`e2e.test -list-images`): each
/// Kubernetes release moves some tags, so ours are tagged from this.
pub(super) fn wanted(e2e: &Path, repo_list: &Path) -> anyhow::Result<Vec<String>> {
    let out = Command::new(e2e)
        .arg("-list-images")
        .env("KUBE_TEST_REPO_LIST", repo_list)
        .output()
        .with_context(|| format!("running {} -list-images", e2e.display()))?;
    if !out.status.success() {
        bail!(
            "{} -list-images failed: {}",
            e2e.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let refs: Vec<String> = String::from_utf8(out.stdout)?
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    Ok(refs)
}

/// The repository name of a reference (`local/e2e/busybox:1.37.0-2` ->
/// `busybox`), and the reference as containerd stores it: a first
/// component that is no registry host means Docker Hub (`docker.io/`).
fn parse_ref(reference: &str) -> Option<(String, String)> {
    let (path, _tag) = reference.rsplit_once(':')?;
    let name = path.rsplit('/').next()?.to_owned();
    let first = path.split('/').next()?;
    let is_host =
        path.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    let full = match is_host {
        true => reference.to_owned(),
        false => format!("docker.io/{reference}"),
    };
    Some((name, full))
}

/// For each reference the suite wants whose repository one of `built`
/// serves (by name, or through [`SERVED_BY`]): (wanted, built image).
/// Fails when the suite names none of an image a storage pass needs.
fn tags_for(built: &[String], wanted: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    let ours: Vec<(String, String)> = built.iter().filter_map(|b| parse_ref(b)).collect();
    let mut tags = Vec::new();
    for w in wanted.iter().filter(|w| w.starts_with(REGISTRY)) {
        let Some((name, full)) = parse_ref(w) else {
            continue;
        };
        let serving = SERVED_BY
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(name.as_str(), |(_, by)| by);
        if let Some((_, image)) = ours.iter().find(|(n, _)| n == serving)
            && *image != full
        {
            tags.push((full, image.clone()));
        }
    }
    for needed in NEEDED {
        let named = wanted
            .iter()
            .filter(|w| w.starts_with(REGISTRY))
            .filter_map(|w| parse_ref(w))
            .any(|(n, _)| n == *needed);
        if !named {
            bail!("the suite's -list-images names no {needed} image: {wanted:?}");
        }
    }
    Ok(tags)
}

/// The suite's images, built, and the references the suite names that
/// each serves.
#[derive(Clone, Debug)]
pub struct SuiteImages {
    /// The images built (each a docker-archive tarball).
    pub built: Vec<BuiltImage>,
    /// (alias the suite names, built image it is a tag of).
    pub aliases: Vec<(String, String)>,
}

/// Builds the suite's images into `out`, with the aliases for the
/// references in `wanted` (the suite's `-list-images`) they serve.
pub(super) fn build(root: &Path, out: &Path, wanted: &[String]) -> anyhow::Result<SuiteImages> {
    let built = crate::images::build(&ImageOptions {
        out: out.to_owned(),
        pins: Pins::Check,
        recipes: Some(root.join("tests/storage-e2e/images")),
        ..ImageOptions::default()
    })?;
    let references: Vec<String> = built.iter().map(|b| b.reference.clone()).collect();
    let aliases = tags_for(&references, wanted)?;
    Ok(SuiteImages { built, aliases })
}

/// Imports `images` into the containerd of every node of the lab in
/// `manifest` (nodes on this host), each alias tagged.
pub(super) fn import(manifest: &KubeManifest, images: &SuiteImages) -> anyhow::Result<()> {
    for node in &manifest.lab.nodes {
        let sock = containerd_socket(&manifest.lab.dir.join("nodes").join(&node.name));
        for image in &images.built {
            import_image(&sock, &image.archive)
                .with_context(|| format!("importing {} on {}", image.reference, node.name))?;
        }
        for (alias, image) in &images.aliases {
            ctr_at(&sock, &tag_args(image, alias))
                .with_context(|| format!("tagging {image} as {alias} on {}", node.name))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn ours_are_tagged_with_the_tags_the_suite_names() {
        let built = strings(&[
            "local/e2e/busybox:1.36.1-1",
            "local/e2e/agnhost:2.53",
            "local/e2e/nginx:1.14-4",
            "local/e2e/pause:3.10",
        ]);
        let wanted = strings(&[
            "local/e2e/busybox:1.37.0-2",
            "local/e2e/agnhost:2.66.1",
            "local/e2e/agnhost:2.55",
            "local/e2e/nginx:1.27.0-2",
            "local/e2e/pause:3.10",
            "local/e2e/glibc-dns-testing:2.1.1",
            "local/e2e/kitten:1.8",
            "invalid.registry.k8s.io/invalid/alpine:3.1",
            "registry.k8s.io/e2e-test-images/busybox:1.36.1-1",
        ]);
        let mut tags = tags_for(&built, &wanted).expect("tags");
        tags.sort();
        assert_eq!(
            tags,
            vec![
                (
                    "docker.io/local/e2e/agnhost:2.55".into(),
                    "docker.io/local/e2e/agnhost:2.53".into()
                ),
                (
                    "docker.io/local/e2e/agnhost:2.66.1".into(),
                    "docker.io/local/e2e/agnhost:2.53".into()
                ),
                (
                    "docker.io/local/e2e/busybox:1.37.0-2".into(),
                    "docker.io/local/e2e/busybox:1.36.1-1".into()
                ),
                (
                    "docker.io/local/e2e/glibc-dns-testing:2.1.1".into(),
                    "docker.io/local/e2e/busybox:1.36.1-1".into()
                ),
                (
                    "docker.io/local/e2e/nginx:1.27.0-2".into(),
                    "docker.io/local/e2e/nginx:1.14-4".into()
                ),
            ]
        );
    }

    #[test]
    fn a_suite_that_names_no_needed_image_is_refused() {
        let built = strings(&["local/e2e/busybox:1.36.1-1"]);
        let wanted = strings(&["local/e2e/busybox:1.37.0-2", "local/e2e/agnhost:2.66.1"]);
        let err = tags_for(&built, &wanted).expect_err("no nginx, no pause");
        assert!(format!("{err:#}").contains("nginx"), "{err:#}");
    }
}
