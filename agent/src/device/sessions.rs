//! Ensuring the node can see a target: an iSCSI login on every portal (each
//! with its own timeout, the dead ones reported), or an FC host rescan.

use std::time::{Duration, Instant};

use super::Devices;
use crate::error::AgentError;
use crate::host::fc::{self, Wwpn};
use crate::host::iscsiadm::{self, Chap, IscsiError, LoginOutcome, MutualChap, Portal, Secret};
use crate::host::sysfs::{self, ScanAddress};

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

impl TargetSpec {
    /// What the per-target lock is keyed by: the IQN, or the WWPNs, so a
    /// caller that only knows a device's paths finds the same lock.
    pub(crate) fn lock_key(&self) -> String {
        match &self.transport {
            Transport::Iscsi { iqn, .. } => format!("iscsi:{iqn}"),
            Transport::Fc { wwpns } => {
                let mut w: Vec<String> = wwpns.iter().map(ToString::to_string).collect();
                w.sort();
                format!("fc:{}", w.join(","))
            }
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
    /// Parses the API message's pieces; errors name the field.
    pub fn iscsi(
        name: &str,
        iqn: &str,
        portals: &[String],
        chap: Option<(&str, &str, &str, &str)>,
    ) -> Result<Self, AgentError> {
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
        let chap = chap
            .filter(|(u, ..)| !u.is_empty())
            .map(|(u, p, mu, mp)| Chap {
                username: u.to_owned(),
                password: Secret::new(p),
                mutual: (!mu.is_empty()).then(|| MutualChap {
                    username: mu.to_owned(),
                    password: Secret::new(mp),
                }),
            });
        Ok(Self {
            name: name.to_owned(),
            transport: Transport::Iscsi {
                iqn: iqn.to_owned(),
                portals,
                chap,
            },
        })
    }

    /// An FC target from WWPNs in any spelling.
    pub fn fc(name: &str, wwpns: &[String]) -> Result<Self, AgentError> {
        let wwpns = wwpns
            .iter()
            .map(|w| Wwpn::parse(w))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| AgentError::InvalidArgument {
                field: "target.fibre_channel.wwpns",
                reason: e.to_string(),
            })?;
        Ok(Self {
            name: name.to_owned(),
            transport: Transport::Fc { wwpns },
        })
    }
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
        iscsiadm::create_node(&self.host, iqn, portal).await?;
        match chap {
            Some(c) => iscsiadm::set_chap(&self.host, iqn, portal, c).await?,
            None => iscsiadm::clear_chap(&self.host, iqn, portal).await?,
        }
        iscsiadm::login(&self.host, iqn, portal, self.login_timeout).await
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
