//! The client's record of what the driver acknowledged: every volume a
//! CreateVolume answered, and whether a DeleteVolume was sent for it. The
//! invariants are checked against it.

use std::collections::BTreeMap;

/// One acknowledged volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acked {
    /// The volume ID the driver answered.
    pub id: String,
    /// The LUN it names (the ID's WWID half).
    pub wwid: String,
    /// The binding UID (the ID's other half).
    pub uid: String,
    /// Whether a DeleteVolume was sent (from then on the LUN may be
    /// released at any moment, acknowledged or not).
    pub dying: bool,
}

/// Acknowledged volumes by CreateVolume name.
#[derive(Debug, Default)]
pub struct Ledger {
    volumes: BTreeMap<String, Acked>,
    /// Volumes whose DeleteVolume was acknowledged.
    pub deleted: u64,
}

impl Ledger {
    /// Records CreateVolume(`name`) answering `id`. Returns the names of
    /// other live volumes already on the same LUN: each one is a LUN bound
    /// to two volumes. A repeated answer for `name` must be the same ID;
    /// a different one is returned as a conflict too.
    pub fn acknowledge(&mut self, name: &str, id: &str) -> Vec<String> {
        let (wwid, uid) = id.rsplit_once(':').unwrap_or((id, ""));
        let mut conflicts: Vec<String> = self
            .volumes
            .iter()
            .filter(|(n, v)| n.as_str() != name && !v.dying && v.wwid == wwid)
            .map(|(n, v)| format!("{n} ({})", v.id))
            .collect();
        if let Some(prev) = self.volumes.get(name)
            && prev.id != id
        {
            conflicts.push(format!("{name} answered earlier as {}", prev.id));
        }
        self.volumes.insert(
            name.to_owned(),
            Acked {
                id: id.to_owned(),
                wwid: wwid.to_owned(),
                uid: uid.to_owned(),
                dying: false,
            },
        );
        conflicts
    }

    /// Marks `name` as being deleted (before the DeleteVolume is sent).
    pub fn dying(&mut self, name: &str) {
        if let Some(v) = self.volumes.get_mut(name) {
            v.dying = true;
        }
    }

    /// Forgets `name` once its DeleteVolume was acknowledged.
    pub fn deleted(&mut self, name: &str) {
        if self.volumes.remove(name).is_some() {
            self.deleted += 1;
        }
    }

    /// The live (acknowledged, never sent to DeleteVolume) volumes.
    pub fn live(&self) -> impl Iterator<Item = (&String, &Acked)> {
        self.volumes.iter().filter(|(_, v)| !v.dying)
    }

    /// The acknowledged volume `name`.
    pub fn get(&self, name: &str) -> Option<&Acked> {
        self.volumes.get(name)
    }

    /// How many volumes are recorded (live or dying).
    pub fn len(&self) -> usize {
        self.volumes.len()
    }

    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.volumes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lun_answered_for_two_live_volumes_is_a_conflict() {
        let mut l = Ledger::default();
        assert!(l.acknowledge("a", "naa.1:u1").is_empty());
        assert_eq!(l.acknowledge("b", "naa.1:u2"), vec!["a (naa.1:u1)"]);
    }

    #[test]
    fn a_lun_released_by_a_sent_delete_may_be_bound_again() {
        let mut l = Ledger::default();
        l.acknowledge("a", "naa.1:u1");
        l.dying("a");
        assert!(l.acknowledge("b", "naa.1:u2").is_empty());
        l.deleted("a");
        assert_eq!(l.deleted, 1);
        assert_eq!(l.live().count(), 1);
    }

    #[test]
    fn a_retried_create_answering_another_id_is_a_conflict() {
        let mut l = Ledger::default();
        l.acknowledge("a", "naa.1:u1");
        assert!(l.acknowledge("a", "naa.1:u1").is_empty());
        assert_eq!(l.acknowledge("a", "naa.2:u9").len(), 1);
    }
}
