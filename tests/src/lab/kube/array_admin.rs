//! The array administrator of a kept Kubernetes lab. Growing a volume
//! beyond its LUN waits for the array to grow the LUN: the proxy records a
//! PendingResizeRequest, and an administrator acts on it. The lab's expand
//! step does that by hand; a suite that expands volumes on its own (the
//! storage e2e suite's volume-expand specs) needs someone to do it while it
//! runs. This one grows the LUN's backing file to the size asked for and
//! has tgtd re-read it, and logs every action.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use csi_scsi_proxy::resources::PendingResizeRequest;

use crate::kube::Kubectl;
use crate::lab::kube::KubeManifest;
use crate::lab::kube::api::Typed;
use crate::tgt::{refresh_shown_lun, shown_luns};

/// How often the requests are read.
const POLL: Duration = Duration::from_secs(2);

/// A running administrator; [`ArrayAdmin::stop`] ends it.
pub struct ArrayAdmin {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<usize>>,
}

impl ArrayAdmin {
    /// Starts acting on the PendingResizeRequests of the lab in
    /// `manifest`; each action (or failure) is a line in `log`.
    pub fn start(manifest: &KubeManifest, log: &Path) -> anyhow::Result<Self> {
        let port = manifest
            .lab
            .tgtd_control_port
            .context("the lab.json names no tgtd control port (a lab older than the array administrator): bring the lab up again")?;
        let kubectl = Kubectl::new(&manifest.kubectl, &manifest.kubeconfig);
        let mut log =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for tgtadm");
            let mut grown = 0;
            // A line is written once: a request it cannot act on stays
            // open, and is read again every poll.
            let mut told = std::collections::HashSet::new();
            while !stopped.load(Ordering::Relaxed) {
                match rt.block_on(act_once(&kubectl, port)) {
                    Ok(lines) => {
                        grown += lines.iter().filter(|l| l.starts_with("grew")).count();
                        for l in lines.into_iter().filter(|l| told.insert(l.clone())) {
                            let _ = writeln!(log, "{l}");
                        }
                    }
                    Err(e) => {
                        let _ = writeln!(log, "error: {e:#}");
                    }
                }
                std::thread::sleep(POLL);
            }
            grown
        });
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops it; how many LUNs it grew.
    pub fn stop(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for ArrayAdmin {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Grows every LUN an open request asks more of; a line per LUN grown.
async fn act_once(kubectl: &Kubectl, port: u16) -> anyhow::Result<Vec<String>> {
    let requests = kubectl.objects::<PendingResizeRequest>(&["-A"])?;
    let open: Vec<_> = requests
        .iter()
        .filter(|r| !r.status.as_ref().is_some_and(|s| s.done))
        .collect();
    if open.is_empty() {
        return Ok(Vec::new());
    }
    let luns = shown_luns(port).await?;
    let mut done = Vec::new();
    for r in open {
        let wanted = r.spec.requested_bytes;
        // The lab's WWIDs are `naa.<scsi_id>` (crate::tgt::LunIdentity).
        let Some(lun) = r
            .spec
            .wwid
            .strip_prefix("naa.")
            .and_then(|id| luns.iter().find(|l| l.scsi_id == id))
        else {
            done.push(format!("no LUN on the arrays has WWID {}", r.spec.wwid));
            continue;
        };
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&lun.backing_file)
            .with_context(|| format!("opening {}", lun.backing_file.display()))?;
        let old = file.metadata()?.len();
        if old >= wanted {
            continue;
        }
        file.set_len(wanted)?;
        refresh_shown_lun(port, lun).await?;
        done.push(format!(
            "grew {} ({}) {old} -> {wanted} bytes for PVC {}/{}",
            r.spec.wwid,
            lun.backing_file.display(),
            r.metadata.namespace.as_deref().unwrap_or_default(),
            r.spec.claim_name
        ));
    }
    Ok(done)
}
