//! The control plane's own certificates: one CA, the API server's serving
//! certificate, and client certificates whose subject is the Kubernetes
//! identity (CN = user, O = group), written with kubeconfigs that use them.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, SanType,
};
use time::{Duration, OffsetDateTime};

/// The lab cluster's CA and the files issued from it, under one directory.
pub struct KubePki {
    dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and key written to disk.
#[derive(Clone, Debug)]
pub struct KeyFiles {
    /// PEM certificate.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
}

impl KubePki {
    /// Creates a CA in `dir` (ca.crt, ca.key) and the service-account key.
    pub fn create(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "csi-scsi lab cluster CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params);
        let cert = params.self_signed(&key)?;
        write_secret(&dir.join("ca.key"), &key.serialize_pem())?;
        std::fs::write(dir.join("ca.crt"), cert.pem())?;
        // Service-account tokens are signed with this key (ES256).
        let sa = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        write_secret(&dir.join("sa.key"), &sa.serialize_pem())?;
        std::fs::write(dir.join("sa.pub"), sa.public_key_pem())?;
        Ok(Self {
            dir: dir.to_owned(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The CA key (kube-controller-manager signs kubelet CSRs with it).
    pub fn ca_key(&self) -> PathBuf {
        self.dir.join("ca.key")
    }

    /// The service-account signing key (private).
    pub fn sa_key(&self) -> PathBuf {
        self.dir.join("sa.key")
    }

    /// The service-account verification key (public).
    pub fn sa_pub(&self) -> PathBuf {
        self.dir.join("sa.pub")
    }

    /// A serving certificate named `name` for these DNS names and addresses.
    pub fn serving(&self, name: &str, dns: &[&str], ips: &[IpAddr]) -> anyhow::Result<KeyFiles> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, name);
        for d in dns {
            params
                .subject_alt_names
                .push(SanType::DnsName((*d).try_into()?));
        }
        for ip in ips {
            params.subject_alt_names.push(SanType::IpAddress(*ip));
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(name, params)
    }

    /// A client certificate for user `user` in `groups`.
    pub fn client(&self, file: &str, user: &str, groups: &[&str]) -> anyhow::Result<KeyFiles> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, user);
        for g in groups {
            params.distinguished_name.push(DnType::OrganizationName, *g);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(file, params)
    }

    fn sign(&self, file: &str, mut params: CertificateParams) -> anyhow::Result<KeyFiles> {
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        validity(&mut params);
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let cert = params.signed_by(&key, &self.issuer)?;
        let files = KeyFiles {
            cert: self.dir.join(format!("{file}.crt")),
            key: self.dir.join(format!("{file}.key")),
        };
        std::fs::write(&files.cert, cert.pem())?;
        write_secret(&files.key, &key.serialize_pem())?;
        Ok(files)
    }

    /// A kubeconfig at `path` for `server` authenticating with `creds`.
    pub fn kubeconfig_cert(
        &self,
        path: &Path,
        server: &str,
        creds: &KeyFiles,
    ) -> anyhow::Result<()> {
        self.kubeconfig_elsewhere(path, server, &self.ca(), (&creds.cert, &creds.key))
    }

    /// A kubeconfig at `path` for a machine that keeps the CA, the
    /// certificate and the key at its own paths (`ca`, `cert`, `key`: a
    /// lab guest's), which is what it names.
    pub fn kubeconfig_elsewhere(
        &self,
        path: &Path,
        server: &str,
        ca: &Path,
        (cert, key): (&Path, &Path),
    ) -> anyhow::Result<()> {
        let user = format!(
            "    client-certificate: {}\n    client-key: {}\n",
            cert.display(),
            key.display()
        );
        self.kubeconfig(path, server, ca, &user)
    }

    /// A kubeconfig at `path` for `server` authenticating with a bearer
    /// token read from `token_file` (a service account's TokenRequest).
    pub fn kubeconfig_token(
        &self,
        path: &Path,
        server: &str,
        token_file: &Path,
    ) -> anyhow::Result<()> {
        let user = format!("    tokenFile: {}\n", token_file.display());
        self.kubeconfig(path, server, &self.ca(), &user)
    }

    fn kubeconfig(&self, path: &Path, server: &str, ca: &Path, user: &str) -> anyhow::Result<()> {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\nusers:\n- name: lab\n  user:\n{user}contexts:\n- name: lab\n  context:\n    cluster: lab\n    user: lab\ncurrent-context: lab\n",
            ca = ca.display()
        );
        write_secret(path, &text).with_context(|| format!("writing {}", path.display()))
    }
}

fn validity(params: &mut CertificateParams) {
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::minutes(5);
    params.not_after = now + Duration::days(30);
}

/// Writes a file only its owner can read (keys, kubeconfigs).
fn write_secret(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(text.as_bytes())?;
    Ok(())
}
