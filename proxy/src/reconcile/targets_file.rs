//! Embedded mode's SCSITargets: a JSON file (an array of targets, the same
//! shape as the SCSITarget spec plus `name`) synced into the inventory when
//! it changes. A bad file (an entry that does not parse, or whose IQN,
//! portals or WWPNs do not: `Target::check_transport`) keeps the targets
//! already stored.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use csi_scsi_textfs::file_watch;
use tokio::sync::Notify;

use crate::device::Target;
use crate::inventory::Inventory;

/// Lets an editor's save (write, rename) land before rereading.
const SETTLE: Duration = Duration::from_millis(50);

/// Reads and validates the file.
pub fn read(path: &Path) -> Result<Vec<Target>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let raw: Vec<serde_json::Map<String, serde_json::Value>> =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut targets = Vec::with_capacity(raw.len());
    for object in raw {
        let name = object.get("name").and_then(|n| n.as_str()).unwrap_or("");
        if name.is_empty() {
            return Err(format!("{}: a target has no name", path.display()));
        }
        // Said plainly here: serde's own words for a flattened enum are not.
        if object.contains_key("iscsi") == object.contains_key("fibreChannel") {
            return Err(format!(
                "{}: target {name}: exactly one of iscsi or fibreChannel is required",
                path.display()
            ));
        }
        let name = name.to_owned();
        let target = serde_json::from_value::<Target>(object.into())
            .map_err(|e| format!("{}: target {name}: {e}", path.display()))?;
        // Refused here, once, rather than by every agent on every Discover.
        target
            .check_transport()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        targets.push(target);
    }
    Ok(targets)
}

/// Makes the stored targets equal the file's; true when anything changed.
pub async fn sync(inventory: &Inventory, targets: Vec<Target>) -> Result<bool, String> {
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

/// Syncs now, then on every change of the file ([`file_watch`], polling
/// every `poll` as the fallback); notifies `changed` after each sync that
/// changed something. A sync the store refused is retried every `poll`.
pub async fn watch(
    path: std::path::PathBuf,
    inventory: Arc<Inventory>,
    changed: Arc<Notify>,
    poll: Duration,
) {
    // Started before the first read, so no edit falls in between.
    let mut changes = file_watch::watch_paths([&path], poll, SETTLE);
    loop {
        let mut store_failed = false;
        match read(&path) {
            Ok(targets) => match sync(inventory.as_ref(), targets).await {
                Ok(true) => {
                    tracing::info!(path = %path.display(), "targets changed");
                    changed.notify_one();
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "cannot store targets");
                    store_failed = true;
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "targets file rejected; keeping the stored targets")
            }
        }
        tokio::select! {
            woke = changes.changed() => if woke.is_err() { return },
            _ = tokio::time::sleep(poll), if store_failed => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::EmbeddedInventory;

    fn target(name: &str) -> String {
        format!(
            r#"{{"name":"{name}","iscsi":{{"portals":["198.18.0.9:3260"],"iqn":"iqn.2026-01.test:{name}"}}}}"#
        )
    }

    #[tokio::test]
    async fn the_file_is_synced_at_start_and_again_after_an_edit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("targets.json");
        std::fs::write(&path, format!("[{}]", target("t1"))).expect("write");
        let inventory = Arc::new(Inventory::new(Arc::new(
            EmbeddedInventory::open(&dir.path().join("store.db")).expect("store"),
        )));
        let changed = Arc::new(Notify::new());
        // An hour: only the notify side can explain a prompt sync.
        let task = tokio::spawn(watch(
            path.clone(),
            inventory.clone(),
            changed.clone(),
            Duration::from_secs(3600),
        ));
        let within = Duration::from_secs(10);
        tokio::time::timeout(within, changed.notified())
            .await
            .expect("first sync");

        let tmp = dir.path().join(".targets.tmp");
        std::fs::write(&tmp, format!("[{},{}]", target("t1"), target("t2"))).expect("write");
        std::fs::rename(&tmp, &path).expect("rename over");
        tokio::time::timeout(within, changed.notified())
            .await
            .expect("sync after the edit");
        let names: Vec<String> = inventory
            .targets()
            .await
            .expect("targets")
            .into_iter()
            .map(|t| t.name)
            .collect();
        assert_eq!(names, ["t1", "t2"]);
        task.abort();
    }

    #[test]
    fn a_target_whose_iqn_or_portal_does_not_parse_is_refused_when_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("targets.json");
        std::fs::write(&path, format!("[{}]", target("t1"))).expect("write");
        assert_eq!(read(&path).map(|t| t.len()), Ok(1));
        for (entry, said) in [
            (
                r#"{"name":"t2","iscsi":{"portals":["198.18.0.9:3260"],"iqn":"iqn.2026-1.test:t2"}}"#,
                r#"target t2's iscsi.iqn "iqn.2026-1.test:t2" is not of the form"#,
            ),
            (
                r#"{"name":"t2","iscsi":{"portals":["198.18.0.9:70000"],"iqn":"iqn.2026-01.test:t2"}}"#,
                "target t2's iscsi.portals: invalid portal",
            ),
            (
                r#"{"name":"t2","fibreChannel":{"wwpns":["0x5"]}}"#,
                "target t2's fibreChannel.wwpns: invalid WWPN",
            ),
        ] {
            std::fs::write(&path, format!("[{},{entry}]", target("t1"))).expect("write");
            let e = read(&path).expect_err(entry);
            assert!(e.contains(said), "{e}");
        }
    }
}
