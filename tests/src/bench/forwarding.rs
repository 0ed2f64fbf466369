//! Row 1, forwarding overhead: ControllerPublishVolume from a CSI client
//! through the real proxy to the real agent over mTLS, against a bare tonic
//! mTLS unary call (the gRPC health check) to an echo server built like the
//! agent's API server, with the same certificates, on the same loopback.
//!
//! The volume is already published, so each call is the idempotent path
//! the external-attacher retries through: the proxy reads the device and
//! the targets from its store, calls Attach, and the agent rescans the FC
//! host and looks the device up by WWID (real sysfs and /dev lookups over
//! a prepared disk), with nothing to wait for. Calls are interleaved in
//! blocks of 50 so both sides see the same machine.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use csi_scsi_daemon::agent_channel;
use csi_scsi_proto::agent::AttachRequest;
use csi_scsi_proto::agent::agent_client::AgentClient;
use csi_scsi_proto::csi::{ControllerGetCapabilitiesRequest, ControllerPublishVolumeRequest};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use super::fixture::{NodeFixture, TARGET, WWPN, create_request, ext4, fc_target, start_proxy};
use super::helpers::proxy_store;
use super::proc::{Proc, wait_for_file};
use super::stats::{Samples, us};
use super::table::{Row, Target, Unit};
use super::{Options, is_root};
use crate::csi_client::csi_channel;
use crate::pki::Pki;

const BLOCK: usize = 50;

/// Runs row 1.
pub async fn run(opts: Options, dir: PathBuf) -> Vec<Row> {
    if !is_root() {
        return vec![Row::skipped(
            1,
            "ControllerPublish via proxy (vs mTLS echo)",
            Unit::Micros,
            "needs root (loop devices, device nodes)",
        )];
    }
    measure(opts, &dir).await.unwrap_or_else(|e| {
        vec![Row::error(
            1,
            "ControllerPublish via proxy (vs mTLS echo)",
            format!("{e:#}"),
        )]
    })
}

async fn measure(opts: Options, dir: &Path) -> anyhow::Result<Vec<Row>> {
    let n = opts.pick(1000, 100);
    let pki = Pki::init(dir);
    let node = NodeFixture::start(&dir.join("node-a"), &pki, "node-a", 1, 64 << 20).await?;
    let proxy_tls = pki.issue_proxy("proxy-tls");
    let pdir = dir.join("proxy");
    std::fs::create_dir_all(&pdir)?;
    std::fs::write(pdir.join("agents.txt"), format!("node-a {}\n", node.api))?;
    let targets = pdir.join("targets.json");
    std::fs::write(
        &targets,
        serde_json::to_string(&serde_json::json!([{
            "name": TARGET,
            "fibreChannel": { "wwpns": [format!("0x{WWPN}")] },
            "deviceLabels": { "tier": "fast" },
        }]))?,
    )?;
    let mut proxy = start_proxy(&pdir, &proxy_tls, Some(&targets)).await?;

    // The proxy discovers the LUN through the agent at start; bind it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let volume = loop {
        match proxy
            .controller
            .create_volume(create_request("pv-forwarding", "node-a"))
            .await
        {
            Ok(r) => break r.into_inner().volume.context("no volume")?,
            // Not discovered yet: no device at all, or none that fits.
            Err(s)
                if Instant::now() < deadline
                    && matches!(
                        s.code(),
                        tonic::Code::ResourceExhausted | tonic::Code::OutOfRange
                    ) =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(s) => anyhow::bail!("CreateVolume: {s}\nproxy log:\n{}", proxy.proc.log_tail()),
        }
    };
    let publish = ControllerPublishVolumeRequest {
        volume_id: volume.volume_id.clone(),
        node_id: "node-a".into(),
        volume_capability: Some(ext4()),
        readonly: false,
        secrets: Default::default(),
        volume_context: Default::default(),
    };
    // The first publish attaches for real; every later one is idempotent.
    let first = proxy
        .controller
        .controller_publish_volume(publish.clone())
        .await
        .with_context(|| format!("first ControllerPublishVolume\n{}", proxy.proc.log_tail()))?;
    anyhow::ensure!(
        first
            .into_inner()
            .publish_context
            .contains_key("devicePath"),
        "no devicePath"
    );

    // The baseline server, with the agent's own certificate directory.
    let port_file = dir.join("echo.port");
    let echo_socket = dir.join("echo.sock");
    let mut echo = Proc::helper(
        &[
            "__echo".into(),
            "--tls-dir".into(),
            node.tls.display().to_string(),
            "--node".into(),
            "node-a".into(),
            "--ports-file".into(),
            port_file.display().to_string(),
            "--socket".into(),
            echo_socket.display().to_string(),
        ],
        &dir.join("echo.log"),
    )?;
    let port = wait_for_file(&port_file, &mut echo, Duration::from_secs(20)).await?;
    let echo_addr = format!("127.0.0.1:{}", port.trim());
    let store = proxy_store(&proxy_tls)?;
    let mut health = HealthClient::new(agent_channel(
        &echo_addr,
        "node-a",
        store.clone(),
        Duration::from_secs(5),
    )?);
    let mut unix_health = HealthClient::new(
        csi_channel(&echo_socket)
            .await
            .context("the Unix-socket echo")?,
    );
    let mut direct = AgentClient::new(agent_channel(
        &node.api.to_string(),
        "node-a",
        store,
        Duration::from_secs(5),
    )?);
    let attach = AttachRequest {
        wwid: node.luns[0].wwid.clone(),
        targets: vec![fc_target()],
        lun: 0,
    };

    let (mut via_proxy, mut echoed, mut attached, mut unix_echoed, mut no_op) = (
        Samples::with_capacity(n),
        Samples::with_capacity(n),
        Samples::with_capacity(n),
        Samples::with_capacity(n),
        Samples::with_capacity(n),
    );
    let mut c = proxy.controller.clone();
    for round in 0..(n / BLOCK + 1) {
        // Round 0 warms every connection up and is not counted.
        let counted = round > 0;
        for _ in 0..BLOCK {
            let t = Instant::now();
            c.controller_publish_volume(publish.clone())
                .await
                .context("ControllerPublishVolume")?;
            if counted {
                via_proxy.push(t.elapsed());
            }
        }
        for _ in 0..BLOCK {
            let t = Instant::now();
            health
                .check(HealthCheckRequest {
                    service: String::new(),
                })
                .await
                .context("echo")?;
            if counted {
                echoed.push(t.elapsed());
            }
        }
        for _ in 0..BLOCK {
            let t = Instant::now();
            unix_health
                .check(HealthCheckRequest {
                    service: String::new(),
                })
                .await
                .context("Unix echo")?;
            if counted {
                unix_echoed.push(t.elapsed());
            }
        }
        for _ in 0..BLOCK {
            let t = Instant::now();
            c.controller_get_capabilities(ControllerGetCapabilitiesRequest {})
                .await
                .context("ControllerGetCapabilities")?;
            if counted {
                no_op.push(t.elapsed());
            }
        }
        for _ in 0..BLOCK {
            let t = Instant::now();
            direct.attach(attach.clone()).await.context("Attach")?;
            if counted {
                attached.push(t.elapsed());
            }
        }
    }
    proxy.proc.check_alive()?;
    let how = format!(
        "{} calls of each kind, interleaved in blocks of {BLOCK} after a warm-up block; the volume is already published, \
         so every call is the idempotent Attach: CSI over the proxy's Unix socket, two store \
         reads, one mTLS call; the agent answers from the attachment it recorded once the device behind the \
         by-id link still reports the WWID (no LIP, no scan)",
        via_proxy.len()
    );
    // The proxy's own share: the publish less the agent's Attach called
    // directly; its floor is the two hops it cannot avoid (a bare gRPC
    // call over a Unix socket, and one over mutual TLS).
    let share =
        |q: fn(&Samples) -> Duration| us(q(&via_proxy)).max(us(q(&attached))) - us(q(&attached));
    let floor = |q: fn(&Samples) -> Duration| us(q(&unix_echoed)) + us(q(&echoed));
    Ok(vec![
        Row::new(1, "ControllerPublish client→proxy→agent p50 (vs mTLS echo p50)", Unit::Micros, us(via_proxy.p50()))
            .baseline(us(echoed.p50()))
            .note(how),
        Row::new(1, "ControllerPublish client→proxy→agent p99 (vs mTLS echo p99)", Unit::Micros, us(via_proxy.p99()))
            .baseline(us(echoed.p99())),
        Row::new(1, "breakdown: agent Attach called directly p50 (vs echo p50)", Unit::Micros, us(attached.p50()))
            .baseline(us(echoed.p50()))
            .note("the bench calls the agent's Attach itself with the proxy's certificate"),
        Row::new(1, "breakdown: agent Attach called directly p99 (vs echo p99)", Unit::Micros, us(attached.p99()))
            .baseline(us(echoed.p99())),
        Row::new(1, "baseline: gRPC echo over a Unix socket p50 (vs mTLS echo p50)", Unit::Micros, us(unix_echoed.p50()))
            .baseline(us(echoed.p50()))
            .note("the same health service as the mTLS echo, served on a Unix socket by the same helper process"),
        Row::new(1, "breakdown: ControllerGetCapabilities via the proxy p50 (vs Unix echo p50)", Unit::Micros, us(no_op.p50()))
            .baseline(us(unix_echoed.p50()))
            .note("a call the proxy answers from memory: its CSI server stack (layers, request span, deadline scope) over the Unix hop"),
        Row::new(1, "proxy's own share (1a − 1c) p50 (vs Unix echo + mTLS echo p50)", Unit::Micros, share(Samples::p50))
            .baseline(floor(Samples::p50))
            .target(Target::RatioAtMost(1.5))
            .note("the two hops no forwarder avoids are the floor: everything else is the proxy's own work (the CSI layers, the store reads, the volume lock, the agent call's stack)"),
        Row::new(1, "proxy's own share (1b − 1d) p99 (vs Unix echo + mTLS echo p99)", Unit::Micros, share(Samples::p99))
            .baseline(floor(Samples::p99))
            .target(Target::RatioAtMost(2.0)),
    ])
}
