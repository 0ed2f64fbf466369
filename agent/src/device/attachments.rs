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
    /// Loads `<dir>/attachments.json`. Missing on a node with no iSCSI
    /// session (`sessions_live` false) is a node with nothing attached yet,
    /// and the empty record is written at once, so that from then on a
    /// missing record means a lost one. An unreadable record (a power cut
    /// can leave a renamed file empty), or a missing one while sessions are
    /// live, leaves `attachments.json.bad` behind: while that file exists
    /// the agent does not know which LUNs share a session and never logs
    /// out of a target on detach (an operator removes it once the node's
    /// sessions are known to match the record).
    pub fn load(dir: &std::path::Path, sessions_live: bool) -> Self {
        let path = dir.join("attachments.json");
        let bad = path.with_extension("json.bad");
        let state = match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).unwrap_or_else(|e| {
                tracing::error!(path = %path.display(), error = %e, kept = %bad.display(), "attachment records unreadable: no target is logged out until the kept copy is removed");
                let _ = std::fs::rename(&path, &bad);
                BTreeMap::new()
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !sessions_live => BTreeMap::new(),
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, sessions_live, kept = %bad.display(), "attachment records missing or unreadable while iSCSI sessions are live: no target is logged out until the marker is removed");
                let _ = std::fs::write(
                    &bad,
                    format!("attachments.json could not be read at start ({e}) while iSCSI sessions were live\n"),
                );
                BTreeMap::new()
            }
        };
        let this = Self {
            path,
            state: Mutex::new(state),
            limit: 0,
        };
        if !this.path.exists() {
            let s = this.state.lock().unwrap_or_else(|p| p.into_inner()).clone();
            if let Err(e) = this.save(&s) {
                tracing::error!(error = %e, "cannot write the attachment record");
            }
        }
        this
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
    /// rewritten only when that is news); fails when the record cannot be
    /// saved durably, so no attach succeeds without its record.
    pub fn add(
        &self,
        wwid: &str,
        targets: impl IntoIterator<Item = String>,
    ) -> Result<(), AgentError> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let entry = s.entry(wwid.to_owned()).or_default();
        let before = entry.clone();
        entry.extend(targets);
        if *entry == before && !before.is_empty() {
            return Ok(());
        }
        if let Err(e) = self.save(&s) {
            // Not recorded, not attached as far as the record goes.
            if let Some(entry) = s.get_mut(wwid) {
                *entry = before;
            }
            return Err(e);
        }
        Ok(())
    }

    /// Whether `wwid` is recorded as attached through every one of `targets`.
    pub fn covers(&self, wwid: &str, targets: &[String]) -> bool {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.get(wwid)
            .is_some_and(|ts| targets.iter().all(|t| ts.contains(t)))
    }

    /// Forgets `wwid`; returns the targets no other attached LUN uses (none
    /// while an unreadable record is kept aside: then it cannot be known).
    /// Fails, forgetting nothing, when the record cannot be saved.
    pub fn remove(&self, wwid: &str, targets: &[String]) -> Result<Vec<String>, AgentError> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(was) = s.remove(wwid) else {
            return Ok(self.unused(&s, targets));
        };
        if let Err(e) = self.save(&s) {
            s.insert(wwid.to_owned(), was);
            return Err(e);
        }
        Ok(self.unused(&s, targets))
    }

    fn unused(&self, s: &BTreeMap<String, BTreeSet<String>>, targets: &[String]) -> Vec<String> {
        if self.path.with_extension("json.bad").exists() {
            tracing::warn!(path = %self.path.display(), "an unreadable attachment record is kept aside: no target is logged out");
            return Vec::new();
        }
        targets
            .iter()
            .filter(|t| !s.values().any(|ts| ts.contains(*t)))
            .cloned()
            .collect()
    }

    fn save(&self, s: &BTreeMap<String, BTreeSet<String>>) -> Result<(), AgentError> {
        // Admitted LUNs still attaching are not attached yet.
        let attached: BTreeMap<&String, &BTreeSet<String>> = s
            .iter()
            .filter(|(_, targets)| !targets.is_empty())
            .collect();
        let not_saved = |source| AgentError::RecordNotSaved {
            path: self.path.clone(),
            source,
        };
        let bytes = serde_json::to_vec_pretty(&attached).map_err(|e| not_saved(e.into()))?;
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(not_saved)?;
        }
        csi_scsi_certs::write_durably(&self.path, &bytes, 0o600).map_err(not_saved)
    }
}

impl Admission<'_> {
    /// Records the LUN as attached through `targets` (durably, or fails).
    pub fn complete(mut self, targets: impl IntoIterator<Item = String>) -> Result<(), AgentError> {
        self.attachments.add(&self.wwid, targets)?;
        self.reserved = false;
        Ok(())
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
        let a = Attachments::load(dir.path(), false).with_limit(2);
        a.admit("naa.1")
            .expect("first")
            .complete(["t".to_owned()])
            .expect("saved");
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
            .complete(["t".to_owned()])
            .expect("saved");
        assert_eq!(
            a.admit("naa.4")
                .err()
                .map(|e| e.to_string().contains("limit")),
            Some(true)
        );
        a.remove("naa.1", &["t".to_owned()]).expect("saved");
        assert!(a.admit("naa.4").is_ok(), "a detach frees a place");
    }

    #[test]
    fn an_attachment_that_cannot_be_saved_fails_and_is_not_recorded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = Attachments::load(dir.path(), false);
        a.add("naa.1", ["t1".to_owned()]).expect("saved");
        // The record's place taken by a directory: every durable write fails.
        let record = dir.path().join("attachments.json");
        std::fs::remove_file(&record).expect("rm");
        std::fs::create_dir(&record).expect("a directory in its place");
        std::fs::write(record.join("x"), "").expect("non-empty");
        let admission = a.admit("naa.2").expect("room");
        match admission.complete(["t1".to_owned()]) {
            Err(AgentError::RecordNotSaved { .. }) => {}
            other => panic!("expected RecordNotSaved, got {other:?}"),
        }
        assert!(!a.covers("naa.2", &["t1".to_owned()]), "not recorded");
        // A detach that cannot save forgets nothing, so no session is
        // logged out on the strength of an unsaved record.
        assert!(matches!(
            a.remove("naa.1", &["t1".to_owned()]),
            Err(AgentError::RecordNotSaved { .. })
        ));
        assert!(a.covers("naa.1", &["t1".to_owned()]));
    }

    #[test]
    fn an_unreadable_record_is_kept_aside_and_no_target_is_logged_out_while_it_is() {
        let dir = tempfile::tempdir().expect("tempdir");
        // What a power cut can leave: the renamed file, empty.
        std::fs::write(dir.path().join("attachments.json"), "").expect("write");
        let a = Attachments::load(dir.path(), false);
        assert!(
            dir.path().join("attachments.json.bad").exists(),
            "kept aside"
        );
        a.add("naa.1", ["t1".to_owned()]).expect("saved");
        assert_eq!(
            a.remove("naa.1", &["t1".to_owned()]).expect("saved"),
            Vec::<String>::new(),
            "which LUNs share t1 is unknown: never log out"
        );
        std::fs::remove_file(dir.path().join("attachments.json.bad")).expect("operator");
        a.add("naa.1", ["t1".to_owned()]).expect("saved");
        assert_eq!(
            a.remove("naa.1", &["t1".to_owned()]).expect("saved"),
            vec!["t1".to_owned()]
        );
    }

    #[test]
    fn a_record_missing_while_sessions_are_live_is_not_taken_for_nothing_attached() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = Attachments::load(dir.path(), true);
        assert!(dir.path().join("attachments.json.bad").exists(), "marked");
        a.add("naa.1", ["t1".to_owned()]).expect("saved");
        assert!(
            a.remove("naa.1", &["t1".to_owned()])
                .expect("saved")
                .is_empty(),
            "never log out on a guess"
        );
        // A fresh node (no session) writes its empty record at once.
        let fresh = tempfile::tempdir().expect("tempdir");
        let _ = Attachments::load(fresh.path(), false);
        assert_eq!(
            std::fs::read_to_string(fresh.path().join("attachments.json")).expect("written"),
            "{}"
        );
        assert!(!fresh.path().join("attachments.json.bad").exists());
    }

    #[test]
    fn no_limit_admits_everything() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = Attachments::load(dir.path(), false);
        let held: Vec<_> = (0..100)
            .map(|i| a.admit(&format!("naa.{i}")).expect("admit"))
            .collect();
        assert_eq!(held.len(), 100);
    }
}
