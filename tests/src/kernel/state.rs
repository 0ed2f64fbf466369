//! The stand-in's memory of one node: live sessions with the loop devices
//! it attached, in `<root>/iscsi/state.json`, guarded by a lock file so the
//! `iscsiadm` stand-in and the watcher never interleave. Node records are
//! files, as open-iscsi keeps them (see [`super::records`]).

use std::fs::File;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

/// One node record (`-m node -T <iqn> -p <portal>`), as read from its file.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeRecord {
    /// `node.session.auth.authmethod`.
    pub authmethod: String,
    /// `node.session.auth.username`.
    pub username: String,
    /// `node.session.auth.password`.
    pub password: String,
    /// `node.session.auth.username_in`.
    pub username_in: String,
    /// `node.session.auth.password_in`.
    pub password_in: String,
    /// `node.conn[0].timeo.login_timeout` in seconds.
    pub login_timeout: u64,
}

/// One disk the stand-in created.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct DiskRecord {
    /// LUN number.
    pub lun: u32,
    /// Kernel name (`sdb`).
    pub kernel_name: String,
    /// The loop device holding the data.
    pub loop_device: PathBuf,
}

/// One live session.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SessionRecord {
    /// Session id.
    pub sid: u32,
    /// SCSI host number.
    pub host: u32,
    /// Target IQN.
    pub iqn: String,
    /// Portal.
    pub portal: String,
    /// Its disks.
    pub disks: Vec<DiskRecord>,
}

/// Everything the stand-in remembers for one node.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NodeState {
    /// Live iSCSI sessions.
    pub sessions: Vec<SessionRecord>,
    /// FC disks (host number, wwpn, LUN) created by scans.
    pub fc_disks: Vec<(u32, String, DiskRecord)>,
}

/// The state, locked for the lifetime of the guard.
pub struct Locked {
    path: PathBuf,
    _lock: Flock<File>,
    /// The state; saved with [`Locked::save`].
    pub state: NodeState,
}

impl NodeState {
    /// Locks and reads `<root>/iscsi/state.json`.
    pub fn lock(root: &Path) -> std::io::Result<Locked> {
        let dir = root.join("iscsi");
        std::fs::create_dir_all(&dir)?;
        let lock = File::create(dir.join("lock"))?;
        let lock =
            Flock::lock(lock, FlockArg::LockExclusive).map_err(|(_, e)| std::io::Error::from(e))?;
        let path = dir.join("state.json");
        let state = match std::fs::read_to_string(&path) {
            Ok(t) => serde_json::from_str(&t).map_err(std::io::Error::other)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => NodeState::default(),
            Err(e) => return Err(e),
        };
        Ok(Locked {
            path,
            _lock: lock,
            state,
        })
    }

    /// Every disk the stand-in made on this node, iSCSI and FC.
    pub fn disks(&self) -> impl Iterator<Item = &DiskRecord> {
        self.sessions
            .iter()
            .flat_map(|s| s.disks.iter())
            .chain(self.fc_disks.iter().map(|(_, _, d)| d))
    }

    /// The disk the kernel named `kernel_name`, if the stand-in made it.
    pub fn disk(&self, kernel_name: &str) -> Option<&DiskRecord> {
        self.disks().find(|d| d.kernel_name == kernel_name)
    }

    /// Every loop device the stand-in attached on this node.
    pub fn loop_devices(&self) -> Vec<PathBuf> {
        self.disks().map(|d| d.loop_device.clone()).collect()
    }

    /// The lowest free session id (from 1) and SCSI host number (from 10:
    /// below that are the FC HBAs).
    pub fn next_ids(&self) -> (u32, u32) {
        let sid = (1..)
            .find(|s| !self.sessions.iter().any(|x| x.sid == *s))
            .unwrap_or(1);
        let host = (10..)
            .find(|h| !self.sessions.iter().any(|x| x.host == *h))
            .unwrap_or(10);
        (sid, host)
    }
}

impl Locked {
    /// Writes the state back (atomically).
    pub fn save(&self) -> std::io::Result<()> {
        let tmp = self.path.with_extension("json.tmp");
        std::fs::write(
            &tmp,
            serde_json::to_vec_pretty(&self.state).map_err(std::io::Error::other)?,
        )?;
        std::fs::rename(&tmp, &self.path)
    }
}
