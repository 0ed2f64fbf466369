//! The lab's storage fabric as the kernel stand-in needs to know it: which
//! backing file is behind each LUN of each target (what an array knows and
//! a real initiator never needs: here the "kernel" must attach the data to
//! a loop device), and which FC LUNs each node's HBA can see.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The whole fabric.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Fabric {
    /// iSCSI targets (served for real by tgtd).
    pub iscsi: Vec<IscsiTargetDef>,
    /// Emulated FC targets.
    pub fc: Vec<FcTargetDef>,
}

/// One iSCSI target.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct IscsiTargetDef {
    /// Target IQN.
    pub iqn: String,
    /// LUN number -> backing file.
    pub luns: Vec<LunDef>,
}

/// One LUN's backing store and (for FC, where nothing answers INQUIRY)
/// identity.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LunDef {
    /// LUN number.
    pub lun: u32,
    /// Backing file.
    pub file: PathBuf,
    /// The file the kernel stand-in attaches instead of `file`, when the
    /// lab serves it through its failing disks ([`crate::disks`]).
    #[serde(default)]
    pub data: Option<PathBuf>,
    /// Kernel `wwid` text (FC only; iSCSI identities come from the wire).
    #[serde(default)]
    pub wwid: String,
    /// INQUIRY vendor (FC only).
    #[serde(default)]
    pub vendor: String,
    /// INQUIRY model (FC only).
    #[serde(default)]
    pub model: String,
    /// Serial (FC only).
    #[serde(default)]
    pub serial: String,
}

/// One emulated FC target port.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FcTargetDef {
    /// Target port WWPN (16 hex digits).
    pub wwpn: String,
    /// Nodes whose HBA is zoned to it.
    pub nodes: Vec<String>,
    /// Its LUNs.
    pub luns: Vec<LunDef>,
}

impl Fabric {
    /// Reads the fabric file.
    pub fn load(path: &Path) -> std::io::Result<Self> {
        let text = std::fs::read_to_string(path)?;
        serde_json::from_str(&text).map_err(std::io::Error::other)
    }

    /// Writes the fabric file.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(path, text)
    }

    /// The file behind `lun` on iSCSI target `iqn` (see [`LunDef::data_file`]).
    pub fn iscsi_file(&self, iqn: &str, lun: u32) -> Option<&Path> {
        self.iscsi
            .iter()
            .find(|t| t.iqn == iqn)?
            .luns
            .iter()
            .find(|l| l.lun == lun)
            .map(LunDef::data_file)
    }

    /// Every LUN definition, iSCSI and FC.
    pub fn luns_mut(&mut self) -> impl Iterator<Item = &mut LunDef> {
        self.iscsi
            .iter_mut()
            .flat_map(|t| t.luns.iter_mut())
            .chain(self.fc.iter_mut().flat_map(|t| t.luns.iter_mut()))
    }
}

impl LunDef {
    /// What the kernel stand-in attaches to the LUN's loop device: the
    /// failing-disk file when there is one, else the backing file.
    pub fn data_file(&self) -> &Path {
        self.data.as_deref().unwrap_or(&self.file)
    }
}
