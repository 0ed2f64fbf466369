//! Why a target is refused before any agent is asked about it: its
//! selector rests on keys a kubelet can set ([`KubeletSettableSelector`]),
//! or how it is reached does not parse ([`InvalidTransport`]: an IQN,
//! portal or WWPN the contract refuses, which every agent would refuse on
//! every Discover). Discovery skips such a target and says why on its
//! status.

use csi_scsi_contract::iscsi::MAX_PORTALS;
use csi_scsi_contract::{InvalidIqn, InvalidPortal, InvalidWwpn, Iqn, Portal, Wwpn};

use super::model::{Target, Transport};
use super::node_label::KubeletSettableSelector;

/// A target whose IQN, portals or WWPNs do not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("target {target}'s {fault}: no agent is asked about it until its spec is fixed")]
pub struct InvalidTransport {
    /// The target.
    pub target: String,
    /// What does not parse.
    pub fault: TransportFault,
}

/// What part of a target's transport does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TransportFault {
    /// The iSCSI name.
    #[error("iscsi.iqn {0}")]
    Iqn(#[from] InvalidIqn),
    /// A portal.
    #[error("iscsi.portals: {0}")]
    Portal(#[from] InvalidPortal),
    /// No portal at all.
    #[error("iscsi.portals: at least one portal is required")]
    NoPortal,
    /// More portals than an agent logs in to.
    #[error("iscsi.portals: {0} portals; at most {MAX_PORTALS}")]
    TooManyPortals(usize),
    /// A target port name.
    #[error("fibreChannel.wwpns: {0}")]
    Wwpn(#[from] InvalidWwpn),
    /// No target port at all.
    #[error("fibreChannel.wwpns: at least one WWPN is required")]
    NoWwpn,
}

/// Why discovery left a target out.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TargetRefused {
    /// Its selector could select a node that labels itself.
    #[error(transparent)]
    Selector(#[from] KubeletSettableSelector),
    /// How it is reached does not parse.
    #[error(transparent)]
    Transport(#[from] InvalidTransport),
}

// === impl Target ===

impl Target {
    /// Parses the IQN, portals and WWPNs as every agent would: a target
    /// they would all refuse is refused here, once.
    pub fn check_transport(&self) -> Result<(), InvalidTransport> {
        self.transport_fault().map_or(Ok(()), |fault| {
            Err(InvalidTransport {
                target: self.name.clone(),
                fault,
            })
        })
    }

    fn transport_fault(&self) -> Option<TransportFault> {
        match &self.transport {
            Transport::Iscsi(i) => {
                if let Err(e) = Iqn::parse(&i.iqn) {
                    return Some(e.into());
                }
                if let Some(e) = i.portals.iter().find_map(|p| Portal::parse(p).err()) {
                    return Some(e.into());
                }
                match i.portals.len() {
                    0 => Some(TransportFault::NoPortal),
                    n if n > MAX_PORTALS => Some(TransportFault::TooManyPortals(n)),
                    _ => None,
                }
            }
            Transport::FibreChannel(f) => {
                if let Some(e) = f.wwpns.iter().find_map(|w| Wwpn::parse(w).err()) {
                    return Some(e.into());
                }
                f.wwpns.is_empty().then_some(TransportFault::NoWwpn)
            }
        }
    }
}

// === impl TargetRefused ===

impl TargetRefused {
    /// The target refused.
    pub fn target(&self) -> &str {
        match self {
            Self::Selector(s) => &s.target,
            Self::Transport(t) => &t.target,
        }
    }

    /// The reason a status condition gives (a CamelCase word).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Selector(_) => "SelectorNotProtected",
            Self::Transport(_) => "InvalidTransport",
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::device::{FcTarget, IscsiTarget, NewLuns};

    fn target(transport: Transport) -> Target {
        Target {
            name: "t1".into(),
            transport,
            node_selector: BTreeMap::new(),
            nodes: Vec::new(),
            device_labels: BTreeMap::new(),
            array: None,
            new_luns: NewLuns::default(),
        }
    }

    fn iscsi(iqn: &str, portals: &[&str]) -> Target {
        target(Transport::Iscsi(IscsiTarget {
            portals: portals.iter().map(|p| (*p).to_owned()).collect(),
            iqn: iqn.into(),
            chap_secret_ref: None,
        }))
    }

    fn fc(wwpns: &[&str]) -> Target {
        target(Transport::FibreChannel(FcTarget {
            wwpns: wwpns.iter().map(|w| (*w).to_owned()).collect(),
        }))
    }

    #[test]
    fn a_transport_every_agent_would_refuse_is_refused_naming_the_field() {
        const IQN: &str = "iqn.2026-01.test:t1";
        let many: Vec<String> = (1..=MAX_PORTALS + 1)
            .map(|i| format!("198.18.0.{i}:3260"))
            .collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        for (t, said) in [
            (iscsi("iqn.x", &["198.18.0.9:3260"]), "iscsi.iqn \"iqn.x\""),
            (iscsi("iqn.2026-01.test:a b", &["198.18.0.9"]), "iscsi.iqn"),
            (
                iscsi(IQN, &["198.18.0.9:0"]),
                "iscsi.portals: invalid portal",
            ),
            (iscsi(IQN, &["-p"]), "iscsi.portals: invalid portal"),
            (iscsi(IQN, &[]), "at least one portal"),
            (iscsi(IQN, &many), "17 portals; at most 16"),
            (fc(&["zz:zz"]), "fibreChannel.wwpns: invalid WWPN"),
            (fc(&[]), "at least one WWPN"),
        ] {
            let e = t.check_transport().expect_err(said).to_string();
            assert!(e.starts_with("target t1's ") && e.contains(said), "{e}");
        }
        for good in [
            iscsi(IQN, &["198.18.0.9:3260", "[fd00::1]", "array.example"]),
            iscsi("naa.6001405d27e5d898829468b90ce4ef8c", &many[..MAX_PORTALS]),
            fc(&["0x500a098188888888", "50:0a:09:81:99:99:99:99"]),
        ] {
            assert_eq!(good.check_transport(), Ok(()), "{good:?}");
        }
    }
}
