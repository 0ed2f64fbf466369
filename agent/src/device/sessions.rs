//! Ensuring the node can see a target: an iSCSI login on every portal (each
//! with its own timeout, the dead ones reported), or an FC host rescan.

use std::fmt;
use std::time::{Duration, Instant};

use csi_scsi_textfs::text;

use super::Devices;
use crate::error::AgentError;
use crate::host::fc::{self, Wwpn};
use crate::host::iscsiadm::{self, Chap, IscsiError, LoginOutcome, MutualChap, Portal, Secret};
use crate::host::sysfs::{self, ScanAddress};

/// Most portals one iSCSI target may list (real arrays have a few per
/// controller; each is a login, and they are tried at once).
pub const MAX_PORTALS: usize = 16;
/// Most iSCSI logins this node runs at once: an attach storm still
/// overlaps its logins, without hundreds of iscsiadm processes.
pub const MAX_CONCURRENT_LOGINS: usize = 8;
/// How a target is reached, parsed from the agent API request.
#[derive(Clone, Debug)]
pub enum Transport {
    /// iSCSI portals and IQN, with CHAP.
    Iscsi {
        /// Target IQN.
        iqn: String,
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
            Transport::Iscsi { iqn, .. } => vec![TargetKey::Iscsi(iqn.clone())],
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

/// How one portal fared.
#[derive(Clone, Debug)]
pub struct PortalReport {
    /// `ip:port`, or the FC host.
    pub portal: String,
    /// Whether it answered.
    pub reachable: bool,
    /// Why not (never credentials).
    pub error: String,
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
        chap: Option<(&str, &str, &str, &str)>,
    ) -> Result<Self, AgentError> {
        check_name(name)?;
        check_iqn(iqn)?;
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
            Some((u, p, mu, mp)) if !u.is_empty() => {
                check_text("target.iscsi.chap.username", u, MAX_CHAP, Shown::Value)?;
                check_text("target.iscsi.chap.password", p, MAX_CHAP, Shown::Secret)?;
                let mutual = if mu.is_empty() {
                    None
                } else {
                    check_text(
                        "target.iscsi.chap.mutual_username",
                        mu,
                        MAX_CHAP,
                        Shown::Value,
                    )?;
                    check_text(
                        "target.iscsi.chap.mutual_password",
                        mp,
                        MAX_CHAP,
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
            transport: Transport::Iscsi {
                iqn: iqn.to_owned(),
                portals,
                chap,
            },
        })
    }

    /// The agent API's description of a target, checked.
    pub fn from_api(t: &csi_scsi_proto::agent::Target) -> Result<Self, AgentError> {
        use csi_scsi_proto::agent::target::Transport as Api;
        match &t.transport {
            Some(Api::Iscsi(i)) => Self::iscsi(
                &t.name,
                &i.iqn,
                &i.portals,
                i.chap.as_ref().map(|c| {
                    (
                        c.username.as_str(),
                        c.password.as_str(),
                        c.mutual_username.as_str(),
                        c.mutual_password.as_str(),
                    )
                }),
            ),
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

/// The longest iSCSI name (RFC 3720), CHAP name or secret (iscsid's limit),
/// and target name (a Kubernetes object name).
const MAX_IQN: usize = 223;
const MAX_CHAP: usize = 255;
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

/// An iSCSI name (RFC 3720 3.2.6.3) as iscsiadm takes it: printable ASCII
/// without blanks, at most 223 bytes, and one of `iqn.<yyyy-mm>.<naming
/// authority>[:<name>]`, `eui.<16 hex digits>` or `naa.<16 or 32 hex
/// digits>` (the prefixes the SCSITarget CRD requires too). A name that
/// looks like an option (`-o`) has none of these forms.
fn check_iqn(iqn: &str) -> Result<(), AgentError> {
    const FIELD: &str = "target.iscsi.iqn";
    check_text(FIELD, iqn, MAX_IQN, Shown::Value)?;
    let hex = |s: &str, lens: &[usize]| {
        lens.contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
    };
    let problem = if !iqn.bytes().all(|b| b.is_ascii_graphic()) {
        "contains blanks or characters other than printable ASCII"
    } else if let Some(rest) = iqn.strip_prefix("iqn.") {
        if iqn_form(rest) {
            return Ok(());
        }
        "is not of the form iqn.<yyyy-mm>.<naming authority>[:<name>]"
    } else if let Some(rest) = iqn.strip_prefix("eui.") {
        if hex(rest, &[16]) {
            return Ok(());
        }
        "is not of the form eui.<16 hex digits>"
    } else if let Some(rest) = iqn.strip_prefix("naa.") {
        if hex(rest, &[16, 32]) {
            return Ok(());
        }
        "is not of the form naa.<16 or 32 hex digits>"
    } else {
        "is not an iSCSI name (iqn., eui. or naa.)"
    };
    Err(AgentError::InvalidArgument {
        field: FIELD,
        reason: format!("{} {problem}", text::quote(iqn, text::INPUT_MAX)),
    })
}

/// What follows `iqn.`: a date `yyyy-mm`, a dot, and a naming authority
/// (a reversed domain name), then optionally `:` and anything printable.
fn iqn_form(rest: &str) -> bool {
    let b = rest.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    let month_ok = rest
        .get(5..7)
        .and_then(|m| m.parse::<u8>().ok())
        .is_some_and(|m| (1..=12).contains(&m));
    let authority = rest.get(8..).map(|a| a.split(':').next().unwrap_or(""));
    digits(0..4)
        && b.get(4) == Some(&b'-')
        && digits(5..7)
        && month_ok
        && b.get(7) == Some(&b'.')
        && authority.is_some_and(|a| !a.is_empty() && !a.starts_with('.') && !a.ends_with('.'))
}

impl Devices {
    /// Logs in on every portal (or rescans every FC host). Succeeds when at
    /// least one portal answered; the reports say which did not.
    pub async fn ensure_session(
        &self,
        target: &TargetSpec,
    ) -> Result<Vec<PortalReport>, AgentError> {
        match &target.transport {
            Transport::Iscsi { iqn, portals, chap } => {
                let logins = portals
                    .iter()
                    .map(|p| self.login_portal(iqn, p, chap.as_ref()));
                let results = futures::future::join_all(logins).await;
                let mut reports = Vec::new();
                let mut refused = None;
                for (portal, result) in portals.iter().zip(results) {
                    match result {
                        Ok(_) => reports.push(PortalReport {
                            portal: portal.to_string(),
                            reachable: true,
                            error: String::new(),
                        }),
                        Err(e) => {
                            if matches!(
                                e,
                                IscsiError::AuthFailed { .. } | IscsiError::LoginRefused { .. }
                            ) {
                                refused = Some(e.to_string());
                            }
                            tracing::warn!(target = %iqn, %portal, error = %e, "portal login failed");
                            reports.push(PortalReport {
                                portal: portal.to_string(),
                                reachable: false,
                                error: e.to_string(),
                            });
                        }
                    }
                }
                if reports.iter().any(|r| r.reachable) {
                    return Ok(reports);
                }
                if let Some(reason) = refused {
                    return Err(AgentError::LoginRefused {
                        target: iqn.clone(),
                        reason,
                    });
                }
                Err(AgentError::NoPortalAnswered {
                    target: iqn.clone(),
                    detail: reports
                        .iter()
                        .map(|r| format!("{}: {}", r.portal, r.error))
                        .collect::<Vec<_>>()
                        .join("; "),
                })
            }
            Transport::Fc { .. } => {
                let hosts = fc::fc_hosts(&self.host)
                    .map_err(|e| AgentError::io(self.host.sys("class/fc_host"), e))?;
                let mut reports = Vec::new();
                for h in hosts {
                    let r = fc::issue_lip(&self.host, h.host_no).and_then(|()| {
                        sysfs::scan_host(&self.host, h.host_no, ScanAddress::default())
                    });
                    reports.push(PortalReport {
                        portal: format!("host{}", h.host_no),
                        reachable: r.is_ok(),
                        error: r.err().map(|e| e.to_string()).unwrap_or_default(),
                    });
                }
                Ok(reports)
            }
        }
    }

    async fn login_portal(
        &self,
        iqn: &str,
        portal: &Portal,
        chap: Option<&Chap>,
    ) -> Result<LoginOutcome, IscsiError> {
        // Held for the whole login: a bounded number at a time.
        let _slot = self.logins.acquire().await;
        // A live session keeps its record: no secret is handled again
        // (every Attach and Discover passes through here). iscsiadm still
        // has the last word (it answers "already present", or logs in if
        // the session went meanwhile); only a record gone sends us on to
        // write it anew.
        if self.has_session(iqn, portal) {
            match iscsiadm::login(&self.host, iqn, portal, self.login_timeout).await {
                Err(IscsiError::NoNodeRecord { .. }) => {}
                done => return done,
            }
        }
        iscsiadm::create_node(&self.host, iqn, portal).await?;
        match chap {
            Some(c) => iscsiadm::set_chap(&self.host, iqn, portal, c).await?,
            None => iscsiadm::clear_chap(&self.host, iqn, portal).await?,
        }
        iscsiadm::login(&self.host, iqn, portal, self.login_timeout).await
    }

    /// Whether a session to `iqn` through `portal` is listed in sysfs (an
    /// unreadable list is "no": the login then finds out for itself).
    fn has_session(&self, iqn: &str, portal: &Portal) -> bool {
        sysfs::iscsi_sessions(&self.host).is_ok_and(|sessions| {
            sessions
                .iter()
                .any(|s| s.target == iqn && s.portal.as_ref() == Some(portal))
        })
    }

    /// Asks the SCSI layer to look for new LUNs of `target` (session rescan
    /// or FC host scan).
    pub async fn rescan_target(&self, target: &TargetSpec) -> Result<(), AgentError> {
        match &target.transport {
            Transport::Iscsi { iqn, .. } => {
                let sessions = sysfs::iscsi_sessions(&self.host)
                    .map_err(|e| AgentError::io(self.host.sys("class/iscsi_session"), e))?;
                for s in sessions.iter().filter(|s| &s.target == iqn) {
                    iscsiadm::rescan_session(&self.host, s.sid).await?;
                }
                Ok(())
            }
            Transport::Fc { .. } => self.ensure_session(target).await.map(|_| ()),
        }
    }

    /// Logs out of every portal of `target` (iSCSI; FC has no session).
    pub async fn logout(&self, target: &TargetSpec) -> Result<(), AgentError> {
        if let Transport::Iscsi { iqn, portals, .. } = &target.transport {
            for p in portals {
                iscsiadm::logout(&self.host, iqn, p).await?;
                // The record (and the CHAP secret in it) goes with the
                // session: nothing is left for a reboot to log in with.
                iscsiadm::delete_node(&self.host, iqn, p).await?;
            }
        }
        Ok(())
    }

    /// Waits until the set of disks seen through `target` stops changing
    /// (the kernel scans asynchronously after a login or a scan request).
    pub async fn settle(&self, target: &TargetSpec, within: Duration) {
        let start = Instant::now();
        let mut last: Option<Vec<String>> = None;
        let mut stable_since = Instant::now();
        while start.elapsed() < within {
            let now: Vec<String> = sysfs::scsi_disks(&self.host)
                .unwrap_or_default()
                .into_iter()
                .filter(|d| super::came_through(d, target))
                .map(|d| format!("{}={}", d.kernel_name, d.size_bytes))
                .collect();
            if last.as_ref() == Some(&now) {
                if stable_since.elapsed() >= Duration::from_millis(300) {
                    return;
                }
            } else {
                last = Some(now);
                stable_since = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
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
    fn well_formed_iscsi_names_are_accepted() {
        for iqn in [
            "iqn.2003-01.org.linux-iscsi.array-a:lun0",
            "iqn.2016-04.com.open-iscsi:ef9f41e2ffa7:vs.3",
            "iqn.2026-11.io.csi-scsi.lab:array-a",
            "iqn.1992-08.com.netapp",
            "eui.0123456789ABCDEF",
            "naa.5000c5003011cb28",
            "naa.6001405d27e5d898829468b90ce4ef8c",
        ] {
            let t = TargetSpec::iscsi("array-a", iqn, &portals(), None).expect(iqn);
            assert!(matches!(t.transport, Transport::Iscsi { iqn: ref i, .. } if i == iqn));
        }
    }

    #[test]
    fn malformed_iscsi_names_are_refused_naming_the_field() {
        let long = format!("iqn.2003-01.org.example:{}", "a".repeat(200));
        for iqn in [
            "",
            "-o",
            "--op=delete",
            "iqn.x:a b",
            "iqn.a\nnode.startup = automatic",
            "iqn.2003-1.org.example",
            "iqn.2003-13.org.example",
            "iqn.2003-01.",
            "iqn.2003-01.:x",
            "iqn.2003-01org.example",
            "IQN.2003-01.org.example",
            "eui.0123",
            "eui.0123456789abcdeg",
            "naa.6001405d27e5d898829468b90ce4ef8",
            "array-a",
            "iqn.2003-01.org.ex\u{e9}",
            long.as_str(),
        ] {
            let (field, reason) =
                refused_field(TargetSpec::iscsi("array-a", iqn, &portals(), None));
            assert_eq!(field, "target.iscsi.iqn", "{iqn:?}");
            assert!(!reason.chars().any(char::is_control), "{reason:?}");
            assert!(reason.len() < 256, "{reason}");
        }
    }

    #[test]
    fn chap_fields_are_checked_and_secrets_never_quoted() {
        let iqn = "iqn.2003-01.org.example:array1";
        let secret = "s3cr3t-\nvalue";
        let long_secret = "q".repeat(300);
        for (chap, want) in [
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
            let r = TargetSpec::iscsi("array-a", iqn, &portals(), Some(chap));
            let (field, reason) = refused_field(r);
            assert_eq!(field, want, "{chap:?}");
            assert!(
                !reason.contains("s3cr3t") && !reason.contains("qqq"),
                "{reason}"
            );
        }
        // An empty username means no CHAP, whatever else is sent.
        let t = TargetSpec::iscsi("array-a", iqn, &portals(), Some(("", "x\n", "", "")))
            .expect("no CHAP");
        assert!(matches!(t.transport, Transport::Iscsi { chap: None, .. }));
        let t = TargetSpec::iscsi(
            "array-a",
            iqn,
            &portals(),
            Some(("user", "pw", "tgt", "pw2")),
        )
        .expect("mutual CHAP");
        let Transport::Iscsi { chap: Some(c), .. } = t.transport else {
            panic!("CHAP expected");
        };
        assert_eq!(c.username, "user");
        assert_eq!(c.mutual.map(|m| m.username).as_deref(), Some("tgt"));
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
