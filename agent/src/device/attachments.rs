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
    /// The lost-record marker when it could not be written at start: kept
    /// here, so a marker that failed to save still holds targets back.
    unsaved: Mutex<Option<Lost>>,
    /// Attaches in flight per target name: a target one of them is waiting
    /// on for its device is in use, though nothing is recorded through it
    /// yet (so a detach of another LUN does not log out under it).
    attaching: Mutex<BTreeMap<String, usize>>,
}

/// A LUN's place under the attach limit, held while it attaches: given up
/// when dropped, unless [`Admission::complete`] recorded the attachment.
#[must_use]
pub struct Admission<'a> {
    attachments: &'a Attachments,
    wwid: String,
    reserved: bool,
    /// Targets marked in use by this attach ([`Admission::through`]).
    through: Vec<String>,
}

/// The marker a lost record leaves (`<dir>/attachments.lost.json`): the
/// iSCSI targets whose sessions were live when the record was found
/// missing or unreadable, which are then never logged out while any LUN
/// still shows through them. An operator may delete it once the node's
/// sessions are known to match the record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Lost {
    /// Why the record was lost.
    reason: String,
    /// The targets (IQNs) with live sessions then; `None` when they could
    /// not be listed, which holds every target back.
    sessions: Option<BTreeSet<String>>,
}

/// Whether a detach may log out of an iSCSI target (see [`Attachments::may_log_out`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Logout {
    /// Yes: no lost record is in the way.
    Allowed,
    /// Yes, and the target leaves the lost record's list once it has.
    AllowedReleasing,
    /// No: why.
    HeldBack(String),
}

impl Attachments {
    /// Loads `<dir>/attachments.json`. `live` lists the iSCSI targets with
    /// a live session on this node (or why they cannot be listed). Missing
    /// on a node with no session is a node with nothing attached yet, and
    /// the empty record is written at once, so that from then on a missing
    /// record means a lost one. An unreadable record (a power cut can leave
    /// a renamed file empty) is kept aside as `attachments.json.bad`; it,
    /// or a missing record while sessions are live, is never taken for
    /// "nothing attached": the targets live now are written to
    /// `attachments.lost.json` and held back from logout while any LUN
    /// shows through them (see [`Self::may_log_out`]).
    pub fn load(dir: &std::path::Path, live: Result<BTreeSet<String>, String>) -> Self {
        let path = dir.join("attachments.json");
        let this = Self {
            path: path.clone(),
            state: Mutex::new(BTreeMap::new()),
            limit: 0,
            unsaved: Mutex::new(None),
            attaching: Mutex::new(BTreeMap::new()),
        };
        let lost = match std::fs::read_to_string(&path) {
            Ok(text) => match serde_json::from_str(&text) {
                Ok(state) => {
                    *this.state.lock().unwrap_or_else(|p| p.into_inner()) = state;
                    None
                }
                Err(e) => {
                    let _ = std::fs::rename(&path, path.with_extension("json.bad"));
                    Some(format!(
                        "attachments.json was unreadable at start ({e}); kept as attachments.json.bad"
                    ))
                }
            },
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    && live.as_ref().is_ok_and(BTreeSet::is_empty) =>
            {
                None
            }
            Err(e) => Some(format!(
                "attachments.json could not be read at start ({e}) while iSCSI sessions may be live"
            )),
        };
        if let Some(reason) = lost {
            let lost = Lost {
                sessions: live.as_ref().ok().cloned(),
                reason: match &live {
                    Ok(_) => reason,
                    Err(why) => format!("{reason}; the live sessions cannot be listed: {why}"),
                },
            };
            tracing::error!(reason = %lost.reason, held_back = ?lost.sessions, marker = %this.lost_path().display(), "attachment record lost: targets with a live session are not logged out while a LUN shows through them");
            if let Err(e) = this.save_lost(&lost) {
                tracing::error!(error = %e, "cannot write the lost-record marker; it is kept in memory until the agent restarts");
                *this.unsaved.lock().unwrap_or_else(|p| p.into_inner()) = Some(lost);
            }
        }
        if !this.path.exists() {
            let s = this.state.lock().unwrap_or_else(|p| p.into_inner()).clone();
            if let Err(e) = this.save(&s) {
                tracing::error!(error = %e, "cannot write the attachment record");
            }
        }
        this
    }

    fn lost_path(&self) -> PathBuf {
        self.path.with_file_name("attachments.lost.json")
    }

    /// The lost-record marker, read at each decision so that an operator's
    /// deletion takes effect at once (or the one kept in memory when it
    /// could not be written). A marker that cannot be read holds every
    /// target back.
    fn lost(&self) -> Option<Lost> {
        match std::fs::read(self.lost_path()) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => self
                .unsaved
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            Ok(bytes) => Some(serde_json::from_slice(&bytes).unwrap_or_else(|e| Lost {
                reason: format!("the lost-record marker is unreadable: {e}"),
                sessions: None,
            })),
            Err(e) => Some(Lost {
                reason: format!("the lost-record marker cannot be read: {e}"),
                sessions: None,
            }),
        }
    }

    fn save_lost(&self, lost: &Lost) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(lost)?;
        csi_scsi_textfs::write_durably(&self.lost_path(), &bytes, 0o600)
    }

    /// Whether a detach may log out of the iSCSI target `iqn`, no attached
    /// LUN recorded through it any more. With the record lost at start, a
    /// target whose session was live then is held back while any LUN
    /// (`luns_showing`) still shows through it: which of them were attached
    /// is not known.
    pub fn may_log_out(&self, iqn: &str, luns_showing: usize) -> Logout {
        let Some(lost) = self.lost() else {
            return Logout::Allowed;
        };
        match &lost.sessions {
            Some(held) if !held.contains(iqn) => Logout::Allowed,
            Some(_) if luns_showing == 0 => Logout::AllowedReleasing,
            Some(_) => Logout::HeldBack(format!(
                "{luns_showing} LUN(s) still show through it, and the attachment record was lost ({})",
                lost.reason
            )),
            None => Logout::HeldBack(format!(
                "the attachment record was lost and the sessions live then are not known ({})",
                lost.reason
            )),
        }
    }

    /// Drops `iqn` from the lost record's list (logged out); the marker
    /// goes when the list is empty.
    pub fn release(&self, iqn: &str) {
        let Some(mut lost) = self.lost() else {
            return;
        };
        let Some(held) = lost.sessions.as_mut() else {
            return;
        };
        held.remove(iqn);
        let mut unsaved = self.unsaved.lock().unwrap_or_else(|p| p.into_inner());
        if unsaved.is_some() {
            *unsaved = (!held.is_empty()).then_some(lost);
            return;
        }
        let result = if held.is_empty() {
            std::fs::remove_file(self.lost_path())
        } else {
            self.save_lost(&lost)
        };
        if let Err(e) = result {
            tracing::warn!(%iqn, error = %e, "cannot update the lost-record marker; the target stays held back");
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
                through: Vec::new(),
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
            through: Vec::new(),
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

    /// Forgets `wwid`; returns the targets no other attached LUN uses
    /// (whether one may be logged out is [`Self::may_log_out`]'s to say).
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
        let attaching = self.attaching.lock().unwrap_or_else(|p| p.into_inner());
        targets
            .iter()
            .filter(|t| !s.values().any(|ts| ts.contains(*t)) && !attaching.contains_key(*t))
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
        csi_scsi_textfs::write_durably(&self.path, &bytes, 0o600).map_err(not_saved)
    }
}

impl Admission<'_> {
    /// Marks `targets` in use by this attach until it completes or drops.
    pub fn through(&mut self, targets: &[String]) {
        let mut attaching = self
            .attachments
            .attaching
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for t in targets {
            *attaching.entry(t.clone()).or_default() += 1;
            self.through.push(t.clone());
        }
    }

    /// Records the LUN as attached through `targets` (durably, or fails).
    pub fn complete(mut self, targets: impl IntoIterator<Item = String>) -> Result<(), AgentError> {
        self.attachments.add(&self.wwid, targets)?;
        self.reserved = false;
        Ok(())
    }
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        // After `complete`, the record holds the targets: the marks go.
        let mut attaching = self
            .attachments
            .attaching
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for t in self.through.drain(..) {
            if let Some(n) = attaching.get_mut(&t) {
                *n -= 1;
                if *n == 0 {
                    attaching.remove(&t);
                }
            }
        }
        drop(attaching);
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
        let a = Attachments::load(dir.path(), Ok(BTreeSet::new())).with_limit(2);
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
        let a = Attachments::load(dir.path(), Ok(BTreeSet::new()));
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

    fn live(iqns: &[&str]) -> Result<BTreeSet<String>, String> {
        Ok(iqns.iter().map(|s| (*s).to_owned()).collect())
    }

    #[test]
    fn an_unreadable_record_is_kept_aside_and_live_targets_are_held_back_while_luns_show() {
        let dir = tempfile::tempdir().expect("tempdir");
        // What a power cut can leave: the renamed file, empty.
        std::fs::write(dir.path().join("attachments.json"), "").expect("write");
        let a = Attachments::load(dir.path(), live(&["iqn.a"]));
        assert!(
            dir.path().join("attachments.json.bad").exists(),
            "kept aside"
        );
        assert!(dir.path().join("attachments.lost.json").exists(), "marked");
        a.add("naa.1", ["t1".to_owned()]).expect("saved");
        assert_eq!(
            a.remove("naa.1", &["t1".to_owned()]).expect("saved"),
            vec!["t1".to_owned()],
            "nothing recorded uses t1 any more"
        );
        // But its session was live when the record was lost: while any LUN
        // shows through it, which of them were attached is not known.
        assert!(matches!(a.may_log_out("iqn.a", 1), Logout::HeldBack(why) if why.contains("lost")));
        // A target logged in to since is not held back.
        assert_eq!(a.may_log_out("iqn.b", 3), Logout::Allowed);
        // No LUN left: logged out, and released from the marker, which
        // goes with its last target.
        assert_eq!(a.may_log_out("iqn.a", 0), Logout::AllowedReleasing);
        a.release("iqn.a");
        assert!(!dir.path().join("attachments.lost.json").exists());
        assert_eq!(a.may_log_out("iqn.a", 1), Logout::Allowed);
    }

    #[test]
    fn a_record_missing_while_sessions_are_live_is_not_taken_for_nothing_attached() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = Attachments::load(dir.path(), live(&["iqn.a", "iqn.b"]));
        assert!(dir.path().join("attachments.lost.json").exists(), "marked");
        a.add("naa.1", ["t1".to_owned()]).expect("saved");
        a.remove("naa.1", &["t1".to_owned()]).expect("saved");
        for iqn in ["iqn.a", "iqn.b"] {
            assert!(
                matches!(a.may_log_out(iqn, 2), Logout::HeldBack(_)),
                "never log out on a guess"
            );
        }
        // Releasing one keeps the other held back.
        a.release("iqn.a");
        assert!(matches!(a.may_log_out("iqn.b", 1), Logout::HeldBack(_)));
        // The operator deletes the marker: at once, nothing is held back.
        std::fs::remove_file(dir.path().join("attachments.lost.json")).expect("operator");
        assert_eq!(a.may_log_out("iqn.b", 1), Logout::Allowed);

        // A fresh node (no session) writes its empty record at once.
        let fresh = tempfile::tempdir().expect("tempdir");
        let _ = Attachments::load(fresh.path(), Ok(BTreeSet::new()));
        assert_eq!(
            std::fs::read_to_string(fresh.path().join("attachments.json")).expect("written"),
            "{}"
        );
        assert!(!fresh.path().join("attachments.lost.json").exists());
    }

    #[test]
    fn sessions_that_cannot_be_listed_hold_every_target_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = Attachments::load(dir.path(), Err("sysfs: permission denied".into()));
        assert!(
            matches!(a.may_log_out("iqn.any", 0), Logout::HeldBack(why) if why.contains("not known")),
            "a missing record with unknown sessions is no proof of anything"
        );
        // A garbled marker holds everything back too.
        std::fs::write(dir.path().join("attachments.lost.json"), "{").expect("garble");
        assert!(matches!(a.may_log_out("iqn.any", 0), Logout::HeldBack(_)));
    }

    #[test]
    fn no_limit_admits_everything() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = Attachments::load(dir.path(), Ok(BTreeSet::new()));
        let held: Vec<_> = (0..100)
            .map(|i| a.admit(&format!("naa.{i}")).expect("admit"))
            .collect();
        assert_eq!(held.len(), 100);
    }
}
