//! DeleteVolume and the release workers, over the embedded store (a real
//! SQLite file), the real agent pool and mutual TLS, and a stub agent
//! whose wipes can be slow or fail: DeleteVolume answers before the wipe,
//! the wipe runs once per release and never twice at once, a restarted
//! proxy resumes it, a LUN being released is never handed out, a failed
//! wipe is counted and retried, and a replica that stops leading sends no
//! Attach, Detach or Wipe.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/agent_stub.rs"]
mod agent_stub;
#[path = "support/devices.rs"]
mod devices;
// Only `lifecycle_led` and `test_ca` are used here.
#[allow(dead_code)]
#[path = "support/lifecycle.rs"]
mod lifecycle_support;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use csi_scsi_certs::CertificateAuthority;
use csi_scsi_contract::Wwid;
use csi_scsi_proxy::agents::{Backoff, deadline};
use csi_scsi_proxy::device::{
    Access, AccessMode, Device, DiscoveryRound, FsType, NewLuns, Phase, Placement,
};
use csi_scsi_proxy::directory::FileDirectory;
use csi_scsi_proxy::inventory::{EmbeddedInventory, Inventory};
use csi_scsi_proxy::leader::LeaderHandle;
use csi_scsi_proxy::lifecycle::{CreateRequest, Lifecycle};
use csi_scsi_proxy::parameters::ClassParameters;
use csi_scsi_proxy::reconcile::qualify::{self, QualifyConfig};
use csi_scsi_proxy::reconcile::release::{self, ReleaseConfig};
use tokio::time::Instant;
use tonic::{Code, Status};

use agent_stub::{Reads, StubAgent, WipeBehaviour};
use devices::{lun, round, wwid};

/// One node (`node-a`) that sees LUNs 1..=n, served by a stub agent.
struct Fixture {
    dir: tempfile::TempDir,
    ca: CertificateAuthority,
    agent: StubAgent,
    /// The agents of the other nodes (`node-b`, ...), when there are.
    others: Vec<StubAgent>,
    agents: Arc<FileDirectory>,
}

/// A proxy: a controller and its release workers over the fixture's store.
struct Proxy {
    life: Arc<Lifecycle>,
    workers: tokio::task::JoinHandle<()>,
}

impl Fixture {
    async fn new(luns: u32, wipe: Duration, failures: u32) -> Self {
        Self::with_nodes(luns, vec![WipeBehaviour::new(wipe, failures)]).await
    }

    /// Nodes `node-a`, `node-b`, ... (one per behaviour), each seeing LUNs
    /// 1..=n, of a target that trusts its new LUNs.
    async fn with_nodes(luns: u32, behaviours: Vec<WipeBehaviour>) -> Self {
        Self::with_policy(luns, behaviours, NewLuns::Trust).await
    }

    /// As [`Self::with_nodes`], the LUNs found by a target whose new LUNs
    /// go through `policy`.
    async fn with_policy(luns: u32, behaviours: Vec<WipeBehaviour>, policy: NewLuns) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca = lifecycle_support::test_ca();
        let wwids: Vec<Wwid> = (1..=luns).map(wwid).collect();
        let seen: Vec<&str> = wwids.iter().map(Wwid::as_str).collect();
        let mut stubs = Vec::new();
        let mut listing = String::new();
        for (i, behaviour) in behaviours.into_iter().enumerate() {
            let node = format!("node-{}", char::from(b'a' + i as u8));
            let agent = agent_stub::start(&ca, &node, &seen, behaviour, dir.path()).await;
            listing.push_str(&format!("{node} {}\n", agent.address));
            stubs.push((node, agent));
        }
        let agents_file = dir.path().join("agents");
        std::fs::write(&agents_file, listing).unwrap();
        let agents = FileDirectory::load(&agents_file).unwrap();
        let nodes: Vec<String> = stubs.iter().map(|(n, _)| n.clone()).collect();
        let mut stubs = stubs.into_iter().map(|(_, a)| a);
        let f = Self {
            dir,
            ca,
            agent: stubs.next().expect("one node at least"),
            others: stubs.collect(),
            agents,
        };
        let inv = f.inventory();
        let reports: Vec<(&str, Vec<_>)> = nodes
            .iter()
            .map(|n| (n.as_str(), (1..=luns).map(|i| lun(i, 1 << 30)).collect()))
            .collect();
        inv.apply_discovery(DiscoveryRound {
            new_luns: policy,
            ..round("t1", &reports, &[])
        })
        .await
        .unwrap();
        f
    }

    fn db(&self) -> PathBuf {
        self.dir.path().join("inventory.db")
    }

    fn inventory(&self) -> Arc<Inventory> {
        Arc::new(Inventory::new(Arc::new(
            EmbeddedInventory::open(&self.db()).unwrap(),
        )))
    }

    /// A proxy (a fresh process, as far as its state goes) with `workers`
    /// release workers, scanning often and retrying soon.
    fn proxy(&self, workers: usize) -> Proxy {
        self.proxy_led(workers, LeaderHandle::always())
    }

    /// As [`Self::proxy`], leading as `leader` says.
    fn proxy_led(&self, workers: usize, leader: LeaderHandle) -> Proxy {
        let soon =
            Backoff::try_new(Duration::from_millis(100), Duration::from_millis(400), 0.0).unwrap();
        self.proxy_with(workers, leader, soon)
    }

    /// As [`Self::proxy`], a release that did not finish waiting `retry`.
    fn proxy_with(&self, workers: usize, leader: LeaderHandle, retry: Backoff) -> Proxy {
        let life = Arc::new(lifecycle_support::lifecycle_led(
            &self.ca,
            self.inventory(),
            self.agents.clone(),
            self.dir.path(),
            leader,
        ));
        let config = ReleaseConfig {
            workers,
            scan_interval: Duration::from_millis(200),
            retry,
        };
        let qualify = QualifyConfig {
            workers: 2,
            scan_interval: Duration::from_millis(200),
            reprobe: Duration::from_millis(300),
            retry: Backoff::try_new(Duration::from_millis(100), Duration::from_millis(400), 0.0)
                .unwrap(),
        };
        let (releasing, qualifying) = (life.clone(), life.clone());
        let workers = tokio::spawn(async move {
            tokio::join!(
                release::run(releasing, config),
                qualify::run(qualifying, qualify)
            );
        });
        Proxy { life, workers }
    }
}

impl Proxy {
    /// Kills it: its workers stop mid-call, as in a crash or a lost Lease.
    async fn kill(self) {
        self.workers.abort();
        let _ = self.workers.await;
    }

    async fn create(&self, name: &str) -> Result<Device, Status> {
        self.life
            .create(CreateRequest {
                name: name.into(),
                required_bytes: 1,
                limit_bytes: 0,
                access: vec![Access {
                    block: false,
                    fs_type: None,
                    mode: AccessMode::SingleNodeWriter,
                }],
                parameters: ClassParameters::parse(&HashMap::new()).unwrap(),
                placement: Placement::anywhere(),
            })
            .await
            .map_err(Status::from)
    }

    async fn device(&self, wwid: &Wwid) -> Device {
        self.life.inventory().device(wwid).await.unwrap().unwrap()
    }

    /// Waits (up to 15 s) until `wwid` is in `phase`.
    async fn wait_for(&self, wwid: &Wwid, phase: Phase) -> Device {
        let until = Instant::now() + Duration::from_secs(15);
        loop {
            let d = self.device(wwid).await;
            if d.phase == phase {
                return d;
            }
            assert!(
                Instant::now() < until,
                "{wwid} still {:?} ({}), not {phase:?}",
                d.phase,
                d.reason
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn volume_id(d: &Device) -> String {
    format!("{}:{}", d.wwid, d.binding.as_ref().unwrap().uid)
}

#[tokio::test]
async fn delete_volume_answers_within_the_callers_deadline_while_a_slow_wipe_runs_on() {
    let f = Fixture::new(1, Duration::from_secs(2), 0).await;
    let p = f.proxy(2);
    let vol = p.create("pv-1").await.unwrap();
    let id = volume_id(&vol);

    // The provisioner's `--timeout`, shorter than the wipe.
    let start = Instant::now();
    deadline::within(
        Some(start + Duration::from_secs(1)),
        p.life.delete(&id, "t"),
    )
    .await
    .unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(p.device(&vol.wwid).await.phase, Phase::Releasing);

    let released = p.wait_for(&vol.wwid, Phase::Available).await;
    assert!(start.elapsed() >= Duration::from_secs(2), "not wiped first");
    assert!(released.binding.is_none());
    assert_eq!(f.agent.log.started(&vol.wwid), 1);
    assert_eq!(f.agent.log.finished(&vol.wwid), 1);
    p.kill().await;
}

#[tokio::test]
async fn retried_deletes_wipe_the_lun_exactly_once() {
    let f = Fixture::new(1, Duration::from_millis(800), 0).await;
    let p = f.proxy(4);
    let vol = p.create("pv-1").await.unwrap();
    let id = volume_id(&vol);

    for _ in 0..5 {
        p.life.delete(&id, "t").await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    p.wait_for(&vol.wwid, Phase::Available).await;
    // Retries after the release, and several scans, change nothing.
    p.life.delete(&id, "t").await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(f.agent.log.started(&vol.wwid), 1);
    assert_eq!(
        f.agent.log.busy_answers(),
        0,
        "no second wipe was even asked"
    );
    assert_eq!(p.device(&vol.wwid).await.phase, Phase::Available);
    p.kill().await;
}

#[tokio::test]
async fn a_restarted_proxy_resumes_a_release_cut_off_mid_wipe_and_never_wipes_twice_at_once() {
    let f = Fixture::new(1, Duration::from_millis(1500), 0).await;
    let first = f.proxy(2);
    let vol = first.create("pv-1").await.unwrap();
    first.life.delete(&volume_id(&vol), "t").await.unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    while f.agent.log.running() == 0 {
        assert!(Instant::now() < until, "the wipe never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.kill().await;

    // The agent erases on; the new proxy finds the LUN Releasing.
    let second = f.proxy(2);
    assert_eq!(second.device(&vol.wwid).await.phase, Phase::Releasing);
    let released = second.wait_for(&vol.wwid, Phase::Available).await;
    assert!(released.binding.is_none());
    assert_eq!(
        f.agent.log.most_at_once(),
        1,
        "two wipes of one LUN at once"
    );
    // The agent does not remember the wipe the restart cut off, so it is
    // run again once it ends: one more wipe per restart, never more.
    assert!(f.agent.log.busy_answers() >= 1, "met the running wipe");
    assert_eq!(f.agent.log.started(&vol.wwid), 2);
    second.kill().await;
}

#[tokio::test]
async fn a_lun_being_released_is_never_bound_and_its_volume_name_waits_for_it() {
    let f = Fixture::new(1, Duration::from_millis(1500), 0).await;
    let p = f.proxy(2);
    let vol = p.create("pv-1").await.unwrap();
    p.life.delete(&volume_id(&vol), "t").await.unwrap();

    let other = p.create("pv-2").await.unwrap_err();
    assert_eq!(other.code(), Code::ResourceExhausted, "{other:?}");
    // The deleted volume's name is not its old volume any more.
    let same_name = p.create("pv-1").await.unwrap_err();
    assert_eq!(same_name.code(), Code::Aborted, "{same_name:?}");
    assert_eq!(p.device(&vol.wwid).await.phase, Phase::Releasing);

    p.wait_for(&vol.wwid, Phase::Available).await;
    let again = p.create("pv-1").await.unwrap();
    assert_eq!(again.wwid, vol.wwid);
    assert_ne!(volume_id(&again), volume_id(&vol), "a new volume");
    assert_eq!(f.agent.log.started(&vol.wwid), 1);
    p.kill().await;
}

#[tokio::test]
async fn a_failed_wipe_is_counted_and_retried_until_it_succeeds() {
    let f = Fixture::new(1, Duration::from_millis(50), 2).await;
    let p = f.proxy(2);
    let vol = p.create("pv-1").await.unwrap();
    p.life.delete(&volume_id(&vol), "t").await.unwrap();

    let released = p.wait_for(&vol.wwid, Phase::Available).await;
    assert_eq!(f.agent.log.started(&vol.wwid), 3);
    assert_eq!(released.wipe_failures, 2);
    assert!(released.binding.is_none() && released.reason.is_empty());
    p.kill().await;
}

/// A proxy whose failed wipes wait an hour before they are retried: only
/// an operator's request (or a restart) brings one sooner.
fn patient(f: &Fixture) -> Proxy {
    let hour = Backoff::try_new(Duration::from_secs(3600), Duration::from_secs(3600), 0.0).unwrap();
    f.proxy_with(2, LeaderHandle::always(), hour)
}

/// Sets what an operator sets on `wwid` (`spec.retired`, `spec.retryWipe`).
async fn operator(p: &Proxy, wwid: &Wwid, retired: bool, retry_wipe: &str) {
    p.life
        .inventory()
        .modify(wwid, |d| {
            d.retired = retired;
            d.retry_wipe = retry_wipe.into();
            true
        })
        .await
        .unwrap()
        .expect("the device");
}

/// Several release scans' time.
const SCANS: Duration = Duration::from_secs(1);

#[tokio::test]
async fn an_operator_s_retry_request_ends_a_failed_wipe_s_backoff_and_the_wipe_runs_again() {
    let f = Fixture::new(1, Duration::from_millis(20), 1).await;
    let p = patient(&f);
    let vol = p.create("pv-1").await.unwrap();
    p.life.delete(&volume_id(&vol), "t").await.unwrap();
    let failed = failed_never_available(&p, &vol.wwid).await;
    assert_eq!(failed.wipe_failures, 1);
    // The backoff holds across scans: no second attempt by itself.
    tokio::time::sleep(SCANS).await;
    assert_eq!(f.agent.log.started(&vol.wwid), 1);
    assert_eq!(p.device(&vol.wwid).await.phase, Phase::Failed);

    operator(&p, &vol.wwid, false, "2026-05-01T10:00:00Z").await;
    let released = p.wait_for(&vol.wwid, Phase::Available).await;
    assert_eq!(
        f.agent.log.started(&vol.wwid),
        2,
        "one more wipe, a whole one"
    );
    assert_eq!(released.wipe_failures, 1);
    assert!(released.binding.is_none() && released.reason.is_empty());
    // The request answered, nothing more runs.
    tokio::time::sleep(SCANS).await;
    assert_eq!(f.agent.log.started(&vol.wwid), 2);
    p.kill().await;
}

#[tokio::test]
async fn a_retired_lun_is_neither_wiped_nor_offered_even_when_a_retry_is_asked_until_it_is_back_in_service()
 {
    let f = Fixture::new(2, Duration::from_millis(20), 1).await;
    let p = patient(&f);
    let vol = p.create("pv-1").await.unwrap();
    p.life.delete(&volume_id(&vol), "t").await.unwrap();
    failed_never_available(&p, &vol.wwid).await;

    operator(&p, &vol.wwid, true, "asked").await;
    tokio::time::sleep(SCANS).await;
    assert_eq!(
        f.agent.log.started(&vol.wwid),
        1,
        "a retired LUN is not wiped"
    );
    let held = p.device(&vol.wwid).await;
    assert_eq!(held.phase, Phase::Failed, "nor offered: {held:?}");
    assert!(held.binding.is_some(), "its deleted volume's record stays");
    // A new volume gets the other LUN, then none.
    let other = p.create("pv-2").await.unwrap();
    assert_ne!(other.wwid, vol.wwid);
    let none = p.create("pv-3").await.unwrap_err();
    assert_eq!(none.code(), Code::ResourceExhausted, "{none:?}");
    // A DeleteVolume retried meanwhile does not wipe it either.
    p.life.delete(&volume_id(&vol), "t").await.unwrap();
    tokio::time::sleep(SCANS).await;
    assert_eq!(f.agent.log.started(&vol.wwid), 1);

    // Back in service: the pending request is new to the workers, so the
    // wipe runs at once, and the LUN is offered again.
    operator(&p, &vol.wwid, false, "asked").await;
    p.wait_for(&vol.wwid, Phase::Available).await;
    assert_eq!(f.agent.log.started(&vol.wwid), 2);
    let again = p.create("pv-3").await.unwrap();
    assert_eq!(again.wwid, vol.wwid);
    p.kill().await;
}

#[tokio::test]
async fn no_more_wipes_run_at_once_than_there_are_workers() {
    let f = Fixture::new(5, Duration::from_millis(300), 0).await;
    let p = f.proxy(2);
    let mut vols = Vec::new();
    for i in 0..5 {
        vols.push(p.create(&format!("pv-{i}")).await.unwrap());
    }
    // All five deleted at once (each DeleteVolume waits a moment for a
    // quick release): five releases wanted together.
    let ids: Vec<String> = vols.iter().map(volume_id).collect();
    for r in futures::future::join_all(ids.iter().map(|id| p.life.delete(id, "t"))).await {
        r.unwrap();
    }
    for v in &vols {
        p.wait_for(&v.wwid, Phase::Available).await;
        assert_eq!(f.agent.log.started(&v.wwid), 1);
    }
    assert_eq!(f.agent.log.most_at_once(), 2);
    p.kill().await;
}

/// Waits (up to 15 s) until `wwid`'s wipe has failed at least once, and
/// checks it was never offered again meanwhile.
async fn failed_never_available(p: &Proxy, wwid: &Wwid) -> Device {
    let until = Instant::now() + Duration::from_secs(15);
    loop {
        let d = p.device(wwid).await;
        assert_ne!(
            d.phase,
            Phase::Available,
            "an unproven wipe was offered again"
        );
        if d.phase == Phase::Failed {
            return d;
        }
        assert!(Instant::now() < until, "{wwid} still {:?}", d.phase);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_wipe_that_covers_less_than_the_recorded_size_is_failed_never_available() {
    let mut short = WipeBehaviour::new(Duration::from_millis(10), 0);
    short.short_by = 64 << 20;
    let f = Fixture::with_nodes(1, vec![short]).await;
    let p = f.proxy(1);
    let vol = p.create("pv-short").await.unwrap();
    p.life.delete(&volume_id(&vol), "t").await.unwrap();
    let failed = failed_never_available(&p, &vol.wwid).await;
    assert!(
        failed.reason.contains("erased") && failed.reason.contains(&(1u64 << 30).to_string()),
        "{}",
        failed.reason
    );
    assert!(failed.wipe_failures >= 1);
    assert!(
        failed.binding.is_some(),
        "the binding stays until a wipe is proven"
    );
    p.kill().await;
}

#[tokio::test]
async fn a_wipe_another_node_reads_data_after_is_failed_never_available() {
    let mut liar = WipeBehaviour::new(Duration::ZERO, 0);
    liar.reads = Reads::Data;
    let f = Fixture::with_nodes(
        1,
        vec![WipeBehaviour::new(Duration::from_millis(10), 0), liar],
    )
    .await;
    let p = f.proxy(1);
    let vol = p.create("pv-data").await.unwrap();
    p.life.delete(&volume_id(&vol), "t").await.unwrap();
    let failed = failed_never_available(&p, &vol.wwid).await;
    assert!(
        failed.reason.contains("node-b reads data"),
        "{}",
        failed.reason
    );
    assert!(f.others[0].log.verified(&vol.wwid) >= 1);
    assert_eq!(f.others[0].log.started(&vol.wwid), 0, "node-b only reads");
    p.kill().await;
}

#[tokio::test]
async fn a_wipe_another_node_sees_smaller_is_failed_never_available() {
    let mut small = WipeBehaviour::new(Duration::ZERO, 0);
    small.reads = Reads::Smaller;
    let f = Fixture::with_nodes(
        1,
        vec![WipeBehaviour::new(Duration::from_millis(10), 0), small],
    )
    .await;
    let p = f.proxy(1);
    let vol = p.create("pv-small").await.unwrap();
    p.life.delete(&volume_id(&vol), "t").await.unwrap();
    let failed = failed_never_available(&p, &vol.wwid).await;
    assert!(failed.reason.contains("node-b reads"), "{}", failed.reason);
    p.kill().await;
}

#[tokio::test]
async fn a_wipe_another_node_reads_back_as_zeroes_is_offered_again() {
    let f = Fixture::with_nodes(
        1,
        vec![
            WipeBehaviour::new(Duration::from_millis(10), 0),
            WipeBehaviour::new(Duration::ZERO, 0),
        ],
    )
    .await;
    let p = f.proxy(1);
    let vol = p.create("pv-zeroes").await.unwrap();
    p.life.delete(&volume_id(&vol), "t").await.unwrap();
    p.wait_for(&vol.wwid, Phase::Available).await;
    assert_eq!(f.agent.log.started(&vol.wwid), 1);
    assert_eq!(f.others[0].log.verified(&vol.wwid), 1);
    p.kill().await;
}

#[tokio::test]
async fn a_wipe_no_other_node_can_verify_stands_on_its_own_read_back() {
    let mut mute = WipeBehaviour::new(Duration::ZERO, 0);
    mute.reads = Reads::Nothing;
    let f = Fixture::with_nodes(
        1,
        vec![WipeBehaviour::new(Duration::from_millis(10), 0), mute],
    )
    .await;
    let p = f.proxy(1);
    let vol = p.create("pv-mute").await.unwrap();
    p.life.delete(&volume_id(&vol), "t").await.unwrap();
    let done = p.wait_for(&vol.wwid, Phase::Available).await;
    assert_eq!(done.wipe_failures, 0);
    p.kill().await;
}

#[tokio::test]
async fn a_replica_that_stops_leading_sends_no_attach_detach_or_wipe_and_its_calls_carry_its_epoch()
{
    let f = Fixture::new(1, Duration::from_millis(50), 0).await;
    let (leads, rx) = tokio::sync::watch::channel(true);
    let p = f.proxy_led(1, LeaderHandle::from_receiver(rx));
    let vol = p.create("pv-1").await.unwrap();
    let id = volume_id(&vol);
    let access = Access {
        block: false,
        fs_type: Some(FsType::Ext4),
        mode: AccessMode::SingleNodeWriter,
    };
    p.life
        .publish(&id, &devices::node("node-a"), &access, "t")
        .await
        .unwrap();
    assert_eq!(f.agent.log.attached(&vol.wwid), 1);

    // Leadership lost (a lapsed term reads the same): nothing that
    // changes a node is sent.
    leads.send_replace(false);
    let not_leading = |e: Status| {
        assert_eq!(e.code(), Code::Unavailable, "{e:?}");
        assert!(e.message().contains("does not lead"), "{e:?}");
    };
    not_leading(
        p.life
            .publish(&id, &devices::node("node-a"), &access, "t")
            .await
            .map_err(Status::from)
            .unwrap_err(),
    );
    not_leading(
        p.life
            .unpublish(&id, Some(&devices::node("node-a")), "t")
            .await
            .map_err(Status::from)
            .unwrap_err(),
    );
    assert_eq!(f.agent.log.attached(&vol.wwid), 1, "an Attach was sent");
    assert_eq!(f.agent.log.detached(&vol.wwid), 0, "a Detach was sent");

    leads.send_replace(true);
    p.life
        .unpublish(&id, Some(&devices::node("node-a")), "t")
        .await
        .unwrap();
    assert_eq!(f.agent.log.detached(&vol.wwid), 1);
    leads.send_replace(false);
    p.life.delete(&id, "t").await.unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(f.agent.log.started(&vol.wwid), 0, "a Wipe was sent");
    assert_eq!(p.device(&vol.wwid).await.phase, Phase::Releasing);

    // Leading again, the release goes on.
    leads.send_replace(true);
    p.wait_for(&vol.wwid, Phase::Available).await;
    assert_eq!(f.agent.log.started(&vol.wwid), 1);
    // Every call that reached the agent carried the epoch (0: a handle
    // with no election behind it).
    let epochs = f.agent.log.epochs();
    assert_eq!(
        epochs,
        [
            ("Attach", Some("0".to_owned())),
            ("Detach", Some("0".to_owned())),
            ("Wipe", Some("0".to_owned())),
        ]
    );
    p.kill().await;
}

/// A node whose Verify reads `reads`, its wipes quick and successful.
fn reading(reads: Reads) -> WipeBehaviour {
    WipeBehaviour {
        reads,
        ..WipeBehaviour::new(Duration::ZERO, 0)
    }
}

/// `wwid` stays out of Available, and CreateVolume finds nothing, for a
/// while the workers run (they probe every 200 ms here).
async fn never_offered(p: &Proxy, wwid: &Wwid, phase: Phase) -> Device {
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        let d = p.device(wwid).await;
        assert_eq!(d.phase, phase, "{wwid}: {}", d.reason);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let refused = p
        .create("pv-claimant")
        .await
        .expect_err("no LUN is offered");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    p.device(wwid).await
}

#[tokio::test]
async fn a_new_lun_is_offered_once_a_node_reads_it_blank_and_one_holding_data_is_never_bound() {
    // Blank: Unverified at discovery, Available after the probe.
    let f = Fixture::with_policy(1, vec![reading(Reads::Zeroes)], NewLuns::Probe).await;
    assert_eq!(
        f.inventory().device(&wwid(1)).await.unwrap().unwrap().phase,
        Phase::Unverified
    );
    let p = f.proxy(1);
    p.wait_for(&wwid(1), Phase::Available).await;
    assert!(
        f.agent.log.verified(&wwid(1)) >= 2,
        "both ends, then the spread ranges"
    );
    assert!(p.create("pv-1").await.is_ok());
    p.kill().await;

    // Data: held, never bound, and the reason says how to release it.
    let f = Fixture::with_policy(1, vec![reading(Reads::Data)], NewLuns::Probe).await;
    let p = f.proxy(1);
    p.wait_for(&wwid(1), Phase::HoldsData).await;
    let held = never_offered(&p, &wwid(1), Phase::HoldsData).await;
    assert!(
        held.reason.contains("data at byte 0 through node node-a")
            && held.reason.contains("newLuns: wipe"),
        "{}",
        held.reason
    );
    assert_eq!(f.agent.log.started(&wwid(1)), 0, "a probe never writes");
    p.kill().await;
}

#[tokio::test]
async fn a_new_lun_no_node_can_read_whole_stays_unverified() {
    // node-a reads half the recorded size; node-b cannot verify at all.
    let f = Fixture::with_policy(
        1,
        vec![reading(Reads::Smaller), reading(Reads::Nothing)],
        NewLuns::Probe,
    )
    .await;
    let p = f.proxy(1);
    never_offered(&p, &wwid(1), Phase::Unverified).await;
    assert!(f.agent.log.verified(&wwid(1)) >= 1);
    p.kill().await;
}

#[tokio::test]
async fn a_target_set_to_wipe_zeroes_its_new_luns_and_those_held_for_data_before_offering_them() {
    // A new LUN of a target set to wipe: wiped, then offered.
    let f = Fixture::with_policy(1, vec![reading(Reads::Zeroes)], NewLuns::Wipe).await;
    let p = f.proxy(1);
    p.wait_for(&wwid(1), Phase::Available).await;
    assert_eq!(f.agent.log.finished(&wwid(1)), 1);
    p.kill().await;

    // Held for data under probe; the operator sets the target to wipe.
    let f = Fixture::with_policy(1, vec![reading(Reads::Data)], NewLuns::Probe).await;
    let p = f.proxy(1);
    p.wait_for(&wwid(1), Phase::HoldsData).await;
    assert_eq!(f.agent.log.started(&wwid(1)), 0);
    p.life
        .inventory()
        .apply_discovery(DiscoveryRound {
            new_luns: NewLuns::Wipe,
            ..round("t1", &[("node-a", vec![lun(1, 1 << 30)])], &[])
        })
        .await
        .unwrap();
    let wiped = p.wait_for(&wwid(1), Phase::Available).await;
    assert_eq!(f.agent.log.finished(&wwid(1)), 1);
    assert_eq!(wiped.binding, None);
    assert!(p.create("pv-1").await.is_ok());
    p.kill().await;
}
