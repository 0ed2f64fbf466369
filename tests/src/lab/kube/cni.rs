//! The network namespaces of a Kubernetes lab's Pods. `lab down` kills each
//! node's containerd without tearing its Pods' sandboxes down, so the
//! namespaces CNI made for them (bind mounts under `/run/netns`) and
//! libcni's cache entries would outlive the lab: a storage e2e run left
//! dozens. Which are the lab's is read from its own files: the bridge's
//! host-local IPAM keeps one file per address still held, naming the
//! sandbox that holds it, and libcni's cache entry for that sandbox names
//! its namespace.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::lab::net::sh_quiet;

/// Where libcni caches each attachment's result (its default).
const CNI_CACHE: &str = "/var/lib/cni/results";

/// A node's IPAM data directory, as its CNI config sets `dataDir`.
pub fn ipam_dir(node_runtime: &Path) -> PathBuf {
    node_runtime.join("ipam")
}

/// Removes the network namespaces and cache entries of every Pod sandbox
/// that still holds an address on a node of the lab in `lab_dir`; returns
/// how many namespaces it removed. Safe to run twice.
pub fn remove_pod_netns(lab_dir: &Path) -> usize {
    let sandboxes = held_by(lab_dir);
    if sandboxes.is_empty() {
        return 0;
    }
    let mut namespaces = BTreeSet::new();
    for entry in std::fs::read_dir(CNI_CACHE).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        // `<network>-<sandbox id>-<interface>`.
        if !sandboxes.iter().any(|id| name.contains(&format!("-{id}-"))) {
            continue;
        }
        if let Some(cached) = std::fs::read(entry.path())
            .ok()
            .and_then(|b| serde_json::from_slice::<Cached>(&b).ok())
        {
            namespaces.extend(
                cached
                    .result
                    .interfaces
                    .into_iter()
                    .filter_map(|i| i.sandbox),
            );
        }
        let _ = std::fs::remove_file(entry.path());
    }
    let mut removed = 0;
    for ns in &namespaces {
        let path = Path::new(ns);
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        // Only what `ip netns` manages: never unmount anything else.
        let managed = ["/run/netns", "/var/run/netns"]
            .iter()
            .any(|d| path.parent() == Some(Path::new(d)));
        if managed && Path::new("/run/netns").join(name).exists() {
            sh_quiet("ip", &["netns", "del", name]);
            removed += 1;
        }
    }
    removed
}

/// The sandbox (container) IDs that hold an address in any node's IPAM
/// directory under `lab_dir`.
fn held_by(lab_dir: &Path) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    let nodes = std::fs::read_dir(lab_dir.join("nodes"));
    for node in nodes.into_iter().flatten().flatten() {
        let ipam = ipam_dir(&node.path().join("runtime"));
        // `<dataDir>/<network>/<address>`: the first line is the sandbox.
        for network in std::fs::read_dir(&ipam).into_iter().flatten().flatten() {
            for held in std::fs::read_dir(network.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                let is_address = held
                    .file_name()
                    .to_str()
                    .is_some_and(|n| n.parse::<std::net::IpAddr>().is_ok());
                let id = is_address
                    .then(|| std::fs::read_to_string(held.path()).ok())
                    .flatten()
                    .and_then(|t| t.lines().next().map(str::trim).map(str::to_owned))
                    .filter(|id| !id.is_empty() && id.chars().all(|c| c.is_ascii_hexdigit()));
                ids.extend(id);
            }
        }
    }
    ids
}

/// libcni's cache entry: the parts read here.
#[derive(Deserialize)]
struct Cached {
    #[serde(default)]
    result: CachedResult,
}

#[derive(Default, Deserialize)]
struct CachedResult {
    #[serde(default)]
    interfaces: Vec<Interface>,
}

#[derive(Deserialize)]
struct Interface {
    sandbox: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sandboxes_are_read_from_the_address_files_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let lab = ipam_dir(&dir.path().join("nodes/node-a/runtime")).join("lab");
        std::fs::create_dir_all(&lab).expect("mkdir");
        std::fs::write(lab.join("198.19.1.66"), "0157aa0c\neth0").expect("write");
        std::fs::write(lab.join("last_reserved_ip.0"), "198.19.1.66").expect("write");
        std::fs::write(lab.join("lock"), "").expect("write");
        std::fs::write(lab.join("198.19.1.67"), "not an id\neth0").expect("write");
        assert_eq!(
            held_by(dir.path()).into_iter().collect::<Vec<_>>(),
            ["0157aa0c"]
        );
    }
}
