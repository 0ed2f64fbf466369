//! An agent stand-in for the proxy's own tests: the real agent API served
//! over real mutual TLS (a node certificate from the test CA), whose Wipe
//! behaves as the agent's does towards the proxy: it refuses a WWID it does
//! not see (NOT_FOUND), answers ABORTED while a wipe of that WWID runs,
//! keeps wiping when the caller goes away, and can be told to take long or
//! to fail. Every wipe is logged. An Attach of a WWID it sees, and every
//! Detach, succeed and are counted; the other calls are UNIMPLEMENTED.
//! The leader-epoch header of every Attach, Detach and Wipe is logged.
// Not every binary uses every helper.
#![allow(dead_code)]

use csi_scsi_contract::Wwid;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_scsi_certs::{
    CertificateAuthority, Identity, MaterialPaths, MaterialStore, Role, TrustDomain, Validity,
    server_config, write_issued,
};
use csi_scsi_proto::agent::agent_server::{Agent, AgentServer};
use csi_scsi_proto::agent::{
    AttachRequest, AttachResponse, DetachRequest, DetachResponse, DiscoverRequest,
    DiscoverResponse, RescanRequest, RescanResponse, StatusRequest, StatusResponse, VerifyRequest,
    VerifyResponse, WipeProgress, WipeRequest,
};
use futures::Stream;
use tonic::{Request, Response, Status};

/// What the stub's wipes did.
#[derive(Debug, Default)]
pub struct WipeLog {
    state: Mutex<LogState>,
}

#[derive(Debug, Default)]
struct LogState {
    started: BTreeMap<String, u32>,
    finished: BTreeMap<String, u32>,
    running: BTreeSet<String>,
    busy_answers: u32,
    most_at_once: usize,
    attached: BTreeMap<String, u32>,
    detached: BTreeMap<String, u32>,
    verified: BTreeMap<String, u32>,
    /// Every call's method and leader-epoch header, in order.
    epochs: Vec<(&'static str, Option<String>)>,
}

impl WipeLog {
    /// Wipes of `wwid` started.
    pub fn started(&self, wwid: &Wwid) -> u32 {
        self.lock().started.get(wwid.as_str()).copied().unwrap_or(0)
    }

    /// Wipes of `wwid` that ran to their end (success or failure).
    pub fn finished(&self, wwid: &Wwid) -> u32 {
        self.lock()
            .finished
            .get(wwid.as_str())
            .copied()
            .unwrap_or(0)
    }

    /// Wipes running now.
    pub fn running(&self) -> usize {
        self.lock().running.len()
    }

    /// Most wipes that ran at once, over every WWID.
    pub fn most_at_once(&self) -> usize {
        self.lock().most_at_once
    }

    /// Verify calls answered for `wwid`.
    pub fn verified(&self, wwid: &Wwid) -> u32 {
        self.lock()
            .verified
            .get(wwid.as_str())
            .copied()
            .unwrap_or(0)
    }

    /// ABORTED answers given because that WWID was being wiped.
    pub fn busy_answers(&self) -> u32 {
        self.lock().busy_answers
    }

    /// Attach calls for `wwid` answered OK.
    pub fn attached(&self, wwid: &Wwid) -> u32 {
        self.lock()
            .attached
            .get(wwid.as_str())
            .copied()
            .unwrap_or(0)
    }

    /// Detach calls for `wwid` answered OK.
    pub fn detached(&self, wwid: &Wwid) -> u32 {
        self.lock()
            .detached
            .get(wwid.as_str())
            .copied()
            .unwrap_or(0)
    }

    /// Every call received: its method and leader-epoch header (`None`
    /// when it had none), in order.
    pub fn epochs(&self) -> Vec<(&'static str, Option<String>)> {
        self.lock().epochs.clone()
    }

    /// Notes that `request` (of `method`) arrived.
    fn received<T>(&self, method: &'static str, request: &Request<T>) {
        let epoch = request
            .metadata()
            .get(csi_scsi_contract::LEADER_EPOCH_HEADER)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        self.lock().epochs.push((method, epoch));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// How the stub's wipes behave.
#[derive(Debug)]
pub struct WipeBehaviour {
    /// How long one wipe takes.
    pub duration: Duration,
    /// The next this many wipes fail with INTERNAL (an I/O error).
    pub failures_left: Mutex<u32>,
    /// A finished wipe reports this many bytes fewer than asked for (an
    /// agent whose device stayed at an old size, before the check).
    pub short_by: u64,
    /// What a Verify of this node reads.
    pub reads: Reads,
}

/// What a stub's Verify answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reads {
    /// The expected size, all zeroes.
    Zeroes,
    /// Data at the first offset asked.
    Data,
    /// Half the expected size.
    Smaller,
    /// UNIMPLEMENTED (an agent that cannot verify).
    Nothing,
}

impl WipeBehaviour {
    /// Wipes of `duration`, the first `failures` of which fail; whole
    /// wipes, and a Verify that reads zeroes.
    pub fn new(duration: Duration, failures: u32) -> Self {
        Self {
            duration,
            failures_left: Mutex::new(failures),
            short_by: 0,
            reads: Reads::Zeroes,
        }
    }
}

/// A running stub agent for one node.
pub struct StubAgent {
    /// Where it listens.
    pub address: SocketAddr,
    /// What its wipes did.
    pub log: Arc<WipeLog>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for StubAgent {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Serves a stub agent for `node` that sees `wwids`, with a certificate
/// from `ca` written under `scratch`.
pub async fn start(
    ca: &CertificateAuthority,
    node: &str,
    wwids: &[&str],
    behaviour: WipeBehaviour,
    scratch: &std::path::Path,
) -> StubAgent {
    let domain = TrustDomain::new("csi-scsi.local").expect("domain");
    let issued = ca
        .issue(&Identity::Node(node.to_owned()), Validity::days(1))
        .expect("issue");
    let dir = scratch.join(format!("agent-{node}-tls"));
    write_issued(&dir, &issued).expect("write TLS material");
    let store = MaterialStore::load(
        MaterialPaths::in_dir(&dir),
        Role::Agent {
            node: node.to_owned(),
        },
        domain,
    )
    .expect("TLS material");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let log = Arc::new(WipeLog::default());
    let service = Service {
        wwids: wwids.iter().map(|w| (*w).to_owned()).collect(),
        behaviour: Arc::new(behaviour),
        log: log.clone(),
    };
    let incoming =
        csi_scsi_daemon::tls_incoming(listener, server_config(store).expect("server config"));
    let server = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(AgentServer::new(service))
            .serve_with_incoming(incoming)
            .await;
    });
    StubAgent {
        address,
        log,
        server,
    }
}

struct Service {
    wwids: BTreeSet<String>,
    behaviour: Arc<WipeBehaviour>,
    log: Arc<WipeLog>,
}

type WipeStream = Pin<Box<dyn Stream<Item = Result<WipeProgress, Status>> + Send>>;

#[tonic::async_trait]
impl Agent for Service {
    async fn discover(
        &self,
        _: Request<DiscoverRequest>,
    ) -> Result<Response<DiscoverResponse>, Status> {
        Err(Status::unimplemented("stub"))
    }

    async fn attach(
        &self,
        request: Request<AttachRequest>,
    ) -> Result<Response<AttachResponse>, Status> {
        self.log.received("Attach", &request);
        let wwid = request.into_inner().wwid;
        if !self.wwids.contains(&wwid) {
            return Err(Status::not_found(format!("no device {wwid} on this node")));
        }
        *self.log.lock().attached.entry(wwid.clone()).or_default() += 1;
        Ok(Response::new(AttachResponse {
            device_path: format!("/dev/disk/by-id/wwn-{wwid}"),
            lun: None,
        }))
    }

    async fn detach(
        &self,
        request: Request<DetachRequest>,
    ) -> Result<Response<DetachResponse>, Status> {
        self.log.received("Detach", &request);
        let wwid = request.into_inner().wwid;
        *self.log.lock().detached.entry(wwid).or_default() += 1;
        Ok(Response::new(DetachResponse::default()))
    }

    type WipeStream = WipeStream;

    async fn wipe(&self, request: Request<WipeRequest>) -> Result<Response<WipeStream>, Status> {
        self.log.received("Wipe", &request);
        let request = request.into_inner();
        let wwid = request.wwid;
        let size = request
            .expected_size_bytes
            .saturating_sub(self.behaviour.short_by);
        if !self.wwids.contains(&wwid) {
            return Err(Status::not_found(format!("no device {wwid} on this node")));
        }
        {
            let mut s = self.log.lock();
            if !s.running.insert(wwid.clone()) {
                s.busy_answers += 1;
                return Err(Status::aborted(format!("{wwid} is being wiped")));
            }
            *s.started.entry(wwid.clone()).or_default() += 1;
            s.most_at_once = s.most_at_once.max(s.running.len());
        }
        // As the agent's erase in spawn_blocking: it runs to its end even
        // when the caller is gone.
        let (behaviour, log) = (self.behaviour.clone(), self.log.clone());
        let erase = tokio::spawn(async move {
            tokio::time::sleep(behaviour.duration).await;
            let failed = {
                let mut left = behaviour
                    .failures_left
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                let failed = *left > 0;
                *left = left.saturating_sub(1);
                failed
            };
            let mut s = log.lock();
            s.running.remove(&wwid);
            *s.finished.entry(wwid.clone()).or_default() += 1;
            if failed {
                Err(Status::internal(format!("I/O error wiping {wwid}")))
            } else {
                Ok(())
            }
        });
        match erase.await {
            Ok(Ok(())) => {
                let done = WipeProgress {
                    done: true,
                    bytes_done: size,
                    bytes_total: size,
                    ..WipeProgress::default()
                };
                Ok(Response::new(Box::pin(futures::stream::iter([Ok(done)]))))
            }
            Ok(Err(status)) => Err(status),
            Err(e) => Err(Status::internal(e.to_string())),
        }
    }

    async fn rescan(&self, _: Request<RescanRequest>) -> Result<Response<RescanResponse>, Status> {
        Err(Status::unimplemented("stub"))
    }

    async fn verify(
        &self,
        request: Request<VerifyRequest>,
    ) -> Result<Response<VerifyResponse>, Status> {
        let request = request.into_inner();
        if !self.wwids.contains(&request.wwid) {
            return Err(Status::not_found(format!(
                "no device {} on this node",
                request.wwid
            )));
        }
        *self.log.lock().verified.entry(request.wwid).or_default() += 1;
        let size = request.expected_size_bytes;
        let first = request.offsets.first().copied().unwrap_or(0);
        let (size_bytes, zeroes) = match self.behaviour.reads {
            Reads::Zeroes => (size, true),
            Reads::Data => (size, false),
            Reads::Smaller => (size / 2, true),
            Reads::Nothing => return Err(Status::unimplemented("stub: no Verify")),
        };
        Ok(Response::new(VerifyResponse {
            size_bytes,
            zeroes,
            nonzero_offset: if zeroes { 0 } else { first },
        }))
    }

    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        Err(Status::unimplemented("stub"))
    }
}
