//! Volume IDs as the proxy issues them: `<wwid>:<binding-uid>`.

/// A volume ID split into the LUN and the binding it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeRef {
    /// Canonical WWID.
    pub wwid: String,
    /// Binding UID.
    pub uid: String,
}

impl VolumeRef {
    /// Splits at the last `:`; `None` when either half is empty or the
    /// text cannot be one of our IDs.
    pub fn parse(id: &str) -> Option<Self> {
        let (wwid, uid) = id.rsplit_once(':')?;
        let uid_ok = !uid.is_empty()
            && uid.len() <= 64
            && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        let wwid_ok = ["naa.", "eui.", "t10.", "name."]
            .iter()
            .any(|p| wwid.starts_with(p))
            && wwid.len() <= 256
            && !wwid.chars().any(char::is_control);
        (uid_ok && wwid_ok).then(|| Self {
            wwid: wwid.to_owned(),
            uid: uid.to_owned(),
        })
    }
}

impl std::fmt::Display for VolumeRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.wwid, self.uid)
    }
}
