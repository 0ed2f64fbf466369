//! A `Lifecycle` for tests, over the inventory and directory a test built:
//! throwaway proxy TLS material, short agent-call deadlines, no Secrets.
//! Shared by the test binaries through `#[path]`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use csi_scsi_certs::{
    CertificateAuthority, Identity, MaterialPaths, MaterialStore, Role, TrustDomain, Validity,
    write_issued,
};
use csi_scsi_proxy::agents::{AgentPool, Backoff, CallConfig};
use csi_scsi_proxy::directory::AgentDirectory;
use csi_scsi_proxy::inventory::Inventory;
use csi_scsi_proxy::leader::LeaderHandle;
use csi_scsi_proxy::lifecycle::Lifecycle;
use csi_scsi_proxy::secrets::NoSecrets;

/// A controller over `inventory` and `directory`; its TLS material goes
/// under `scratch`. Needs a Tokio runtime.
pub fn lifecycle(
    inventory: Arc<Inventory>,
    directory: Arc<dyn AgentDirectory>,
    scratch: &Path,
) -> Lifecycle {
    lifecycle_trusting(&test_ca(), inventory, directory, scratch)
}

/// A throwaway CA of the test trust domain.
pub fn test_ca() -> CertificateAuthority {
    csi_scsi_certs::install_crypto_provider();
    let domain = TrustDomain::new("csi-scsi.local").expect("domain");
    CertificateAuthority::create(&domain, Validity::days(1)).expect("CA")
}

/// As [`lifecycle`], with the proxy certificate issued by `ca` (so agents
/// with certificates from `ca` answer it).
pub fn lifecycle_trusting(
    ca: &CertificateAuthority,
    inventory: Arc<Inventory>,
    directory: Arc<dyn AgentDirectory>,
    scratch: &Path,
) -> Lifecycle {
    lifecycle_led(ca, inventory, directory, scratch, LeaderHandle::always())
}

/// As [`lifecycle_trusting`], its agent calls made for `leader`.
pub fn lifecycle_led(
    ca: &CertificateAuthority,
    inventory: Arc<Inventory>,
    directory: Arc<dyn AgentDirectory>,
    scratch: &Path,
    leader: LeaderHandle,
) -> Lifecycle {
    csi_scsi_certs::install_crypto_provider();
    let domain = TrustDomain::new("csi-scsi.local").expect("domain");
    let proxy = ca
        .issue(&Identity::Proxy, Validity::days(1))
        .expect("issue");
    let material = scratch.join("proxy-tls");
    write_issued(&material, &proxy).expect("write TLS material");
    let tls = MaterialStore::load(MaterialPaths::in_dir(&material), Role::Proxy, domain)
        .expect("TLS material");
    // An agent that does not answer fails a call in well under a second.
    let calls = CallConfig {
        connect_timeout: Duration::from_millis(500),
        deadline: Duration::from_secs(2),
        wipe_deadline: Duration::from_secs(20),
        attempts: 2,
        backoff: Backoff::try_new(Duration::from_millis(10), Duration::from_millis(50), 0.0)
            .expect("backoff"),
        concurrency: 8,
    };
    Lifecycle::new(
        inventory,
        AgentPool::new(directory, tls, calls, leader),
        Arc::new(NoSecrets),
    )
}
