//! The leader fence on the node: the highest leader epoch any proxy call
//! has carried, kept durably in `<state-dir>/leader-epoch`. A destructive
//! call (Attach, Detach, Wipe) from an older epoch comes from a proxy that
//! stopped leading (frozen past its Lease, say) after a newer leader acted:
//! it is refused before anything is done. Every call raises the epoch, so
//! the new leader's first discovery pass fences the node. A call without
//! the header (an older proxy, a test) is epoch 0.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use csi_scsi_contract::{LEADER_EPOCH_HEADER, LeaderEpoch};
use tonic::Request;

use crate::error::AgentError;

/// The record's file name in the state directory.
const FILE: &str = "leader-epoch";

/// What a call may do, for the fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CallKind {
    /// Attach, Detach, Wipe: refused from a stale leader.
    Destructive,
    /// Discover, Status, Rescan, Verify: never refused, still raise the
    /// epoch.
    ReadOnly,
}

/// The highest leader epoch seen, and where it is kept.
#[derive(Debug)]
pub(crate) struct EpochFence {
    path: PathBuf,
    /// The highest epoch seen, or why the record was unreadable at start.
    highest: Mutex<Result<LeaderEpoch, String>>,
}

impl EpochFence {
    /// Loads `<dir>/leader-epoch`; missing is a node no proxy has called
    /// yet (epoch 0). An unreadable record is doubt: destructive calls are
    /// refused (UNAVAILABLE) until an operator removes it.
    pub(crate) fn load(dir: &Path) -> Self {
        let path = dir.join(FILE);
        let highest = match std::fs::read_to_string(&path) {
            Ok(text) => LeaderEpoch::parse(text.trim_end_matches('\n')).map_err(|e| e.to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(LeaderEpoch(0)),
            Err(e) => Err(e.to_string()),
        };
        match &highest {
            Ok(e) => {
                tracing::info!(epoch = %e, path = %path.display(), "highest proxy leader epoch seen")
            }
            Err(reason) => {
                tracing::error!(%reason, path = %path.display(), "the highest proxy leader epoch seen is unreadable: Attach, Detach and Wipe are refused until the file is removed")
            }
        }
        Self {
            path,
            highest: Mutex::new(highest),
        }
    }

    /// The highest epoch seen; `None` if unreadable.
    #[cfg(test)]
    pub(crate) fn highest(&self) -> Option<LeaderEpoch> {
        self.lock().as_ref().ok().copied()
    }

    /// The one check: admits `request` as a call of `kind`, or says why
    /// not. A higher epoch is saved before the call proceeds; a destructive
    /// call whose higher epoch cannot be saved is refused (a restart would
    /// forget it).
    pub(crate) fn admit<T>(&self, request: &Request<T>, kind: CallKind) -> Result<(), AgentError> {
        let epoch = match request.metadata().get(LEADER_EPOCH_HEADER) {
            None => LeaderEpoch(0),
            Some(v) => LeaderEpoch::parse(&String::from_utf8_lossy(v.as_bytes()))?,
        };
        let mut highest = self.lock();
        let seen = match (&*highest, kind) {
            (Ok(seen), _) => *seen,
            (Err(reason), CallKind::Destructive) => {
                return Err(AgentError::LeaderEpochUnknown {
                    path: self.path.clone(),
                    reason: reason.clone(),
                });
            }
            (Err(_), CallKind::ReadOnly) => return Ok(()),
        };
        if epoch < seen {
            return match kind {
                CallKind::Destructive => Err(AgentError::StaleLeader {
                    epoch,
                    highest: seen,
                }),
                CallKind::ReadOnly => Ok(()),
            };
        }
        if epoch > seen {
            let saved = self.save(epoch);
            match (saved, kind) {
                (Ok(()), _) => {
                    tracing::info!(%epoch, previous = %seen, "a newer proxy leader: older leaders' Attach, Detach and Wipe are refused from now on");
                    *highest = Ok(epoch);
                }
                (Err(e), CallKind::Destructive) => return Err(e),
                // The epoch stays where it was saved; the next call tries again.
                (Err(e), CallKind::ReadOnly) => {
                    tracing::warn!(error = %e, %epoch, "cannot save the newer leader epoch")
                }
            }
        }
        Ok(())
    }

    fn save(&self, epoch: LeaderEpoch) -> Result<(), AgentError> {
        let not_saved = |source| AgentError::RecordNotSaved {
            path: self.path.clone(),
            source,
        };
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(not_saved)?;
        }
        csi_scsi_textfs::write_durably(&self.path, format!("{epoch}\n").as_bytes(), 0o600)
            .map_err(not_saved)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Result<LeaderEpoch, String>> {
        self.highest.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;
    use crate::api::status::to_status;

    fn call(epoch: Option<&str>) -> Request<()> {
        let mut r = Request::new(());
        if let Some(e) = epoch {
            r.metadata_mut()
                .insert(LEADER_EPOCH_HEADER, e.parse().expect("ascii"));
        }
        r
    }

    fn code(r: Result<(), AgentError>) -> Code {
        r.map_or_else(|e| to_status(e).code(), |()| Code::Ok)
    }

    #[test]
    fn an_older_epoch_is_refused_only_for_destructive_calls_and_the_highest_survives_a_restart() {
        use CallKind::{Destructive, ReadOnly};
        let dir = tempfile::tempdir().expect("tempdir");
        let fence = EpochFence::load(dir.path());
        // (epoch header, kind, code, highest after)
        let table = [
            (None, Destructive, Code::Ok, 0),
            (Some("7"), ReadOnly, Code::Ok, 7),
            (Some("6"), Destructive, Code::FailedPrecondition, 7),
            (None, Destructive, Code::FailedPrecondition, 7),
            (Some("6"), ReadOnly, Code::Ok, 7),
            (Some("7"), Destructive, Code::Ok, 7),
            (Some("9"), Destructive, Code::Ok, 9),
            (Some("8"), Destructive, Code::FailedPrecondition, 9),
            (Some("x"), ReadOnly, Code::InvalidArgument, 9),
        ];
        for (epoch, kind, want, after) in table {
            assert_eq!(
                code(fence.admit(&call(epoch), kind)),
                want,
                "{epoch:?} {kind:?}"
            );
            assert_eq!(
                fence.highest(),
                Some(LeaderEpoch(after)),
                "{epoch:?} {kind:?}"
            );
        }
        let restarted = EpochFence::load(dir.path());
        assert_eq!(restarted.highest(), Some(LeaderEpoch(9)));
        let refused = restarted
            .admit(&call(Some("8")), Destructive)
            .expect_err("stale");
        assert!(
            refused
                .to_string()
                .contains("a call from a proxy that led in epoch 8; epoch 9 has led since"),
            "{refused}"
        );
    }

    #[test]
    fn an_unreadable_record_refuses_destructive_calls_and_an_unsaved_epoch_is_not_taken() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(FILE), "").expect("write");
        let fence = EpochFence::load(dir.path());
        assert_eq!(fence.highest(), None);
        assert_eq!(
            code(fence.admit(&call(Some("3")), CallKind::Destructive)),
            Code::Unavailable
        );
        assert_eq!(
            code(fence.admit(&call(Some("3")), CallKind::ReadOnly)),
            Code::Ok
        );

        // A record that cannot be written: a directory takes its place
        // once loaded.
        let blocked = dir.path().join("blocked");
        let fence = EpochFence::load(&blocked);
        std::fs::create_dir_all(blocked.join(FILE).join("x")).expect("mkdir");
        assert_eq!(fence.highest(), Some(LeaderEpoch(0)));
        assert_eq!(
            code(fence.admit(&call(Some("5")), CallKind::Destructive)),
            Code::Unavailable
        );
        assert_eq!(
            code(fence.admit(&call(Some("5")), CallKind::ReadOnly)),
            Code::Ok
        );
        assert_eq!(fence.highest(), Some(LeaderEpoch(0)), "unsaved: not taken");
    }
}
