//! Embedded mode's SCSITargets: a JSON file (an array of targets, the same
//! shape as the SCSITarget spec plus `name`) synced into the inventory when
//! it changes. A bad file keeps the targets already stored.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::Notify;

use crate::inventory::{Inventory, Target};

/// Reads and validates the file.
pub fn read(path: &Path) -> Result<Vec<Target>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let targets: Vec<Target> =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    for t in &targets {
        match (&t.iscsi, &t.fibre_channel) {
            (Some(_), None) | (None, Some(_)) => {}
            _ => {
                return Err(format!(
                    "target {}: exactly one of iscsi or fibreChannel is required",
                    t.name
                ));
            }
        }
        if t.name.is_empty() {
            return Err("a target has no name".into());
        }
    }
    Ok(targets)
}

/// Makes the stored targets equal the file's; true when anything changed.
pub async fn sync(inventory: &dyn Inventory, targets: Vec<Target>) -> Result<bool, String> {
    let stored = inventory.targets().await.map_err(|e| e.to_string())?;
    let mut changed = false;
    for t in &targets {
        if !stored.contains(t) {
            inventory
                .put_target(t.clone())
                .await
                .map_err(|e| e.to_string())?;
            changed = true;
        }
    }
    for old in stored
        .iter()
        .filter(|s| !targets.iter().any(|t| t.name == s.name))
    {
        inventory
            .remove_target(&old.name)
            .await
            .map_err(|e| e.to_string())?;
        changed = true;
    }
    Ok(changed)
}

/// Syncs now, then on every change of the file (and every `poll`);
/// notifies `changed` after each sync that changed something.
pub async fn watch(
    path: std::path::PathBuf,
    inventory: Arc<dyn Inventory>,
    changed: Arc<Notify>,
    poll: Duration,
) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
    let watcher = notify::recommended_watcher(move |e: notify::Result<notify::Event>| {
        if e.is_ok() {
            let _ = tx.try_send(());
        }
    });
    let _watcher = match watcher {
        Ok(mut w) => {
            let dir = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            if let Err(e) = w.watch(dir, RecursiveMode::NonRecursive) {
                tracing::warn!(error = %e, "cannot watch the targets file; polling only");
            }
            Some(w)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch the targets file; polling only");
            None
        }
    };
    loop {
        match read(&path) {
            Ok(targets) => match sync(inventory.as_ref(), targets).await {
                Ok(true) => {
                    tracing::info!(path = %path.display(), "targets changed");
                    changed.notify_one();
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "cannot store targets"),
            },
            Err(e) => {
                tracing::warn!(error = %e, "targets file rejected; keeping the stored targets")
            }
        }
        tokio::select! {
            _ = rx.recv() => tokio::time::sleep(Duration::from_millis(50)).await,
            _ = tokio::time::sleep(poll) => {}
        }
        while rx.try_recv().is_ok() {}
    }
}
