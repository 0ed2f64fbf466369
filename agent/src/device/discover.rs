//! Discover: ensure the session, scan, and report every LUN seen through
//! the target.

use std::time::Duration;

use super::{Devices, PortalReport, TargetSpec, came_through};
use crate::error::AgentError;
use crate::host::sysfs::Lun;

impl Devices {
    /// The LUNs `target` exposes to this node, grouped by WWID (only the
    /// paths through this target are listed), and how each portal fared.
    pub async fn discover(
        &self,
        target: &TargetSpec,
    ) -> Result<(Vec<Lun>, Vec<PortalReport>), AgentError> {
        let _held = self.lock_targets(std::slice::from_ref(target)).await;
        let reports = self.connect_target(target).await?;
        self.rescan_target(target).await?;
        self.settle(target, Duration::from_secs(3)).await;
        let mut luns = self.luns()?;
        for lun in &mut luns {
            lun.paths.retain(|p| came_through(p, target));
        }
        luns.retain(|l| !l.paths.is_empty());
        Ok((luns, reports))
    }
}
