//! `NodeName`: a Kubernetes node name, which is also the CSI node ID the
//! agent reports in NodeGetInfo and the CO hands back in ControllerPublish.
//! It is compared as given: not lower-cased, trimmed or otherwise rewritten,
//! so the name an agent reports, the name Kubernetes schedules a Pod on and
//! the name a publication is stored under stay one and the same text.

use std::fmt;

use csi_scsi_textfs::excerpt;

/// A node's name, as given.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeName(String);

/// The longest node name: NodeGetInfo's `node_id` "SHALL NOT exceed 256
/// bytes".
pub const MAX_LEN: usize = 256;

/// Why a string is not a node name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid node name {input:?}: {reason}")]
pub struct InvalidNodeName {
    /// What was given, cut to an [`excerpt`] (control characters escaped
    /// by `Debug`).
    pub input: String,
    /// Why it was refused, worded to follow a field's name (`node_id is
    /// required`), as the proxy's CSI refusals quote it.
    pub reason: String,
}

// === impl NodeName ===

impl NodeName {
    /// Takes a node name as given: 1 to [`MAX_LEN`] bytes, no control
    /// characters.
    pub fn parse(input: &str) -> Result<Self, InvalidNodeName> {
        let bad = |reason: String| InvalidNodeName {
            input: excerpt(input),
            reason,
        };
        if input.is_empty() {
            return Err(bad("is required".into()));
        }
        if input.len() > MAX_LEN {
            return Err(bad(format!(
                "is {} bytes long; at most {MAX_LEN}",
                input.len()
            )));
        }
        if input.chars().any(char::is_control) {
            return Err(bad("contains control characters".into()));
        }
        Ok(Self(input.to_owned()))
    }

    /// The name, as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for NodeName {
    type Err = InvalidNodeName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl AsRef<str> for NodeName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for NodeName {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for NodeName {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

// A stored node name is its text; reading one back refuses a text that is
// not a node name rather than carrying it on as a key.
crate::stored_text::stored_as_text!(NodeName, NodeName::parse);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_are_taken_as_given_or_refused_with_a_reason() {
        let at_limit = "n".repeat(MAX_LEN);
        let over = "n".repeat(MAX_LEN + 1);
        for (input, want) in [
            ("node-a", Ok("node-a")),
            ("Node-A", Ok("Node-A")),
            (" node-a ", Ok(" node-a ")),
            ("ip-10-0-0-1.ec2.internal", Ok("ip-10-0-0-1.ec2.internal")),
            ("nœud", Ok("nœud")),
            (at_limit.as_str(), Ok(at_limit.as_str())),
            ("", Err("is required")),
            (over.as_str(), Err("is 257 bytes long; at most 256")),
            ("node\n", Err("contains control characters")),
            ("no\0de", Err("contains control characters")),
            ("node\u{7f}", Err("contains control characters")),
        ] {
            match (NodeName::parse(input), want) {
                (Ok(n), Ok(w)) => {
                    assert_eq!(n, w);
                    assert_eq!(n.to_string(), w);
                    assert_eq!(w.parse::<NodeName>(), Ok(n));
                }
                (Err(e), Err(reason)) => assert_eq!(e.reason, reason, "{input:?}"),
                (got, want) => panic!("{input:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn errors_quote_an_excerpt_of_a_long_input() {
        let e = NodeName::parse(&"x".repeat(100_000)).expect_err("too long");
        assert!(e.to_string().len() < 200, "{e}");
        assert!(e.to_string().contains("100000 bytes"), "{e}");
    }

    #[cfg(feature = "serde")]
    #[test]
    fn a_stored_node_name_reads_back_only_if_it_parses() {
        let n = NodeName::parse("node-a").expect("node name");
        let json = serde_json::to_string(&n).expect("serialise");
        assert_eq!(json, "\"node-a\"");
        assert_eq!(
            serde_json::from_str::<NodeName>(&json).expect("read back"),
            n
        );
        for refused in ["\"\"", "\"node\\n\"", "17", "null"] {
            assert!(
                serde_json::from_str::<NodeName>(refused).is_err(),
                "{refused} read as a node name"
            );
        }
    }

    #[cfg(feature = "serde")]
    #[test]
    fn its_schema_is_a_plain_string() {
        assert_eq!(
            schemars::schema_for!(NodeName),
            schemars::schema_for!(String)
        );
    }
}
