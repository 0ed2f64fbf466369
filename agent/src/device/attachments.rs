//! Which LUNs this node attached, and through which targets: the session
//! reference counts. Kept in a small JSON file so a restarted agent still
//! knows not to log out of a target another attached LUN uses. Also the
//! node's attach limit (`--max-volumes`, what NodeGetInfo reports): a new
//! LUN is admitted only while fewer are attached.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Mutex;

use crate::error::AgentError;

/// The attachments of this node.
#[derive(Debug)]
pub struct Attachments {
    path: PathBuf,
    /// Targets by WWID. An entry with no target is a LUN admitted and
    /// still attaching: it holds its place under the limit, and is never
    /// saved.
    state: Mutex<BTreeMap<String, BTreeSet<String>>>,
    /// Most LUNs attached at once (0: no limit).
    limit: u64,
}

/// A LUN's place under the attach limit, held while it attaches: given up
/// when dropped, unless [`Admission::complete`] recorded the attachment.
#[must_use]
pub struct Admission<'a> {
    attachments: &'a Attachments,
    wwid: String,
    reserved: bool,
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
            limit: 0,
        }
    }

    /// The same, admitting at most `limit` attached LUNs (0: no limit).
    pub fn with_limit(mut self, limit: u64) -> Self {
        self.limit = limit;
        self
    }

    /// Admits `wwid` for attaching: it is attached (or attaching) already,
    /// or fewer LUNs than the limit are. A new LUN holds its place until
    /// the admission completes or drops, so concurrent attaches of
    /// different LUNs cannot pass the limit together.
    pub fn admit(&self, wwid: &str) -> Result<Admission<'_>, AgentError> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.contains_key(wwid) {
            return Ok(Admission {
                attachments: self,
                wwid: wwid.to_owned(),
                reserved: false,
            });
        }
        if self.limit > 0 && s.len() as u64 >= self.limit {
            return Err(AgentError::AttachLimit {
                wwid: wwid.to_owned(),
                limit: self.limit,
            });
        }
        s.insert(wwid.to_owned(), BTreeSet::new());
        Ok(Admission {
            attachments: self,
            wwid: wwid.to_owned(),
            reserved: true,
        })
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
        // Admitted LUNs still attaching are not attached yet.
        let attached: BTreeMap<&String, &BTreeSet<String>> = s
            .iter()
            .filter(|(_, targets)| !targets.is_empty())
            .collect();
        let result = serde_json::to_vec_pretty(&attached)
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

impl Admission<'_> {
    /// Records the LUN as attached through `targets`.
    pub fn complete(mut self, targets: impl IntoIterator<Item = String>) {
        self.attachments.add(&self.wwid, targets);
        self.reserved = false;
    }
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        if self.reserved {
            let mut s = self
                .attachments
                .state
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            // Give the place up, unless an attachment was recorded meanwhile.
            if s.get(&self.wwid).is_some_and(BTreeSet::is_empty) {
                s.remove(&self.wwid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_admits_attached_luns_and_new_ones_only_while_there_is_room() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = Attachments::load(dir.path()).with_limit(2);
        a.admit("naa.1").expect("first").complete(["t".to_owned()]);
        let second = a.admit("naa.2").expect("second holds the last place");
        match a.admit("naa.3") {
            Err(AgentError::AttachLimit { limit: 2, .. }) => {}
            Err(other) => panic!("expected the attach limit, got {other}"),
            Ok(_) => panic!("a third LUN passed a limit of 2"),
        }
        assert!(
            a.admit("naa.1").is_ok(),
            "an attached LUN is always admitted"
        );
        let saved = std::fs::read_to_string(dir.path().join("attachments.json")).expect("saved");
        assert!(
            !saved.contains("naa.2"),
            "a LUN still attaching is not recorded: {saved}"
        );
        drop(second);
        a.admit("naa.3")
            .expect("the place given up is free again")
            .complete(["t".to_owned()]);
        assert_eq!(
            a.admit("naa.4")
                .err()
                .map(|e| e.to_string().contains("limit")),
            Some(true)
        );
        a.remove("naa.1", &["t".to_owned()]);
        assert!(a.admit("naa.4").is_ok(), "a detach frees a place");
    }

    #[test]
    fn no_limit_admits_everything() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = Attachments::load(dir.path());
        let held: Vec<_> = (0..100)
            .map(|i| a.admit(&format!("naa.{i}")).expect("admit"))
            .collect();
        assert_eq!(held.len(), 100);
    }
}
