//! A node's own files, as kubelet and a Pod on that node reach them: the
//! host's on a stand-in node, the guest's (through its helper) on a VM
//! node. The life cycle reads and writes volumes only through these.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use super::LabNode;

impl LabNode {
    /// `mkdir -p` on the node.
    pub async fn mkdir(&self, path: &Path) -> anyhow::Result<()> {
        match &self.vm {
            Some(vm) => vm.guest.mkdir(path).await,
            None => Ok(std::fs::create_dir_all(path)?),
        }
    }

    /// Writes a new file on the node, fsynced.
    pub async fn write_file(&self, path: &Path, data: &[u8]) -> anyhow::Result<()> {
        match &self.vm {
            Some(vm) => vm.guest.write(path, None, data).await,
            None => {
                let mut f = std::fs::File::create(path)?;
                f.write_all(data)?;
                Ok(f.sync_all()?)
            }
        }
    }

    /// Reads a whole file on the node.
    pub async fn read_file(&self, path: &Path) -> anyhow::Result<Vec<u8>> {
        match &self.vm {
            Some(vm) => vm.guest.read(path, None).await,
            None => Ok(std::fs::read(path)?),
        }
    }

    /// Writes `data` at `offset` of an existing file or device, fsynced.
    pub async fn write_at(&self, path: &Path, offset: u64, data: &[u8]) -> anyhow::Result<()> {
        match &self.vm {
            Some(vm) => vm.guest.write(path, Some(offset), data).await,
            None => {
                let mut f = std::fs::OpenOptions::new().write(true).open(path)?;
                f.seek(SeekFrom::Start(offset))?;
                f.write_all(data)?;
                Ok(f.sync_all()?)
            }
        }
    }

    /// Reads `len` bytes at `offset` of a file or device on the node.
    pub async fn read_at(&self, path: &Path, offset: u64, len: u64) -> anyhow::Result<Vec<u8>> {
        match &self.vm {
            Some(vm) => vm.guest.read(path, Some((offset, len))).await,
            None => {
                let mut f = std::fs::File::open(path)?;
                f.seek(SeekFrom::Start(offset))?;
                let mut buf = vec![0u8; len as usize];
                f.read_exact(&mut buf)?;
                Ok(buf)
            }
        }
    }
}
