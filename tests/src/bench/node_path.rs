//! Row 5, the node path: NodeStageVolume + NodePublishVolume of an
//! already-formatted ext4 volume through the real agent's CSI socket,
//! against a bare `mount` + `mount --bind` (the mount(8) commands) of the
//! same device node in the same run. Unpublish and unstage (and the bare
//! umounts) run between iterations and are not timed. The mount(2)
//! syscalls made directly are reported too: the floor under both.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};
use csi_scsi_proto::csi::NodeGetCapabilitiesRequest;
use nix::mount::{MntFlags, MsFlags, mount, umount2};

use super::fixture::{NodeFixture, publish, stage, unpublish, unstage};
use super::proc::sh;
use super::stats::{Samples, us};
use super::table::{Row, Target, Unit};
use super::{Options, is_root};
use crate::pki::Pki;

/// Runs row 5.
pub async fn run(opts: Options, dir: PathBuf) -> Vec<Row> {
    if !is_root() {
        return vec![Row::skipped(
            5,
            "NodeStage + NodePublish (vs mount + bind mount)",
            Unit::Micros,
            "needs root (loop devices, mounts)",
        )];
    }
    measure(opts, &dir)
        .await
        .unwrap_or_else(|e| vec![Row::error(5, "NodeStage + NodePublish", format!("{e:#}"))])
}

fn run_cmd(cmd: &str, args: &[&Path]) -> anyhow::Result<()> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .with_context(|| format!("running {cmd}"))?;
    if !out.status.success() {
        bail!(
            "{cmd} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

async fn measure(opts: Options, dir: &Path) -> anyhow::Result<Vec<Row>> {
    let n = opts.pick(100, 10);
    let warm = 3;
    let pki = Pki::init(dir);
    let mut node = NodeFixture::start(&dir.join("node-p"), &pki, "node-p", 1, 64 << 20).await?;
    let lun = &node.luns[0];
    let dev = lun.dev_node.clone();
    let id = lun.volume_id.clone();
    sh(
        "mkfs.ext4",
        &["-q", "-F", &lun.backing.device.display().to_string()],
    )?;
    let staging = node.staging("pv-node-path")?;
    let target = node.target("pod-1", "pv-node-path")?;
    let bare_stage = node.kubelet.join("bare/stage");
    let bare_target = node.kubelet.join("bare/target");
    std::fs::create_dir_all(&bare_stage)?;
    std::fs::create_dir_all(&bare_target)?;

    let (mut agent, mut bare, mut syscalls, mut calls, mut own) = (
        Samples::with_capacity(n),
        Samples::with_capacity(n),
        Samples::with_capacity(n),
        Samples::with_capacity(n),
        Samples::with_capacity(n),
    );
    for i in 0..(n + warm) {
        let counted = i >= warm;
        let t = Instant::now();
        stage(&mut node.node, &id, &staging)
            .await
            .context("NodeStageVolume")?;
        publish(&mut node.node, &id, &staging, &target)
            .await
            .context("NodePublishVolume")?;
        let node_path = t.elapsed();
        unpublish(&mut node.node, &id, &target)
            .await
            .context("NodeUnpublishVolume")?;
        unstage(&mut node.node, &id, &staging)
            .await
            .context("NodeUnstageVolume")?;
        if counted {
            agent.push(node_path);
        }

        let t = Instant::now();
        run_cmd(
            "mount",
            &[Path::new("-t"), Path::new("ext4"), &dev, &bare_stage],
        )?;
        run_cmd("mount", &[Path::new("--bind"), &bare_stage, &bare_target])?;
        let d = t.elapsed();
        run_cmd("umount", &[&bare_target])?;
        run_cmd("umount", &[&bare_stage])?;
        if counted {
            bare.push(d);
        }

        let t = Instant::now();
        mount(
            Some(&dev),
            &bare_stage,
            Some("ext4"),
            MsFlags::empty(),
            None::<&str>,
        )?;
        mount(
            Some(&bare_stage),
            &bare_target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )?;
        let d = t.elapsed();
        umount2(&bare_target, MntFlags::empty())?;
        umount2(&bare_stage, MntFlags::empty())?;
        if counted {
            syscalls.push(d);
        }

        // Two calls that do nothing on the node: the agent's CSI hops alone.
        let t = Instant::now();
        for _ in 0..2 {
            node.node
                .node_get_capabilities(NodeGetCapabilitiesRequest {})
                .await
                .context("NodeGetCapabilities")?;
        }
        let hops = t.elapsed();
        if counted {
            calls.push(hops);
            // Paired with this iteration's hops: the node path less them.
            own.push(node_path.saturating_sub(hops));
        }
    }
    node.agent.check_alive()?;
    Ok(vec![
        Row::new(5, "NodeStage + NodePublish p50 (vs `mount` + `mount --bind` p50)", Unit::Micros, us(agent.p50()))
            .baseline(us(bare.p50()))
            .target(Target::RatioAtMost(1.3))
            .note(format!(
                "{n} iterations after {warm} warm-up ones, the three kinds interleaved; the agent probes the device \
                 in process (libblkid, the asked type's superblock alone), then mounts with mount(2) itself; the baseline runs mount(8) twice on the same device node"
            )),
        Row::new(5, "NodeStage + NodePublish p99 (vs `mount` + `mount --bind` p99)", Unit::Micros, us(agent.p99()))
            .baseline(us(bare.p99())),
        Row::new(5, "NodeStage + NodePublish p50 (vs the two mount(2) syscalls alone)", Unit::Micros, us(agent.p50()))
            .baseline(us(syscalls.p50()))
            .target(Target::RatioAtMost(2.0))
            .note("the floor: the same two mounts made directly by the bench process, no process spawned"),
        Row::new(5, "breakdown: two NodeGetCapabilities calls p50 (vs the two mount(2) syscalls)", Unit::Micros, us(calls.p50()))
            .baseline(us(syscalls.p50()))
            .note("the CSI hops alone (gRPC over the agent's Unix socket, nothing done): part of 5c that no node path avoids"),
        Row::new(5, "breakdown: NodeStage + NodePublish less the two CSI hops p50 (vs the two mount(2) syscalls)", Unit::Micros, us(own.p50()))
            .baseline(us(syscalls.p50()))
            .note("per iteration, 5c's time less 5d's: what the agent does beyond what any plugin served over CSI pays (its checks, the probe, both mounts, its trips to the blocking pool)"),
    ])
}
