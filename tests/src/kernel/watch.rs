//! Acting on the sysfs trigger files the agent writes, as the kernel does:
//! `echo 1 > device/delete` removes the path, `echo 1 > device/rescan`
//! re-reads its size, `echo "- - -" > scsi_host/hostN/scan` and
//! `echo 1 > fc_host/hostN/issue_lip` scan for LUNs.

use std::path::Path;

use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;

use super::state::{DiskRecord, NodeState};
use super::{NodeContext, attach_loop, detach_loop, refresh_loop};
use crate::fabric::Fabric;
use crate::node_tree::{DiskPath, NodeTree, PathTransport};

/// Watches the node's tree until the process is killed.
pub async fn run(ctx: NodeContext) -> std::io::Result<()> {
    let tree = NodeTree::create(&ctx.root)?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut watcher = notify::recommended_watcher(move |e: notify::Result<notify::Event>| {
        if let Ok(ev) = e
            && matches!(
                ev.kind,
                EventKind::Modify(_)
                    | EventKind::Access(notify::event::AccessKind::Close(
                        notify::event::AccessMode::Write
                    ))
            )
        {
            for p in ev.paths {
                let _ = tx.send(p);
            }
        }
    })
    .map_err(std::io::Error::other)?;
    watcher
        .watch(&tree.sys().join("devices"), RecursiveMode::Recursive)
        .map_err(std::io::Error::other)?;
    eprintln!(
        "lab kernel: watching {} for node {}",
        tree.sys().display(),
        ctx.node
    );
    while let Some(path) = rx.recv().await {
        let Some(name) = path.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
            continue;
        };
        if !matches!(name.as_str(), "delete" | "rescan" | "scan" | "issue_lip") {
            continue;
        }
        let Ok(content) = std::fs::read_to_string(&path) else {
            continue;
        };
        // An empty rescan trigger is acted on too: a write that landed
        // while the last one was acted on, within the same mtime tick, was
        // cleared with it, and its own event must still re-read the size (a
        // rescan more is harmless; our own clear's event costs one). Other
        // triggers name what to do: empty, there is nothing to do.
        let empty = content.trim().is_empty();
        if empty && name != "rescan" {
            continue;
        }
        let written = modified(&path);
        let result = match name.as_str() {
            "delete" => delete(&ctx, &tree, &path),
            "rescan" => rescan(&ctx, &tree, &path),
            _ => scan(&ctx, &tree, &path).await,
        };
        if let Err(e) = result {
            eprintln!("lab kernel: {} on {}: {e}", name, path.display());
        }
        // A kernel acts within the write; the agent waits for the trigger
        // to read empty before it reads what the action changed (a size
        // after a rescan), so it is reset only now. A write that came in
        // meanwhile (a newer mtime) stays, and its event acts on it again.
        if !empty && modified(&path) == written {
            let _ = std::fs::write(&path, "");
        }
    }
    Ok(())
}

/// When `trigger` was last written (`None` when it cannot be read).
fn modified(trigger: &Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(trigger).and_then(|m| m.modified()).ok()
}

/// The kernel name of the disk whose device directory holds `trigger`.
fn disk_of(trigger: &Path) -> Option<String> {
    let dir = trigger.parent()?.join("block");
    let entry = std::fs::read_dir(dir).ok()?.flatten().next()?;
    Some(entry.file_name().to_string_lossy().into_owned())
}

fn delete(ctx: &NodeContext, tree: &NodeTree, trigger: &Path) -> std::io::Result<()> {
    let Some(name) = disk_of(trigger) else {
        return Ok(());
    };
    let mut locked = NodeState::lock(&ctx.root)?;
    let mut loop_device = None;
    for s in &mut locked.state.sessions {
        if let Some(pos) = s.disks.iter().position(|d| d.kernel_name == name) {
            loop_device = Some(s.disks.remove(pos).loop_device);
        }
    }
    if let Some(pos) = locked
        .state
        .fc_disks
        .iter()
        .position(|(_, _, d)| d.kernel_name == name)
    {
        loop_device = Some(locked.state.fc_disks.remove(pos).2.loop_device);
    }
    tree.remove_disk(&name)?;
    if let Some(l) = loop_device {
        detach_loop(&l);
    }
    locked.save()?;
    eprintln!("lab kernel: deleted path {name}");
    Ok(())
}

fn rescan(ctx: &NodeContext, tree: &NodeTree, trigger: &Path) -> std::io::Result<()> {
    let Some(name) = disk_of(trigger) else {
        return Ok(());
    };
    let locked = NodeState::lock(&ctx.root)?;
    if let Some(d) = locked.state.disk(&name) {
        refresh_loop(&d.loop_device);
        tree.rescan_size(&name, &d.loop_device)?;
    }
    Ok(())
}

/// `.../hostN/scsi_host/hostN/scan` or `.../hostN/fc_host/hostN/issue_lip`.
async fn scan(ctx: &NodeContext, tree: &NodeTree, trigger: &Path) -> std::io::Result<()> {
    let host: Option<u32> = trigger
        .parent()
        .and_then(|p| p.file_name())
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("host"))
        .and_then(|n| n.parse().ok());
    let Some(host) = host else { return Ok(()) };
    let locked = NodeState::lock(&ctx.root)?;
    if let Some(s) = locked.state.sessions.iter().find(|s| s.host == host) {
        let sid = s.sid;
        let (code, _, err) = super::iscsiadm::rescan_session(ctx, locked, sid).await;
        if code != 0 {
            return Err(std::io::Error::other(err));
        }
        return Ok(());
    }
    fc_scan(ctx, tree, locked, host)
}

fn fc_scan(
    ctx: &NodeContext,
    tree: &NodeTree,
    mut locked: super::state::Locked,
    host: u32,
) -> std::io::Result<()> {
    if !tree
        .sys()
        .join(format!("class/fc_host/host{host}"))
        .exists()
    {
        return Ok(());
    }
    let fabric = Fabric::load(&ctx.fabric)?;
    for t in fabric.fc.iter().filter(|t| t.nodes.contains(&ctx.node)) {
        for l in &t.luns {
            let have = locked
                .state
                .fc_disks
                .iter()
                .any(|(h, w, d)| *h == host && w == &t.wwpn && d.lun == l.lun);
            if have {
                continue;
            }
            // Slow fabrics answer late: the lab can delay FC scans.
            std::thread::sleep(ctx.scan_delay);
            let loop_device = attach_loop(l.data_file())?;
            let disk = DiskPath {
                transport: PathTransport::Fc {
                    host,
                    wwpn: t.wwpn.clone(),
                },
                target: 0,
                lun: l.lun,
                wwid: l.wwid.clone(),
                vendor: l.vendor.clone(),
                model: l.model.clone(),
                serial: l.serial.clone(),
                backing: loop_device.clone(),
            };
            match tree.add_disk(&disk) {
                Ok(name) => {
                    eprintln!(
                        "lab kernel: FC LUN {} of {} appeared as {name}",
                        l.lun, t.wwpn
                    );
                    locked.state.fc_disks.push((
                        host,
                        t.wwpn.clone(),
                        DiskRecord {
                            lun: l.lun,
                            kernel_name: name,
                            loop_device,
                        },
                    ));
                }
                Err(e) => {
                    detach_loop(&loop_device);
                    return Err(e);
                }
            }
        }
    }
    locked.save()
}
