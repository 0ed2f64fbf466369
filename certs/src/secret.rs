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
        block(&mut out, key, pem);
    }
    out
}

/// The cluster CA for enrolment, as two objects for `kubectl apply -f -`:
/// the Secret `name` with `ca.crt` and `ca.key` (mounted by the proxy, the
/// signer, alone) and the ConfigMap `name` with `ca.crt` only (mounted by
/// every agent, which trusts it while it enrols).
pub fn ca_manifests(ca: &crate::CertificateAuthority, name: &str, namespace: &str) -> String {
    let meta = format!(
        "metadata:\n  name: {name}\n  namespace: {namespace}\n  labels:\n    app.kubernetes.io/part-of: csi-scsi\n"
    );
    let mut out = format!("apiVersion: v1\nkind: Secret\n{meta}type: Opaque\nstringData:\n");
    block(&mut out, "ca.crt", ca.cert_pem());
    block(&mut out, "ca.key", ca.key_pem());
    out.push_str(&format!(
        "---\napiVersion: v1\nkind: ConfigMap\n{meta}data:\n"
    ));
    block(&mut out, "ca.crt", ca.cert_pem());
    out
}

/// `  key: |` and the PEM indented under it.
fn block(out: &mut String, key: &str, pem: &str) {
    out.push_str(&format!("  {key}: |\n"));
    for line in pem.lines() {
        out.push_str("    ");
        out.push_str(line);
        out.push('\n');
    }
}
