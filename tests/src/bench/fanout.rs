//! Row 2, fan-out: Discover across 10, 100 and 1,000 agents through the
//! proxy's own client (`AgentPool` + `fan_out`, the code the discovery
//! reconciler runs, with the proxy's default bound of 64 calls in flight)
//! against the slowest single agent called alone.
//!
//! The agents are real tonic agent API servers in a helper process, each on
//! its own loopback port with its own certificate; 1 % of them (at least
//! one) take 500 ms to answer and 10 % take 20 ms. "Cold" passes start with
//! a fresh pool, so every agent costs a TCP connect and a full mutual TLS
//! handshake (as after a proxy restart); "warm" passes reuse the channels
//! (as every later discovery pass does). The process's open descriptors and
//! resident memory are read from /proc around the passes: the bench
//! process holds only the client side.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use csi_scsi_certs::{
    CertificateAuthority, Identity, TrustDomain, Validity, write_ca, write_issued,
};
use csi_scsi_contract::NodeName;
use csi_scsi_proto::agent::DiscoverRequest;
use csi_scsi_proxy::agents::{AgentPool, Backoff, CallConfig, fan_out};
use csi_scsi_proxy::directory::{AgentDirectory, FileDirectory};
use csi_scsi_proxy::leader::LeaderHandle;
use nix::sys::resource::{Resource, getrlimit, setrlimit};

use super::Options;
use super::fixture::fc_target;
use super::helpers::{DOMAIN, SLOW, fleet_node, latency_of, proxy_store};
use super::proc::{Proc, fd_count, rss_mib, wait_for_file};
use super::stats::{Samples, ms};
use super::table::{Row, Target, Unit, Verdict};

/// The proxy's default `--agent-concurrency`.
const CONCURRENCY: usize = 64;

/// Runs row 2.
pub async fn run(opts: Options, dir: PathBuf) -> Vec<Row> {
    measure(opts, &dir)
        .await
        .unwrap_or_else(|e| vec![Row::error(2, "Discover fan-out", format!("{e:#}"))])
}

/// The proxy's call settings (its command-line defaults).
fn call_config() -> anyhow::Result<CallConfig> {
    Ok(CallConfig {
        connect_timeout: Duration::from_secs(5),
        deadline: Duration::from_secs(60),
        wipe_deadline: Duration::from_secs(7200),
        attempts: 4,
        backoff: Backoff::try_new(Duration::from_millis(100), Duration::from_secs(5), 0.5)?,
        concurrency: CONCURRENCY,
    })
}

/// Raises this process's open-file limit to at least `want` (children
/// inherit it). Returns the soft limit now in force.
pub fn raise_nofile(want: u64) -> anyhow::Result<u64> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft >= want {
        return Ok(soft);
    }
    // Raising the hard limit needs CAP_SYS_RESOURCE; without it, go as far
    // as the hard limit allows.
    if setrlimit(Resource::RLIMIT_NOFILE, want, hard.max(want)).is_err() {
        setrlimit(Resource::RLIMIT_NOFILE, hard.min(want), hard)?;
    }
    Ok(getrlimit(Resource::RLIMIT_NOFILE)?.0)
}

async fn measure(opts: Options, dir: &Path) -> anyhow::Result<Vec<Row>> {
    let sizes: Vec<usize> = opts.pick(vec![10, 100, 1000], vec![10, 100]);
    let largest = sizes.iter().copied().max().unwrap_or(0);
    // Passes of each kind (the median is reported), and the extra warm
    // passes after which memory must not have grown.
    let (passes, extra_passes) = opts.pick((3, 5), (1, 2));
    let want = 3 * largest as u64 + 1024;
    let limit = raise_nofile(want)?;
    anyhow::ensure!(limit >= want, "RLIMIT_NOFILE is {limit}, {want} needed");

    let domain = TrustDomain::new(DOMAIN)?;
    let ca = CertificateAuthority::create(&domain, Validity::days(1))?;
    write_ca(&dir.join("ca"), &ca)?;
    write_issued(
        &dir.join("proxy"),
        &ca.issue(&Identity::Proxy, Validity::days(1))?,
    )?;
    let store = proxy_store(&dir.join("proxy"))?;
    let me = std::process::id();
    let mut rows = Vec::new();
    for &n in &sizes {
        let ports = dir.join(format!("fleet-{n}.txt"));
        let mut fleet = Proc::helper(
            &[
                "__agents".into(),
                "--ca".into(),
                dir.join("ca").display().to_string(),
                "--dir".into(),
                dir.join(format!("fleet-{n}")).display().to_string(),
                "--count".into(),
                n.to_string(),
                "--ports-file".into(),
                ports.display().to_string(),
            ],
            &dir.join(format!("fleet-{n}.log")),
        )?;
        wait_for_file(&ports, &mut fleet, Duration::from_secs(300)).await?;
        let agents_file = dir.join(format!("agents-{n}.txt"));
        std::fs::copy(&ports, &agents_file)?;
        let directory: Arc<dyn AgentDirectory> = FileDirectory::load(&agents_file)?;
        let nodes: Vec<NodeName> = (0..n).map(fleet_node).collect();
        let slowest = (0..n)
            .find(|&i| latency_of(i, n) == SLOW)
            .map(fleet_node)
            .context("no slow agent")?;
        let pass = |pool: Arc<AgentPool>, nodes: Vec<NodeName>| async move {
            let t = Instant::now();
            let results = fan_out(&pool, nodes, discover(), "bench-fan-out", CONCURRENCY).await;
            let elapsed = t.elapsed();
            let failed: Vec<String> = results
                .into_iter()
                .filter_map(|(node, r)| match r {
                    Ok(d) if d.luns.len() == 4 => None,
                    Ok(d) => Some(format!("{node}: {} LUNs, not 4", d.luns.len())),
                    Err(e) => Some(format!("{node}: {e}")),
                })
                .collect();
            (elapsed, failed)
        };
        let mut errors: Vec<String> = Vec::new();
        let (mut single_cold, mut single_warm, mut all_cold, mut all_warm) = (
            Samples::default(),
            Samples::default(),
            Samples::default(),
            Samples::default(),
        );
        for _ in 0..passes {
            let pool = AgentPool::new(
                directory.clone(),
                store.clone(),
                call_config()?,
                LeaderHandle::always(),
            );
            let (d, failed) = pass(pool.clone(), vec![slowest.clone()]).await;
            single_cold.push(d);
            errors.extend(failed);
            let (d, failed) = pass(pool, vec![slowest.clone()]).await;
            single_warm.push(d);
            errors.extend(failed);
        }
        // The handshakes alone: a cold fan-out to the agents that answer at
        // once, the floor under the cold row's excess over the slowest agent.
        let prompt: Vec<NodeName> = (0..n)
            .filter(|&i| latency_of(i, n) == Duration::ZERO)
            .map(fleet_node)
            .collect();
        let mut prompt_cold = Samples::default();
        if n == largest {
            for _ in 0..passes {
                let pool = AgentPool::new(
                    directory.clone(),
                    store.clone(),
                    call_config()?,
                    LeaderHandle::always(),
                );
                let (d, failed) = pass(pool, prompt.clone()).await;
                prompt_cold.push(d);
                errors.extend(failed);
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
        // Dropped pools close their connections in the background.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let fds_before = fd_count(me)?;
        let (rss_before, _) = rss_mib(me)?;
        let mut kept = None;
        for _ in 0..passes {
            let pool = AgentPool::new(
                directory.clone(),
                store.clone(),
                call_config()?,
                LeaderHandle::always(),
            );
            let (d, failed) = pass(pool.clone(), nodes.clone()).await;
            all_cold.push(d);
            errors.extend(failed);
            kept = Some(pool);
        }
        let pool = kept.context("no pass")?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let fds_held = fd_count(me)?.saturating_sub(fds_before);
        let (rss_after_cold, _) = rss_mib(me)?;
        for _ in 0..passes {
            let (d, failed) = pass(pool.clone(), nodes.clone()).await;
            all_warm.push(d);
            errors.extend(failed);
        }
        for _ in 0..extra_passes {
            let (_, failed) = pass(pool.clone(), nodes.clone()).await;
            errors.extend(failed);
        }
        let (rss_after_more, _) = rss_mib(me)?;
        let open_channels = pool.open_channels();
        drop(pool);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let fds_left = fd_count(me)?.saturating_sub(fds_before);
        fleet.check_alive()?;
        drop(fleet);

        let judged = n == largest;
        let slow_count = (0..n).filter(|&i| latency_of(i, n) == SLOW).count();
        let with_target = |row: Row, ratio: f64| {
            if judged {
                row.target(Target::RatioAtMost(ratio))
            } else {
                row
            }
        };
        let worst = all_cold.percentile(100.0);
        let mut cold = with_target(
            Row::new(2, format!("Discover fan-out to {n} agents, cold (vs slowest agent alone, cold)"), Unit::Millis, ms(all_cold.p50()))
                .baseline(ms(single_cold.p50())),
            1.6,
        )
        .note(format!(
            "median of {passes} passes each (worst pass {:.1} ms, {:.2}×); {slow_count} agent(s) at {} ms, {} at 20 ms, the rest at once; at most \
             {CONCURRENCY} calls in flight; cold = fresh pool (TCP connect + mutual TLS handshake per agent)",
            ms(worst),
            ms(worst) / ms(single_cold.p50()).max(f64::MIN_POSITIVE),
            SLOW.as_millis(),
            (0..n).filter(|&i| latency_of(i, n) == super::helpers::BUSY).count()
        ));
        let mut warm = with_target(
            Row::new(
                2,
                format!("Discover fan-out to {n} agents, warm (vs slowest agent alone, warm)"),
                Unit::Millis,
                ms(all_warm.p50()),
            )
            .baseline(ms(single_warm.p50())),
            2.0,
        );
        if !errors.is_empty() {
            let detail = format!(
                "{} failed calls, e.g. {}",
                errors.len(),
                errors[..errors.len().min(3)].join("; ")
            );
            for row in [&mut cold, &mut warm] {
                row.verdict = Verdict::Error;
                row.note = format!("{} {detail}", row.note).trim().to_owned();
            }
        }
        rows.push(cold);
        rows.push(warm);
        if judged {
            // Where the last slow agent stands in the fan-out's order.
            let last_slow = (0..n)
                .rev()
                .find(|&i| latency_of(i, n) == SLOW)
                .unwrap_or(0);
            rows.push(
                Row::new(2, format!("breakdown: cold fan-out to the {} agents that answer at once (vs slowest agent alone, cold)", prompt.len()), Unit::Millis, ms(prompt_cold.p50()))
                    .baseline(ms(single_cold.p50()))
                    .note(format!(
                        "the connects and mutual-TLS handshakes alone (both ends on this machine's cores), median of {passes} passes: \
                         the last slow agent (number {last_slow} of {n}) is called after about {:.0} ms of them, \
                         so the cold row cannot go below about {:.2}× here",
                        ms(prompt_cold.p50()) * last_slow as f64 / prompt.len().max(1) as f64,
                        (ms(prompt_cold.p50()) * last_slow as f64 / prompt.len().max(1) as f64 + ms(single_cold.p50()))
                            / ms(single_cold.p50()).max(f64::MIN_POSITIVE)
                    )),
            );
            rows.push(
                Row::new(2, format!("fds held by the pool after fan-out to {n} agents (vs agents)"), Unit::Fds, fds_held as f64)
                    .baseline(n as f64)
                    .target(Target::RatioAtMost(1.1))
                    .note(format!(
                        "one HTTP/2 connection per agent, reused by every pass ({open_channels} channels open); \
                         {fds_left} fds left after the pool is dropped; RLIMIT_NOFILE raised to {limit}"
                    )),
            );
            rows.push(
                Row::new(2, format!("bench RSS after {extra_passes} more fan-outs to {n} (vs after the first passes)"), Unit::Mebibytes, rss_after_more)
                    .baseline(rss_after_cold)
                    .target(Target::RatioAtMost(1.1))
                    .note(format!(
                        "{rss_before:.1} MiB before the fan-outs: {:.1} KiB per agent channel",
                        (rss_after_cold - rss_before).max(0.0) * 1024.0 / n as f64
                    )),
            );
        }
    }
    Ok(rows)
}

fn discover() -> DiscoverRequest {
    DiscoverRequest {
        target: Some(fc_target()),
    }
}
