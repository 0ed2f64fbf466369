//! The proxy's `/status` document and the gauges read from its state: the
//! inventory by phase (and the devices themselves, up to a limit), every
//! agent of the directory with its address, reachability and last round
//! trip, the pending resize requests, leadership, and the last failed
//! calls. Agents are probed in the background (the agent API's `Status`
//! call, bounded concurrency, a short timeout), so `/status` answers from
//! memory at any scale. Targets appear by name with their Secret reference,
//! never with credentials; a reader off the machine gets the document
//! without portals, IQNs, WWPNs, Secret names or error messages
//! (`Status::redacted`, applied by the status port).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use csi_scsi_contract::NodeName;
use csi_scsi_daemon::{Metrics, StatusSource, rfc3339, set_gauge, set_gauges};
use csi_scsi_proto::agent::StatusRequest;
use csi_scsi_status::{SCHEMA, Status, proxy as doc};
use futures::StreamExt;
use futures::future::BoxFuture;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::Serialize;

use crate::device::{Device, Phase, ResizeRequest, Target, Transport};
use crate::leader::LeaderHandle;
use crate::lifecycle::Lifecycle;

/// Most devices listed in `/status` (the summary by phase counts all).
pub const STATUS_DEVICES: usize = 1000;

/// The proxy's status source.
pub struct ProxyStatus {
    life: Arc<Lifecycle>,
    metrics: Metrics,
    gauges: Gauges,
    probes: Arc<Mutex<BTreeMap<NodeName, Probe>>>,
    leader: Option<(LeaderHandle, String)>,
    started: SystemTime,
}

/// The last probe of one agent.
#[derive(Clone, Debug, Serialize)]
struct Probe {
    address: String,
    reachable: bool,
    round_trip_ms: f64,
    checked: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// The gauges read from the proxy's state (at each scrape and `/status`).
#[derive(Debug)]
struct Gauges {
    devices: Family<PhaseLabels, Gauge>,
    agents: Family<StateLabels, Gauge>,
    resizes_pending: Gauge,
    releases_running: Gauge,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

// === impl ProxyStatus ===

impl ProxyStatus {
    /// The status of the controller over `life`, with errors from `metrics`
    /// (where it registers its gauges: one per process).
    pub fn new(life: Arc<Lifecycle>, metrics: Metrics) -> Self {
        Self {
            life,
            gauges: Gauges::new(&metrics),
            metrics,
            probes: Arc::new(Mutex::new(BTreeMap::new())),
            leader: None,
            started: SystemTime::now(),
        }
    }

    /// Reports leadership from `handle` (`mode` names the election, e.g.
    /// `kubernetes-lease`); without it the proxy is the only replica.
    pub fn with_leader(mut self, handle: LeaderHandle, mode: &str) -> Self {
        self.leader = Some((handle, mode.to_owned()));
        self
    }

    /// Probes every agent now and then every `every`, each within
    /// `timeout`, at most `concurrency` at once. Stops with the runtime.
    pub fn spawn_prober(
        &self,
        every: Duration,
        timeout: Duration,
        concurrency: usize,
    ) -> tokio::task::JoinHandle<()> {
        let life = self.life.clone();
        let probes = self.probes.clone();
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(every);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                probe_all(&life, &probes, timeout, concurrency).await;
            }
        })
    }

    fn agents(&self) -> Vec<doc::Agent> {
        let agents = self.life.agents().directory().snapshot();
        let probes = self.probes.lock().unwrap_or_else(|p| p.into_inner());
        agents
            .iter()
            .map(|(node, entry)| {
                // A probe of an older address says nothing about this one.
                let p = probes.get(node).filter(|p| p.address == entry.address);
                doc::Agent {
                    node: node.to_string(),
                    address: entry.address.clone(),
                    reachable: p.map(|p| p.reachable),
                    round_trip_ms: p.map(|p| p.round_trip_ms),
                    last_probe: p.map(|p| p.checked.clone()),
                    version: p.and_then(|p| p.version.clone()),
                    error: p.and_then(|p| p.error.clone()),
                }
            })
            .collect()
    }

    async fn phases(&self, problems: &mut Vec<String>) -> BTreeMap<&'static str, u64> {
        let mut by_phase: BTreeMap<&'static str, u64> = [
            Phase::Available,
            Phase::Bound,
            Phase::Releasing,
            Phase::Failed,
            Phase::Lost,
        ]
        .into_iter()
        .map(|p| (p.as_str(), 0))
        .collect();
        match self.life.inventory().phase_counts().await {
            Ok(counts) => {
                for (phase, n) in counts {
                    by_phase.insert(phase.as_str(), n);
                }
            }
            Err(e) => problems.push(format!("inventory: {e}")),
        }
        by_phase
    }

    fn update_agent_gauges(&self, agents: &[doc::Agent]) {
        let mut by_state: BTreeMap<&str, u64> =
            [("reachable", 0), ("unreachable", 0), ("unknown", 0)]
                .into_iter()
                .collect();
        for a in agents {
            let state = match a.reachable {
                Some(true) => "reachable",
                Some(false) => "unreachable",
                None => "unknown",
            };
            *by_state.entry(state).or_default() += 1;
        }
        self.gauges.set_agents(by_state);
    }
}

impl StatusSource for ProxyStatus {
    fn status(&self) -> BoxFuture<'_, Status> {
        Box::pin(async move {
            let mut problems = Vec::new();
            let by_phase = self.phases(&mut problems).await;
            let total: u64 = by_phase.values().sum();
            let devices = match self.life.inventory().devices(None, STATUS_DEVICES).await {
                Ok(d) => d,
                Err(e) => {
                    problems.push(format!("inventory devices: {e}"));
                    Vec::new()
                }
            };
            let resizes = match self.life.inventory().resizes().await {
                Ok(r) => r.into_iter().filter(|r| !r.done).collect(),
                Err(e) => {
                    problems.push(format!("resize requests: {e}"));
                    Vec::new()
                }
            };
            let targets = match self.life.inventory().targets().await {
                Ok(t) => t,
                Err(e) => {
                    problems.push(format!("targets: {e}"));
                    Vec::new()
                }
            };
            let agents = self.agents();
            self.gauges
                .set_devices(by_phase.iter().map(|(k, v)| (*k, *v)));
            self.gauges.set_resizes_pending(resizes.len() as u64);
            set_gauge(
                &self.gauges.releases_running,
                self.life.releases().running() as u64,
            );
            self.update_agent_gauges(&agents);
            let leader = match &self.leader {
                Some((handle, mode)) => doc::Leader {
                    mode: mode.clone(),
                    this_replica_leads: handle.is_leader(),
                },
                None => doc::Leader {
                    mode: "single-replica".into(),
                    this_replica_leads: true,
                },
            };
            Status::Proxy(doc::Document {
                schema: SCHEMA,
                version: env!("CARGO_PKG_VERSION").to_owned(),
                started: rfc3339(self.started),
                uptime_seconds: self.started.elapsed().map(|d| d.as_secs()).unwrap_or(0),
                leader,
                inventory: doc::Inventory {
                    devices_by_phase: by_phase
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), *v))
                        .collect(),
                    devices_total: total,
                },
                devices: devices.iter().map(device_view).collect(),
                devices_truncated: (devices.len() as u64) < total,
                // Targets by name; CHAP appears as the Secret's name only.
                targets: targets.iter().map(target_view).collect(),
                agents,
                pending_resizes: resizes.iter().map(resize_view).collect(),
                recent_errors: self.metrics.recent_errors(),
                problems,
                redacted: false,
            })
        })
    }

    fn refresh_metrics(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let mut problems = Vec::new();
            let by_phase = self.phases(&mut problems).await;
            if problems.is_empty() {
                self.gauges
                    .set_devices(by_phase.iter().map(|(k, v)| (*k, *v)));
            }
            if let Ok(r) = self.life.inventory().resizes().await {
                self.gauges
                    .set_resizes_pending(r.iter().filter(|r| !r.done).count() as u64);
            }
            set_gauge(
                &self.gauges.releases_running,
                self.life.releases().running() as u64,
            );
            let agents = self.agents();
            self.update_agent_gauges(&agents);
        })
    }
}

// === impl Gauges ===

impl Gauges {
    /// Registers the gauges in `metrics`.
    fn new(metrics: &Metrics) -> Self {
        let gauges = Self {
            devices: Family::default(),
            agents: Family::default(),
            resizes_pending: Gauge::default(),
            releases_running: Gauge::default(),
        };
        metrics.register(
            "devices",
            "Devices in the inventory, by phase",
            gauges.devices.clone(),
        );
        metrics.register(
            "agents",
            "Agents in the directory, by the state of the last probe (reachable, unreachable, unknown)",
            gauges.agents.clone(),
        );
        metrics.register(
            "resize_requests_pending",
            "Resize requests waiting for a storage administrator to grow a LUN",
            gauges.resizes_pending.clone(),
        );
        // Pending releases are the devices in phase Releasing or Failed.
        metrics.register(
            "releases_running",
            "Wipes of deleted volumes' LUNs running now (on the leader)",
            gauges.releases_running.clone(),
        );
        gauges
    }

    /// Devices by phase (every phase should be listed, zero included).
    fn set_devices<'a>(&self, by_phase: impl IntoIterator<Item = (&'a str, u64)>) {
        set_gauges(&self.devices, by_phase, |phase| PhaseLabels { phase });
    }

    /// Agents by probe state.
    fn set_agents<'a>(&self, by_state: impl IntoIterator<Item = (&'a str, u64)>) {
        set_gauges(&self.agents, by_state, |state| StateLabels { state });
    }

    /// Pending resize requests.
    fn set_resizes_pending(&self, n: u64) {
        set_gauge(&self.resizes_pending, n);
    }
}

fn device_view(d: &Device) -> doc::Device {
    doc::Device {
        wwid: d.wwid.to_string(),
        phase: phase_view(d.phase),
        size_bytes: d.size_bytes,
        target: d.target.clone(),
        lun: d.lun,
        vendor: d.vendor.clone(),
        model: d.model.clone(),
        labels: d.labels.clone(),
        volume_id: d.volume_id(),
        volume_name: d.binding.as_ref().map(|b| b.volume_name.clone()),
        nodes: d.node_names().iter().map(NodeName::to_string).collect(),
        published: d
            .published_nodes()
            .iter()
            .map(NodeName::to_string)
            .collect(),
        reason: d.reason.clone(),
    }
}

fn phase_view(p: Phase) -> doc::Phase {
    match p {
        Phase::Available => doc::Phase::Available,
        Phase::Unverified => doc::Phase::Unverified,
        Phase::HoldsData => doc::Phase::HoldsData,
        Phase::Bound => doc::Phase::Bound,
        Phase::Releasing => doc::Phase::Releasing,
        Phase::Failed => doc::Phase::Failed,
        Phase::Lost => doc::Phase::Lost,
    }
}

/// A target as `/status` shows it: the CHAP Secret by reference only.
fn target_view(t: &Target) -> doc::Target {
    doc::Target {
        name: t.name.clone(),
        iscsi: match &t.transport {
            Transport::Iscsi(i) => Some(doc::IscsiTarget {
                portals: i.portals.clone(),
                iqn: i.iqn.clone(),
                chap_secret_ref: i.chap_secret_ref.as_ref().map(|r| doc::SecretRef {
                    name: r.name.clone(),
                    namespace: r.namespace.clone(),
                }),
            }),
            Transport::FibreChannel(_) => None,
        },
        fibre_channel: match &t.transport {
            Transport::FibreChannel(f) => Some(doc::FcTarget {
                wwpns: f.wwpns.clone(),
            }),
            Transport::Iscsi(_) => None,
        },
        node_selector: t.node_selector.clone(),
        nodes: t.nodes.clone(),
        device_labels: t.device_labels.clone(),
    }
}

fn resize_view(r: &ResizeRequest) -> doc::Resize {
    doc::Resize {
        name: r.name.clone(),
        volume_id: r.volume_id.clone(),
        wwid: r.wwid.clone(),
        requested_bytes: r.requested_bytes,
        current_bytes: r.current_bytes,
        created: r.created,
        done: r.done,
    }
}

/// One round of probes over the directory.
async fn probe_all(
    life: &Arc<Lifecycle>,
    probes: &Mutex<BTreeMap<NodeName, Probe>>,
    timeout: Duration,
    concurrency: usize,
) {
    let agents = life.agents().directory().snapshot();
    let rid = format!("probe-{}", uuid::Uuid::new_v4());
    let todo: Vec<(NodeName, String)> = agents
        .iter()
        .map(|(node, entry)| (node.clone(), entry.address.clone()))
        .collect();
    let results: Vec<(NodeName, Probe)> = futures::stream::iter(todo)
        .map(|(node, address)| {
            let rid = rid.clone();
            let life = life.clone();
            async move {
                let start = Instant::now();
                let call = life.agents().call(&node, StatusRequest {}, &rid);
                let outcome = tokio::time::timeout(timeout, call).await;
                let round_trip_ms = start.elapsed().as_secs_f64() * 1000.0;
                let (reachable, version, error) = match outcome {
                    Ok(Ok(s)) => (true, Some(s.version), None),
                    Ok(Err(e)) => (false, None, Some(e.to_string())),
                    Err(_) => (false, None, Some(format!("no answer within {timeout:?}"))),
                };
                (
                    node,
                    Probe {
                        address,
                        reachable,
                        round_trip_ms: (round_trip_ms * 1000.0).round() / 1000.0,
                        checked: rfc3339(SystemTime::now()),
                        version,
                        error,
                    },
                )
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let mut probes = probes.lock().unwrap_or_else(|p| p.into_inner());
    probes.retain(|node, _| agents.contains_key(node));
    for (node, probe) in results {
        if !probe.reachable {
            tracing::debug!(%node, error = ?probe.error, "agent probe failed");
        }
        probes.insert(node, probe);
    }
}
