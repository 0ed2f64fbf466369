//! The images the suite's Pods run: built from `tests/storage-e2e/images/`
//! and imported into every node's containerd of a kept lab, under the names
//! `KUBE_TEST_REPO_LIST` gives them.

use std::path::Path;

use anyhow::Context;

use crate::images::{BuiltImage, ImageOptions, Pins};
use crate::lab::kube::KubeManifest;
use crate::lab::kube::node::{containerd_socket, ctr_at, import_image};

/// Images the suite names that one of ours serves as is, tagged with the
/// other name on every node: the multi-volume specs start their Pods from
/// `jessie-dnsutils` but run in them only the shell checks they run in
/// `busybox` (`test/e2e/storage/testsuites/multivolume.go`).
const ALIASES: &[(&str, &str)] = &[(
    "docker.io/local/e2e/jessie-dnsutils:1.7",
    "docker.io/local/e2e/busybox:1.36.1-1",
)];

/// Builds the suite's images into `out` and imports them (and their
/// aliases) into every node of the lab in `manifest`; the images built.
pub(super) fn import(
    manifest: &KubeManifest,
    root: &Path,
    out: &Path,
) -> anyhow::Result<Vec<BuiltImage>> {
    let built = crate::images::build(&ImageOptions {
        out: out.to_owned(),
        pins: Pins::Check,
        recipes: Some(root.join("tests/storage-e2e/images")),
        ..ImageOptions::default()
    })?;
    for node in &manifest.lab.nodes {
        let sock = containerd_socket(&manifest.lab.dir.join("nodes").join(&node.name));
        for image in &built {
            import_image(&sock, &image.archive)
                .with_context(|| format!("importing {} on {}", image.reference, node.name))?;
        }
        for (alias, image) in ALIASES {
            // `tag` refuses an existing name: a rerun on the same lab.
            let _ = ctr_at(&sock, &["images", "rm", alias]);
            ctr_at(&sock, &["images", "tag", image, alias])
                .with_context(|| format!("tagging {image} as {alias} on {}", node.name))?;
        }
    }
    Ok(built)
}
