//! Read and write PEM files: keys 0600, written to a temporary file and
//! renamed so a reader never sees half a file.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use csi_scsi_textfs::write_durably;

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
