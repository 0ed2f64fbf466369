//! Row 7, attach storms on one node: N volumes (100; 5 with `--quick`) on
//! one lab node, ControllerPublish + NodeStage + NodePublish of all of them
//! issued at once (as the external-attacher's workers and kubelet do when
//! a node's Pods start together), against the same three calls for one
//! volume alone. The LUNs are the lab's pool (64 MiB each, one iSCSI
//! target served by tgtd, every node logged in through the lab's seam), so
//! the storm shares one session: the work is attaches, probes and mounts.
//!
//! The first storm formats every volume (first use); the second, after
//! every volume was unpublished, finds them formatted (Pods restarting or
//! moving), which is the figure with a target. The agent's peak memory and
//! descriptors during the storms are read from /proc.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use csi_scsi_proto::csi::volume_capability::access_mode::Mode;
use csi_scsi_proto::csi::{CapacityRange, CreateVolumeRequest, Volume};

use super::Options;
use super::proc::{fd_count, rss_mib};
use super::table::{Row, Target, Unit};
use crate::lab::scenario::{
    Clients, attach_and_mount_fs, capability, capacity, prefer, unmount_and_detach,
};
use crate::lab::{Lab, LabConfig, POOL_LUN_BYTES, node_name};

const SECTION: u8 = 7;
const NAME: &str = "attach storm on one node";

/// Runs the row on a runtime of its own (the lab's progress callback is
/// not `Send`); a failure becomes an error row.
pub fn run(opts: Options, dir: PathBuf) -> Vec<Row> {
    let n = opts.pick(100, 5);
    super::on_own_runtime(SECTION, NAME, "needs root (the lab)", measure(n, &dir))
}

/// Times of one volume alone.
const ALONE: usize = 3;

async fn measure(n: usize, dir: &Path) -> anyhow::Result<Vec<Row>> {
    let mut config = LabConfig::for_test(dir);
    // One more than the storm: the volume measured alone.
    config.pool_luns = n + 1;
    let lab = Lab::up(config, &mut |_| {}).await?;
    let node = node_name(0);
    let agent = lab.nodes[0]
        .agent
        .as_ref()
        .context("the node's agent")?
        .pid();
    let mut clients = Clients::connect(&lab).await?;
    let want = (n as i64 + 1) * POOL_LUN_BYTES as i64;
    let deadline = Instant::now() + Duration::from_secs(120);
    while capacity(&mut clients.controller, Some(&node), "tier=pool").await? < want {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the pool was not discovered in 120 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut volumes = Vec::with_capacity(n + 1);
    for i in 0..=n {
        let created = clients
            .controller
            .create_volume(CreateVolumeRequest {
                name: format!("storm-{i}"),
                capacity_range: Some(CapacityRange {
                    required_bytes: 32 << 20,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![capability(false, "ext4", Mode::SingleNodeWriter)],
                parameters: [("deviceSelector".to_owned(), "tier=pool".to_owned())].into(),
                accessibility_requirements: Some(prefer(&node)),
                ..Default::default()
            })
            .await
            .with_context(|| format!("CreateVolume storm-{i}"))?;
        volumes.push(created.into_inner().volume.context("no volume")?);
    }
    let alone = &volumes[n];
    let storm = &volumes[..n];

    // One volume alone: first use (formats), then formatted, a few times.
    let alone_first = one_alone(&lab, &mut clients, alone, &node).await?;
    let mut alone_formatted = Vec::with_capacity(ALONE);
    for _ in 0..ALONE {
        alone_formatted.push(one_alone(&lab, &mut clients, alone, &node).await?);
    }
    alone_formatted.sort();
    let alone_formatted = alone_formatted[ALONE / 2];

    let (first, first_fds) = all_at_once(&lab, &clients, storm, &node, agent).await?;
    release_all(&lab, &clients, storm, &node).await?;
    let (formatted, formatted_fds) = all_at_once(&lab, &clients, storm, &node, agent).await?;
    let (_, peak_rss) = rss_mib(agent)?;
    let idle_fds = fd_count(agent)?;
    release_all(&lab, &clients, storm, &node).await?;

    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    Ok(vec![
        Row::new(
            SECTION,
            format!("{n} volumes at once on one node, formatted (vs {n} × one alone)"),
            Unit::Millis,
            ms(formatted),
        )
        .baseline(ms(alone_formatted) * n as f64)
        .target(Target::RatioAtMost(0.2))
        .note(format!(
            "ControllerPublish + NodeStage + NodePublish of {n} volumes issued together, every volume already ext4 \
             (the second storm); one alone takes {:.0} ms (median of {ALONE}); pool LUNs of 64 MiB behind one iSCSI target",
            ms(alone_formatted)
        )),
        Row::new(
            SECTION,
            format!("{n} volumes at once on one node, formatted (vs one alone)"),
            Unit::Millis,
            ms(formatted),
        )
        .baseline(ms(alone_formatted)),
        Row::new(
            SECTION,
            format!("{n} volumes at once on one node, first use: mkfs each (vs {n} × one alone)"),
            Unit::Millis,
            ms(first),
        )
        .baseline(ms(alone_first) * n as f64)
        .note(format!(
            "the first storm formats every volume (mkfs.ext4 is CPU work on two cores): no target; one alone takes {:.0} ms",
            ms(alone_first)
        )),
        Row::new(
            SECTION,
            "agent peak memory (VmHWM) after both storms",
            Unit::Mebibytes,
            peak_rss,
        ),
        Row::new(
            SECTION,
            "agent peak descriptors during the storms (vs after them)",
            Unit::Fds,
            first_fds.max(formatted_fds) as f64,
        )
        .baseline(idle_fds as f64)
        .note("sampled every 10 ms from /proc/<agent>/fd"),
    ])
}

/// Publishes, stages and mounts `vol` alone, timed; then releases it.
async fn one_alone(
    lab: &Lab,
    clients: &mut Clients,
    vol: &Volume,
    node: &str,
) -> anyhow::Result<Duration> {
    let t = Instant::now();
    attach_and_mount_fs(lab, clients, vol, node, false, "ext4", "alone", false).await?;
    let took = t.elapsed();
    unmount_and_detach(lab, clients, vol, node, "alone").await?;
    Ok(took)
}

/// Publishes, stages and publishes every volume at once; the time until
/// the last is mounted, and the most descriptors the agent held meanwhile.
async fn all_at_once(
    lab: &Lab,
    clients: &Clients,
    volumes: &[Volume],
    node: &str,
    agent: u32,
) -> anyhow::Result<(Duration, usize)> {
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut peak = 0;
            while !stop.load(Ordering::Relaxed) {
                peak = peak.max(fd_count(agent).unwrap_or(0));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            peak
        }
    });
    let started = Instant::now();
    let calls = volumes.iter().enumerate().map(|(i, vol)| {
        let mut cl = clients.clone();
        async move {
            attach_and_mount_fs(
                lab,
                &mut cl,
                vol,
                node,
                false,
                "ext4",
                &format!("pod-{i}"),
                false,
            )
            .await
            .with_context(|| format!("volume {i}"))
        }
    });
    let results = futures::future::join_all(calls).await;
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let peak = sampler.await.unwrap_or(0);
    for r in results {
        r?;
    }
    Ok((took, peak))
}

/// Unpublishes, unstages and detaches every volume (untimed), at once.
async fn release_all(
    lab: &Lab,
    clients: &Clients,
    volumes: &[Volume],
    node: &str,
) -> anyhow::Result<()> {
    let calls = volumes.iter().enumerate().map(|(i, vol)| {
        let mut cl = clients.clone();
        async move {
            unmount_and_detach(lab, &mut cl, vol, node, &format!("pod-{i}"))
                .await
                .with_context(|| format!("releasing volume {i}"))
        }
    });
    for r in futures::future::join_all(calls).await {
        r?;
    }
    Ok(())
}
