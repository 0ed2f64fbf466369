//! The election itself: client-go's algorithm over a
//! `coordination.k8s.io/v1` Lease (see the module above), one attempt per
//! retry period.

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

use csi_scsi_contract::LeaderEpoch;

use super::LeaderHandle;
use super::handle::Term;
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

/// The running election: its handle and its task.
#[derive(Debug)]
pub struct LeaderElection {
    handle: LeaderHandle,
    task: JoinHandle<()>,
    api: Api<Lease>,
    config: LeaseConfig,
}

/// Who holds the Lease after an attempt that got an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Holder {
    /// This replica: it acquired or renewed it.
    This,
    /// Another replica, whose claim still stands (or who wrote first).
    Another,
}

/// Why an attempt at the Lease got no answer: nobody is known to hold it
/// any more or less than before.
#[derive(Debug, thiserror::Error)]
enum AttemptError {
    /// The API server refused or failed the read or the write.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// No answer within what was left of the renew deadline.
    #[error("no answer within {0:?}")]
    NoAnswer(Duration),
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
            handle: LeaderHandle::elected(rx, term),
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
            let attempt = self
                .try_acquire_or_renew(budget.max(Duration::from_millis(1)))
                .await;
            match attempt {
                Ok(Holder::This) => {
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
                Ok(Holder::Another) => {
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

    /// One attempt, bounded by `budget`: who holds the Lease afterwards.
    async fn try_acquire_or_renew(&mut self, budget: Duration) -> Result<Holder, AttemptError> {
        match tokio::time::timeout(budget, self.attempt()).await {
            Ok(outcome) => Ok(outcome?),
            Err(_) => Err(AttemptError::NoAnswer(budget)),
        }
    }

    async fn attempt(&mut self) -> Result<Holder, kube::Error> {
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
                    Ok(Holder::This)
                }
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Holder::Another),
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
                return Ok(Holder::Another);
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
                Ok(Holder::This)
            }
            // Someone else wrote first: their record stands.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Holder::Another),
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
