//! The local lab: a small cluster of this driver on one machine, as root.
//! Each node is a network namespace with its own address, its own mount
//! namespace, kubelet directory and device tree, a real `csi-scsi-agent`
//! with its own certificate, and the kernel stand-in (see
//! [`crate::kernel`]). One `csi-scsi-proxy` runs on the embedded store.
//! Storage: a real `tgtd` serves two iSCSI targets (one with CHAP, one
//! with an initiator ACL that excludes a node) over sparse files, one LUN
//! through both targets (multipath), and an emulated Fibre Channel target.
//! The end-to-end tests drive the same harness.

pub mod cgroups;
pub mod kube;
pub mod net;
pub mod node_files;
pub mod scenario;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use self::net::{Network, sh, sh_quiet};
use crate::binaries::binary;
use crate::csi_client::csi_channel;
use crate::daemon::Daemon;
use crate::disks::FaultyDisks;
use crate::fabric::{Fabric, FcTargetDef, IscsiTargetDef, LunDef};
use crate::node_tree::NodeTree;
use crate::pki::Pki;
use crate::tgt::{LunIdentity, Tgtd};
use crate::vm::{self, Vm};

/// Port of every agent's API.
pub const AGENT_PORT: u16 = 9810;
/// Port of every agent's status endpoints (/healthz, /readyz, /metrics, /status).
pub const AGENT_STATUS_PORT: u16 = 9811;
/// Port of the proxy's status endpoints, on the lab's host address.
pub const PROXY_STATUS_PORT: u16 = 9812;
/// Every `iscsiadm` command line a node's agent ran, one a line, in the
/// node's directory (`nodes/<name>/`).
pub const ISCSIADM_ARGV_LOG: &str = "iscsiadm-argv.log";
/// Under `nodes/<node>/`: what the agent's Pod mounts of the node's kernel
/// stand-in (`bin/iscsiadm`, `iscsid.sock`, `tree/`).
pub const SEAM_DIR: &str = "seam";
/// Size of each pool LUN (`LabConfig::pool_luns`).
pub const POOL_LUN_BYTES: u64 = 64 << 20;
/// Size of each large pool LUN (`LabConfig::large_pool_luns`).
pub const LARGE_POOL_LUN_BYTES: u64 = 1 << 30;
/// The `array` every lab iSCSI target names: they are all one tgtd.
pub const LAB_ARRAY: &str = "lab-tgtd";
/// CHAP credentials of array-a (a lab secret, written to the secrets dir).
pub const CHAP_USER: &str = "lab-initiator";
const CHAP_SECRET: &str = "lab-chap-secret-a1b2";

/// array-a's CHAP secret, for the Kubernetes lab's Secret object.
pub(crate) fn chap_secret_for_lab() -> &'static str {
    CHAP_SECRET
}

/// What to build.
#[derive(Clone, Debug)]
pub struct LabConfig {
    /// Prefix of namespace, bridge and interface names (≤ 5 characters).
    pub prefix: String,
    /// Where everything lives.
    pub dir: PathBuf,
    /// Number of nodes.
    pub nodes: usize,
    /// Third octet of 198.18.<subnet>.0/24.
    pub subnet: u8,
    /// tgtd's control port (distinct per concurrent lab).
    pub tgt_control: u16,
    /// Delay before an FC scan shows new LUNs (a slow fabric).
    pub fc_scan_delay_ms: u64,
    /// Extra small LUNs (64 MiB each, `c1`..`cN`) behind a third target,
    /// array-c (no CHAP, no ACL; label `array=c`): a pool for workloads.
    pub pool_luns: usize,
    /// More LUNs on array-c after those, of 1 GiB each (sparse files): for
    /// what a 64 MiB LUN cannot hold (the storage e2e suite's expansion
    /// specs start at 1 GiB, xfs needs 300 MiB).
    pub large_pool_luns: usize,
    /// Extra environment of the proxy (e.g. `CSI_SCSI_FAULT`).
    pub proxy_env: Vec<(String, String)>,
    /// Extra arguments of every agent (e.g. `--max-volumes 4`).
    pub agent_args: Vec<String>,
    /// Serve every LUN through the failing disks ([`crate::disks`]), so a
    /// test can make them fail ([`Lab::disks`]). Off: plain loop devices.
    pub faulty_disks: bool,
    /// Start the proxy on the embedded store. Off for the Kubernetes lab,
    /// which starts its own against the API server.
    pub embedded_proxy: bool,
    /// Leave the agents to the DaemonSet (the Kubernetes lab): each node
    /// gets its kernel stand-in and the seam a Pod reaches it through
    /// (`nodes/<node>/seam`: `bin/iscsiadm` and `iscsid.sock`), no agent
    /// process.
    pub agents_as_pods: bool,
    /// Every node a qemu guest with Debian's kernel, the real initiator,
    /// udev and dm-multipath ([`crate::vm`]); no Fibre Channel target.
    pub vm: bool,
}

/// One node of a running lab.
pub struct LabNode {
    /// Node name.
    pub name: String,
    /// Its address.
    pub ip: String,
    /// Root of its sysfs and /dev trees.
    pub root: PathBuf,
    /// Its kubelet directory.
    pub kubelet: PathBuf,
    /// Its CSI socket.
    pub csi: PathBuf,
    /// Its agent API address.
    pub api: SocketAddr,
    /// Its agent's status endpoints (`http://<status>/status`).
    pub status: SocketAddr,
    /// The agent process.
    pub agent: Option<Daemon>,
    /// The kernel stand-in's watcher.
    pub watcher: Option<Daemon>,
    /// The guest, on a VM node (its agent runs inside).
    pub vm: Option<Vm>,
    agent_args: Vec<String>,
}

/// A running lab.
pub struct Lab {
    /// What it was built from.
    pub config: LabConfig,
    /// Its network.
    pub net: Network,
    /// The iSCSI target daemon.
    pub tgtd: Option<Tgtd>,
    /// The nodes.
    pub nodes: Vec<LabNode>,
    /// The proxy.
    pub proxy: Option<Daemon>,
    /// The proxy's CSI socket.
    pub proxy_csi: PathBuf,
    /// The proxy's status endpoints.
    pub proxy_status: SocketAddr,
    /// Certificates.
    pub pki: Pki,
    /// LUN backing files by name (`a1`, `mp`, ...).
    pub luns: BTreeMap<String, PathBuf>,
    /// The failing disks, by the same names, when `faulty_disks` is set.
    pub disks: Option<FaultyDisks>,
    proxy_args: Vec<String>,
    record: Record,
}

/// What `lab up --keep` leaves behind for any CSI client (`lab.json`).
#[derive(Debug, Serialize, Deserialize)]
pub struct Manifest {
    /// Lab name prefix.
    pub prefix: String,
    /// Lab directory.
    pub dir: PathBuf,
    /// The proxy's CSI socket.
    pub proxy_csi_socket: PathBuf,
    /// The proxy's status endpoints (`csi-scsi --url <this> status`).
    pub proxy_status_url: String,
    /// The proxy's inventory database (inspect with sqlite3).
    pub proxy_store: PathBuf,
    /// Certificate directory (CA and every issued certificate).
    pub certificates: PathBuf,
    /// Per node: CSI socket, agent address, kubelet dir.
    pub nodes: Vec<ManifestNode>,
    /// The arrays' tgtd control port (`tgtadm -C <this> --op show --mode
    /// target`); absent in a lab.json older than it.
    #[serde(default)]
    pub tgtd_control_port: Option<u16>,
}

/// One node in `lab.json`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ManifestNode {
    /// Node name.
    pub name: String,
    /// Its CSI socket.
    pub csi_socket: PathBuf,
    /// Its agent API address (mTLS).
    pub agent_address: String,
    /// Its agent's status endpoints (`csi-scsi --url <this> devices`).
    pub status_url: String,
    /// Its kubelet directory.
    pub kubelet_dir: PathBuf,
    /// Its network namespace.
    pub netns: String,
}

/// What `lab down` needs to clean up after a crash.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Record {
    prefix: String,
    subnet: u8,
    nodes: usize,
    pids: Vec<u32>,
    /// cgroup roots of the Kubernetes lab's kubelets (`/csi-scsi-...`).
    #[serde(default)]
    cgroups: Vec<String>,
}

impl LabConfig {
    /// The README's lab: 3 nodes under /tmp/csi-scsi-lab.
    pub fn standard() -> Self {
        Self {
            prefix: "csil".into(),
            dir: PathBuf::from("/tmp/csi-scsi-lab"),
            nodes: 3,
            subnet: 77,
            tgt_control: 19077,
            fc_scan_delay_ms: 0,
            pool_luns: 0,
            large_pool_luns: 0,
            proxy_env: Vec::new(),
            agent_args: Vec::new(),
            faulty_disks: false,
            embedded_proxy: true,
            agents_as_pods: false,
            vm: false,
        }
    }

    /// A lab for one test, with names and addresses of its own.
    pub fn for_test(dir: &Path) -> Self {
        use std::sync::atomic::{AtomicU16, Ordering};
        // Distinct within this process; a random base keeps parallel test
        // binaries apart too.
        static NEXT: AtomicU16 = AtomicU16::new(0);
        static BASE: std::sync::OnceLock<u16> = std::sync::OnceLock::new();
        let base = *BASE.get_or_init(|| fastrand::u16(..));
        let n = base.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed));
        Self {
            prefix: format!("t{:04x}", n),
            dir: dir.to_owned(),
            nodes: 3,
            subnet: 100 + (n % 150) as u8,
            tgt_control: 20000 + (n % 12000),
            fc_scan_delay_ms: 0,
            pool_luns: 0,
            large_pool_luns: 0,
            proxy_env: Vec::new(),
            agent_args: Vec::new(),
            faulty_disks: false,
            embedded_proxy: true,
            agents_as_pods: false,
            vm: false,
        }
    }

    /// Whether the lab has a pool: array-c, exported by tgtd and declared
    /// as a target, with small LUNs, large ones or both.
    pub fn has_pool(&self) -> bool {
        self.pool_luns + self.large_pool_luns > 0
    }
}

/// The name of node `i`.
pub fn node_name(i: usize) -> String {
    format!("node-{}", (b'a' + i as u8) as char)
}

impl Lab {
    /// Builds and starts everything; `progress` hears about each step.
    pub async fn up(config: LabConfig, progress: &mut dyn FnMut(&str)) -> anyhow::Result<Self> {
        preflight()?;
        down(&config.dir);
        let config = claim_free_network(config)?;
        std::fs::create_dir_all(&config.dir)?;
        let dir = std::fs::canonicalize(&config.dir)?;
        let config = LabConfig {
            dir: dir.clone(),
            ..config
        };
        let net = Network::new(&config.prefix, config.subnet);
        let mut record = Record {
            prefix: config.prefix.clone(),
            subnet: config.subnet,
            nodes: config.nodes,
            pids: Vec::new(),
            cgroups: Vec::new(),
        };
        save_record(&dir, &record)?;

        let pki = Pki::init(&dir.join("pki"));
        if config.agents_as_pods {
            // The DaemonSet's agents enrol with their projected tokens.
            progress("certificates: a CA and the proxy's (csi-scsi-certs); agents enrol");
        } else {
            progress(
                "certificates: a CA, the proxy's, a one-time join token per node (csi-scsi-certs join-token); the proxy enrols each agent",
            );
            for i in 0..config.nodes {
                join_token(&dir.join("pki"), &node_name(i))?;
            }
        }
        let proxy_tls = pki.issue_proxy("proxy-tls");

        progress("network: bridge and one network namespace per node in 198.18.0.0/15");
        net.create_bridge()?;
        for i in 0..config.nodes {
            net.add_node(i)?;
        }

        progress("storage: sparse LUN files and a real tgtd with two iSCSI targets");
        let luns_dir = dir.join("luns");
        std::fs::create_dir_all(&luns_dir)?;
        let mut luns = BTreeMap::new();
        for (name, size) in [
            ("a1", 512u64 << 20),
            ("a2", 1 << 30),
            ("mp", 512 << 20),
            ("b1", 1 << 30),
            ("fc1", 512 << 20),
        ] {
            // A VM node has no Fibre Channel HBA, and no stand-in to fake one.
            if config.vm && name == "fc1" {
                continue;
            }
            let path = luns_dir.join(format!("{name}.img"));
            let f = std::fs::File::create(&path)?;
            f.set_len(size)?;
            luns.insert(name.to_owned(), path);
        }
        for n in 1..=config.pool_luns + config.large_pool_luns {
            let path = luns_dir.join(format!("c{n}.img"));
            let size = if n <= config.pool_luns {
                POOL_LUN_BYTES
            } else {
                LARGE_POOL_LUN_BYTES
            };
            std::fs::File::create(&path)?.set_len(size)?;
            luns.insert(format!("c{n}"), path);
        }
        let portal: SocketAddr = format!("{}:3260", net.host_ip()).parse()?;
        let mut tgtd = Tgtd::start(config.tgt_control, portal, &dir.join("tgtd.log"))
            .await
            .context("starting tgtd")?;
        record.pids.push(tgtd.pid());
        save_record(&dir, &record)?;
        // VM nodes reach every target through two portals, one per NIC:
        // two paths for every LUN, for dm-multipath.
        let mut portals = vec![portal.to_string()];
        if config.vm {
            let second = net.add_second_host_address()?;
            let portal2 = format!("{second}:3260");
            tgtd.add_portal(&portal2).await?;
            portals.push(portal2);
        }
        let iqn_a = "iqn.2026-11.io.csi-scsi.lab:array-a";
        let iqn_b = "iqn.2026-11.io.csi-scsi.lab:array-b";
        tgtd.add_target(1, iqn_a).await?;
        tgtd.add_lun(1, 1, &luns["a1"], &LunIdentity::lab(1, 1))
            .await?;
        tgtd.add_lun(1, 2, &luns["a2"], &LunIdentity::lab(1, 2))
            .await?;
        // One LUN exported by both arrays' targets: two paths, one WWID.
        tgtd.add_lun(1, 3, &luns["mp"], &LunIdentity::lab(9, 1))
            .await?;
        tgtd.bind_all(1).await?;
        tgtd.add_chap(1, CHAP_USER, CHAP_SECRET).await?;
        tgtd.add_target(2, iqn_b).await?;
        tgtd.add_lun(2, 1, &luns["b1"], &LunIdentity::lab(2, 1))
            .await?;
        tgtd.add_lun(2, 2, &luns["mp"], &LunIdentity::lab(9, 1))
            .await?;
        // array-b's ACL admits every node but the last one.
        for i in 0..config.nodes.saturating_sub(1) {
            tgtd.bind_initiator_address(2, &net.node_ip(i)).await?;
        }
        let iqn_c = "iqn.2026-11.io.csi-scsi.lab:array-c";
        let mut pool = Vec::new();
        if config.has_pool() {
            tgtd.add_target(3, iqn_c).await?;
            for n in 1..=(config.pool_luns + config.large_pool_luns) as u64 {
                let file = &luns[&format!("c{n}")];
                tgtd.add_lun(3, n, file, &LunIdentity::lab(3, n)).await?;
                pool.push(lun_def(n as u32, file));
            }
            tgtd.bind_all(3).await?;
        }
        let fc_nodes: Vec<String> = match config.vm {
            true => Vec::new(),
            false => (1..config.nodes).map(node_name).collect(),
        };
        let mut fabric = Fabric {
            iscsi: vec![
                IscsiTargetDef {
                    iqn: iqn_a.into(),
                    luns: vec![
                        lun_def(1, &luns["a1"]),
                        lun_def(2, &luns["a2"]),
                        lun_def(3, &luns["mp"]),
                    ],
                },
                IscsiTargetDef {
                    iqn: iqn_b.into(),
                    luns: vec![lun_def(1, &luns["b1"]), lun_def(2, &luns["mp"])],
                },
            ],
            fc: luns
                .get("fc1")
                .map(|fc1| FcTargetDef {
                    wwpn: "500a0981891b8dc5".into(),
                    nodes: fc_nodes.clone(),
                    luns: vec![LunDef {
                        lun: 0,
                        file: fc1.clone(),
                        data: None,
                        wwid: "naa.600a098038303053453f463045727031".into(),
                        vendor: "NETAPP".into(),
                        model: "LUN C-Mode".into(),
                        serial: "80SE?F0Erp1".into(),
                    }],
                })
                .into_iter()
                .collect(),
        };
        if !pool.is_empty() {
            fabric.iscsi.push(IscsiTargetDef {
                iqn: iqn_c.into(),
                luns: pool,
            });
        }
        let disks = match config.faulty_disks {
            true => {
                progress("disks: every LUN served through FUSE, so tests can make it fail");
                let named: Vec<(String, PathBuf)> =
                    luns.iter().map(|(n, p)| (n.clone(), p.clone())).collect();
                let disks = FaultyDisks::mount(&dir.join("disks"), &named)?;
                for def in fabric.luns_mut() {
                    if let Some((name, _)) = named.iter().find(|(_, p)| *p == def.file) {
                        def.data = Some(disks.path(name));
                    }
                }
                Some(disks)
            }
            false => None,
        };
        let fabric_path = dir.join("fabric.json");
        fabric.save(&fabric_path)?;

        let mut nodes = Vec::new();
        // VM nodes that are Kubernetes nodes boot once the control plane
        // is up (crate::lab::kube::vm_node).
        if config.vm && !config.agents_as_pods {
            nodes = start_vm_nodes(&config, &net, &mut record, progress).await?;
        } else if !config.vm {
            progress("nodes: device trees, shared kubelet directories, kernel stand-ins, agents");
        }
        for i in (0..config.nodes).filter(|_| !config.vm) {
            let node = start_node(
                &config,
                &net,
                i,
                &fabric_path,
                fc_nodes.contains(&node_name(i)),
                &mut record,
            )
            .await?;
            nodes.push(node);
        }

        progress("proxy: embedded store, agents file, targets file, CHAP secret");
        let secrets = dir.join("secrets/chap-array-a");
        std::fs::create_dir_all(&secrets)?;
        std::fs::write(secrets.join("username"), CHAP_USER)?;
        std::fs::write(secrets.join("password"), CHAP_SECRET)?;
        std::fs::set_permissions(
            secrets.join("password"),
            std::fs::Permissions::from_mode(0o600),
        )?;
        let agents: String = nodes
            .iter()
            .map(|n| format!("{} {}\n", n.name, n.api))
            .collect();
        std::fs::write(dir.join("agents.txt"), agents)?;
        // array-a, -b and -c are targets of one tgtd: they say so (`array`),
        // so the LUN both export is one device with paths through each,
        // not a conflict.
        let mut targets = serde_json::json!([
            {"name": "array-a", "iscsi": {"portals": portals, "iqn": iqn_a, "chapSecretRef": {"name": "chap-array-a"}},
             "deviceLabels": {"array": "a", "tier": "fast"}, "array": LAB_ARRAY},
            {"name": "array-b", "iscsi": {"portals": portals, "iqn": iqn_b},
             "deviceLabels": {"array": "b", "tier": "capacity"}, "array": LAB_ARRAY}
        ]);
        let list = targets.as_array_mut().context("targets")?;
        if !config.vm {
            list.push(serde_json::json!(
                {"name": "fc-1", "fibreChannel": {"wwpns": ["50:0a:09:81:89:1b:8d:c5"]}, "nodes": fc_nodes,
                 "deviceLabels": {"array": "fc", "tier": "fast"}}
            ));
        }
        if config.has_pool() {
            list.push(serde_json::json!(
                {"name": "array-c", "iscsi": {"portals": portals, "iqn": iqn_c},
                 "deviceLabels": {"array": "c", "tier": "pool"}, "array": LAB_ARRAY}
            ));
        }
        std::fs::write(
            dir.join("targets.json"),
            serde_json::to_vec_pretty(&targets)?,
        )?;
        let proxy_csi = dir.join("proxy/csi.sock");
        let proxy_status: SocketAddr = format!("{}:{PROXY_STATUS_PORT}", net.host_ip()).parse()?;
        let mut lab = Self {
            config,
            net,
            tgtd: Some(tgtd),
            nodes,
            proxy: None,
            proxy_csi,
            proxy_status,
            pki,
            luns,
            disks,
            proxy_args: Vec::new(),
            record,
        };
        lab.proxy_args = lab.proxy_args(&proxy_tls);
        if lab.config.embedded_proxy {
            lab.restart_proxy().await?;
            if !lab.config.agents_as_pods {
                lab.wait_enrolled().await?;
            }
        }
        Ok(lab)
    }

    fn proxy_args(&self, tls: &Path) -> Vec<String> {
        let dir = &self.config.dir;
        [
            "--csi-endpoint",
            &self.proxy_csi.display().to_string(),
            "--tls-dir",
            &tls.display().to_string(),
            "--store",
            &dir.join("proxy/inventory.db").display().to_string(),
            "--agents-file",
            &dir.join("agents.txt").display().to_string(),
            "--targets-file",
            &dir.join("targets.json").display().to_string(),
            "--secrets-dir",
            &dir.join("secrets").display().to_string(),
            "--discovery-interval",
            "5",
            // Releases a kill interrupted resume within seconds.
            "--release-scan-interval",
            "5",
            // A LUN held for its data and erased on the array is offered
            // within seconds.
            "--held-lun-reprobe",
            "5",
            "--agent-timeout",
            "30",
            "--status-listen",
            &self.proxy_status.to_string(),
            "--agent-probe-interval",
            "5",
            // The signer: agents enrol with their join tokens.
            "--signer-ca-dir",
            &self.pki.ca_dir().display().to_string(),
            "--join-tokens-dir",
            &dir.join("pki/join-tokens").display().to_string(),
            "--enrol-interval",
            "2",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// Waits until the proxy has enrolled every agent (its certificate is
    /// in its node's `pki/<node>-tls`).
    async fn wait_enrolled(&self) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        for n in &self.nodes {
            let cert = self
                .config
                .dir
                .join("pki")
                .join(format!("{}-tls", n.name))
                .join(csi_scsi_certs::TLS_CERT_FILE);
            while !match &n.vm {
                // The agent's production --tls-dir, in the guest.
                Some(vm) => vm
                    .guest
                    .exec(&["test", "-s", "/etc/csi-scsi/tls/tls.crt"])
                    .await
                    .is_ok_and(|(code, _)| code == 0),
                None => cert.exists(),
            } {
                if tokio::time::Instant::now() > deadline {
                    bail!(
                        "the proxy did not enrol {} within 60 s (see proxy.log)",
                        n.name
                    );
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// Grows LUN `name` (`a1`, `mp`, `c3`, ...) by `by` bytes, as an array
    /// administrator would: the backing file grows and tgtd re-reads its
    /// size. Returns the old and new sizes.
    pub async fn grow_lun(&mut self, name: &str, by: u64) -> anyhow::Result<(u64, u64)> {
        let path = self
            .luns
            .get(name)
            .with_context(|| format!("no LUN {name}"))?;
        let old = std::fs::metadata(path)?.len();
        let new = old + by;
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)?
            .set_len(new)?;
        // tgtd caches a LUN's size: re-add the LUN(s) on this file.
        let pool = name
            .strip_prefix('c')
            .and_then(|n| n.parse::<u64>().ok())
            .map(|n| [(3, n)]);
        let tids: &[(u32, u64)] = match (name, &pool) {
            ("a1", _) => &[(1, 1)],
            ("a2", _) => &[(1, 2)],
            ("mp", _) => &[(1, 3), (2, 2)],
            ("b1", _) => &[(2, 1)],
            // array-c, the pool: `cN` is its LUN N.
            (_, Some(c)) => c,
            _ => bail!("growing {name} is not supported"),
        };
        for &(tid, lun) in tids {
            self.tgtd
                .as_mut()
                .context("tgtd")?
                .refresh_lun_size(tid, lun)
                .await?;
        }
        Ok((old, new))
    }

    /// Records processes the lab did not start itself (the Kubernetes
    /// lab's), so `lab down` stops them after a crash too.
    pub fn record_pids(&mut self, pids: &[u32]) -> anyhow::Result<()> {
        self.record.pids.extend_from_slice(pids);
        save_record(&self.config.dir, &self.record)
    }

    /// Records a cgroup root for `lab down` to empty and remove.
    pub fn record_cgroup(&mut self, root: &str) -> anyhow::Result<()> {
        self.record.cgroups.push(root.to_owned());
        save_record(&self.config.dir, &self.record)
    }

    /// The phase the embedded proxy's store records for `wwid` now
    /// (empty when it has no such device).
    pub fn device_phase(&self, wwid: &str) -> anyhow::Result<String> {
        Ok(crate::reliability::store::run(
            &self.proxy_store(),
            &format!("SELECT phase FROM devices WHERE wwid = '{wwid}'"),
        )?
        .trim()
        .to_owned())
    }

    /// Waits up to `bound` for `wwid` to reach `phase`; the error names
    /// the phases seen on the way.
    pub async fn wait_device_phase(
        &self,
        wwid: &str,
        phase: &str,
        bound: Duration,
    ) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + bound;
        let mut seen: Vec<String> = Vec::new();
        loop {
            let now = self.device_phase(wwid)?;
            if now == phase {
                return Ok(());
            }
            if seen.last() != Some(&now) {
                seen.push(now);
            }
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "{wwid} never {phase} in {bound:?}; seen: {}",
                    seen.join(" -> ")
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The proxy's inventory database.
    pub fn proxy_store(&self) -> PathBuf {
        self.config.dir.join("proxy/inventory.db")
    }

    /// Kills the proxy with SIGKILL (as a crash or an OOM kill would).
    pub fn kill_proxy(&mut self) {
        if let Some(proxy) = self.proxy.take() {
            sigkill(proxy.pid());
            drop(proxy);
        }
    }

    /// Starts the proxy (killing a running one first) with its original
    /// arguments and `config.proxy_env`; waits for its CSI socket.
    pub async fn restart_proxy(&mut self) -> anyhow::Result<()> {
        self.kill_proxy();
        let dir = self.config.dir.clone();
        let proxy = Daemon::spawn_with(
            &binary("csi-scsi-proxy"),
            &self.proxy_args,
            &self.config.proxy_env,
            &dir.join("proxy.log"),
        );
        self.record.pids.push(proxy.pid());
        save_record(&dir, &self.record)?;
        wait_socket(&self.proxy_csi, &proxy).await?;
        self.proxy = Some(proxy);
        Ok(())
    }

    /// Kills node `i`'s agent (as a crash would).
    pub fn kill_agent(&mut self, i: usize) {
        if let Some(agent) = self.nodes[i].agent.take() {
            sigkill(agent.pid());
            // The nsenter/unshare chain: kill the agent itself too.
            sh_quiet(
                "pkill",
                &[
                    "-KILL",
                    "-f",
                    &format!("--node-name {}", self.nodes[i].name),
                ],
            );
            drop(agent);
        }
    }

    /// Restarts node `i`'s agent with its original arguments.
    pub async fn restart_agent(&mut self, i: usize) -> anyhow::Result<()> {
        self.kill_agent(i);
        let node = &mut self.nodes[i];
        let log = self.config.dir.join(format!("{}.agent.log", node.name));
        let agent = Daemon::spawn_program(Path::new("nsenter"), &node.agent_args, &log);
        wait_socket(&node.csi, &agent).await?;
        node.agent = Some(agent);
        Ok(())
    }

    /// Logs node `i` out of array `array` (`array-a`, ...) through its
    /// `iscsiadm`, as an operator or a lost session would, behind the
    /// agent's back.
    pub fn logout_iscsi(&self, i: usize, array: &str) -> anyhow::Result<()> {
        let out = std::process::Command::new(
            self.config
                .dir
                .join("nodes")
                .join(&self.nodes[i].name)
                .join("bin/iscsiadm"),
        )
        .args([
            "-m",
            "node",
            "-T",
            &format!("iqn.2026-11.io.csi-scsi.lab:{array}"),
            "-p",
            &format!("{}:3260", self.net.host_ip()),
            "--logout",
        ])
        .output()?;
        if !out.status.success() {
            bail!(
                "iscsiadm --logout: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// The lab's `lab.json`.
    pub fn manifest(&self) -> Manifest {
        Manifest {
            prefix: self.config.prefix.clone(),
            dir: self.config.dir.clone(),
            proxy_csi_socket: self.proxy_csi.clone(),
            proxy_status_url: format!("http://{}", self.proxy_status),
            proxy_store: self.config.dir.join("proxy/inventory.db"),
            certificates: self.config.dir.join("pki"),
            nodes: self
                .nodes
                .iter()
                .enumerate()
                .map(|(i, n)| ManifestNode {
                    name: n.name.clone(),
                    csi_socket: n.csi.clone(),
                    agent_address: n.api.to_string(),
                    status_url: format!("http://{}", n.status),
                    kubelet_dir: n.kubelet.clone(),
                    netns: self.net.netns(i),
                })
                .collect(),
            tgtd_control_port: self.tgtd.as_ref().map(Tgtd::control_port),
        }
    }

    /// Leaves every process running after this handle is dropped. Failing
    /// disks (`faulty_disks`) live in this process, so they cannot stay:
    /// keep a lab without them.
    pub fn keep(mut self) -> Manifest {
        let m = self.manifest();
        if let Some(p) = self.proxy.take() {
            p.detach();
        }
        for n in &mut self.nodes {
            if let Some(a) = n.agent.take() {
                a.detach();
            }
            if let Some(w) = n.watcher.take() {
                w.detach();
            }
            if let Some(vm) = n.vm.take() {
                vm.qemu.detach();
                vm.relay.detach();
            }
        }
        if let Some(t) = self.tgtd.take() {
            // Its Drop would stop it: the lab stays up.
            std::mem::forget(t);
        }
        self.config.dir = PathBuf::new();
        m
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Nothing may stay blocked on a stalled disk while the lab goes
        // (the disks themselves go after `down`, as fields drop).
        if let Some(disks) = &self.disks {
            disks.heal_all();
        }
        self.proxy.take();
        for n in &mut self.nodes {
            n.agent.take();
            n.watcher.take();
            n.vm.take();
        }
        self.tgtd.take();
        if !self.config.dir.as_os_str().is_empty() {
            down(&self.config.dir);
        }
    }
}

/// SIGKILLs `pid` at once (no `kill` process spawned on the way: the
/// crash suite times its kills to land mid-call).
pub(crate) fn sigkill(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

fn lun_def(lun: u32, file: &Path) -> LunDef {
    LunDef {
        lun,
        file: file.to_owned(),
        data: None,
        wwid: String::new(),
        vendor: String::new(),
        model: String::new(),
        serial: String::new(),
    }
}

async fn start_node(
    config: &LabConfig,
    net: &Network,
    i: usize,
    fabric: &Path,
    fc: bool,
    record: &mut Record,
) -> anyhow::Result<LabNode> {
    let name = node_name(i);
    let base = config.dir.join("nodes").join(&name);
    let root = base.join("tree");
    let tree = NodeTree::create(&root)?;
    if fc {
        tree.add_fc_host(1, &format!("10000000c9a0000{i}"))?;
    }
    // kubelet's directory, shared as the DaemonSet's Bidirectional mount
    // makes it: the agent's mounts in its own namespace show up here.
    let kubelet = base.join("kubelet");
    std::fs::create_dir_all(kubelet.join("plugins/csi-scsi.io"))?;
    let k = kubelet.display().to_string();
    sh("mount", &["--bind", &k, &k])?;
    sh("mount", &["--make-shared", &k])?;
    let initiator = format!("iqn.2026-11.io.csi-scsi.lab:{name}");
    let kernel = binary("csi-scsi-lab-kernel");
    let ctx_args = [
        "--node".to_owned(),
        name.clone(),
        "--root".into(),
        root.display().to_string(),
        "--fabric".into(),
        fabric.display().to_string(),
        "--initiator".into(),
        initiator.clone(),
    ];
    let bin = base.join("bin");
    std::fs::create_dir_all(&bin)?;
    let wrapper = bin.join("iscsiadm");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\n# The lab's kernel stand-in plays iscsiadm for {name}; every\n# command line is kept in {argv} (tests check no secret is ever on one).\necho \"$*\" >> {argv}\nexec {} {} iscsiadm \"$@\"\n",
            kernel.display(),
            ctx_args.join(" "),
            argv = base.join(ISCSIADM_ARGV_LOG).display()
        ),
    )?;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
    let mut watch_args = ctx_args.to_vec();
    watch_args.extend([
        "--scan-delay-ms".into(),
        config.fc_scan_delay_ms.to_string(),
    ]);
    if config.agents_as_pods {
        // The agent's container reaches this node's stand-in as the real
        // iscsiadm reaches iscsid: through a socket on a hostPath volume.
        let seam = base.join(SEAM_DIR);
        std::fs::create_dir_all(seam.join("bin"))?;
        std::fs::create_dir_all(seam.join("tree"))?;
        std::fs::copy(&kernel, seam.join("bin/iscsiadm"))?;
        watch_args.extend([
            "--iscsid-socket".into(),
            seam.join(crate::kernel::iscsid::SOCKET)
                .display()
                .to_string(),
            "--argv-log".into(),
            base.join(ISCSIADM_ARGV_LOG).display().to_string(),
        ]);
    }
    watch_args.push("watch".into());
    // In the node's network namespace, as its kernel is: the logins it
    // makes for the agent's Pod come from the node's address, which the
    // arrays' ACLs name (from the host's, array-b refused them).
    let mut in_node = vec![
        format!("--net=/run/netns/{}", net.netns(i)),
        kernel.display().to_string(),
    ];
    in_node.extend(watch_args);
    let watcher = Daemon::spawn_program(Path::new("nsenter"), &in_node, &base.join("kernel.log"));
    record.pids.push(watcher.pid());

    let csi = kubelet.join("plugins/csi-scsi.io/csi.sock");
    let api: SocketAddr = format!("{}:{AGENT_PORT}", net.node_ip(i)).parse()?;
    let status: SocketAddr = format!("{}:{AGENT_STATUS_PORT}", net.node_ip(i)).parse()?;
    let tls = config.dir.join("pki").join(format!("{name}-tls"));
    let agent_bin = binary("csi-scsi-agent");
    let mut agent_args: Vec<String> = vec![
        format!("--net=/run/netns/{}", net.netns(i)),
        "unshare".into(),
        "--mount".into(),
        "--propagation".into(),
        "unchanged".into(),
        "--".into(),
        agent_bin.display().to_string(),
    ];
    agent_args.extend(
        [
            "--node-name",
            &name,
            "--csi-endpoint",
            &format!("unix://{}", csi.display()),
            "--agent-listen",
            &api.to_string(),
            "--status-listen",
            &status.to_string(),
            "--tls-dir",
            &tls.display().to_string(),
            "--join-token-file",
            &config
                .dir
                .join("pki")
                .join(format!("{name}.join-token"))
                .display()
                .to_string(),
            "--enrol-ca-file",
            &config.dir.join("pki/ca/ca.crt").display().to_string(),
            "--sysfs-root",
            &root.join("sys").display().to_string(),
            "--dev-root",
            &root.join("dev").display().to_string(),
            "--kubelet-dir",
            &k,
            "--iscsi-node-dir",
            &crate::kernel::records::nodes_dir(&root)
                .display()
                .to_string(),
            "--state-dir",
            &base.join("agent-state").display().to_string(),
            "--tool",
            &format!("iscsiadm={}", wrapper.display()),
            "--login-timeout",
            "5",
            "--tls-poll-interval",
            "5",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    agent_args.extend(config.agent_args.iter().cloned());
    let agent = match config.agents_as_pods {
        true => None,
        false => {
            let agent = Daemon::spawn_program(
                Path::new("nsenter"),
                &agent_args,
                &config.dir.join(format!("{name}.agent.log")),
            );
            record.pids.push(agent.pid());
            save_record(&config.dir, record)?;
            wait_socket(&csi, &agent).await?;
            Some(agent)
        }
    };
    Ok(LabNode {
        name,
        ip: net.node_ip(i),
        root,
        kubelet,
        csi,
        api,
        status,
        agent,
        watcher: Some(watcher),
        vm: None,
        agent_args,
    })
}

/// The resident memory of process `pid` in MiB (0 when unreadable: a
/// figure printed, never a decision).
pub(crate) fn rss_mib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0)
        >> 10
}

impl LabNode {
    /// A VM node: lab address `ip` (its namespace's), its agent API and
    /// status served at `serving` (forwarded from `ip` on the VM lab; the
    /// guest's cluster address when it is a Kubernetes node).
    pub(crate) fn guest(
        name: &str,
        ip: &str,
        serving: std::net::Ipv4Addr,
        vm: Vm,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            name: name.to_owned(),
            ip: ip.to_owned(),
            root: PathBuf::from("/"),
            kubelet: PathBuf::from("/var/lib/kubelet"),
            csi: vm.csi.clone(),
            api: SocketAddr::from((serving, AGENT_PORT)),
            status: SocketAddr::from((serving, AGENT_STATUS_PORT)),
            agent: None,
            watcher: None,
            vm: Some(vm),
            agent_args: Vec::new(),
        })
    }
}

/// Boots every node as a VM ([`crate::vm`]) and waits until each serves
/// CSI; prints the time and memory each took.
async fn start_vm_nodes(
    config: &LabConfig,
    net: &Network,
    record: &mut Record,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<Vec<LabNode>> {
    let t = std::time::Instant::now();
    let image = vm::Image::build(&config.dir.join("vm"), None)?;
    progress(&format!(
        "VM image: Debian's kernel and an initramfs from Debian packages with this build's agent ({:.1}s)",
        t.elapsed().as_secs_f64()
    ));
    let t = std::time::Instant::now();
    progress(&format!(
        "nodes: {} qemu guests (TCG), each in its node's namespace with two NICs; agents with production defaults",
        config.nodes
    ));
    let second = net.second_host_ip();
    let mut nodes = Vec::new();
    for i in 0..config.nodes {
        let name = node_name(i);
        let base = config.dir.join("nodes").join(&name);
        let pki = config.dir.join("pki");
        let vm = vm::boot(
            &image,
            net,
            &vm::NodeSpec {
                name: &name,
                index: i,
                dir: &base,
                portal2: &second,
                enrolment: Some((
                    &pki.join(format!("{name}.join-token")),
                    &pki.join("ca/ca.crt"),
                )),
                agent_port: AGENT_PORT,
                status_port: AGENT_STATUS_PORT,
                kube: None,
            },
        )?;
        record.pids.extend([vm.qemu.pid(), vm.relay.pid()]);
        save_record(&config.dir, record)?;
        let ip = net.node_ip(i);
        nodes.push(LabNode::guest(&name, &ip, ip.parse()?, vm)?);
    }
    for n in &mut nodes {
        let booted = std::time::Instant::now();
        let vm = n.vm.as_mut().context("vm")?;
        vm.wait_ready(Duration::from_secs(180)).await?;
        let rss_mib = rss_mib(vm.qemu.pid());
        progress(&format!(
            "{}: booted and serving CSI ({:.1}s after boot began, +{:.1}s waited here); qemu RSS {rss_mib} MiB",
            n.name,
            t.elapsed().as_secs_f64(),
            booted.elapsed().as_secs_f64()
        ));
    }
    Ok(nodes)
}

async fn wait_socket(path: &Path, daemon: &Daemon) -> anyhow::Result<()> {
    for _ in 0..200 {
        if csi_channel(path).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("{} did not come up:\n{}", path.display(), daemon.log())
}

/// Moves `config` to a subnet and a name prefix nobody on this machine uses
/// (another lab, another test binary), so two labs never share a route.
fn claim_free_network(mut config: LabConfig) -> anyhow::Result<LabConfig> {
    let addrs = sh("ip", &["-4", "-o", "addr", "show"]).unwrap_or_default();
    let links = sh("ip", &["-o", "link", "show"]).unwrap_or_default();
    let netns = sh("ip", &["netns", "list"]).unwrap_or_default();
    for _ in 0..150 {
        let subnet_used = addrs.contains(&format!(" 198.18.{}.", config.subnet));
        let prefix_used = links.contains(&format!("{}br", config.prefix))
            || netns.contains(&format!("{}-n", config.prefix));
        if !subnet_used && !prefix_used {
            return Ok(config);
        }
        config.subnet = if config.subnet >= 249 {
            100
        } else {
            config.subnet + 1
        };
        if prefix_used {
            config.prefix = format!("t{:04x}", fastrand::u16(..));
        }
    }
    bail!("no free 198.18.x.0/24 subnet for the lab")
}

fn preflight() -> anyhow::Result<()> {
    if !nix::unistd::Uid::effective().is_root() {
        bail!("the lab needs root (network namespaces, loop devices, mounts, tgtd)");
    }
    for tool in [
        "tgtd",
        "tgtadm",
        "ip",
        "losetup",
        "nsenter",
        "unshare",
        "mkfs.xfs",
        "mkfs.ext4",
        "blkid",
        "wipefs",
    ] {
        if sh("sh", &["-c", &format!("command -v {tool}")]).is_err() {
            bail!(
                "{tool} is missing: install the packages listed in .ci/run (tgt, iproute2, util-linux, xfsprogs, e2fsprogs)"
            );
        }
    }
    Ok(())
}

fn save_record(dir: &Path, record: &Record) -> anyhow::Result<()> {
    std::fs::write(
        dir.join("lab-state.json"),
        serde_json::to_vec_pretty(record)?,
    )?;
    Ok(())
}

/// Removes every process, mount, loop device, namespace and file a lab in
/// `dir` made. Safe to run twice, and after a crash.
pub fn down(dir: &Path) {
    let Ok(dir) = std::fs::canonicalize(dir) else {
        return;
    };
    let record: Record = std::fs::read_to_string(dir.join("lab-state.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    for pid in &record.pids {
        sh_quiet("kill", &["-TERM", &pid.to_string()]);
    }
    // Agents run under nsenter/unshare: match them by their tree too.
    kill_matching("-TERM", &dir);
    std::thread::sleep(Duration::from_millis(300));
    for pid in &record.pids {
        sh_quiet("kill", &["-KILL", &pid.to_string()]);
    }
    kill_matching("-KILL", &dir);
    // The Kubernetes lab's containers: their processes live in the
    // kubelets' cgroup roots, not under the lab's directory.
    for root in &record.cgroups {
        cgroups::remove_tree(root);
    }
    // While the lab's files are all there (before any unmount): they say
    // which Pods' network namespaces are ours.
    kube::cni::remove_pod_netns(&dir);
    // Loop devices over the lab's files, before the mounts: a loop over a
    // failing disk names its file by a path under the lab only while the
    // disks' FUSE mount is there. A loop still mounted is freed at its
    // unmount (losetup -d sets autoclear).
    // The stand-in attaches loops inside the nodes' mount namespaces,
    // where a failing disk's file has a path the host cannot resolve
    // (`/a1`): those are found through the nodes' own records.
    let recorded: Vec<String> = std::fs::read_dir(dir.join("nodes"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|n| std::fs::read_to_string(n.path().join("tree/iscsi/state.json")).ok())
        .filter_map(|t| serde_json::from_str::<crate::kernel::state::NodeState>(&t).ok())
        .flat_map(|s| s.loop_devices())
        .map(|p| p.display().to_string())
        .collect();
    if let Ok(list) = sh("losetup", &["-l", "-n", "-O", "NAME,BACK-FILE"]) {
        for line in list.lines() {
            let mut it = line.split_whitespace();
            if let (Some(dev), Some(file)) = (it.next(), it.next()) {
                let ours = Path::new(file).starts_with(&dir)
                    || (recorded.iter().any(|r| r == dev) && !Path::new(file).exists());
                if ours {
                    sh_quiet("losetup", &["-d", dev]);
                }
            }
        }
    }
    // Mounts under the lab, deepest first.
    let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(unescape))
        .filter(|m| Path::new(m).starts_with(&dir))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in mounts {
        sh_quiet("umount", &["-l", &m]);
    }
    if !record.prefix.is_empty() {
        Network::new(&record.prefix, record.subnet).destroy(record.nodes);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Signals every process whose command line names `dir`, but not this
/// one nor its ancestors (`lab up --dir DIR`, and whatever started it,
/// name it too).
fn kill_matching(signal: &str, dir: &Path) {
    let mut spare = vec![std::process::id().to_string()];
    while let Some(parent) =
        std::fs::read_to_string(format!("/proc/{}/stat", spare[spare.len() - 1]))
            .ok()
            .and_then(|stat| {
                // pid (comm) state ppid ...: comm may hold spaces, so read after ')'.
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1).map(str::to_owned))
            })
            .filter(|p| p != "0" && p != "1")
    {
        spare.push(parent);
    }
    let pids = sh("pgrep", &["-f", &dir.display().to_string()]).unwrap_or_default();
    for pid in pids.lines().filter(|p| !spare.iter().any(|s| s == p)) {
        sh_quiet("kill", &[signal, pid]);
    }
}

fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// A one-time join token for `node`'s agent, made as docs/certificates.md
/// says (`csi-scsi-certs join-token`): its digest in `pki/join-tokens` (the
/// proxy's), the token in `pki/<node>.join-token` (the agent's, 0600).
fn join_token(pki: &Path, node: &str) -> anyhow::Result<()> {
    let token = sh(
        &binary("csi-scsi-certs").display().to_string(),
        &[
            "join-token",
            "--node",
            node,
            "--dir",
            &pki.join("join-tokens").display().to_string(),
            "--ttl-minutes",
            "10",
        ],
    )?;
    csi_scsi_certs::write_private_file(&pki.join(format!("{node}.join-token")), token.trim())?;
    std::fs::create_dir_all(pki.join(format!("{node}-tls")))?;
    Ok(())
}
