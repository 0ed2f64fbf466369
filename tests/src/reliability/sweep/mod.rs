//! The bad-input sweep. Against a running lab, every RPC of CSI Identity
//! (proxy and agents), Controller (proxy) and Node (agents), and of the
//! agent API over mTLS, is sent a table of malformed requests: empty IDs,
//! missing or unknown capabilities, 1 MiB fields, unknown parameters,
//! paths outside the kubelet directory, `..` escapes, relative paths,
//! symlinks out, volumes and nodes that do not exist, random garbage IDs
//! and undecodable bytes. Each answer's code is checked against the code
//! the CSI spec's tables name (agent.proto's list for the agent API); every
//! refusal must carry a short, non-empty message that holds no secret.
//! Well-formed control requests prove the services still say yes. Two
//! volumes stay published on node-a throughout, and the LUN files read the
//! same after the sweep as before it: nothing malformed touched a device.
//! Garbage comes from one seeded source, so a failing run replays.
//!
//! This module holds the entry point and the tally: `Sweep::table` sends
//! a table of cases to one RPC, which the requests' type names (`rpc.rs`).
//! Each service's tables live in a file of their own.

mod agent_api;
mod codes;
mod controller;
mod dangerous;
mod fixture;
mod garbage;
mod identity;
mod inputs;
mod invariants;
mod node;
mod requests;
mod rpc;
mod wire;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use csi_scsi_proto::agent::agent_client::AgentClient;
use csi_scsi_proto::csi::DeleteVolumeRequest;
use tonic::{Code, Status};

use super::{Scale, SuiteReport};
use crate::lab::scenario::Clients;
use crate::lab::{Lab, LabConfig};
use fixture::Fixture;
use rpc::Rpc;

/// How long one call may take before the sweep calls it hung.
const CALL_LIMIT: Duration = Duration::from_secs(30);
/// A field far over any limit, yet under the 4 MiB gRPC message limit.
const HUGE: usize = 1 << 20;
/// The longest status message accepted. Clients cap the trailer block that
/// carries it (hyper at 16 KiB, percent-encoded), so a message that echoes
/// a huge field whole reaches the caller as a transport error instead of
/// its code, and floods the sidecars' events and logs.
const MAX_MESSAGE: usize = 4096;
/// Node-a: the node the fixtures live on.
const NODE: &str = "node-a";

/// The services the report counts requests and codes under.
const IDENTITY: &str = "identity";
const CONTROLLER: &str = "controller";
const NODE_SVC: &str = "node";
const AGENT_API: &str = "agent-api";
const WIRE: &str = "wire";

/// Runs the sweep against a lab brought up in `dir`.
pub async fn run(scale: Scale, seed: u64, dir: &Path) -> anyhow::Result<SuiteReport> {
    csi_scsi_certs::install_crypto_provider();
    let started = Instant::now();
    let mut rng = fastrand::Rng::with_seed(seed);
    let lab = Lab::up(LabConfig::for_test(dir), &mut |_| {}).await?;
    let mut cl = Clients::connect(&lab).await?;
    fixture::wait_for_discovery(&lab, &mut cl).await?;
    let lab_up = started.elapsed();

    let chap = std::fs::read_to_string(lab.config.dir.join("secrets/chap-array-a/password"))
        .context("the lab's CHAP secret")?;
    let token = format!("sweep-secret-{:016x}", rng.u64(..));
    let mut sw = Sweep {
        report: SuiteReport::new("sweep", seed),
        sent: BTreeMap::new(),
        codes: BTreeMap::new(),
        secrets: vec![chap.trim().to_owned(), token],
        created: Vec::new(),
    };
    let fx = Fixture::up(&lab, &mut cl, &mut rng).await?;
    let heads = fx.seed_luns(&lab, &mut rng)?;
    let agent = AgentClient::new(fixture::agent_channel(&lab)?);
    let sweep_start = Instant::now();

    identity::sweep(&mut sw, &lab, &mut rng).await?;
    controller::sweep(&mut sw, &mut cl, &fx, &mut rng).await;
    node::sweep(&mut sw, &lab, &mut cl, &fx, &mut rng).await;
    agent_api::sweep(&mut sw, &lab, agent.clone(), &fx, &mut rng).await?;
    let wires = wire::channels(&lab).await?;
    wire::sweep(&mut sw, &wires, &mut rng).await;
    for _ in 0..scale.pick(3, 200) {
        garbage::round(&mut sw, &mut cl, &fx, agent.clone(), &mut rng).await;
        // And garbage on the wire: every RPC of every service.
        for (channel, rpcs) in &wires {
            wire::every_rpc(&mut sw, channel, rpcs, &mut rng).await;
        }
    }
    // Last: well-formed calls that would destroy the fixtures if the
    // drivers got them wrong.
    dangerous::sweep(&mut sw, &mut cl, &fx, agent.clone()).await;
    let swept = sweep_start.elapsed();

    invariants::check(&mut sw, &lab, &mut cl, &fx, &heads, agent).await?;
    for id in std::mem::take(&mut sw.created) {
        let _ = call(cl.controller.delete_volume(DeleteVolumeRequest {
            volume_id: id,
            secrets: HashMap::new(),
        }))
        .await;
    }
    fx.down(&mut sw, &lab, &mut cl).await;

    let mut report = sw.finish();
    report.note(format!(
        "lab up {:.1}s, sweep {:.1}s; {} LUN heads compared",
        lab_up.as_secs_f64(),
        swept.as_secs_f64(),
        heads.len()
    ));
    report.elapsed = started.elapsed();
    Ok(report)
}

/// The sweep's tally and its report.
struct Sweep {
    report: SuiteReport,
    /// Requests sent, per service.
    sent: BTreeMap<&'static str, u64>,
    /// Codes answered, per service.
    codes: BTreeMap<&'static str, BTreeMap<String, u64>>,
    /// Strings no answer may contain.
    secrets: Vec<String>,
    /// Volumes a malformed CreateVolume made anyway, to delete at the end.
    created: Vec<String>,
}

impl Sweep {
    /// Counts one answer of `service`'s `rpc` to the request `case`, and
    /// checks its code against `want` and its message. Returns whether the
    /// code was one of `want`.
    fn check<T>(
        &mut self,
        service: &'static str,
        rpc: &str,
        case: &str,
        result: &Result<T, Status>,
        want: &[Code],
    ) -> bool {
        self.report.op();
        *self.sent.entry(service).or_default() += 1;
        let code = match result {
            Ok(_) => Code::Ok,
            Err(s) => s.code(),
        };
        *self
            .codes
            .entry(service)
            .or_default()
            .entry(format!("{code:?}"))
            .or_default() += 1;
        let msg = result.as_ref().err().map(Status::message).unwrap_or("");
        let ok = self.report.check(want.contains(&code), || {
            format!(
                "{service} {rpc} with {case}: answered {code:?} ({}), the spec wants {want:?}",
                clip(msg)
            )
        });
        if let Err(s) = result {
            let m = s.message();
            // Error Scheme: "The status message MUST contain a human
            // readable description of error".
            self.report.check(!m.trim().is_empty(), || {
                format!("{service} {rpc} with {case}: {code:?} with an empty message")
            });
            self.report.check(m.len() <= MAX_MESSAGE, || {
                format!(
                    "{service} {rpc} with {case}: a {} byte message (echoes the input?): {}",
                    m.len(),
                    clip(m)
                )
            });
            // Error Scheme: "The status details MUST be empty."
            self.report.check(s.details().is_empty(), || {
                format!("{service} {rpc} with {case}: status details are not empty")
            });
            for secret in &self.secrets {
                self.report.check(!m.contains(secret.as_str()), || {
                    format!("{service} {rpc} with {case}: the message holds a secret")
                });
            }
        }
        ok
    }

    /// Sends `req` (described as `case`) through `client` and checks the
    /// answer against `want` as [`Sweep::check`] does. Returns the reply
    /// if the call succeeded, for checks beyond the code.
    async fn send<R: Rpc>(
        &mut self,
        client: &mut R::Client,
        case: &str,
        req: R,
        want: &[Code],
    ) -> Option<R::Reply> {
        let r = req.send(client).await;
        self.check(R::SERVICE, R::NAME, case, &r, want);
        r.ok()
    }

    /// Sends every case of `cases`, in order, and checks each answer.
    /// Returns each case with its reply if the call succeeded.
    async fn table<R: Rpc>(
        &mut self,
        client: &mut R::Client,
        cases: Cases<R>,
    ) -> Vec<(String, Option<R::Reply>)> {
        let mut answers = Vec::with_capacity(cases.0.len());
        for (case, req, want) in cases.0 {
            let reply = self.send(client, &case, req, want).await;
            answers.push((case, reply));
        }
        answers
    }

    /// Checks a property of an answer beyond its code.
    fn holds(&mut self, holds: bool, what: impl FnOnce() -> String) -> bool {
        self.report.check(holds, what)
    }

    /// The secrets map every request that has one carries.
    fn secrets(&self) -> HashMap<String, String> {
        HashMap::from([
            ("password".to_owned(), self.secrets[0].clone()),
            ("sweepToken".to_owned(), self.secrets[1].clone()),
        ])
    }

    fn finish(mut self) -> SuiteReport {
        let sent: Vec<String> = self.sent.iter().map(|(s, n)| format!("{s} {n}")).collect();
        self.report
            .note(format!("requests per service: {}", sent.join(", ")));
        for (service, codes) in &self.codes {
            let c: Vec<String> = codes.iter().map(|(c, n)| format!("{c} {n}")).collect();
            self.report
                .note(format!("{service} codes: {}", c.join(", ")));
        }
        self.report
    }
}

/// A table of requests to one RPC: (what the request is, the request, the
/// codes the spec allows), sent in order by [`Sweep::table`].
struct Cases<R>(Vec<(String, R, &'static [Code])>);

impl<R> Cases<R> {
    fn new() -> Self {
        Self(Vec::new())
    }

    /// Adds `req`, described as `case`, to be answered with one of `want`.
    fn add(&mut self, case: impl Into<String>, req: R, want: &'static [Code]) -> &mut Self {
        self.0.push((case.into(), req, want));
        self
    }

    /// Adds one request per `(case, input)`, made by `make` and described
    /// as `prefix` then the input's case, each to be answered with one of
    /// `want`.
    fn each<I>(
        &mut self,
        prefix: &str,
        inputs: Vec<(String, I)>,
        want: &'static [Code],
        mut make: impl FnMut(I) -> R,
    ) -> &mut Self {
        for (case, input) in inputs {
            self.add(format!("{prefix}{case}"), make(input), want);
        }
        self
    }
}

/// The first 200 characters of `s`, for a violation's text.
fn clip(s: &str) -> String {
    let mut out: String = s.chars().take(200).collect();
    if out.len() < s.len() {
        out.push_str(&format!("... ({} bytes)", s.len()));
    }
    out
}

/// Awaits one call, bounded by [`CALL_LIMIT`].
async fn call<T>(
    fut: impl Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, Status> {
    match tokio::time::timeout(CALL_LIMIT, fut).await {
        Ok(r) => r.map(tonic::Response::into_inner),
        Err(_) => Err(Status::deadline_exceeded(format!(
            "sweep: no answer within {CALL_LIMIT:?}"
        ))),
    }
}
