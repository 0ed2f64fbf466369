//! The `/status` documents of csi-scsi's two binaries as plain data: the
//! agent's ([`agent::Document`]) and the proxy's ([`proxy::Document`]),
//! told apart by their `component` field ([`Status`]). The servers build
//! and serialise these types; the `csi-scsi` CLI deserialises them.
//!
//! The JSON names are the ones operators' scripts read (see
//! `docs/operations.md`). A field that older readers can do without may be
//! added within a schema (they ignore it); renaming, removing or retyping a
//! field, or adding a variant to an enum, takes a new [`SCHEMA`]. A reader
//! checks the [`Header`] first and refuses a schema it does not know with a
//! [`SchemaError`] that says so.
//!
//! Nothing secret is part of these types: targets name their CHAP Secret,
//! never its contents; no initiator name, no pod UID. A reader who is not
//! on the machine itself gets less still: [`Status::redacted`].
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod agent;
pub mod proxy;
mod redact;

use std::fmt;

use serde::{Deserialize, Serialize};

/// The schema of the documents these types describe (`schema` in JSON).
pub const SCHEMA: u32 = 1;

/// The schema of a document without a `schema` field: those came before
/// the field and have exactly the shape of schema 1.
pub const UNVERSIONED_SCHEMA: u32 = 1;

/// A `/status` document of either binary, tagged by `component`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "component", rename_all = "lowercase")]
pub enum Status {
    /// An agent's (`"component": "agent"`).
    Agent(agent::Document),
    /// The proxy's (`"component": "proxy"`).
    Proxy(proxy::Document),
}

/// What every `/status` document carries: enough to tell whether this
/// crate can read the rest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// `agent` or `proxy`; `None` when the document has no `component`.
    #[serde(default)]
    pub component: Option<String>,
    /// The document's schema ([`UNVERSIONED_SCHEMA`] when it has none).
    #[serde(default = "unversioned")]
    pub schema: u32,
}

/// Why a document cannot be read with these types.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SchemaError {
    /// No `component`: not a csi-scsi `/status` document.
    NoComponent,
    /// A `component` other than `agent` or `proxy`.
    UnknownComponent(String),
    /// A `schema` other than [`SCHEMA`].
    Unsupported {
        /// The document's schema.
        found: u32,
    },
}

/// A failed call, as `recent_errors` lists it (newest first).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorRecord {
    /// When it finished (RFC 3339, UTC).
    pub time: String,
    /// Where: the gRPC service (`csi.v1.Node`, `csi.agent.v1.Agent`) or a
    /// background task (`discovery`).
    pub source: String,
    /// The method or step.
    pub method: String,
    /// The gRPC code name (`NotFound`, `Unavailable`, ...).
    pub code: String,
    /// The message sent to the caller.
    pub message: String,
    /// The request ID of the call, empty when it had none.
    pub request_id: String,
}

fn unversioned() -> u32 {
    UNVERSIONED_SCHEMA
}

// === impl Status ===

impl Status {
    /// The failed calls it lists, newest first.
    pub fn recent_errors(&self) -> &[ErrorRecord] {
        match self {
            Self::Agent(d) => &d.recent_errors,
            Self::Proxy(d) => &d.recent_errors,
        }
    }
}

// === impl Header ===

impl Header {
    /// `Ok` when the document is an agent's or the proxy's in [`SCHEMA`].
    pub fn check(&self) -> Result<(), SchemaError> {
        match self.component.as_deref() {
            None => return Err(SchemaError::NoComponent),
            Some("agent" | "proxy") => {}
            Some(other) => return Err(SchemaError::UnknownComponent(other.to_owned())),
        }
        if self.schema != SCHEMA {
            return Err(SchemaError::Unsupported { found: self.schema });
        }
        Ok(())
    }
}

// === impl SchemaError ===

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoComponent => f.write_str("no component in it: not a csi-scsi /status document"),
            Self::UnknownComponent(c) => {
                write!(f, "component {c:?} is neither \"agent\" nor \"proxy\"")
            }
            Self::Unsupported { found } if *found > SCHEMA => write!(
                f,
                "status schema {found} is newer than this reader understands (schema {SCHEMA}); \
                 use a csi-scsi CLI of the server's release or later"
            ),
            Self::Unsupported { found } => write!(
                f,
                "status schema {found} is older than this reader understands (schema {SCHEMA}); \
                 use a csi-scsi CLI of the server's release"
            ),
        }
    }
}

impl std::error::Error for SchemaError {}

#[cfg(test)]
mod tests;
