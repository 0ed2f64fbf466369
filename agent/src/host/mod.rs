//! The door to the machine's storage: devices (sysfs, /dev and its links,
//! block devices), mounts (the mount table, mount and unmount), filesystems,
//! iSCSI sessions, FC HBAs and multipath maps. Every module here works under
//! a configurable root (sysfs, /dev, mountinfo, the kubelet directory) or
//! through a configurable tool path, so tests and the lab can point the
//! production code at a prepared tree of real loop devices; `command.rs` is
//! the agent's only process spawner. Domain code never builds a path from a
//! literal `/sys`, `/dev` or `/proc`.
//!
//! Not through here: the agent's own files, read and written where they are
//! owned (the attachment records in `device/attachments.rs` and the leader
//! epoch in `api/epoch.rs`, both under `--state-dir`; the enrolment
//! credential in `api/enrolment.rs`), and the checks of kubelet's paths
//! (`csi/request.rs` resolves them under the kubelet directory, refusing
//! links out of it; `volume/stats.rs` tells a missing path from a broken one).

pub mod block;
pub(crate) mod blocking;
pub mod command;
pub(crate) mod dev_links;
pub(crate) mod erase;
pub mod fc;
pub(crate) mod filesystem;
pub mod iscsiadm;
pub(crate) mod mount;
pub mod mountinfo;
pub(crate) mod multipath;
pub mod sysfs;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use command::CommandRunner;

pub(crate) use csi_scsi_textfs::excerpt;

/// Where this host's trees and tools are.
#[derive(Debug, Clone)]
pub struct Host {
    /// Root of sysfs (`/sys`).
    pub sysfs: PathBuf,
    /// Root of device nodes (`/dev`); `disk/by-id` and `disk/by-path` live under it.
    pub dev: PathBuf,
    /// The mount table to read (`/proc/self/mountinfo`).
    pub mountinfo: PathBuf,
    /// kubelet's root directory (`/var/lib/kubelet`): staging and target
    /// paths must resolve under it.
    pub kubelet_dir: PathBuf,
    /// open-iscsi's node records (`/etc/iscsi/nodes`): CHAP settings are
    /// written there, never passed on a command line.
    pub iscsi_nodes: PathBuf,
    /// Tool name -> path overrides (`--tool iscsiadm=/path`); others run from `$PATH`.
    pub tools: BTreeMap<String, PathBuf>,
    /// Runs the tools.
    pub runner: CommandRunner,
}

impl Host {
    /// The path to run for tool `name` (an override, or the bare name for `$PATH`).
    pub fn tool(&self, name: &str) -> PathBuf {
        self.tools
            .get(name)
            .cloned()
            .unwrap_or_else(|| PathBuf::from(name))
    }

    /// `path` under the sysfs root (`path` is relative, e.g. `class/scsi_host`).
    pub fn sys(&self, path: impl AsRef<Path>) -> PathBuf {
        self.sysfs.join(path)
    }

    /// `path` under the /dev root (`path` is relative, e.g. `disk/by-id`).
    pub fn dev(&self, path: impl AsRef<Path>) -> PathBuf {
        self.dev.join(path)
    }
}
