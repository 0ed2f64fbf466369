//! The Kubernetes lab's cgroups (v1: one tree per controller): each
//! kubelet puts its Pods under a root of its own, and `lab down` kills
//! what runs there and removes the directories, deepest first.

use std::path::{Path, PathBuf};

use super::net::sh_quiet;

const CGROUP_FS: &str = "/sys/fs/cgroup";

/// Kills every process under `root` (`/csi-scsi-...`) in every controller's
/// tree, then removes the cgroups. Safe to repeat.
pub fn remove_tree(root: &str) {
    let (trees, _) = kill_all(root);
    for tree in &trees {
        for dir in dirs_deepest_first(tree) {
            let _ = std::fs::remove_dir(&dir);
        }
    }
}

/// SIGKILLs every process under `root` in every controller's tree (three
/// rounds: a dying process may still fork), leaving the cgroups; returns
/// the trees, and how many processes it killed.
pub fn kill_all(root: &str) -> (Vec<PathBuf>, usize) {
    let root = root.trim_start_matches('/');
    if root.is_empty() || root.contains("..") {
        return (Vec::new(), 0);
    }
    let trees: Vec<PathBuf> = std::fs::read_dir(CGROUP_FS)
        .into_iter()
        .flatten()
        .flatten()
        .map(|c| c.path().join(root))
        .filter(|p| p.is_dir())
        .collect();
    let mut killed = std::collections::BTreeSet::new();
    for _ in 0..3 {
        for tree in &trees {
            for dir in dirs_deepest_first(tree) {
                for pid in std::fs::read_to_string(dir.join("cgroup.procs"))
                    .unwrap_or_default()
                    .lines()
                {
                    sh_quiet("kill", &["-KILL", pid]);
                    killed.insert(pid.to_owned());
                }
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    (trees, killed.len())
}

fn dirs_deepest_first(top: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![top.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(entry.path());
            }
        }
        out.push(dir);
    }
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out
}

/// Creates `root` in every controller's tree (kubelet requires its
/// `cgroupRoot` to exist); cpuset gets its parent's CPUs and memory nodes,
/// without which no task may join it.
pub fn create_root(root: &str) -> anyhow::Result<()> {
    let root = root.trim_start_matches('/');
    for controller in std::fs::read_dir(CGROUP_FS)?.flatten() {
        let dir = controller.path().join(root);
        if controller.file_name() == "unified" {
            continue;
        }
        std::fs::create_dir_all(&dir)?;
        if controller.file_name() == "cpuset" {
            for file in ["cpuset.cpus", "cpuset.mems"] {
                let parent = std::fs::read_to_string(controller.path().join(file))?;
                std::fs::write(dir.join(file), parent.trim())?;
            }
        }
    }
    Ok(())
}
