//! Durable file writes: a reader sees the old file or the new one, never
//! a part, and the new one survives a power cut once the write returns.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt};
use std::path::Path;

/// Replaces `path` with `contents` (mode `mode`, whatever the old file's
/// was) so that a reader sees the old file or the new one, never a part,
/// and so that the new one survives a power cut once this returns: a
/// temporary file in the same directory, fsync, rename, fsync of the
/// directory. The one way csi-scsi writes a record or a key.
pub fn write_durably(path: &Path, contents: &[u8], mode: u32) -> std::io::Result<()> {
    use atomic_write_file::unix::OpenOptionsExt as _;
    let mut file = atomic_write_file::OpenOptions::new()
        .preserve_mode(false)
        .mode(mode)
        .open(path)?;
    file.write_all(contents)?;
    // The mode given applies through the umask; set it exactly.
    file.set_permissions(fs::Permissions::from_mode(mode))?;
    file.commit()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::write_durably;

    #[test]
    fn a_durable_write_replaces_the_file_whole_with_exactly_the_mode_asked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tls.key");
        std::fs::write(&path, "old, world-readable").expect("old");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        write_durably(&path, b"new secret", 0o600).expect("write");
        assert_eq!(std::fs::read(&path).expect("read"), b"new secret");
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "a key never keeps the old file's wider mode");
        let left: Vec<_> = std::fs::read_dir(dir.path()).expect("ls").collect();
        assert_eq!(left.len(), 1, "no temporary file is left behind");
    }

    #[test]
    fn a_durable_write_that_cannot_complete_leaves_the_old_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("record");
        std::fs::write(&path, "old").expect("old");
        // A directory cannot be replaced by a file: the rename fails.
        let blocked = dir.path().join("blocked");
        std::fs::create_dir(&blocked).expect("dir");
        std::fs::write(blocked.join("x"), "").expect("non-empty");
        assert!(write_durably(&blocked, b"new", 0o600).is_err());
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "old");
    }
}
