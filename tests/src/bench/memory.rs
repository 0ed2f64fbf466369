//! Row 4, the agent's memory: resident memory of the real agent process
//! idle (serving, its node showing 100 FC disks, no call made), then after
//! 100 volumes were staged through CSI (each formatted ext4 by the agent on
//! first stage, and mounted). The proxy's half of row 4 is measured in
//! [`super::inventory`].

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::fixture::{NodeFixture, stage, unstage};
use super::proc::{mount_points, rss_mib};
use super::table::{Row, Target, Unit};
use super::{Options, is_root};
use crate::pki::Pki;

/// Runs the agent half of row 4.
pub async fn run(opts: Options, dir: PathBuf) -> Vec<Row> {
    if !is_root() {
        return vec![Row::skipped(
            4,
            "agent RSS idle",
            Unit::Mebibytes,
            "needs root (loop devices, mounts)",
        )];
    }
    measure(opts, &dir)
        .await
        .unwrap_or_else(|e| vec![Row::error(4, "agent RSS", format!("{e:#}"))])
}

/// The highest VmRSS of `pid` over `samples` reads 100 ms apart.
async fn settled_rss(pid: u32, samples: usize) -> anyhow::Result<(f64, f64)> {
    let mut rss: f64 = 0.0;
    let mut peak = 0.0;
    for _ in 0..samples {
        let (r, p) = rss_mib(pid)?;
        rss = rss.max(r);
        peak = p;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok((rss, peak))
}

async fn measure(opts: Options, dir: &Path) -> anyhow::Result<Vec<Row>> {
    let n = opts.pick(100, 5);
    let pki = Pki::init(dir);
    let mut node = NodeFixture::start(&dir.join("node-m"), &pki, "node-m", n, 16 << 20).await?;
    let pid = node.agent.pid();
    let (settle, reads) = opts.pick(
        (Duration::from_secs(2), 10),
        (Duration::from_millis(500), 3),
    );
    tokio::time::sleep(settle).await;
    let (idle, idle_peak) = settled_rss(pid, reads).await?;
    let mut staged = Vec::with_capacity(n);
    let t = Instant::now();
    for i in 0..n {
        let staging = node.staging(&format!("pv-{i}"))?;
        let id = node.luns[i].volume_id.clone();
        stage(&mut node.node, &id, &staging).await?;
        staged.push((id, staging));
    }
    let stage_time = t.elapsed();
    let mounted = mount_points()
        .iter()
        .filter(|p| p.starts_with(&node.kubelet))
        .count();
    anyhow::ensure!(mounted == n, "{mounted} staging mounts, {n} expected");
    tokio::time::sleep(settle / 2).await;
    node.agent.check_alive()?;
    let (busy, busy_peak) = settled_rss(pid, reads).await?;
    for (id, staging) in &staged {
        unstage(&mut node.node, id, staging).await?;
    }
    Ok(vec![
        Row::new(4, "agent RSS idle", Unit::Mebibytes, idle)
            .target(Target::AtMost(16.0))
            .note(format!(
                "VmRSS (highest of {reads} reads 100 ms apart) {settle:?} after start, serving both sockets, {n} FC disks in its tree, \
                 no call yet; peak (VmHWM) {idle_peak:.1} MiB"
            )),
        Row::new(4, format!("agent RSS with {n} volumes staged (vs idle)"), Unit::Mebibytes, busy)
            .baseline(idle)
            .note(format!(
                "after {n} NodeStageVolume calls (mkfs.ext4 + mount each, {:.1} s in all); peak (VmHWM) {busy_peak:.1} MiB",
                stage_time.as_secs_f64()
            )),
    ])
}
