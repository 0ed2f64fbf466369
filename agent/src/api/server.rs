//! The agent API service: parse, check the caller, call the device layer,
//! map. Each call is one span carrying the method, WWID and request ID
//! (sent by the proxy in `x-request-id`).

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use csi_scsi_daemon::{RequestId, grpc_timeout};
use csi_scsi_proto::agent::agent_server::Agent;
use csi_scsi_proto::agent::*;
use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::epoch::{CallKind, EpochFence};
use super::metrics::WipeMetrics;
use super::status::to_status;
use crate::device::{Devices, TargetSpec, WipeMode as Mode};
use crate::host::sysfs::{Lun as HostLun, Transport as PathTransport};
use csi_scsi_contract::Wwid;

/// Default deadline when the proxy sends none.
const DEFAULT_DEADLINE: Duration = Duration::from_secs(60);

/// The agent API.
pub(crate) struct AgentApi {
    devices: Arc<Devices>,
    node: String,
    /// Refuses a stale proxy leader's destructive calls.
    fence: EpochFence,
    wipes: Option<WipeMetrics>,
}

impl AgentApi {
    /// The API of `node`, over `devices`, for the proxy as `trust` (the
    /// agent's current TLS material) knows it, behind the leader `fence`.
    pub(crate) fn new(devices: Arc<Devices>, node: &str, fence: EpochFence) -> Self {
        Self {
            devices,
            node: node.to_owned(),
            fence,
            wipes: None,
        }
    }

    /// Also counts wipes (bytes, duration) in `metrics`, where it registers
    /// their series.
    pub(crate) fn with_metrics(mut self, metrics: &csi_scsi_daemon::Metrics) -> Self {
        self.wipes = Some(WipeMetrics::new(metrics));
        self
    }
}

/// A WWID as agent.proto names devices: canonical form only
/// ([`Wwid::parse_canonical`]). The other spellings `Wwid::parse` reads are
/// what the kernel and udev print; a caller that sends one (or pads it with
/// blanks or NULs) is not the proxy.
fn wwid(s: &str) -> Result<Wwid, Status> {
    Wwid::parse_canonical(s).map_err(|e| to_status(e.into()))
}

/// A target of the request, parsed. The constructors of [`TargetSpec`]
/// check every field (name, IQN, portals, CHAP, WWPNs) so a malformed
/// target is INVALID_ARGUMENT at once, not a login failure on every portal
/// (UNAVAILABLE); their errors become a status through [`to_status`], the
/// one mapping.
fn target(t: &Target) -> Result<TargetSpec, Status> {
    TargetSpec::from_api(t).map_err(to_status)
}

fn lun_message(l: &HostLun) -> Lun {
    let first = l.paths.first();
    Lun {
        wwid: l.wwid.to_string(),
        size_bytes: l.size_bytes(),
        vendor: first.map(|p| p.vendor.clone()).unwrap_or_default(),
        model: first.map(|p| p.model.clone()).unwrap_or_default(),
        serial: first.and_then(|p| p.serial.clone()).unwrap_or_default(),
        lun: first
            .map(|p| u32::try_from(p.hctl.lun).unwrap_or(u32::MAX))
            .unwrap_or(0),
        paths: l
            .paths
            .iter()
            .map(|p| DevicePath {
                kernel_name: p.kernel_name.clone(),
                hctl: format!(
                    "{}:{}:{}:{}",
                    p.hctl.host, p.hctl.channel, p.hctl.target, p.hctl.lun
                ),
                by_path: p.by_path.first().cloned().unwrap_or_default(),
                by_id: p.by_id.first().cloned().unwrap_or_default(),
                target: match &p.transport {
                    PathTransport::Iscsi { target, .. } => target.clone().unwrap_or_default(),
                    PathTransport::Fc { target_wwpn } => {
                        target_wwpn.map(|w| w.to_0x()).unwrap_or_default()
                    }
                    PathTransport::Other => String::new(),
                },
            })
            .collect(),
        multipath_device: l
            .map
            .as_ref()
            .map(|m| m.kernel_name.clone())
            .unwrap_or_default(),
        holders: l.paths.iter().flat_map(|p| p.holders.clone()).collect(),
    }
}

impl AgentApi {
    /// Admits a call (the caller is already known to be the proxy: see
    /// [`super::ProxyOnly`]): for a destructive one, not from a leader older
    /// than one already seen. Returns its request ID.
    fn accept<T>(&self, request: &Request<T>, kind: CallKind) -> Result<String, Status> {
        let rid = RequestId::of(request).to_string();
        self.fence.admit(request, kind).map_err(|e| {
            // A stale leader's call is a fenced-off proxy acting: say so
            // on the node, where its answer may never be read.
            tracing::warn!(request_id = %rid, error = %e, "call refused by the leader fence");
            to_status(e)
        })?;
        Ok(rid)
    }
}

fn span(method: &'static str, wwid: &str, rid: &str) -> tracing::Span {
    tracing::info_span!("agent_api", method, wwid = %wwid, request_id = %rid)
}

type WipeStream = Pin<Box<dyn Stream<Item = Result<WipeProgress, Status>> + Send>>;

#[tonic::async_trait]
impl Agent for AgentApi {
    async fn discover(
        &self,
        request: Request<DiscoverRequest>,
    ) -> Result<Response<DiscoverResponse>, Status> {
        let rid = self.accept(&request, CallKind::ReadOnly)?;
        let req = request.into_inner();
        let t = target(
            req.target
                .as_ref()
                .ok_or_else(|| Status::invalid_argument("target: is required"))?,
        )?;
        async move {
            let (luns, portals) = self.devices.discover(&t).await.map_err(to_status)?;
            tracing::info!(target = %t.name, luns = luns.len(), "discovered");
            Ok(Response::new(DiscoverResponse {
                luns: luns.iter().map(lun_message).collect(),
                portals: portals
                    .into_iter()
                    .map(|p| PortalState {
                        portal: p.portal,
                        reachable: p.reachable,
                        error: p.error,
                    })
                    .collect(),
            }))
        }
        .instrument(span("Discover", "", &rid))
        .await
    }

    async fn attach(
        &self,
        request: Request<AttachRequest>,
    ) -> Result<Response<AttachResponse>, Status> {
        let rid = self.accept(&request, CallKind::Destructive)?;
        // Leave a margin to answer before the caller gives up.
        let timeout = grpc_timeout::from_metadata(request.metadata()).unwrap_or(DEFAULT_DEADLINE);
        let wait = grpc_timeout::budget(timeout);
        let req = request.into_inner();
        let span = span("Attach", &req.wwid, &rid);
        async move {
            let w = wwid(&req.wwid)?;
            let targets = req
                .targets
                .iter()
                .map(target)
                .collect::<Result<Vec<_>, _>>()?;
            let (path, lun) = self
                .devices
                .attach(&w, &targets, req.lun, wait)
                .await
                .map_err(to_status)?;
            Ok(Response::new(AttachResponse {
                device_path: path.display().to_string(),
                lun: Some(lun_message(&lun)),
            }))
        }
        .instrument(span)
        .await
    }

    async fn detach(
        &self,
        request: Request<DetachRequest>,
    ) -> Result<Response<DetachResponse>, Status> {
        let rid = self.accept(&request, CallKind::Destructive)?;
        let req = request.into_inner();
        let span = span("Detach", &req.wwid, &rid);
        async move {
            let w = wwid(&req.wwid)?;
            let targets = req
                .targets
                .iter()
                .map(target)
                .collect::<Result<Vec<_>, _>>()?;
            let removed = self.devices.detach(&w, &targets).await.map_err(to_status)?;
            Ok(Response::new(DetachResponse { removed }))
        }
        .instrument(span)
        .await
    }

    type WipeStream = WipeStream;

    async fn wipe(
        &self,
        request: Request<WipeRequest>,
    ) -> Result<Response<Self::WipeStream>, Status> {
        let rid = self.accept(&request, CallKind::Destructive)?;
        let req = request.into_inner();
        let w = wwid(&req.wwid)?;
        let mode = match WipeMode::try_from(req.mode) {
            Ok(WipeMode::None) => Mode::Signatures,
            Ok(WipeMode::Discard) => Mode::Discard,
            Ok(WipeMode::Zero) => Mode::Zero,
            Ok(WipeMode::Random1) => Mode::Random(1),
            Ok(WipeMode::Random3) => Mode::Random(3),
            Ok(WipeMode::Unspecified) | Err(_) => {
                return Err(Status::invalid_argument("mode: unknown wipe mode"));
            }
        };
        // Check presence up front so a missing device is NOT_FOUND at once.
        if self.devices.lun(&w).map_err(to_status)?.is_none() {
            return Err(Status::not_found(format!(
                "no device with WWID {w} on node {}",
                self.node
            )));
        }
        let expected = req.expected_size_bytes;
        let (out_tx, out_rx) = mpsc::channel::<Result<WipeProgress, Status>>(16);
        let (step_tx, mut step_rx) = mpsc::channel(16);
        let devices = self.devices.clone();
        let span = span("Wipe", w.as_str(), &rid);
        let forward = out_tx.clone();
        let started = std::time::Instant::now();
        let metrics = self.wipes.clone();
        let failed_metrics = self.wipes.clone();
        tokio::spawn(async move {
            while let Some(s) = step_rx.recv().await {
                let s: crate::device::WipeStep = s;
                if s.done
                    && let Some(m) = &metrics
                {
                    let bytes = s.bytes_total.saturating_mul(u64::from(s.passes.max(1)));
                    m.finished(s.method, bytes, started.elapsed(), true);
                }
                let msg = WipeProgress {
                    bytes_done: s.bytes_done,
                    bytes_total: s.bytes_total,
                    pass: s.pass,
                    passes: s.passes,
                    method: s.method.to_owned(),
                    done: s.done,
                };
                if forward.send(Ok(msg)).await.is_err() {
                    break;
                }
            }
        });
        tokio::spawn(
            async move {
                if let Err(e) = devices.wipe(&w, mode, expected, step_tx).await {
                    tracing::warn!(error = %e, "wipe failed");
                    if let Some(m) = &failed_metrics {
                        let name = match mode {
                            Mode::Signatures => "signatures",
                            Mode::Discard => "discard",
                            Mode::Zero => "zero",
                            Mode::Random(_) => "random",
                        };
                        m.finished(name, 0, started.elapsed(), false);
                    }
                    let _ = out_tx.send(Err(to_status(e))).await;
                }
            }
            .instrument(span),
        );
        Ok(Response::new(Box::pin(ReceiverStream::new(out_rx))))
    }

    async fn rescan(
        &self,
        request: Request<RescanRequest>,
    ) -> Result<Response<RescanResponse>, Status> {
        let rid = self.accept(&request, CallKind::ReadOnly)?;
        let req = request.into_inner();
        let span = span("Rescan", &req.wwid, &rid);
        async move {
            let w = wwid(&req.wwid)?;
            let size_bytes = self.devices.rescan(&w).await.map_err(to_status)?;
            Ok(Response::new(RescanResponse { size_bytes }))
        }
        .instrument(span)
        .await
    }

    async fn verify(
        &self,
        request: Request<VerifyRequest>,
    ) -> Result<Response<VerifyResponse>, Status> {
        let rid = self.accept(&request, CallKind::ReadOnly)?;
        let req = request.into_inner();
        let span = span("Verify", &req.wwid, &rid);
        async move {
            let w = wwid(&req.wwid)?;
            if req.offsets.len() > crate::device::MAX_RANGES {
                return Err(Status::invalid_argument(format!(
                    "offsets: {} given, at most {} are read",
                    req.offsets.len(),
                    crate::device::MAX_RANGES
                )));
            }
            let v = self
                .devices
                .verify(
                    &w,
                    req.expected_size_bytes,
                    &req.offsets,
                    u64::from(req.length),
                )
                .await
                .map_err(to_status)?;
            Ok(Response::new(VerifyResponse {
                size_bytes: v.size_bytes,
                zeroes: v.nonzero_at.is_none(),
                nonzero_offset: v.nonzero_at.unwrap_or(0),
            }))
        }
        .instrument(span)
        .await
    }

    async fn status(
        &self,
        request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        self.accept(&request, CallKind::ReadOnly)?;
        let sessions = self
            .devices
            .iscsi_sessions()
            .into_iter()
            .map(|s| Session {
                target: s.target.clone(),
                iqn: s.target,
                portal: s.portal.map(|p| p.to_string()).unwrap_or_default(),
                state: s.state,
            })
            .collect();
        let devices = self
            .devices
            .luns()
            .map_err(to_status)?
            .iter()
            .map(lun_message)
            .collect();
        Ok(Response::new(StatusResponse {
            node: self.node.clone(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            sessions,
            devices,
        }))
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;

    fn iscsi(iqn: &str, chap: Option<(&str, &str)>) -> Target {
        Target {
            name: "array-a".to_owned(),
            transport: Some(target::Transport::Iscsi(IscsiTarget {
                portals: vec!["198.18.0.1:3260".to_owned()],
                iqn: iqn.to_owned(),
                chap: chap.map(|(u, p)| ChapCredentials {
                    username: u.to_owned(),
                    password: p.to_owned(),
                    mutual_username: String::new(),
                    mutual_password: String::new(),
                }),
            })),
        }
    }

    #[test]
    fn malformed_targets_are_invalid_arguments_naming_the_field() {
        let fc = |wwpns: Vec<String>| Target {
            name: "fc-1".to_owned(),
            transport: Some(target::Transport::FibreChannel(FibreChannelTarget {
                wwpns,
            })),
        };
        let huge = "t0p-s3cret".repeat(100);
        for (t, field) in [
            (iscsi("", None), "target.iscsi.iqn"),
            (iscsi("--op=delete", None), "target.iscsi.iqn"),
            (iscsi("iqn.x:a b", None), "target.iscsi.iqn"),
            (iscsi("array-a", None), "target.iscsi.iqn"),
            (
                iscsi("iqn.2003-01.org.example:a", Some(("u\nx", "pw"))),
                "target.iscsi.chap.username",
            ),
            (
                iscsi("iqn.2003-01.org.example:a", Some(("u", &huge))),
                "target.iscsi.chap.password",
            ),
            (fc(Vec::new()), "target.fibre_channel.wwpns"),
            (
                Target {
                    name: "array-a".to_owned(),
                    transport: None,
                },
                "target",
            ),
        ] {
            let status = target(&t).expect_err(field);
            assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
            assert!(status.message().contains(field), "{}", status.message());
            assert!(!status.message().contains("s3cret"), "{}", status.message());
        }
    }

    #[test]
    fn a_well_formed_target_parses() {
        let t = target(&iscsi(
            "iqn.2026-11.io.csi-scsi.lab:array-a",
            Some(("user", "secret")),
        ))
        .expect("valid");
        assert_eq!(t.name, "array-a");
        assert_eq!(
            t.lock_keys(),
            [crate::device::TargetKey::Iscsi(
                "iqn.2026-11.io.csi-scsi.lab:array-a".to_owned()
            )]
        );
    }
}
