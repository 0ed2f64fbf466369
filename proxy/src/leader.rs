//! Leader election through a `coordination.k8s.io/v1` Lease, so that one
//! proxy replica runs discovery and writes the inventory. The algorithm is
//! client-go's: a candidate takes the Lease when its holder has not renewed
//! it for a whole lease duration *as observed on the candidate's own clock*
//! (no clock comparison across machines); the holder renews every retry
//! period and steps down when it could not renew within the renew deadline,
//! which is shorter than the lease duration, so it stops before anyone else
//! may start. Every write is a resourceVersion-guarded replace.
//!
//! `LeaderHandle` is what the rest of the proxy sees: `is_leader()`, the
//! leader epoch its agent calls carry (`epoch()`: the Lease's
//! `leaseTransitions` when this replica acquired it), a
//! `watch` to follow changes, `LeaderGate` to answer the Controller calls
//! that change state with UNAVAILABLE on a non-leader, and
//! `run_while_leader` for background work.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::ObjectMeta;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::codegen::http;

use csi_scsi_contract::LeaderEpoch;

use crate::kube_wiring::post_params;

/// Names and timings of the election.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// Namespace of the Lease (the driver's).
    pub namespace: String,
    /// Lease name.
    pub name: String,
    /// This replica's identity (its pod name).
    pub identity: String,
    /// How long a holder's claim stands without renewal.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it steps down.
    pub renew_deadline: Duration,
    /// How often candidates try and the leader renews.
    pub retry_period: Duration,
}

/// Why a lease configuration is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseConfigError {
    /// A name is empty.
    #[error("lease {0} must not be empty")]
    Empty(&'static str),
    /// The timings would let two leaders overlap or never renew.
    #[error(
        "lease timings must satisfy retry period < renew deadline < lease duration (got {retry:?} < {renew:?} < {lease:?})"
    )]
    Timings {
        /// Retry period.
        retry: Duration,
        /// Renew deadline.
        renew: Duration,
        /// Lease duration.
        lease: Duration,
    },
}

/// Whether this replica leads, now and as it changes.
#[derive(Clone, Debug)]
pub struct LeaderHandle {
    rx: watch::Receiver<bool>,
    /// For an elected leader: its term (see [`Term`]); `None` while it
    /// does not lead. A process frozen past the term's end (a paused
    /// container, a stalled VM) has lost the Lease to another replica by
    /// the time it wakes, and must refuse before its elector runs again to
    /// notice.
    term: Option<Arc<Mutex<Option<Term>>>>,
    /// Keeps the channel open for a handle with no election behind it.
    _fixed: Option<std::sync::Arc<watch::Sender<bool>>>,
}

/// The running election: its handle and its task.
#[derive(Debug)]
pub struct LeaderElection {
    handle: LeaderHandle,
    task: JoinHandle<()>,
    api: Api<Lease>,
    config: LeaseConfig,
}

/// A tower layer over the Controller service that answers the calls which
/// change state ([`ControllerMethod::needs_leader`]) with UNAVAILABLE
/// unless this replica leads. Reads are served by every replica: each keeps
/// its own watch caches. The sidecars' own elections follow the proxy's
/// through [`LeaderCheck`] and [`exit_when_leadership_lost`]; the gate is
/// the fence for any caller that did not wait.
#[derive(Clone, Debug)]
pub struct LeaderGate(pub LeaderHandle);

/// The service [`LeaderGate`] makes.
#[derive(Clone, Debug)]
pub struct LeaderGated<S> {
    inner: S,
    leader: LeaderHandle,
}

/// A Controller RPC, named by its gRPC path: what the leader gate decides on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControllerMethod {
    /// CreateVolume.
    CreateVolume,
    /// DeleteVolume.
    DeleteVolume,
    /// ControllerPublishVolume.
    ControllerPublishVolume,
    /// ControllerUnpublishVolume.
    ControllerUnpublishVolume,
    /// ValidateVolumeCapabilities.
    ValidateVolumeCapabilities,
    /// ListVolumes.
    ListVolumes,
    /// GetCapacity.
    GetCapacity,
    /// ControllerGetCapabilities.
    ControllerGetCapabilities,
    /// CreateSnapshot.
    CreateSnapshot,
    /// DeleteSnapshot.
    DeleteSnapshot,
    /// ListSnapshots.
    ListSnapshots,
    /// GetSnapshot.
    GetSnapshot,
    /// ControllerExpandVolume.
    ControllerExpandVolume,
    /// ControllerGetVolume.
    ControllerGetVolume,
    /// ControllerModifyVolume.
    ControllerModifyVolume,
}

/// What an elected leader's last renewal lets it do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Term {
    /// Until when it may act (the renewal attempt's start plus the renew
    /// deadline).
    until: Instant,
    /// The Lease's `leaseTransitions` since this replica acquired it: the
    /// leader epoch its agent calls carry.
    epoch: LeaderEpoch,
}

/// The candidate's state between attempts.
struct Elector {
    api: Api<Lease>,
    config: LeaseConfig,
    tx: watch::Sender<bool>,
    /// The handle's fence: renewed with every renewal, cleared on loss.
    term: Arc<Mutex<Option<Term>>>,
    /// The last Lease record seen and when this replica first saw it.
    observed: Option<(Record, Instant)>,
}

/// The parts of a Lease that show its holder is alive.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Record {
    holder: Option<String>,
    renew: Option<Timestamp>,
    transitions: i32,
    /// When the Lease object was created (Unix seconds, 0: not known).
    created: i64,
}

/// How many bits of an epoch count the Lease's transitions; the bits
/// above hold its creation time.
const TRANSITION_BITS: u32 = 20;

impl Record {
    /// The leader epoch of the term this record's holder acts in: the
    /// Lease's creation time, then its `leaseTransitions`. The creation
    /// time keeps epochs rising when the Lease is deleted and created
    /// anew (its count starts again at 0, while every node remembers the
    /// epoch of the old Lease's last term).
    fn epoch(&self) -> LeaderEpoch {
        let created = u64::try_from(self.created).unwrap_or(0);
        // A negative count is no Lease this elector wrote.
        let transitions = u64::try_from(self.transitions)
            .unwrap_or(0)
            .min((1 << TRANSITION_BITS) - 1);
        LeaderEpoch((created << TRANSITION_BITS) | transitions)
    }
}

// === impl LeaseConfig ===

impl LeaseConfig {
    /// client-go's defaults: 15 s lease, 10 s renew deadline, 2 s retry.
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            identity: identity.to_owned(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// Checks names and timings.
    pub fn validate(&self) -> Result<(), LeaseConfigError> {
        for (what, v) in [
            ("namespace", &self.namespace),
            ("name", &self.name),
            ("identity", &self.identity),
        ] {
            if v.is_empty() {
                return Err(LeaseConfigError::Empty(what));
            }
        }
        if !(self.retry_period < self.renew_deadline && self.renew_deadline < self.lease_duration) {
            return Err(LeaseConfigError::Timings {
                retry: self.retry_period,
                renew: self.renew_deadline,
                lease: self.lease_duration,
            });
        }
        Ok(())
    }
}

// === impl LeaderHandle ===

impl LeaderHandle {
    /// A handle that always leads (embedded mode: one proxy, no election).
    pub fn always() -> Self {
        let (tx, rx) = watch::channel(true);
        Self {
            rx,
            term: None,
            _fixed: Some(Arc::new(tx)),
        }
    }

    /// A handle that follows `rx` (another election, tests).
    pub fn from_receiver(rx: watch::Receiver<bool>) -> Self {
        Self {
            rx,
            term: None,
            _fixed: None,
        }
    }

    /// Whether this replica leads now. A stopped election never leads.
    pub fn is_leader(&self) -> bool {
        self.epoch().is_some()
    }

    /// The leader epoch this replica acts in, `None` unless it leads now
    /// (renew deadline included). A handle with no election behind it
    /// ([`Self::always`], [`Self::from_receiver`]) leads in epoch 0: one
    /// proxy, no predecessor to fence off.
    pub fn epoch(&self) -> Option<LeaderEpoch> {
        if self.rx.has_changed().is_err() || !*self.rx.borrow() {
            return None;
        }
        match &self.term {
            None => Some(LeaderEpoch(0)),
            Some(term) => match *term.lock().unwrap_or_else(|p| p.into_inner()) {
                Some(t) if Instant::now() < t.until => Some(t.epoch),
                _ => None,
            },
        }
    }

    /// The epoch of this replica's last term even when it has lapsed,
    /// until its elector notices the loss; `None` without one. Only for
    /// `crate::fault::Fault::SkipLeaderCheck`: a lapsed term acts in no
    /// epoch.
    pub fn lapsed_epoch(&self) -> Option<LeaderEpoch> {
        let term = self.term.as_ref()?;
        term.lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|t| t.epoch)
    }

    /// A receiver that sees every change.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.rx.clone()
    }

    /// Waits until this replica leads; false if the election stopped first.
    pub async fn wait_until_leader(&self) -> bool {
        let mut rx = self.rx.clone();
        rx.wait_for(|leads| *leads).await.is_ok()
    }
}

/// CSI `Probe` is ready only on the leading replica. Each sidecar probes
/// until ready before it campaigns for its own Lease (csi-lib-utils'
/// `ProbeForever`), so the sidecars of a replica that does not lead wait
/// instead of winning their elections and meeting UNAVAILABLE on every
/// write. Not part of `/readyz`: a standby replica is healthy.
#[derive(Clone, Debug)]
pub struct LeaderCheck(pub LeaderHandle);

impl csi_scsi_daemon::Check for LeaderCheck {
    fn name(&self) -> &str {
        "leader"
    }

    fn check(&self) -> Result<(), String> {
        match self.0.is_leader() {
            true => Ok(()),
            false => Err(
                "this replica does not hold the proxy's Lease: its sidecars wait for the Probe while the leader's work"
                    .into(),
            ),
        }
    }
}

/// Waits until this replica, having led, loses the Lease (or the election
/// stops): the caller then shuts the process down. The CSI socket closes,
/// the sidecars beside it exit on the lost connection (csi-lib-utils'
/// `ExitOnConnectionLoss`) and, restarted, wait at the Probe: no sidecar
/// keeps leading beside a proxy that does not.
pub async fn exit_when_leadership_lost(handle: LeaderHandle) {
    let mut rx = handle.subscribe();
    if rx.wait_for(|leads| *leads).await.is_err() {
        return;
    }
    let _ = rx.wait_for(|leads| !*leads).await;
}

/// Runs `work()` while this replica leads: starts it on gaining leadership,
/// aborts it on losing it, and starts it again on the next gain. Returns
/// when the election stops.
pub async fn run_while_leader<F, Fut>(handle: LeaderHandle, mut work: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut rx = handle.subscribe();
    loop {
        // A stopped election may leave `true` behind: it does not lead.
        if rx.wait_for(|leads| *leads).await.is_err() || rx.has_changed().is_err() {
            return;
        }
        tracing::info!("leading: starting leader-only work");
        let task = tokio::spawn(work());
        let lost = rx.wait_for(|leads| !*leads).await.is_ok();
        task.abort();
        if !lost {
            return;
        }
        tracing::warn!("leadership lost: leader-only work stopped");
    }
}

// === impl LeaderElection ===

impl LeaderElection {
    /// Starts campaigning for the Lease in the background.
    pub fn spawn(client: Client, config: LeaseConfig) -> Result<Self, LeaseConfigError> {
        config.validate()?;
        let api: Api<Lease> = Api::namespaced(client, &config.namespace);
        let (tx, rx) = watch::channel(false);
        let term = Arc::new(Mutex::new(None));
        let elector = Elector {
            api: api.clone(),
            config: config.clone(),
            tx,
            term: term.clone(),
            observed: None,
        };
        Ok(Self {
            handle: LeaderHandle {
                rx,
                term: Some(term),
                _fixed: None,
            },
            task: tokio::spawn(elector.run()),
            api,
            config,
        })
    }

    /// The handle the rest of the proxy uses.
    pub fn handle(&self) -> LeaderHandle {
        self.handle.clone()
    }

    /// Stops campaigning and, if this replica holds the Lease, releases it
    /// so a successor need not wait out the lease duration.
    pub async fn step_down(self) {
        self.task.abort();
        let Ok(Some(mut lease)) = self.api.get_opt(&self.config.name).await else {
            return;
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match self
            .api
            .replace(&self.config.name, &post_params(), &lease)
            .await
        {
            Ok(_) => tracing::info!(lease = %self.config.name, "leadership released"),
            Err(e) => {
                tracing::warn!(lease = %self.config.name, error = %e, "could not release the Lease")
            }
        }
    }
}

impl Drop for LeaderElection {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// === impl ControllerMethod ===

impl ControllerMethod {
    /// The method `path` (`/csi.v1.Controller/<Method>`) names; `None` for
    /// any other path.
    pub fn from_path(path: &str) -> Option<Self> {
        let method = path
            .strip_prefix('/')?
            .strip_prefix(csi_scsi_proto::csi::controller_server::SERVICE_NAME)?
            .strip_prefix('/')?;
        Some(match method {
            "CreateVolume" => Self::CreateVolume,
            "DeleteVolume" => Self::DeleteVolume,
            "ControllerPublishVolume" => Self::ControllerPublishVolume,
            "ControllerUnpublishVolume" => Self::ControllerUnpublishVolume,
            "ValidateVolumeCapabilities" => Self::ValidateVolumeCapabilities,
            "ListVolumes" => Self::ListVolumes,
            "GetCapacity" => Self::GetCapacity,
            "ControllerGetCapabilities" => Self::ControllerGetCapabilities,
            "CreateSnapshot" => Self::CreateSnapshot,
            "DeleteSnapshot" => Self::DeleteSnapshot,
            "ListSnapshots" => Self::ListSnapshots,
            "GetSnapshot" => Self::GetSnapshot,
            "ControllerExpandVolume" => Self::ControllerExpandVolume,
            "ControllerGetVolume" => Self::ControllerGetVolume,
            "ControllerModifyVolume" => Self::ControllerModifyVolume,
            _ => return None,
        })
    }

    /// Whether only the leader may serve it: every call that changes state
    /// (the inventory, an attachment, a LUN). The others read the watch
    /// caches every replica keeps.
    pub fn needs_leader(self) -> bool {
        match self {
            Self::CreateVolume
            | Self::DeleteVolume
            | Self::ControllerPublishVolume
            | Self::ControllerUnpublishVolume
            | Self::ControllerExpandVolume
            | Self::ControllerModifyVolume
            | Self::CreateSnapshot
            | Self::DeleteSnapshot => true,
            Self::ControllerGetCapabilities
            | Self::ValidateVolumeCapabilities
            | Self::ListVolumes
            | Self::GetCapacity
            | Self::ControllerGetVolume
            | Self::ListSnapshots
            | Self::GetSnapshot => false,
        }
    }
}

// === impl LeaderGate ===

impl<S> tower::Layer<S> for LeaderGate {
    type Service = LeaderGated<S>;

    fn layer(&self, inner: S) -> Self::Service {
        LeaderGated {
            inner,
            leader: self.0.clone(),
        }
    }
}

impl<S, B> tower::Service<http::Request<B>> for LeaderGated<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        futures::future::Either<S::Future, std::future::Ready<Result<Self::Response, Self::Error>>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let path = request.uri().path();
        // A method this table does not know is gated: it may write.
        let method = ControllerMethod::from_path(path);
        if method.is_none_or(ControllerMethod::needs_leader) && !self.leader.is_leader() {
            let refusal = tonic::Status::unavailable(format!(
                "{}: this csi-scsi-proxy replica is not the leader, and only the leader changes state; retry (the leader holds the Lease)",
                method.map_or("this method", |_| path.trim_start_matches('/'))
            ));
            return futures::future::Either::Right(std::future::ready(Ok(refusal.into_http())));
        }
        futures::future::Either::Left(self.inner.call(request))
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for LeaderGated<S> {
    const NAME: &'static str = S::NAME;
}

// === impl Elector ===

impl Elector {
    async fn run(mut self) {
        let mut last_renew: Option<Instant> = None;
        loop {
            let leading = *self.tx.borrow();
            // The client retries 429/503/504 with backoff, so one attempt
            // could outlast the lease: bound it by what is left of the
            // renew deadline, as client-go does.
            let budget = match last_renew {
                Some(t) if leading => self.config.renew_deadline.saturating_sub(t.elapsed()),
                _ => self.config.renew_deadline,
            };
            let started = Instant::now();
            let attempt = tokio::time::timeout(
                budget.max(Duration::from_millis(1)),
                self.try_acquire_or_renew(),
            )
            .await;
            let attempt = attempt.unwrap_or_else(|_| Err(format!("no answer within {budget:?}")));
            match attempt {
                Ok(true) => {
                    last_renew = Some(Instant::now());
                    // Others count the lease from when they see this
                    // renewal, which is after the attempt started.
                    let epoch = self
                        .observed
                        .as_ref()
                        .map_or(LeaderEpoch(0), |(r, _)| r.epoch());
                    self.fence(Some(Term {
                        until: started + self.config.renew_deadline,
                        epoch,
                    }));
                    if !leading {
                        tracing::info!(lease = %self.config.name, identity = %self.config.identity, "acquired the Lease: leading");
                        self.tx.send_replace(true);
                    }
                }
                Ok(false) => {
                    if leading {
                        tracing::warn!(lease = %self.config.name, "another replica holds the Lease: no longer leading");
                        self.fence(None);
                        self.tx.send_replace(false);
                    }
                }
                Err(e) => {
                    let expired =
                        last_renew.is_none_or(|t| t.elapsed() >= self.config.renew_deadline);
                    tracing::warn!(lease = %self.config.name, error = %e, "Lease not acquired or renewed");
                    if leading && expired {
                        tracing::warn!(lease = %self.config.name, deadline = ?self.config.renew_deadline, "could not renew within the deadline: no longer leading");
                        self.fence(None);
                        self.tx.send_replace(false);
                    }
                }
            }
            let mut wait = self.config.retry_period;
            if !*self.tx.borrow() {
                // Candidates spread out so they do not all try at once.
                wait += self.config.retry_period.mul_f64(fastrand::f64() * 0.2);
            }
            tokio::time::sleep(wait).await;
        }
    }

    /// Sets the term the handle acts in (`None`: not leading).
    fn fence(&self, term: Option<Term>) {
        *self.term.lock().unwrap_or_else(|p| p.into_inner()) = term;
    }

    /// One attempt: true when this replica holds the Lease afterwards.
    async fn try_acquire_or_renew(&mut self) -> Result<bool, String> {
        self.attempt().await.map_err(|e| e.to_string())
    }

    async fn attempt(&mut self) -> Result<bool, kube::Error> {
        let me = self.config.identity.clone();
        let now = Timestamp::now();
        let duration_secs = i32::try_from(self.config.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let Some(lease) = self.api.get_opt(&self.config.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_duration_seconds: Some(duration_secs),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&post_params(), &lease).await {
                Ok(created) => {
                    self.observe(&created);
                    Ok(true)
                }
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let record = self.observe(&lease);
        let spec = lease.spec.clone().unwrap_or_default();
        let held_by_other = record.holder.as_ref().is_some_and(|h| *h != me);
        if held_by_other {
            let lease_duration = spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map(Duration::from_secs)
                .unwrap_or(self.config.lease_duration);
            let seen_since = self
                .observed
                .as_ref()
                .map(|(_, at)| *at)
                .unwrap_or_else(Instant::now);
            if seen_since.elapsed() < lease_duration {
                return Ok(false);
            }
            tracing::info!(lease = %self.config.name, holder = ?record.holder, "the holder let the Lease expire: taking it");
        }
        let mut next = lease.clone();
        let s = next.spec.get_or_insert_with(LeaseSpec::default);
        if record.holder.as_deref() != Some(me.as_str()) {
            s.holder_identity = Some(me);
            s.acquire_time = Some(MicroTime(now));
            // Every acquisition, a released Lease's too, is a new term: the
            // count is the leader epoch, so no two holders share one.
            s.lease_transitions = Some(record.transitions.saturating_add(1));
        }
        s.renew_time = Some(MicroTime(now));
        s.lease_duration_seconds = Some(duration_secs);
        match self
            .api
            .replace(&self.config.name, &post_params(), &next)
            .await
        {
            Ok(written) => {
                self.observe(&written);
                Ok(true)
            }
            // Someone else wrote first: their record stands.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Notes `lease`'s record, restarting the clock when it changed.
    fn observe(&mut self, lease: &Lease) -> Record {
        let spec = lease.spec.clone().unwrap_or_default();
        let record = Record {
            holder: spec.holder_identity.filter(|h| !h.is_empty()),
            renew: spec.renew_time.map(|t| t.0),
            transitions: spec.lease_transitions.unwrap_or(0),
            created: lease
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(0, |t| t.0.as_second()),
        };
        if self.observed.as_ref().map(|(r, _)| r) != Some(&record) {
            self.observed = Some((record.clone(), Instant::now()));
        }
        record
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_scsi_daemon::Check;

    #[tokio::test]
    async fn a_leader_frozen_past_its_renew_deadline_refuses_before_its_elector_runs_again() {
        let (tx, rx) = watch::channel(true);
        let term = |until| Term {
            until,
            epoch: LeaderEpoch(4),
        };
        let held = Arc::new(Mutex::new(Some(term(
            Instant::now() + Duration::from_secs(3600),
        ))));
        let handle = LeaderHandle {
            rx,
            term: Some(held.clone()),
            _fixed: Some(Arc::new(tx)),
        };
        assert!(handle.is_leader(), "renewed a moment ago");
        assert_eq!(handle.epoch(), Some(LeaderEpoch(4)));
        // The process slept through its renew deadline: the watch still
        // says leading (nothing ran to change it), the fence does not.
        *held.lock().expect("lock") = Instant::now()
            .checked_sub(Duration::from_millis(1))
            .map(term);
        assert!(*handle.subscribe().borrow(), "the elector has not run");
        assert!(!handle.is_leader(), "acted on a lapsed renewal");
        assert_eq!(handle.epoch(), None, "a lapsed term has no epoch");
        assert!(LeaderCheck(handle.clone()).check().is_err());
        // The next renewal lets it act again.
        *held.lock().expect("lock") = Some(term(Instant::now() + Duration::from_secs(3600)));
        assert!(handle.is_leader());
    }

    #[test]
    fn a_handle_without_an_election_leads_in_epoch_zero_while_told_it_leads() {
        assert_eq!(LeaderHandle::always().epoch(), Some(LeaderEpoch(0)));
        let (tx, rx) = watch::channel(false);
        let handle = LeaderHandle::from_receiver(rx);
        assert_eq!(handle.epoch(), None);
        tx.send_replace(true);
        assert_eq!(handle.epoch(), Some(LeaderEpoch(0)));
        drop(tx);
        assert_eq!(handle.epoch(), None, "a stopped election never leads");
    }

    #[tokio::test]
    async fn the_probe_waits_for_leadership_and_losing_it_ends_the_process() {
        let (tx, rx) = watch::channel(false);
        let handle = LeaderHandle::from_receiver(rx);
        let check = LeaderCheck(handle.clone());
        assert!(check.check().is_err(), "a standby answered the Probe ready");
        // A standby never lost anything: it waits on.
        let exit = tokio::spawn(exit_when_leadership_lost(handle));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!exit.is_finished(), "a standby was told to exit");
        tx.send(true).expect("the handle listens");
        assert!(check.check().is_ok(), "the leader's Probe is not ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!exit.is_finished(), "the leader was told to exit");
        tx.send(false).expect("the handle listens");
        tokio::time::timeout(Duration::from_secs(5), exit)
            .await
            .expect("losing the Lease ends the process")
            .expect("the waiter ran");
        assert!(check.check().is_err());
    }

    #[test]
    fn only_the_calls_that_change_state_need_the_leader() {
        // (path, method, needs the leader)
        let table = [
            ("CreateVolume", ControllerMethod::CreateVolume, true),
            ("DeleteVolume", ControllerMethod::DeleteVolume, true),
            (
                "ControllerPublishVolume",
                ControllerMethod::ControllerPublishVolume,
                true,
            ),
            (
                "ControllerUnpublishVolume",
                ControllerMethod::ControllerUnpublishVolume,
                true,
            ),
            (
                "ControllerExpandVolume",
                ControllerMethod::ControllerExpandVolume,
                true,
            ),
            (
                "ControllerModifyVolume",
                ControllerMethod::ControllerModifyVolume,
                true,
            ),
            ("CreateSnapshot", ControllerMethod::CreateSnapshot, true),
            ("DeleteSnapshot", ControllerMethod::DeleteSnapshot, true),
            (
                "ControllerGetCapabilities",
                ControllerMethod::ControllerGetCapabilities,
                false,
            ),
            (
                "ValidateVolumeCapabilities",
                ControllerMethod::ValidateVolumeCapabilities,
                false,
            ),
            ("ListVolumes", ControllerMethod::ListVolumes, false),
            ("GetCapacity", ControllerMethod::GetCapacity, false),
            (
                "ControllerGetVolume",
                ControllerMethod::ControllerGetVolume,
                false,
            ),
            ("ListSnapshots", ControllerMethod::ListSnapshots, false),
            ("GetSnapshot", ControllerMethod::GetSnapshot, false),
        ];
        for (name, method, gated) in table {
            let path = format!("/csi.v1.Controller/{name}");
            assert_eq!(ControllerMethod::from_path(&path), Some(method), "{path}");
            assert_eq!(method.needs_leader(), gated, "{path}");
        }
        for other in [
            "/csi.v1.Controller/Frobnicate",
            "/csi.v1.Identity/Probe",
            "/csi.v1.Controller/",
            "csi.v1.Controller/CreateVolume",
            "/csi.v1.Controller/CreateVolume/x",
        ] {
            assert_eq!(ControllerMethod::from_path(other), None, "{other}");
        }
    }
}
