//! Volume IDs: `<wwid>:<binding-uid>`. The proxy issues them, the WWID
//! in canonical form and a fresh UUID (v4) for each binding; the agent and
//! the proxy parse them with [`VolumeId::parse`]. The binding UID changes
//! every time the LUN is bound to a new volume, so a stale call about an
//! old binding can never touch the LUN's next owner.

use std::fmt;

use csi_scsi_textfs::excerpt;

use crate::wwid::{InvalidWwid, Wwid};

/// The longest binding UID (a UUID has 36 characters).
pub const MAX_BINDING_UID_LEN: usize = 64;

/// The longest volume ID: the longest canonical WWID, `:`, the longest
/// binding UID.
pub const MAX_LEN: usize = crate::wwid::MAX_LEN + 1 + MAX_BINDING_UID_LEN;

/// A parsed CSI volume ID: only what this driver could have issued, and it
/// prints back exactly as it was given.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct VolumeId {
    wwid: Wwid,
    binding_uid: String,
}

/// Why a string is not a volume ID. Each variant quotes an excerpt of the
/// ID, never all of it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidVolumeId {
    /// No `:<binding-uid>` part.
    #[error("volume ID {0:?} is not <wwid>:<binding-uid>")]
    Shape(String),
    /// The binding UID is not 1-64 characters of `[A-Za-z0-9-]`.
    #[error("volume ID {0:?} has an invalid binding UID (1 to 64 of A-Z, a-z, 0-9, '-')")]
    Binding(String),
    /// The WWID part is malformed.
    #[error("volume ID has an invalid WWID: {0}")]
    Wwid(#[from] InvalidWwid),
    /// The WWID is valid but not in canonical form: not an ID we issued.
    #[error(
        "volume ID {0:?} does not spell its WWID canonically (naa./eui./t10./name., lower-case hex), so this driver did not issue it"
    )]
    NotCanonical(String),
}

impl VolumeId {
    /// Parses `<wwid>:<binding-uid>`; the binding is after the last `:`.
    pub fn parse(s: &str) -> Result<Self, InvalidVolumeId> {
        let (text, binding) = s
            .rsplit_once(':')
            .ok_or_else(|| InvalidVolumeId::Shape(excerpt(s)))?;
        let binding_ok = !binding.is_empty()
            && binding.len() <= MAX_BINDING_UID_LEN
            && binding
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !binding_ok {
            return Err(InvalidVolumeId::Binding(excerpt(s)));
        }
        // Only the canonical spelling, exactly (no blanks either), is a
        // volume ID we issued: anything else would not print back as given.
        let wwid = Wwid::parse_canonical(text).map_err(|e| match e.reason {
            crate::wwid::NOT_CANONICAL => InvalidVolumeId::NotCanonical(excerpt(s)),
            _ => InvalidVolumeId::Wwid(e),
        })?;
        Ok(Self {
            wwid,
            binding_uid: binding.to_owned(),
        })
    }

    /// The LUN, in canonical form.
    pub fn wwid(&self) -> &Wwid {
        &self.wwid
    }

    /// The binding this volume ID names.
    pub fn binding_uid(&self) -> &str {
        &self.binding_uid
    }
}

impl std::str::FromStr for VolumeId {
    type Err = InvalidVolumeId;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for VolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.wwid, self.binding_uid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_id_round_trips() {
        let s = "naa.6001405d27e5d898829468b90ce4ef8c:7f0c1e2a-5b7d-4c1e-9a0b-1c2d3e4f5a6b";
        assert_eq!(VolumeId::parse(s).expect("valid").to_string(), s);
    }

    #[test]
    fn the_longest_volume_id_parses() {
        let s = format!("t10.{}:{}", "A".repeat(252), "b".repeat(64));
        assert_eq!(s.len(), MAX_LEN);
        let v = VolumeId::parse(&s).expect("at the limit");
        assert_eq!(v.wwid().as_str().len(), crate::wwid::MAX_LEN);
        assert_eq!(v.binding_uid().len(), MAX_BINDING_UID_LEN);
        assert_eq!(v.to_string(), s);
        assert!(
            VolumeId::parse(&format!("{s}b")).is_err(),
            "binding UID over 64"
        );
    }

    #[test]
    fn malformed_volume_ids_are_refused() {
        for bad in [
            "",
            "naa.6001405d27e5d898829468b90ce4ef8c",
            "naa.6001405d27e5d898829468b90ce4ef8c:",
            "naa.6001405d27e5d898829468b90ce4ef8c:a/b",
            "sdb:1234",
            "36001405d27e5d898829468b90ce4ef8c:1234",
            "../../etc:1234",
            " naa.6001405d27e5d898829468b90ce4ef8c:1234",
            "naa.6001405d27e5d898829468b90ce4ef8c\n:1234",
            "naa.6001405D27E5D898829468B90CE4EF8C:1234",
        ] {
            assert!(VolumeId::parse(bad).is_err(), "{bad:?}");
        }
    }
}
