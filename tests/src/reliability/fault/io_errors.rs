//! Leg 4 of the fault suite, disks that fail. The lab's LUNs are served
//! through its failing disks ([`crate::disks`]). Per round, a volume is
//! formatted and given a marker, then, on its LUN: EIO on reads of the
//! head during a stage, a stall during a stage, a stall during a detach,
//! EIO on every write during the wipe of a delete. Each call fails with a
//! retryable code, in bounded time, writing nothing (the LUN's first 4 MiB
//! and last MiB read back the same); once healed, the same call succeeds,
//! and the marker reads back (no volume with data was formatted). The
//! delete answers OK before its wipe: the wipe that meets EIO leaves the
//! LUN Failed, never Available, and once healed the retried wipe
//! completes. Then the size faults ([`super::sizes`]): no size, and a
//! stale size, during the wipe of a delete. Every LUN wiped here must
//! read back as zeroes over the whole size the store records.

use std::collections::HashMap;
use std::path::PathBuf;

use super::*;
use crate::disks::{Fault, ends_of};
use crate::lab::scenario::{attach_and_mount_fs, lun_file, unmount};

/// The head of a LUN, where the probe reads first.
const HEAD: u64 = 1 << 20;
/// Longest a call that meets a failing disk may take to answer: the lab's
/// host-tool timeout, a probe read's own bound, and the proxy's hops.
const FAILING_BOUND: Duration = Duration::from_secs(45);
/// The host-tool timeout the suite's agents run with (`--command-timeout`),
/// so a probe stuck on a stalled disk answers well within `FAILING_BOUND`.
pub(super) const TOOL_TIMEOUT_SECS: &str = "10";

/// What the rounds measured.
#[derive(Default)]
struct Figures {
    refused_ms: Vec<u128>,
    codes: BTreeMap<String, u64>,
}

impl Suite {
    /// `rounds` rounds of failing-disk faults, each on a fresh volume on a
    /// random node.
    pub(super) async fn io_errors(&mut self, rounds: usize) -> anyhow::Result<()> {
        ensure!(
            self.lab.disks.is_some(),
            "the fault suite's lab has failing disks"
        );
        let mut figures = Figures::default();
        for round in 0..rounds {
            let node = node_name(self.rng.usize(..self.lab.nodes.len()));
            self.io_round(round, &node, &mut figures).await?;
            self.size_round(round, &node).await?;
        }
        self.report.note(format!(
            "failing disks: {rounds} round(s) of EIO and stalls in stage, detach and wipe, and of a size of 0 and a stale size in wipe; refused in p50/max {}/{} ms; codes {}",
            p50(&mut figures.refused_ms),
            max(&figures.refused_ms),
            figures
                .codes
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        Ok(())
    }

    async fn io_round(
        &mut self,
        round: usize,
        node: &str,
        figures: &mut Figures,
    ) -> anyhow::Result<()> {
        let name = format!("io{round}");
        let volume = self.create_ext4(&name, node).await?;
        let vol = Vol {
            spec: Spec::new(name.clone(), "zero", node),
            id: volume.volume_id.clone(),
        };
        self.acked.insert(name.clone(), vol.clone());
        let (disk, file) = lun_file(&self.lab, &volume.volume_context["wwid"])
            .context("the volume's LUN is a lab LUN")?;

        let marker = format!("{name}-{:016x}", self.rng.u64(..));
        let target = self
            .stage(&volume, node, "writer")
            .await
            .context("staging the fresh volume")?;
        std::fs::write(target.join("marker"), &marker)?;
        unmount(&self.lab, &mut self.cl, &volume, node, "writer").await?;
        let before = ends_of(&file)?;

        // A stage meets EIO on the head, then a stall.
        for fault in [Fault::ReadError(0..HEAD), Fault::Stall] {
            let what = format!("round {round}: NodeStage with {fault:?} on {disk}");
            self.inject(&disk, fault.clone())?;
            let start = Instant::now();
            self.report.op();
            // Borrows of two fields, not of the suite: both run at once.
            let disks = self.lab.disks.as_ref().context("failing disks")?;
            let (staged, reached) = tokio::join!(
                attach_and_mount_fs(
                    &self.lab,
                    &mut self.cl,
                    &volume,
                    node,
                    false,
                    "ext4",
                    "reader",
                    false
                ),
                async {
                    fault != Fault::Stall || disks.until_stalled(&disk, FAILING_BOUND).await.is_ok()
                }
            );
            let took = start.elapsed();
            self.disks().heal(&disk)?;
            self.report
                .check(reached, || format!("{what}: no I/O reached the stall"));
            self.refused_by_disk(&what, staged.err().map(|e| code_of(&e)), took, figures);
            let after = ends_of(&file)?;
            self.report.check(after == before, || {
                format!("{what}: the LUN's ends changed")
            });
        }

        // Healed: the stage succeeds and the data is there.
        let target = self.stage_until_ok(&volume, node, "reader").await?;
        let read = std::fs::read_to_string(target.join("marker")).unwrap_or_default();
        self.report.check(read == marker, || {
            format!("round {round}: after the faults, {disk}'s marker reads {read:?}, not {marker:?}: a volume with data was formatted")
        });
        unmount(&self.lab, &mut self.cl, &volume, node, "reader").await?;

        // A detach meets a stall: refused, and the volume stays published
        // there (it may still be attached).
        let what = format!("round {round}: ControllerUnpublish from {node} with {disk} stalled");
        self.inject(&disk, Fault::Stall)?;
        let o = self
            .call(&Op::Unpublish(vol.clone(), node.to_owned()), DEADLINE)
            .await;
        self.disks().heal(&disk)?;
        if !o.ok() {
            self.refused_by_disk(&what, Some(o.code), o.took, figures);
            let published = self.published_on(&vol).await;
            self.report.check(published.iter().any(|n| n == node), || {
                format!("{what}: {o}, yet the publish record was dropped ({published:?})")
            });
        }
        self.must(&Op::Unpublish(vol.clone(), node.to_owned()), &what)
            .await;

        // The wipe meets EIO on every write. DeleteVolume answers OK (it
        // does not wait for the wipe); the release worker's wipe fails (the
        // agent answers UNAVAILABLE: another node may reach the LUN), and
        // the LUN stays Releasing or Failed, never Available; healed, the
        // retried wipe (the proxy's backoff starts at 10 s) zeroes it.
        let what = format!("round {round}: DeleteVolume with every write to {disk} failing");
        let wwid = vol.id.split(':').next().unwrap_or_default().to_owned();
        let recorded = crate::reliability::store::recorded_size(&self.lab.proxy_store(), &wwid)?
            .context("the store has the volume's LUN")?;
        self.inject(&disk, Fault::WriteError(0..u64::MAX))?;
        self.delete(&vol, &what).await;
        let held = self.held_while_failing(&wwid, &disk).await?;
        self.disks().heal(&disk)?;
        self.report.check(held.is_ok(), || {
            format!("{what}: while no write could reach it, {held:?}")
        });
        let wiped = self
            .phase_becomes(&wwid, "Available", Duration::from_secs(120))
            .await?;
        self.report.check(wiped.is_ok(), || {
            format!("{what}: after the heal the retried wipe did not complete ({wiped:?})")
        });
        if wiped.is_ok() {
            self.reads_back_zeroes(&what, &wwid, &file, recorded)?;
        }
        Ok(())
    }

    /// Waits until the wipe has met the fault on `disk` (within
    /// `FAILING_BOUND`), checking all the while that `wwid` is never
    /// offered: `Err` names what went wrong.
    async fn held_while_failing(
        &self,
        wwid: &str,
        disk: &str,
    ) -> anyhow::Result<Result<(), String>> {
        let start = Instant::now();
        loop {
            let phase = self.lab.device_phase(wwid)?;
            if phase != "Releasing" && phase != "Failed" {
                return Ok(Err(format!("the LUN went {phase}")));
            }
            if self.disks().state(disk)?.failed > 0 {
                return Ok(Ok(()));
            }
            if start.elapsed() > FAILING_BOUND {
                return Ok(Err("the wipe never reached the disk".into()));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits up to `bound` for the proxy's store to record `wwid` in
    /// `phase`; `Err` with the phases seen on the way if it never does. A
    /// LUN seen Available on the way to Failed is a failure at once.
    pub(super) async fn phase_becomes(
        &self,
        wwid: &str,
        phase: &str,
        bound: Duration,
    ) -> anyhow::Result<Result<(), Vec<String>>> {
        let db = self.lab.proxy_store();
        let start = Instant::now();
        let mut seen: Vec<String> = Vec::new();
        loop {
            let now = crate::reliability::store::run(
                &db,
                &format!("SELECT phase FROM devices WHERE wwid = '{wwid}'"),
            )?
            .trim()
            .to_owned();
            if seen.last() != Some(&now) {
                seen.push(now.clone());
            }
            if now == phase {
                return Ok(Ok(()));
            }
            if (phase == "Failed" && now == "Available") || start.elapsed() > bound {
                return Ok(Err(seen));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(super) fn disks(&self) -> &crate::disks::FaultyDisks {
        self.lab
            .disks
            .as_ref()
            .expect("checked at the start of the leg")
    }

    pub(super) fn inject(&mut self, disk: &str, fault: Fault) -> anyhow::Result<()> {
        self.report.fault();
        self.disks().inject(disk, fault)
    }

    /// Checks a call that met a failing disk: refused (`code`, `None` when
    /// it succeeded) with a retryable code, within the bound.
    fn refused_by_disk(
        &mut self,
        what: &str,
        code: Option<Code>,
        took: Duration,
        figures: &mut Figures,
    ) {
        self.report.op();
        *figures
            .codes
            .entry(code.map_or_else(|| "Ok".to_owned(), |c| format!("{c:?}")))
            .or_default() += 1;
        figures.refused_ms.push(took.as_millis());
        self.report.check(
            matches!(
                code,
                Some(Code::Unavailable | Code::DeadlineExceeded | Code::Aborted)
            ),
            || format!("{what}: answered {code:?} (want a retryable refusal)"),
        );
        self.report.check(took < FAILING_BOUND, || {
            format!("{what}: answered after {} ms", took.as_millis())
        });
    }

    pub(super) async fn create_ext4(&mut self, name: &str, node: &str) -> anyhow::Result<Volume> {
        let request = CreateVolumeRequest {
            name: name.to_owned(),
            capacity_range: Some(CapacityRange {
                required_bytes: VOLUME_BYTES,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![capability(false, "ext4", Mode::SingleNodeWriter)],
            parameters: [("deviceSelector", "array=c"), ("cleanup", "zero")]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<HashMap<_, _>>(),
            secrets: Default::default(),
            volume_content_source: None,
            accessibility_requirements: Some(prefer(node)),
            mutable_parameters: Default::default(),
        };
        self.report.op();
        let volume = self
            .cl
            .controller
            .create_volume(request)
            .await
            .with_context(|| format!("CreateVolume {name}"))?
            .into_inner()
            .volume
            .context("no volume")?;
        Ok(volume)
    }

    async fn stage(&mut self, volume: &Volume, node: &str, pod: &str) -> anyhow::Result<PathBuf> {
        self.report.op();
        attach_and_mount_fs(
            &self.lab,
            &mut self.cl,
            volume,
            node,
            false,
            "ext4",
            pod,
            false,
        )
        .await
    }

    /// Stages until it works (a sidecar's retries), within `RESUME_BOUND`.
    async fn stage_until_ok(
        &mut self,
        volume: &Volume,
        node: &str,
        pod: &str,
    ) -> anyhow::Result<PathBuf> {
        let start = Instant::now();
        loop {
            match self.stage(volume, node, pod).await {
                Ok(t) => return Ok(t),
                Err(_) if start.elapsed() < RESUME_BOUND => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => return Err(e.context("staging after the heal")),
            }
        }
    }

    async fn published_on(&mut self, vol: &Vol) -> Vec<String> {
        self.report.op();
        let mut c = self.cl.controller.clone();
        c.controller_get_volume(ControllerGetVolumeRequest {
            volume_id: vol.id.clone(),
        })
        .await
        .ok()
        .and_then(|r| r.into_inner().status)
        .map(|s| s.published_node_ids)
        .unwrap_or_default()
    }
}

/// The gRPC code inside a scenario error (`Unknown` when there is none).
fn code_of(e: &anyhow::Error) -> Code {
    e.downcast_ref::<tonic::Status>()
        .map_or(Code::Unknown, tonic::Status::code)
}
