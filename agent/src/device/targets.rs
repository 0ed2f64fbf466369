//! A target as the agent API describes it, parsed and checked once
//! ([`TargetSpec`]): how it is reached (iSCSI IQN, portals and CHAP, or FC
//! port WWPNs), and the key of its per-target locks ([`TargetKey`]).
//! Everything iscsiadm and the session records would refuse is refused
//! here, as INVALID_ARGUMENT naming the field, before any portal is tried.

use std::fmt;

use csi_scsi_contract::iscsi::{MAX_CHAP_LEN, MAX_PORTALS};
use csi_scsi_contract::{Iqn, Portal, Wwpn};
use csi_scsi_proto::agent::ChapCredentials;
use csi_scsi_textfs::text;

use crate::error::AgentError;
use crate::host::iscsiadm::{Chap, MutualChap, Secret};
use crate::host::sysfs;

/// How a target is reached, parsed from the agent API request.
#[derive(Clone, Debug)]
pub enum Transport {
    /// iSCSI portals and IQN, with CHAP.
    Iscsi {
        /// Target IQN.
        iqn: Iqn,
        /// Portals.
        portals: Vec<Portal>,
        /// CHAP credentials, if the target needs them.
        chap: Option<Chap>,
    },
    /// FC target ports.
    Fc {
        /// Target port WWPNs.
        wwpns: Vec<Wwpn>,
    },
}

/// A target, named.
#[derive(Clone, Debug)]
pub struct TargetSpec {
    /// The SCSITarget name.
    pub name: String,
    /// How to reach it.
    pub transport: Transport,
}

/// What a path knows of the target it came through: the key of the
/// agent's per-target locks (a caller that only knows a device's paths
/// finds the same locks as one that knows the target), and how a disk is
/// matched to its target.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum TargetKey {
    /// An iSCSI target, by IQN.
    Iscsi(String),
    /// One FC target port, by WWPN (a path comes through one port only).
    Fc(Wwpn),
}

impl TargetSpec {
    /// The per-target locks an operation on this target holds: its IQN,
    /// or each of its ports.
    pub(crate) fn lock_keys(&self) -> Vec<TargetKey> {
        match &self.transport {
            Transport::Iscsi { iqn, .. } => vec![TargetKey::Iscsi(iqn.to_string())],
            Transport::Fc { wwpns } => wwpns.iter().copied().map(TargetKey::Fc).collect(),
        }
    }
}

// === impl TargetKey ===

impl TargetKey {
    /// The lock of the target a path came through, when it names one.
    pub(crate) fn of_path(transport: &sysfs::Transport) -> Option<Self> {
        match transport {
            sysfs::Transport::Iscsi {
                target: Some(iqn), ..
            } => Some(Self::Iscsi(iqn.clone())),
            sysfs::Transport::Fc {
                target_wwpn: Some(w),
            } => Some(Self::Fc(*w)),
            _ => None,
        }
    }
}

impl fmt::Display for TargetKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Iscsi(iqn) => write!(f, "iscsi:{iqn}"),
            Self::Fc(wwpn) => write!(f, "fc:{wwpn}"),
        }
    }
}

impl TargetSpec {
    /// Parses the API message's pieces; errors name the field. Everything
    /// iscsiadm and the session records would refuse (or misread) is
    /// refused here, as INVALID_ARGUMENT, before any portal is tried: the
    /// target name, the IQN's form and length, and the CHAP names and
    /// secrets (whose values no error quotes). A CHAP username left empty
    /// means no CHAP.
    pub fn iscsi(
        name: &str,
        iqn: &str,
        portals: &[String],
        chap: Option<&ChapCredentials>,
    ) -> Result<Self, AgentError> {
        check_name(name)?;
        let iqn = Iqn::parse(iqn).map_err(|e| AgentError::InvalidArgument {
            field: "target.iscsi.iqn",
            reason: e.to_string(),
        })?;
        let portals = portals
            .iter()
            .map(|p| Portal::parse(p))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| AgentError::InvalidArgument {
                field: "target.iscsi.portals",
                reason: e.to_string(),
            })?;
        if portals.is_empty() {
            return Err(AgentError::InvalidArgument {
                field: "target.iscsi.portals",
                reason: "at least one portal is required".into(),
            });
        }
        if portals.len() > MAX_PORTALS {
            return Err(AgentError::InvalidArgument {
                field: "target.iscsi.portals",
                reason: format!("{} portals; at most {MAX_PORTALS}", portals.len()),
            });
        }
        let chap = match chap {
            Some(c) if !c.username.is_empty() => {
                let (u, p) = (c.username.as_str(), c.password.as_str());
                let (mu, mp) = (c.mutual_username.as_str(), c.mutual_password.as_str());
                check_text("target.iscsi.chap.username", u, MAX_CHAP_LEN, Shown::Value)?;
                check_text("target.iscsi.chap.password", p, MAX_CHAP_LEN, Shown::Secret)?;
                let mutual = if mu.is_empty() {
                    None
                } else {
                    check_text(
                        "target.iscsi.chap.mutual_username",
                        mu,
                        MAX_CHAP_LEN,
                        Shown::Value,
                    )?;
                    check_text(
                        "target.iscsi.chap.mutual_password",
                        mp,
                        MAX_CHAP_LEN,
                        Shown::Secret,
                    )?;
                    Some(MutualChap {
                        username: mu.to_owned(),
                        password: Secret::new(mp),
                    })
                };
                Some(Chap {
                    username: u.to_owned(),
                    password: Secret::new(p),
                    mutual,
                })
            }
            _ => None,
        };
        Ok(Self {
            name: name.to_owned(),
            transport: Transport::Iscsi { iqn, portals, chap },
        })
    }

    /// The agent API's description of a target, checked.
    pub fn from_api(t: &csi_scsi_proto::agent::Target) -> Result<Self, AgentError> {
        use csi_scsi_proto::agent::target::Transport as Api;
        match &t.transport {
            Some(Api::Iscsi(i)) => Self::iscsi(&t.name, &i.iqn, &i.portals, i.chap.as_ref()),
            Some(Api::FibreChannel(f)) => Self::fc(&t.name, &f.wwpns),
            None => Err(AgentError::InvalidArgument {
                field: "target",
                reason: "iscsi or fibre_channel is required".to_owned(),
            }),
        }
    }

    /// An FC target from WWPNs in any spelling; at least one is required.
    pub fn fc(name: &str, wwpns: &[String]) -> Result<Self, AgentError> {
        check_name(name)?;
        let wwpns = wwpns
            .iter()
            .map(|w| Wwpn::parse(w))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| AgentError::InvalidArgument {
                field: "target.fibre_channel.wwpns",
                reason: e.to_string(),
            })?;
        if wwpns.is_empty() {
            return Err(AgentError::InvalidArgument {
                field: "target.fibre_channel.wwpns",
                reason: "at least one WWPN is required".into(),
            });
        }
        Ok(Self {
            name: name.to_owned(),
            transport: Transport::Fc { wwpns },
        })
    }
}

/// The longest target name (a Kubernetes object name).
const MAX_NAME: usize = 253;

/// Whether an error may quote the value it refuses.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shown {
    /// Quoted (as a bounded, escaped excerpt).
    Value,
    /// Never quoted: a CHAP secret.
    Secret,
}

/// Refuses text iscsiadm and the session records must never see: empty,
/// longer than `max` bytes, or with control characters (iscsid stores each
/// value as a `key = value` line).
fn check_text(
    field: &'static str,
    value: &str,
    max: usize,
    shown: Shown,
) -> Result<(), AgentError> {
    let problem = if value.is_empty() {
        "is required".to_owned()
    } else if value.len() > max {
        format!("is {} bytes long; at most {max}", value.len())
    } else if value.chars().any(char::is_control) {
        "contains control characters".to_owned()
    } else {
        return Ok(());
    };
    let reason = match shown {
        Shown::Value if !value.is_empty() => {
            format!("{} {problem}", text::quote(value, text::INPUT_MAX))
        }
        Shown::Value | Shown::Secret => problem,
    };
    Err(AgentError::InvalidArgument { field, reason })
}

/// The target's name (the SCSITarget object's).
fn check_name(name: &str) -> Result<(), AgentError> {
    check_text("target.name", name, MAX_NAME, Shown::Value)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PORTALS: &[&str] = &["10.0.0.1:3260"];

    fn portals() -> Vec<String> {
        PORTALS.iter().map(|p| (*p).to_owned()).collect()
    }

    fn refused_field(r: Result<TargetSpec, AgentError>) -> (&'static str, String) {
        match r {
            Err(AgentError::InvalidArgument { field, reason }) => (field, reason),
            other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
        }
    }

    #[test]
    fn an_iqn_is_parsed_by_the_contract_and_refused_naming_the_field() {
        // The forms themselves are `csi_scsi_contract::iscsi`'s table.
        let iqn = "iqn.2003-01.org.linux-iscsi.array-a:lun0";
        let t = TargetSpec::iscsi("array-a", iqn, &portals(), None).expect(iqn);
        assert!(matches!(t.transport, Transport::Iscsi { iqn: ref i, .. } if i.as_str() == iqn));
        for bad in ["", "-o", "iqn.a\nnode.startup = automatic", "array-a"] {
            let (field, reason) =
                refused_field(TargetSpec::iscsi("array-a", bad, &portals(), None));
            assert_eq!(field, "target.iscsi.iqn", "{bad:?}");
            assert!(!reason.chars().any(char::is_control), "{reason:?}");
        }
    }

    #[test]
    fn chap_fields_are_checked_and_secrets_never_quoted() {
        let iqn = "iqn.2003-01.org.example:array1";
        let secret = "s3cr3t-\nvalue";
        let long_secret = "q".repeat(300);
        let chap = |u: &str, p: &str, mu: &str, mp: &str| ChapCredentials {
            username: u.to_owned(),
            password: p.to_owned(),
            mutual_username: mu.to_owned(),
            mutual_password: mp.to_owned(),
        };
        for (fields, want) in [
            (
                ("user\nnode.session.auth.authmethod = None", "pw", "", ""),
                "target.iscsi.chap.username",
            ),
            (("user", "", "", ""), "target.iscsi.chap.password"),
            (("user", secret, "", ""), "target.iscsi.chap.password"),
            (
                ("user", long_secret.as_str(), "", ""),
                "target.iscsi.chap.password",
            ),
            (
                ("user", "pw", "target\r", "pw2"),
                "target.iscsi.chap.mutual_username",
            ),
            (
                ("user", "pw", "target", ""),
                "target.iscsi.chap.mutual_password",
            ),
            (
                ("user", "pw", "target", secret),
                "target.iscsi.chap.mutual_password",
            ),
        ] {
            let (u, p, mu, mp) = fields;
            let r = TargetSpec::iscsi("array-a", iqn, &portals(), Some(&chap(u, p, mu, mp)));
            let (field, reason) = refused_field(r);
            assert_eq!(field, want, "{u:?} {mu:?}");
            assert!(
                !reason.contains("s3cr3t") && !reason.contains("qqq"),
                "{reason}"
            );
        }
        // An empty username means no CHAP, whatever else is sent.
        let t = TargetSpec::iscsi("array-a", iqn, &portals(), Some(&chap("", "x\n", "", "")))
            .expect("no CHAP");
        assert!(matches!(t.transport, Transport::Iscsi { chap: None, .. }));
        let t = TargetSpec::iscsi(
            "array-a",
            iqn,
            &portals(),
            Some(&chap("user", "pw", "tgt", "pw2")),
        )
        .expect("mutual CHAP");
        let Transport::Iscsi { chap: Some(c), .. } = t.transport else {
            panic!("CHAP expected");
        };
        assert_eq!(c.username, "user");
        assert_eq!(c.mutual.map(|m| m.username).as_deref(), Some("tgt"));
        // The credentials print without their secrets.
        let shown = format!("{:?}", chap("user", "s3cr3t", "tgt", "s3cr3t2"));
        assert!(
            shown.contains("user") && !shown.contains("s3cr3t"),
            "{shown}"
        );
    }

    #[test]
    fn target_names_and_fc_wwpns_are_checked() {
        let iqn = "iqn.2003-01.org.example:array1";
        for name in ["", "a\nb"] {
            let (field, _) = refused_field(TargetSpec::iscsi(name, iqn, &portals(), None));
            assert_eq!(field, "target.name");
            let (field, _) =
                refused_field(TargetSpec::fc(name, &["0x500a098188888888".to_owned()]));
            assert_eq!(field, "target.name");
        }
        let (field, _) = refused_field(TargetSpec::iscsi(&"n".repeat(254), iqn, &portals(), None));
        assert_eq!(field, "target.name");
        let (field, reason) = refused_field(TargetSpec::fc("fc-1", &[]));
        assert_eq!(field, "target.fibre_channel.wwpns");
        assert!(reason.contains("at least one"), "{reason}");
        let (field, _) = refused_field(TargetSpec::fc("fc-1", &["zz:zz".to_owned()]));
        assert_eq!(field, "target.fibre_channel.wwpns");
        TargetSpec::fc("fc-1", &["0x500a098188888888".to_owned()]).expect("one WWPN");
        let (field, _) = refused_field(TargetSpec::iscsi("array-a", iqn, &[], None));
        assert_eq!(field, "target.iscsi.portals");
    }

    #[test]
    fn a_target_lists_at_most_max_portals() {
        let iqn = "iqn.2026-11.io.csi-scsi.lab:array-a";
        let many: Vec<String> = (1..=MAX_PORTALS + 1)
            .map(|i| format!("127.0.0.{i}:3260"))
            .collect();
        assert!(TargetSpec::iscsi("array-a", iqn, &many[..MAX_PORTALS], None).is_ok());
        let (field, reason) = refused_field(TargetSpec::iscsi("array-a", iqn, &many, None));
        assert_eq!(field, "target.iscsi.portals");
        assert!(reason.contains("at most 16"), "{reason}");
    }

    #[test]
    fn a_path_finds_the_lock_of_the_target_it_came_through() {
        let iqn = "iqn.2026-11.io.csi-scsi.lab:array-a";
        let t = TargetSpec::iscsi("array-a", iqn, &portals(), None).expect("iSCSI");
        let path = sysfs::Transport::Iscsi {
            session: Some(1),
            target: Some(iqn.to_owned()),
            portal: None,
        };
        assert_eq!(t.lock_keys(), [TargetKey::of_path(&path).expect("named")]);

        // FC: a path knows only its own port, so each port is a key.
        let wwpns = [
            "0x500a098188888888".to_owned(),
            "0x500a098199999999".to_owned(),
        ];
        let t = TargetSpec::fc("fc-1", &wwpns).expect("FC");
        let second = Wwpn::parse(&wwpns[1]).expect("WWPN");
        let path = sysfs::Transport::Fc {
            target_wwpn: Some(second),
        };
        let key = TargetKey::of_path(&path).expect("named");
        assert!(t.lock_keys().contains(&key), "{key}");
        assert_eq!(key.to_string(), "fc:500a098199999999");

        let unnamed = sysfs::Transport::Fc { target_wwpn: None };
        assert_eq!(TargetKey::of_path(&unnamed), None);
    }
}
