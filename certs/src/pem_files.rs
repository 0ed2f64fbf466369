//! Read and write PEM files: keys 0600, written to a temporary file and
//! renamed so a reader never sees half a file.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt};
use std::path::Path;

use crate::{CertError, IssuedCertificate};

/// File name of a certificate chain (as in a `kubernetes.io/tls` Secret).
pub const TLS_CERT_FILE: &str = "tls.crt";
/// File name of a private key.
pub const TLS_KEY_FILE: &str = "tls.key";
/// File name of the CA certificate.
pub const CA_CERT_FILE: &str = "ca.crt";
/// File name of the CA private key (only in the CA's own directory).
pub const CA_KEY_FILE: &str = "ca.key";

/// Writes an issued certificate as `tls.crt`, `tls.key` (0600) and `ca.crt`
/// into `dir`, creating it (0700) if needed.
pub fn write_issued(dir: &Path, issued: &IssuedCertificate) -> Result<(), CertError> {
    create_private_dir(dir)?;
    write_file(&dir.join(TLS_CERT_FILE), &issued.cert_pem, 0o644)?;
    write_file(&dir.join(TLS_KEY_FILE), &issued.key_pem, 0o600)?;
    write_file(&dir.join(CA_CERT_FILE), &issued.ca_pem, 0o644)?;
    Ok(())
}

/// Creates `dir` (and parents) with mode 0700 for the last component.
pub(crate) fn create_private_dir(dir: &Path) -> Result<(), CertError> {
    fs::create_dir_all(dir).map_err(|source| io_err(dir, source))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(|s| io_err(dir, s))
}

/// Writes `contents` to `path` with `mode`, durably (see [`write_durably`]).
pub(crate) fn write_file(path: &Path, contents: &str, mode: u32) -> Result<(), CertError> {
    write_durably(path, contents.as_bytes(), mode).map_err(|source| io_err(path, source))
}

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

/// Reads a whole file as UTF-8.
pub(crate) fn read_to_string(path: &Path) -> Result<String, CertError> {
    fs::read_to_string(path).map_err(|source| io_err(path, source))
}

/// Reads a whole file as bytes.
pub(crate) fn read_bytes(path: &Path) -> Result<Vec<u8>, CertError> {
    fs::read(path).map_err(|source| io_err(path, source))
}

pub(crate) fn io_err(path: &Path, source: std::io::Error) -> CertError {
    CertError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Writes the CA's `ca.crt` and `ca.key` (0600) into `dir` (0700).
pub fn write_ca(dir: &Path, ca: &crate::CertificateAuthority) -> Result<(), CertError> {
    create_private_dir(dir)?;
    write_file(&dir.join(CA_CERT_FILE), ca.cert_pem(), 0o644)?;
    write_file(&dir.join(CA_KEY_FILE), ca.key_pem(), 0o600)
}

/// Writes a file that holds a secret (a Secret manifest) with mode 0600.
pub fn write_private_file(path: &Path, contents: &str) -> Result<(), CertError> {
    write_file(path, contents, 0o600)
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
