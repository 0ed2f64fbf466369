//! Render an issued certificate as a Kubernetes Secret manifest.

use crate::IssuedCertificate;

/// A `kubernetes.io/tls` Secret (YAML) holding `tls.crt`, `tls.key` and
/// `ca.crt`, ready for `kubectl apply -f -`.
pub fn secret_manifest(issued: &IssuedCertificate, name: &str, namespace: &str) -> String {
    let mut out = format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  namespace: {namespace}\n  labels:\n    app.kubernetes.io/part-of: csi-scsi\n  annotations:\n    csi-scsi.io/identity: \"{}\"\ntype: kubernetes.io/tls\nstringData:\n",
        issued.identity
    );
    for (key, pem) in [
        ("tls.crt", &issued.cert_pem),
        ("tls.key", &issued.key_pem),
        ("ca.crt", &issued.ca_pem),
    ] {
        out.push_str(&format!("  {key}: |\n"));
        for line in pem.lines() {
            out.push_str("    ");
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}
