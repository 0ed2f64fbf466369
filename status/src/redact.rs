//! What a reader off the machine may see: the one rule both binaries'
//! `/status` follow for a peer that is not loopback.
//!
//! The status port is unauthenticated and, on the agents, on the host
//! network. What it hands anyone who reaches it must not help them reach
//! the storage: no portal, no target IQN or port WWPN (where and whom to
//! log in to or zone against), no CHAP Secret's name or namespace (what to
//! steal), and no free-text error message (those quote all three). Counts,
//! phases, states, health and request IDs stay: they are what probes,
//! dashboards and a first look need, and a request ID leads to the full
//! message in the log. LUN WWIDs stay too: they name a LUN, not a way to
//! it, and they are how volumes and devices are matched.

use crate::{ErrorRecord, Status, agent, proxy};

impl Status {
    /// Whether the server left storage addresses, names and error messages
    /// out because the reader is not on its machine.
    pub fn is_redacted(&self) -> bool {
        match self {
            Self::Agent(d) => d.redacted,
            Self::Proxy(d) => d.redacted,
        }
    }

    /// The document as a peer that is not on the machine sees it: see the
    /// module's documentation for what is left out and why.
    pub fn redacted(self) -> Self {
        match self {
            Self::Agent(d) => Self::Agent(agent_view(d)),
            Self::Proxy(d) => Self::Proxy(proxy_view(d)),
        }
    }
}

fn agent_view(mut d: agent::Document) -> agent::Document {
    for s in &mut d.sessions {
        s.target.clear();
        s.portal.clear();
    }
    for p in d.devices.iter_mut().flat_map(|d| &mut d.paths) {
        p.target.clear();
        // A by-path name spells out the portal and IQN (or the WWPN).
        p.by_path = None;
    }
    errors_view(&mut d.recent_errors);
    d.redacted = true;
    d
}

fn proxy_view(mut d: proxy::Document) -> proxy::Document {
    for t in &mut d.targets {
        if let Some(i) = &mut t.iscsi {
            i.portals.clear();
            i.iqn.clear();
            i.chap_secret_ref = None;
        }
        if let Some(f) = &mut t.fibre_channel {
            f.wwpns.clear();
        }
    }
    errors_view(&mut d.recent_errors);
    d.redacted = true;
    d
}

/// Errors keep when, where, the code and the request ID; the message may
/// quote a portal, an IQN or a Secret's name.
fn errors_view(errors: &mut [ErrorRecord]) {
    for e in errors {
        e.message.clear();
    }
}
