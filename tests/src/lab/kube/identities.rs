//! The controller Pod's two identities, seen from an attacker's side. Code
//! running in a sidecar (or a leak of the token it holds) has the token
//! mounted into the sidecars: with it the API server must refuse the CA's
//! key and every CHAP Secret, while the same token still does the
//! sidecars' own work (so the refusal is RBAC's, not a broken token). And
//! the Pod must give each container the identity deploy/ says: the proxy
//! the Pod's projected token, each sidecar the sidecars' Secret.

use anyhow::{Context, bail};

use super::KubeLab;
use super::rbac::SIDECARS_ACCOUNT;
use super::targets::CHAP_SECRET;

/// The Secret holding the sidecars' token (deploy/rbac/controller.yaml).
const SIDECARS_TOKEN_SECRET: &str = "csi-scsi-sidecars-token";
/// Where client-go and kube-rs read a Pod's token.
const TOKEN_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The Secrets a sidecar must not read: the signer CA (with its key) and
/// the lab's CHAP Secret (tests/src/lab/kube/targets.rs).
const GUARDED: &[&str] = &["csi-scsi-ca", CHAP_SECRET];

/// Reads the guarded Secrets with the sidecars' token; all must be refused.
pub fn sidecar_token_reads_no_secret(lab: &KubeLab) -> anyhow::Result<String> {
    let ns = lab.namespace.as_str();
    let mounts = token_mounts(lab)?;
    let token = lab
        .kubectl
        .run(&[
            "get",
            "secret",
            SIDECARS_TOKEN_SECRET,
            "-n",
            ns,
            "-o",
            "go-template={{.data.token | base64decode}}",
        ])
        .context("the sidecars' token Secret")?;
    if token.trim().is_empty() {
        bail!("{SIDECARS_TOKEN_SECRET} holds no token (kube-controller-manager fills it in)");
    }
    let dir = lab.lab.config.dir.join("identities");
    std::fs::create_dir_all(&dir)?;
    let token_file = dir.join("sidecars.token");
    std::fs::write(&token_file, token.trim())?;
    let kubeconfig = dir.join("sidecars.kubeconfig");
    lab.plane
        .pki
        .kubeconfig_token(&kubeconfig, &lab.plane.server, &token_file)?;
    let sidecar = lab.kubectl.with_kubeconfig(&kubeconfig);
    // The positive control: the token works for what the sidecars do.
    let whoami = sidecar
        .run(&[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ])
        .context("the sidecars' token authenticates")?;
    let expected = format!("system:serviceaccount:{ns}:{SIDECARS_ACCOUNT}");
    if whoami.trim() != expected {
        bail!("the sidecars' token is {:?}, not {expected}", whoami.trim());
    }
    sidecar
        .run(&["get", "persistentvolumes", "-o", "name"])
        .context("the sidecars' token lists PersistentVolumes (the provisioner's rule)")?;
    let mut refused = Vec::new();
    for name in GUARDED {
        match sidecar.run(&["get", "secret", name, "-n", ns, "-o", "name"]) {
            Ok(_) => bail!("the sidecars' token read Secret {ns}/{name}"),
            Err(e) if e.to_string().contains("Forbidden") => refused.push(*name),
            Err(e) => return Err(e.context(format!("reading Secret {ns}/{name} as the sidecars"))),
        }
    }
    match sidecar.run(&["get", "secrets", "--all-namespaces", "-o", "name"]) {
        Ok(_) => bail!("the sidecars' token listed Secrets"),
        Err(e) if e.to_string().contains("Forbidden") => {}
        Err(e) => return Err(e.context("listing Secrets as the sidecars")),
    }
    Ok(format!(
        "{mounts}; as {SIDECARS_ACCOUNT} (its mounted token) the API server refused Secrets {} and every Secret list, and answered the sidecars' own reads",
        refused.join(", ")
    ))
}

/// Checks which volume each controller container mounts at the token path.
fn token_mounts(lab: &KubeLab) -> anyhow::Result<String> {
    let pods = super::pods::list(
        &lab.kubectl,
        &lab.namespace,
        super::pods::CONTROLLER_SELECTOR,
    )?;
    let spec = pods
        .into_iter()
        .next()
        .context("no controller Pod")?
        .spec
        .context("the controller Pod's spec")?;
    if spec.service_account_name.as_deref() != Some(super::rbac::PROXY_ACCOUNT) {
        bail!(
            "the controller Pod runs as {:?}, not {}",
            spec.service_account_name,
            super::rbac::PROXY_ACCOUNT
        );
    }
    let volumes = spec.volumes.as_deref().context("the Pod's volumes")?;
    let mut seen = 0;
    for c in &spec.containers {
        let name = c.name.as_str();
        let mount = c
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == TOKEN_DIR)
            .with_context(|| format!("container {name} mounts no token"))?;
        let volume = volumes
            .iter()
            .find(|v| v.name == mount.name)
            .with_context(|| format!("container {name}'s token volume"))?;
        let sidecars_secret = volume
            .secret
            .as_ref()
            .is_some_and(|s| s.secret_name.as_deref() == Some(SIDECARS_TOKEN_SECRET));
        let projected = volume.projected.is_some();
        let right = if name == "csi-scsi-proxy" {
            projected && !sidecars_secret
        } else {
            sidecars_secret
        };
        if !right {
            bail!(
                "container {name} mounts the wrong token: volume {}",
                serde_json::to_string(volume)?
            );
        }
        seen += 1;
    }
    Ok(format!(
        "{seen} containers: the proxy holds the Pod's projected token, the sidecars {SIDECARS_TOKEN_SECRET}"
    ))
}
