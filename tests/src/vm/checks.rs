//! What only a real kernel can show, played on a VM lab after its life
//! cycle (`lab up --vm`): each check drives the driver through its CSI
//! sockets, acts on the fabric or the guest's links as an array or a
//! pulled cable would, and asserts what the guest's kernel, dm-multipath
//! and the agent did. Any failed assertion fails the run.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use csi_scsi_proto::csi::*;

use super::guest::Guest;
use crate::lab::Lab;
use crate::lab::scenario::{
    self, Clients, Report, attach_and_mount_fs, create, unmount, unmount_and_detach,
};
use crate::tgt::LunIdentity;

/// Every check, in order. Leaves every volume it made deleted.
pub async fn run(lab: &mut Lab, r: &mut Report) -> anyhow::Result<()> {
    let mut cl = Clients::connect(lab).await?;
    let vol = r
        .step(
            "real kernel: CreateVolume pvc-vm-1 (xfs, array=a) and publish it on node-a through both portals",
            async {
                // 600 MiB: only array-a's own LUNs fit (not mp, which
                // array-b exports too), so both paths are array-a's portals.
                let v = create(
                    &mut cl,
                    "pvc-vm-1",
                    600 << 20,
                    false,
                    &[("deviceSelector", "array=a"), ("fsType", "xfs")],
                    "node-a",
                )
                .await?;
                attach_and_mount_fs(lab, &mut cl, &v, "node-a", false, "xfs", "pod-vm-1", false)
                    .await?;
                // The attach hands out the map as soon as it exists; a
                // path whose scan finished later joins it a moment after.
                let map = wait_map(guest(lab, 0)?, wwid_of(&v)?, |m| m.active == 2, Duration::from_secs(30))
                    .await
                    .context("the map should have 2 active paths")?;
                Ok((v, format!("map {} with 2 active paths", map.name)))
            },
        )
        .await?;
    let target = scenario::volume_paths(lab, &vol, "node-a", "pod-vm-1")?.1;

    let chunk = |k: u32| -> Vec<u8> {
        (0..256 * 1024u32)
            .map(|i| (i.wrapping_mul(2654435761).wrapping_add(k * 7919) >> 11) as u8)
            .collect()
    };
    let written = r.step(
        "failover: NIC 2 of node-a cut while a writer writes; writes go on, the path comes back, nothing is lost",
        async {
            let node = &lab.nodes[0];
            let vm = node.vm.as_ref().context("vm")?;
            let g = &vm.guest;
            let mut written = 0u32;
            let mut slowest = Duration::ZERO;
            let cut_at = Instant::now();
            vm.set_link(1, false).await?;
            // Keep writing (each chunk fsynced) until multipath has failed
            // the cut path and the writes still went through.
            let mut failed_seen = false;
            while cut_at.elapsed() < Duration::from_secs(60) {
                let t = Instant::now();
                g.write(&target.join(format!("chunk-{written}")), None, &chunk(written))
                    .await
                    .with_context(|| format!("write {written} during the cut"))?;
                slowest = slowest.max(t.elapsed());
                written += 1;
                if !failed_seen {
                    failed_seen = map_of(g, wwid_of(&vol)?).await?.failed == 1;
                } else if written >= 10 {
                    break;
                }
            }
            ensure!(failed_seen, "multipath never failed the cut path");
            vm.set_link(1, true).await?;
            let back = wait_map(g, wwid_of(&vol)?, |m| m.active == 2, Duration::from_secs(90))
                .await
                .context("the path was not reinstated")?;
            for k in 0..written {
                let data = g.read(&target.join(format!("chunk-{k}")), None).await?;
                ensure!(data == chunk(k), "chunk {k} differs after the failover");
            }
            Ok((
                written,
                format!(
                    "{written} writes of 256 KiB, each fsynced, the slowest {:.1}s while the path failed; reinstated after {:.1}s: {}",
                    slowest.as_secs_f64(),
                    cut_at.elapsed().as_secs_f64(),
                    back.summary()
                ),
            ))
        },
    )
    .await?;

    r.step(
        "all paths lost while mounted: the array drops node-a's sessions and refuses it; the map queues then fails, stats say so, nothing is detached",
        async {
            let g = &guest(lab, 0)?.clone();
            let wwid = wwid_of(&vol)?;
            let tgtd = lab.tgtd.as_mut().context("tgtd")?;
            tgtd.unbind_all(1).await?;
            let dropped = tgtd.drop_connections(1).await?;
            wait_map(g, wwid, |m| m.active == 0, Duration::from_secs(60))
                .await
                .context("the paths did not fail")?;
            // A direct read of the map: held while multipath queues
            // (no_path_retry), then an I/O error.
            let t = Instant::now();
            let map = map_of(g, wwid).await?;
            let (code, out) = g
                .exec(&[
                    "dd",
                    &format!("if=/dev/mapper/{}", map.name),
                    "of=/dev/null",
                    "bs=4096",
                    "count=1",
                    "iflag=direct",
                ])
                .await?;
            let queued = t.elapsed();
            ensure!(code != 0, "a read with every path gone succeeded: {out}");
            let stats = node_stats(&cl, lab, &vol, "node-a", "pod-vm-1").await?;
            let cond = stats.abnormal_message.context("no condition in NodeGetVolumeStats")?;
            ensure!(cond.contains("no path"), "the condition does not say the paths are gone: {cond}");
            let refused = scenario::controller_unpublish(&mut cl, &vol, "node-a").await;
            ensure!(refused.is_err(), "ControllerUnpublish of a mounted volume was accepted");
            ensure!(
                map_of(g, wwid).await.is_ok(),
                "the map is gone: something detached it"
            );
            // The array takes node-a back: the paths recover on their own.
            let tgtd = lab.tgtd.as_mut().context("tgtd")?;
            tgtd.bind_all(1).await?;
            let back = wait_map(g, wwid, |m| m.active == 2, Duration::from_secs(120))
                .await
                .context("the paths did not come back")?;
            // The filesystem may have shut down on the failed I/O: kubelet
            // remounts (unstage, stage); everything fsynced before is there.
            unmount(lab, &mut cl, &vol, "node-a", "pod-vm-1").await?;
            attach_and_mount_fs(lab, &mut cl, &vol, "node-a", false, "xfs", "pod-vm-1", false)
                .await?;
            for k in 0..written {
                let data = g.read(&target.join(format!("chunk-{k}")), None).await?;
                ensure!(data == chunk(k), "chunk {k} differs after every path was lost");
            }
            Ok((
                (),
                format!(
                    "{dropped} connections dropped; a read failed after {:.1}s ({}); condition: {cond}; unpublish refused: {}; back: {}; remounted, {written} chunks intact",
                    queued.as_secs_f64(),
                    out.lines().next().unwrap_or("").trim(),
                    refused
                        .err()
                        .and_then(|e| e.downcast_ref::<tonic::Status>().map(|s| s.code().to_string()))
                        .unwrap_or_default(),
                    back.summary()
                ),
            ))
        },
    )
    .await?;

    r.step(
        "agent restart with the volume mounted: the guest's agent is killed and comes back; it serves the volume from the live sessions, map and mounts",
        async {
            let g = guest(lab, 0)?;
            g.run(&["sh", "-c", "kill -9 $(cat /run/agent.pid)"]).await?;
            let t = Instant::now();
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                if let Ok(s) = node_stats(&cl, lab, &vol, "node-a", "pod-vm-1").await {
                    ensure!(s.abnormal_message.is_none(), "abnormal after restart: {:?}", s.abnormal_message);
                    break;
                }
                ensure!(t.elapsed() < Duration::from_secs(60), "the agent did not come back");
            }
            // The data written before the restart is there.
            let data = g.read(&target.join("chunk-0"), None).await?;
            ensure!(data.len() == 256 * 1024, "chunk-0 is {} bytes", data.len());
            Ok(((), format!("serving again after {:.1}s", t.elapsed().as_secs_f64())))
        },
    )
    .await?;

    r.step(
        "detach on the real kernel: unpublish, unstage, ControllerUnpublish; the map, its paths, their links and array-a's sessions are gone from node-a",
        async {
            // The agent's log (its second serial port) says when it logs
            // out; discovery logs in again on its next pass, by design.
            let log = lab.config.dir.join("nodes/node-a/agent.log");
            let logouts = || {
                std::fs::read_to_string(&log)
                    .map(|t| {
                        t.lines()
                            .filter(|l| l.contains("logged out") && l.contains("array-a"))
                            .count()
                    })
                    .unwrap_or(0)
            };
            let before = logouts();
            unmount_and_detach(lab, &mut cl, &vol, "node-a", "pod-vm-1").await?;
            let g = guest(lab, 0)?;
            let left = leftovers(g, wwid_of(&vol)?).await?;
            ensure!(left.is_empty(), "left behind on node-a: {left}");
            let until = Instant::now() + Duration::from_secs(5);
            while logouts() == before {
                ensure!(
                    Instant::now() < until,
                    "node-a did not log out of array-a, which no attached LUN uses any more"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok((
                (),
                "no map, no /sys/block path, no /dev/disk link of the LUN; array-a's idle maps removed and its sessions logged out".into(),
            ))
        },
    )
    .await?;

    r.step(
        "online resize2fs: an ext4 volume on b1 mounted on node-b; the array grows b1; the paths are rescanned, the map resized, ext4 grown while mounted",
        async { ext4_online_growth(lab, &mut cl).await },
    )
    .await?;

    r.step(
        "LUN number reused by the array: node-a's staged-to-be LUN is unmapped and another mapped at its number; NodeStage refuses, nothing is written",
        async { lun_reuse(lab, &mut cl).await },
    )
    .await?;

    r.step(
        "stale map: the array grows a LUN while node-a's agent is down (its rescan fails); data in the new tail; DeleteVolume: node-a's agent grows its map and wipes the whole LUN",
        async { stale_map_wipe(lab, &mut cl).await },
    )
    .await?;

    r.step("DeleteVolume pvc-vm-1", async {
        scenario::delete(&mut cl, &vol).await?;
        Ok(((), String::new()))
    })
    .await?;
    Ok(())
}

/// The stale-map check (issue 35, item 1): after an expansion, a node
/// whose rescan failed keeps its multipath map at the old size; the wipe
/// on that node must cover the size the inventory records (the agent grows
/// the map first), or be refused, never erase the old prefix only.
async fn stale_map_wipe(lab: &mut Lab, cl: &mut Clients) -> anyhow::Result<((), String)> {
    // 700 MiB on array-a: a1 is pvc-vm-1's and mp (512 MiB) too small, so
    // only a2 (1 GiB) fits. Raw block: a wipe needs no filesystem.
    let v = create(
        cl,
        "pvc-vm-stale",
        700 << 20,
        true,
        &[("deviceSelector", "array=a"), ("cleanup", "discard")],
        "node-a",
    )
    .await?;
    let wwid = wwid_of(&v)?.to_owned();
    let (name, file) = scenario::lun_file(lab, &wwid).context("the bound LUN")?;
    ensure!(
        matches!(name.as_str(), "a1" | "a2"),
        "array=a bound {name}, not one of its own LUNs"
    );
    let g = guest(lab, 0)?.clone();
    // The proxy wipes on the first node (by name) that sees the LUN:
    // node-a, once it is back on array-a (it logged out in the detach
    // check; discovery logs it in again) and listed on the device.
    wait_map(&g, &wwid, |m| m.active >= 1, Duration::from_secs(60))
        .await
        .context("the LUN's map on node-a")?;
    wait_node_listed(lab, &wwid, "node-a").await?;

    // node-a's agent dies (and stays down: /run/agent.stopped) before the
    // array grows the LUN, so the controller's rescan cannot reach node-a.
    g.run(&[
        "sh",
        "-c",
        // SIGKILL: a draining agent would still answer the rescan.
        "touch /run/agent.stopped; p=$(cat /run/agent.pid); kill -9 $p; \
         while kill -0 $p 2>/dev/null; do sleep 1; done",
    ])
    .await?;
    let (old, new) = lab.grow_lun(&name, 64 << 20).await?;
    let grown = cl
        .controller
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: v.volume_id.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: new as i64,
                limit_bytes: 0,
            }),
            secrets: HashMap::new(),
            volume_capability: Some(scenario::capability(
                true,
                "",
                csi_scsi_proto::csi::volume_capability::access_mode::Mode::SingleNodeWriter,
            )),
        })
        .await
        .context("ControllerExpandVolume (node-b's and node-c's rescans)")?
        .into_inner()
        .capacity_bytes;
    ensure!(
        grown as u64 == new,
        "ControllerExpand answered {grown} bytes, the array has {new}"
    );
    // Another tenant's data in the tail only the new size covers (and at
    // the very end), written on the array itself.
    let marker =
        b"data past the old end of the LUN: only a wipe of the new size removes it\n".repeat(1000);
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::OpenOptions::new().write(true).open(&file)?;
        for at in [old, new - marker.len() as u64] {
            f.seek(SeekFrom::Start(at))?;
            f.write_all(&marker)?;
        }
        f.sync_all()?;
    }
    g.run(&["rm", "-f", "/run/agent.stopped"]).await?;
    let t = Instant::now();
    while cl
        .node("node-a")
        .node_get_info(NodeGetInfoRequest {})
        .await
        .is_err()
    {
        ensure!(
            t.elapsed() < Duration::from_secs(60),
            "node-a's agent did not come back"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    wait_node_listed(lab, &wwid, "node-a").await?;
    let map = format!("/dev/mapper/3{}", wwid.trim_start_matches("naa."));
    let map_size = |g: Guest| {
        let map = map.clone();
        async move {
            let out = g.run(&["blockdev", "--getsize64", &map]).await?;
            out.trim()
                .parse::<u64>()
                .with_context(|| format!("blockdev --getsize64 {map}: {out}"))
        }
    };
    let stale = map_size(g.clone()).await?;
    ensure!(
        stale == old,
        "node-a's map is {stale} bytes before the delete, not the old {old}: nothing is stale"
    );
    // Its paths: discovery's session rescan (`iscsiadm --rescan`) re-reads
    // their capacity, so they may be new already; the map keeps the size
    // it was built with (multipathd does not resize it by itself).
    let paths = g
        .run(&[
            "sh",
            "-c",
            &format!(
                "d=$(basename $(readlink -f {map})); for s in /sys/block/$d/slaves/*; do \
                 echo \"$(basename $s) $(( $(cat $s/size) * 512 >> 20 )) MiB\"; done"
            ),
        ])
        .await?;
    let log = lab.config.dir.join("nodes/node-a/agent.log");
    let log_from = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);

    let t = Instant::now();
    scenario::delete(cl, &v).await?;
    if let Err(e) = lab
        .wait_device_phase(&wwid, "Available", Duration::from_secs(90))
        .await
    {
        let reason = crate::reliability::store::run(
            &lab.proxy_store(),
            &format!("SELECT phase, reason FROM devices WHERE wwid = '{wwid}'"),
        )
        .unwrap_or_default();
        bail!("{e:#}: {}", reason.trim());
    }
    let released_in = t.elapsed();
    let after = map_size(g.clone()).await?;
    ensure!(
        after == new,
        "{name} is Available, but node-a's map is {after} bytes, the LUN {new}"
    );
    let text = std::fs::read(&log)?;
    let text = strip_ansi(&String::from_utf8_lossy(&text[log_from as usize..]));
    let resized = text
        .lines()
        .any(|l| l.contains("multipath map resized") && l.contains(&wwid));
    ensure!(
        resized,
        "node-a's agent did not resize {name}'s map (its log since the delete):\n{text}"
    );
    let bytes = text
        .lines()
        .filter(|l| l.contains(" wiped") && l.contains(&wwid))
        .find_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("bytes="))
                .and_then(|b| b.parse::<u64>().ok())
        })
        .with_context(|| {
            format!("node-a's agent did not wipe {name} (its log since the delete):\n{text}")
        })?;
    ensure!(bytes >= new, "node-a wiped {bytes} bytes of a LUN of {new}");
    let len = std::fs::metadata(&file)?.len();
    ensure!(len == new, "{name}'s file is {len} bytes, not {new}");
    ensure!(
        scenario::all_zero(&file)?,
        "{name} is Available but its file still holds data (the tail marker?)"
    );
    Ok((
        (),
        format!(
            "{name} {} -> {} MiB; node-a's rescan failed (agent down); before the delete node-a's map {} MiB, its paths {}; released in {:.1}s: node-a's agent grew its map to {} MiB and wiped {} bytes; the whole backing file (with the tail markers) reads zeroes",
            old >> 20,
            new >> 20,
            stale >> 20,
            paths.trim().replace('\n', ", "),
            released_in.as_secs_f64(),
            after >> 20,
            bytes
        ),
    ))
}

/// Waits until the proxy's store lists `node` among the nodes that see
/// `wwid` (discovery re-adds a node that logged in again or came back).
async fn wait_node_listed(lab: &Lab, wwid: &str, node: &str) -> anyhow::Result<()> {
    let t = Instant::now();
    loop {
        let nodes = crate::reliability::store::run(
            &lab.proxy_store(),
            &format!("SELECT node FROM device_nodes WHERE wwid = '{wwid}'"),
        )?;
        if nodes.lines().any(|n| n.trim() == node) {
            return Ok(());
        }
        ensure!(
            t.elapsed() < Duration::from_secs(60),
            "the proxy does not list {node} for {wwid}: {}",
            nodes.trim().replace('\n', ",")
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `text` without its terminal colour codes (the agent logs to a serial
/// console, a terminal).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // ESC [ ... final byte (a letter).
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The reuse check: a volume on array-b's LUN, published to node-a; the
/// array swaps another LUN in at that number; the stage must refuse on
/// the identity the kernel reads again, and the new LUN stays untouched.
async fn lun_reuse(lab: &mut Lab, cl: &mut Clients) -> anyhow::Result<((), String)> {
    // 600 MiB: only b1 fits (LUN 1 of array-b).
    let v = create(
        cl,
        "pvc-vm-reuse",
        600 << 20,
        false,
        &[("deviceSelector", "array=b"), ("fsType", "xfs")],
        "node-a",
    )
    .await?;
    let wwid = wwid_of(&v)?.to_owned();
    let (name, file) = scenario::lun_file(lab, &wwid).context("the bound LUN")?;
    let (tid, lun) = match name.as_str() {
        "b1" => (2, 1),
        other => bail!("array=b bound {other}, not b1"),
    };
    let ctx = cl
        .controller
        .controller_publish_volume(ControllerPublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            node_id: "node-a".into(),
            volume_capability: Some(scenario::capability(
                false,
                "xfs",
                csi_scsi_proto::csi::volume_capability::access_mode::Mode::SingleNodeWriter,
            )),
            readonly: false,
            secrets: HashMap::new(),
            volume_context: v.volume_context.clone(),
        })
        .await
        .context("ControllerPublishVolume")?
        .into_inner()
        .publish_context;
    // The array: the LUN goes, another (with a marker) takes its number.
    let other = lab.config.dir.join("luns/reused.img");
    let marker = b"another tenant's LUN: never write here".repeat(100);
    std::fs::write(&other, &marker)?;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&other)?
        .set_len(256 << 20)?;
    let tgtd = lab.tgtd.as_mut().context("tgtd")?;
    tgtd.remove_lun(tid, lun).await?;
    tgtd.add_lun(tid, lun, &other, &LunIdentity::lab(7, 1))
        .await?;
    let node = &lab.nodes[0];
    // The array's unit attention says the inquiry data changed; node-a's
    // paths read it again (as an operator's or a tool's rescan would), so
    // the kernel now reports the new LUN's WWID under the old map.
    let g = &node.vm.as_ref().context("vm")?.guest;
    g.run(&[
        "sh",
        "-c",
        "for d in /sys/block/sd*/device/rescan; do echo 1 > $d; done",
    ])
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (staging, _) = scenario::volume_paths(lab, &v, "node-a", "pod-vm-r")?;
    node.mkdir(&staging).await?;
    let staged = cl
        .node("node-a")
        .node_stage_volume(NodeStageVolumeRequest {
            volume_id: v.volume_id.clone(),
            publish_context: ctx,
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(scenario::capability(
                false,
                "xfs",
                csi_scsi_proto::csi::volume_capability::access_mode::Mode::SingleNodeWriter,
            )),
            secrets: HashMap::new(),
            volume_context: v.volume_context.clone(),
        })
        .await;
    let after = std::fs::read(&other)?;
    let untouched =
        after[..marker.len()] == marker[..] && after[marker.len()..].iter().all(|&b| b == 0);
    // The array puts the volume's LUN back, so the volume can be cleaned up.
    let tgtd = lab.tgtd.as_mut().context("tgtd")?;
    tgtd.remove_lun(tid, lun).await?;
    tgtd.add_lun(tid, lun, &file, &LunIdentity::lab(2, 1))
        .await?;
    let status = match staged {
        Ok(_) => bail!("NodeStage of a LUN whose number was reused succeeded"),
        Err(s) => s,
    };
    ensure!(untouched, "the other LUN was written to");
    ensure!(
        status.message().contains("WWID"),
        "NodeStage was refused, but not for the changed identity: {status:?}"
    );
    // The operator's repair once the array has b1 back: node-a's paths
    // read their identity again, and the maps multipathd built while the
    // paths reported the other LUN are rebuilt (`multipath -F`: unused maps
    // only; then `multipath`). Until then the agent refuses to detach a
    // path another LUN's map holds, as it must.
    let g = guest(lab, 0)?;
    let before = g.run(&["multipath", "-ll"]).await?;
    g.run(&[
        "sh",
        "-c",
        "for d in /sys/block/sd*/device/rescan; do echo 1 > $d; done; sleep 2; multipath -F; multipath >/dev/null",
    ])
    .await?;
    wait_map(g, &wwid, |m| m.active == 2, Duration::from_secs(60))
        .await
        .with_context(|| format!("b1's map after the repair (before it: {before})"))?;
    scenario::controller_unpublish(cl, &v, "node-a")
        .await
        .context("after the LUN came back")?;
    scenario::delete(cl, &v).await?;
    Ok((
        (),
        format!(
            "{name} swapped for another LUN at LUN {lun}: NodeStage {}: {}; the other LUN untouched",
            status.code(),
            status.message()
        ),
    ))
}

/// An ext4 volume grown while mounted: what this machine's kernel cannot
/// do (no online resize2fs), a real one can.
async fn ext4_online_growth(lab: &mut Lab, cl: &mut Clients) -> anyhow::Result<((), String)> {
    // 600 MiB: only b1 fits (1 GiB, LUN 1 of array-b; node-b is in its ACL).
    let v = create(
        cl,
        "pvc-vm-ext4",
        600 << 20,
        false,
        &[
            ("deviceSelector", "array=b"),
            ("fsType", "ext4"),
            ("cleanup", "discard"),
        ],
        "node-b",
    )
    .await?;
    let (name, _) = scenario::lun_file(lab, wwid_of(&v)?).context("the bound LUN")?;
    ensure!(name == "b1", "array=b bound {name}, not b1");
    let target =
        attach_and_mount_fs(lab, cl, &v, "node-b", false, "ext4", "pod-vm-e", false).await?;
    let g = guest(lab, 1)?.clone();
    let df = |out: String| -> anyhow::Result<u64> {
        out.lines()
            .nth(1)
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|k| k.parse::<u64>().ok())
            .context("df output")
    };
    let t = target.display().to_string();
    let before = df(g.run(&["df", "-k", &t]).await?)?;
    let (old, new) = lab.grow_lun("b1", 256 << 20).await?;
    scenario::expand(lab, cl, &v, "node-b", "pod-vm-e", "ext4", new).await?;
    let after = df(g.run(&["df", "-k", &t]).await?)?;
    ensure!(
        after > before + (200 << 10),
        "ext4 did not grow online: {before} KiB -> {after} KiB"
    );
    unmount_and_detach(lab, cl, &v, "node-b", "pod-vm-e").await?;
    scenario::delete(cl, &v).await?;
    // The next check binds b1 again: wait for its release (discard) to end.
    let until = Instant::now() + Duration::from_secs(120);
    while scenario::capacity(&mut cl.controller, Some("node-a"), "array=b").await? < 600 << 20 {
        ensure!(
            Instant::now() < until,
            "b1 was not released within 2 minutes"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok((
        (),
        format!(
            "LUN {} -> {} MiB; ext4 {} -> {} MiB while mounted",
            old >> 20,
            new >> 20,
            before >> 10,
            after >> 10
        ),
    ))
}

/// Node `i`'s guest helper.
fn guest(lab: &Lab, i: usize) -> anyhow::Result<&Guest> {
    Ok(&lab.nodes[i].vm.as_ref().context("not a VM node")?.guest)
}

fn wwid_of(v: &Volume) -> anyhow::Result<&str> {
    v.volume_context
        .get("wwid")
        .map(String::as_str)
        .context("no wwid in the volume context")
}

/// A map as `multipath -ll` shows it.
pub(crate) struct MapView {
    /// The map's name (`3<naa>`).
    pub(crate) name: String,
    /// Paths `active ready running`.
    pub(crate) active: usize,
    /// Paths failed or faulty.
    pub(crate) failed: usize,
    /// The listing itself.
    pub(crate) listing: String,
}

impl MapView {
    /// "N active, M failed".
    pub(crate) fn summary(&self) -> String {
        format!("{} active, {} failed", self.active, self.failed)
    }
}

/// The multipath map of `wwid` (`naa.<hex>`) in the guest.
pub(crate) async fn map_of(g: &Guest, wwid: &str) -> anyhow::Result<MapView> {
    let name = format!("3{}", wwid.trim_start_matches("naa."));
    let listing = g.run(&["multipath", "-ll", &name]).await?;
    ensure!(listing.contains(&name), "no map {name}: {listing}");
    let active = listing
        .lines()
        .filter(|l| l.contains("active ready running"))
        .count();
    let failed = listing
        .lines()
        .filter(|l| l.contains("failed") && (l.contains(" sd") || l.contains("faulty")))
        .count();
    Ok(MapView {
        name,
        active,
        failed,
        listing,
    })
}

/// Waits until the map of `wwid` satisfies `ok`.
pub(crate) async fn wait_map(
    g: &Guest,
    wwid: &str,
    ok: impl Fn(&MapView) -> bool,
    within: Duration,
) -> anyhow::Result<MapView> {
    let start = Instant::now();
    loop {
        let m = map_of(g, wwid).await?;
        if ok(&m) {
            return Ok(m);
        }
        if start.elapsed() > within {
            let why = paths_diagnosis(g)
                .await
                .unwrap_or_else(|e| format!("({e:#})"));
            bail!("after {within:?}: {}\n{why}", m.listing);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The guest's view below the map, for a check that timed out: each SCSI
/// device's state, each iSCSI session's and connection's, and the
/// kernel's last words (a path multipath keeps failed is either still
/// offline here or never logged in again).
async fn paths_diagnosis(g: &Guest) -> anyhow::Result<String> {
    g.run(&[
        "sh",
        "-c",
        "for d in /sys/block/sd*; do echo \"$(basename $d) $(cat $d/device/state)\"; done; \
         for s in /sys/class/iscsi_session/session*; do echo \"$(basename $s) $(cat $s/state) $(cat $s/targetname)\"; done; \
         for c in /sys/class/iscsi_connection/*; do echo \"$(basename $c) $(cat $c/persistent_address) $(cat $c/state 2>/dev/null)\"; done; \
         dmesg | tail -n 30",
    ])
    .await
}

/// What a node still shows of `wwid`: maps, paths, links.
async fn leftovers(g: &Guest, wwid: &str) -> anyhow::Result<String> {
    let serial = format!("3{}", wwid.trim_start_matches("naa."));
    let out = g
        .run(&[
            "sh",
            "-c",
            &format!(
                "for d in /sys/block/*; do w=$(cat $d/device/wwid $d/dm/uuid 2>/dev/null); \
                 case \"$w\" in *{hex}*) echo \"$d $w\";; esac; done; \
                 ls /dev/disk/by-id /dev/mapper | grep {hex} || true",
                hex = &serial[1..]
            ),
        ])
        .await?;
    Ok(out.trim().replace('\n', "; "))
}

/// NodeGetVolumeStats' condition of `vol` at its published path.
struct Stats {
    abnormal_message: Option<String>,
}

async fn node_stats(
    cl: &Clients,
    lab: &Lab,
    vol: &Volume,
    node: &str,
    pod: &str,
) -> anyhow::Result<Stats> {
    let s = scenario::volume_stats(lab, cl, vol, node, pod).await?;
    Ok(Stats {
        abnormal_message: s.volume_condition.filter(|c| c.abnormal).map(|c| c.message),
    })
}
