//! Ensuring the node can see a target: an iSCSI login on every portal (each
//! with its own timeout, the dead ones reported), or an FC LIP and host
//! scan; rescans, logouts, and waiting for the kernel's scan to settle.

use std::time::{Duration, Instant};

use csi_scsi_contract::{Iqn, Portal};

use super::Devices;
use super::targets::{TargetSpec, Transport};
use crate::error::AgentError;
use crate::host::fc;
use crate::host::iscsiadm::{self, Chap, IscsiError, LoginOutcome};
use crate::host::sysfs::{self, ScanAddress};

/// Most iSCSI logins this node runs at once: an attach storm still
/// overlaps its logins, without hundreds of iscsiadm processes.
pub(super) const MAX_CONCURRENT_LOGINS: usize = 8;

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

impl Devices {
    /// Makes the node see `target`'s LUNs: an iSCSI login on every portal
    /// (an existing session is kept), or for FC a LIP and a SCSI scan on
    /// every HBA. Succeeds when at least one portal (or HBA) answered; the
    /// reports say which did not.
    pub async fn connect_target(
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
                        target: iqn.to_string(),
                        reason,
                    });
                }
                Err(AgentError::NoPortalAnswered {
                    target: iqn.to_string(),
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
        iqn: &Iqn,
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
            match iscsiadm::login(&self.host, iqn.as_str(), portal, self.login_timeout).await {
                Err(IscsiError::NoNodeRecord { .. }) => {}
                done => return done,
            }
        }
        iscsiadm::create_node(&self.host, iqn.as_str(), portal).await?;
        match chap {
            Some(c) => iscsiadm::set_chap(&self.host, iqn.as_str(), portal, c).await?,
            None => iscsiadm::clear_chap(&self.host, iqn.as_str(), portal).await?,
        }
        iscsiadm::login(&self.host, iqn.as_str(), portal, self.login_timeout).await
    }

    /// Whether a session to `iqn` through `portal` is listed in sysfs (an
    /// unreadable list is "no": the login then finds out for itself).
    fn has_session(&self, iqn: &Iqn, portal: &Portal) -> bool {
        sysfs::iscsi_sessions(&self.host).is_ok_and(|sessions| {
            sessions
                .iter()
                .any(|s| s.target == iqn.as_str() && s.portal.as_ref() == Some(portal))
        })
    }

    /// Asks the SCSI layer to look for new LUNs of `target` (session rescan
    /// or FC host scan).
    pub async fn rescan_target(&self, target: &TargetSpec) -> Result<(), AgentError> {
        match &target.transport {
            Transport::Iscsi { iqn, .. } => {
                let sessions = sysfs::iscsi_sessions(&self.host)
                    .map_err(|e| AgentError::io(self.host.sys("class/iscsi_session"), e))?;
                for s in sessions.iter().filter(|s| s.target == iqn.as_str()) {
                    iscsiadm::rescan_session(&self.host, s.sid).await?;
                }
                Ok(())
            }
            Transport::Fc { .. } => self.connect_target(target).await.map(|_| ()),
        }
    }

    /// Logs out of every portal of `target` (iSCSI; FC has no session).
    pub async fn logout(&self, target: &TargetSpec) -> Result<(), AgentError> {
        if let Transport::Iscsi { iqn, portals, .. } = &target.transport {
            for p in portals {
                iscsiadm::logout(&self.host, iqn.as_str(), p).await?;
                // The record (and the CHAP secret in it) goes with the
                // session: nothing is left for a reboot to log in with.
                iscsiadm::delete_node(&self.host, iqn.as_str(), p).await?;
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
