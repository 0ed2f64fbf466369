//! Which LUNs this node attached, and through which targets: the session
//! reference counts. Kept in a small JSON file so a restarted agent still
//! knows not to log out of a target another attached LUN uses.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Mutex;

/// The attachments of this node.
#[derive(Debug)]
pub struct Attachments {
    path: PathBuf,
    state: Mutex<BTreeMap<String, BTreeSet<String>>>,
}

impl Attachments {
    /// Loads `<dir>/attachments.json` (empty when missing or unreadable;
    /// an unreadable file is kept aside, never silently trusted).
    pub fn load(dir: &std::path::Path) -> Self {
        let path = dir.join("attachments.json");
        let state = match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).unwrap_or_else(|e| {
                tracing::warn!(path = %path.display(), error = %e, "attachment records unreadable; starting empty");
                let _ = std::fs::rename(&path, path.with_extension("json.bad"));
                BTreeMap::new()
            }),
            Err(_) => BTreeMap::new(),
        };
        Self {
            path,
            state: Mutex::new(state),
        }
    }

    /// Records that `wwid` is attached through `targets` (the file is
    /// rewritten only when that is news).
    pub fn add(&self, wwid: &str, targets: impl IntoIterator<Item = String>) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let entry = s.entry(wwid.to_owned()).or_default();
        let before = entry.len();
        entry.extend(targets);
        let changed = entry.len() != before || before == 0;
        if changed {
            self.save(&s);
        }
    }

    /// Whether `wwid` is recorded as attached through every one of `targets`.
    pub fn covers(&self, wwid: &str, targets: &[String]) -> bool {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.get(wwid)
            .is_some_and(|ts| targets.iter().all(|t| ts.contains(t)))
    }

    /// Forgets `wwid`; returns the targets no other attached LUN uses.
    pub fn remove(&self, wwid: &str, targets: &[String]) -> Vec<String> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.remove(wwid);
        self.save(&s);
        targets
            .iter()
            .filter(|t| !s.values().any(|ts| ts.contains(*t)))
            .cloned()
            .collect()
    }

    fn save(&self, s: &BTreeMap<String, BTreeSet<String>>) {
        let tmp = self.path.with_extension("json.tmp");
        let result = serde_json::to_vec_pretty(s)
            .map_err(std::io::Error::other)
            .and_then(|bytes| {
                if let Some(dir) = self.path.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                std::fs::write(&tmp, bytes)?;
                std::fs::rename(&tmp, &self.path)
            });
        if let Err(e) = result {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot save attachment records");
        }
    }
}
