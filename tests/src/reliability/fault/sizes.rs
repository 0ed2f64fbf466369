//! The failing-disk leg's size faults: a LUN whose size its nodes read
//! wrong while a DeleteVolume wipes it.
//!
//! - **No size** (`Fault::Size(0)`, a path in transition): the wipe is
//!   refused, the LUN is never Available while the fault stands and its
//!   data is all there; once healed, the retried wipe makes it Available.
//! - **A stale size** (`Fault::Size(old)` after the array grew the LUN and
//!   the inventory recorded the growth: a rescan that did not take): an
//!   erase of the old size would leave the grown tail, where a marker was
//!   written, as it was. The wipe is refused while the fault stands; once
//!   healed, the tail reads back as zeroes.
//!
//! Both run at once, on two volumes, so their retries' backoffs overlap.
//! Each ends with the invariant of every wiped LUN here: it reads back as
//! zeroes over the whole size the store records, from its backing file
//! (not through the node that wiped it).

use std::os::unix::fs::FileExt;

use super::*;
use crate::disks::{Fault, ends_of};
use crate::lab::scenario::lun_file;
use crate::reliability::store::{Readback, read_back, recorded_size};

/// How much the array grows the stale-size LUN by.
const GROWTH: u64 = 16 << 20;
/// How long the nodes' rescans (a discovery pass every 5 s rescans every
/// node) may take to see a size fault.
const SEEN_BOUND: Duration = Duration::from_secs(30);
/// How long a wipe may take to be refused once the delete is sent.
const REFUSED_BOUND: Duration = Duration::from_secs(45);

/// One size fault on one volume's LUN.
struct Case {
    what: String,
    vol: Vol,
    wwid: String,
    disk: String,
    file: PathBuf,
    /// The size the node reports while the fault stands.
    reported: u64,
    /// The size the store recorded before the delete.
    recorded: u64,
    /// What the agent's refusal says (in the proxy's log).
    refusal: &'static str,
    /// Where the tenant's marker is, and what it is.
    marker_at: u64,
    marker: Vec<u8>,
    /// The LUN's ends before the delete.
    ends: Vec<u8>,
    /// Whether the wipe was refused for its size (`Err`: what happened
    /// instead), once known.
    refused: Option<Result<(), String>>,
    /// The agent's refusal, as the proxy logged it.
    said: String,
    /// Release attempts that ended otherwise before it.
    before: Vec<String>,
}

impl Suite {
    /// One round of size faults: no size, and a stale size, each during
    /// the wipe of a DeleteVolume.
    pub(super) async fn size_round(&mut self, round: usize, node: &str) -> anyhow::Result<()> {
        let began = Instant::now();
        let mut cases = vec![
            self.no_size_case(round, node).await?,
            self.stale_size_case(round, node).await?,
        ];
        let log = self.lab.config.dir.join("proxy.log");
        let from = std::fs::metadata(&log).map_or(0, |m| m.len());
        for c in &cases {
            self.inject(&c.disk, Fault::Size(c.reported))?;
        }
        // The fault stands where the wipe looks: every path of the LUN on
        // every node is rescanned (as a path's state change or an
        // administrator's rescan would) and reports the faulted size before
        // the delete is sent. A path left unrescanned keeps its size and
        // its I/O works: a wipe through it covers the LUN, rightly.
        for c in &cases {
            let seen = self.nodes_report(&c.wwid, c.reported, SEEN_BOUND).await?;
            let why = match &seen {
                Err(paths) => self.why_unchanged(paths, c.reported),
                Ok(()) => String::new(),
            };
            self.report.check(seen.is_ok(), || {
                format!(
                    "{}: the nodes never reported the fault ({seen:?}){why}",
                    c.what
                )
            });
        }
        for c in &cases {
            self.delete(&c.vol, &c.what).await;
        }
        // Until each wipe has been refused for its size (the proxy's log
        // says so), the LUN is never Available.
        let start = Instant::now();
        while cases.iter().any(|c| c.refused.is_none()) {
            let text = std::fs::read(&log).unwrap_or_default();
            let text = String::from_utf8_lossy(text.get(from as usize..).unwrap_or_default());
            for c in cases.iter_mut().filter(|c| c.refused.is_none()) {
                let phase = self.lab.device_phase(&c.wwid)?;
                if phase != "Releasing" && phase != "Failed" {
                    c.refused = Some(Err(format!(
                        "the LUN went {phase} while it reported {} bytes",
                        c.reported
                    )));
                    continue;
                }
                // The release attempts that failed so far, in order.
                let failed: Vec<&str> = text
                    .lines()
                    .filter(|l| l.contains("release not finished") && l.contains(&c.wwid))
                    .collect();
                if let Some(n) = failed.iter().position(|l| l.contains(c.refusal)) {
                    c.refused = Some(Ok(()));
                    c.said = excerpt(failed[n], c.refusal);
                    // Attempts that ended otherwise first, for the report.
                    c.before = failed[..n].iter().map(|l| excerpt(l, "error")).collect();
                } else if start.elapsed() > REFUSED_BOUND {
                    c.refused = Some(Err(format!(
                        "no wipe was refused for its size within {REFUSED_BOUND:?} (phase {phase})"
                    )));
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let refused_in = start.elapsed();
        for c in &cases {
            self.disks().heal(&c.disk)?;
        }
        let healed = Instant::now();
        for c in &cases {
            let held = c.refused.clone().unwrap_or(Ok(()));
            self.report
                .check(held.is_ok(), || format!("{}: {held:?}", c.what));
            // Nothing was written while the fault stood.
            let ends = ends_of(&c.file)?;
            let mut marker = vec![0u8; c.marker.len()];
            std::fs::File::open(&c.file)?.read_exact_at(&mut marker, c.marker_at)?;
            self.report.check(ends == c.ends && marker == c.marker, || {
                format!("{}: the LUN's data changed while the fault stood", c.what)
            });
        }
        for c in &cases {
            let wiped = self
                .phase_becomes(&c.wwid, "Available", Duration::from_secs(120))
                .await?;
            self.report.check(wiped.is_ok(), || {
                format!(
                    "{}: after the heal the retried wipe did not complete ({wiped:?})",
                    c.what
                )
            });
            if wiped.is_ok() {
                self.reads_back_zeroes(&c.what, &c.wwid, &c.file, c.recorded)?;
            }
            if !matches!(c.refused, Some(Ok(()))) || wiped.is_err() {
                eprintln!(
                    "[fault] {}: proxy log about {} (tail):\n{}",
                    c.what,
                    c.wwid,
                    about(&log, &c.wwid, 30)
                );
            }
        }
        self.report.note(format!(
            "size faults, round {round}: both wipes refused within {} ms of the deletes, Available {} ms after the heal, {} ms in all; e.g. \"{}\", \"{}\"",
            refused_in.as_millis(),
            healed.elapsed().as_millis(),
            began.elapsed().as_millis(),
            cases[0].said,
            cases[1].said,
        ));
        for c in cases.iter().filter(|c| !c.before.is_empty()) {
            self.report.note(format!(
                "size faults: {} release attempt(s) of {} ended otherwise before the refusal: {}",
                c.before.len(),
                c.disk,
                c.before.join(" | ")
            ));
        }
        Ok(())
    }

    /// A volume whose LUN will report no size; a marker in its data.
    async fn no_size_case(&mut self, round: usize, node: &str) -> anyhow::Result<Case> {
        let (vol, wwid, disk, file) = self.volume(&format!("nosize{round}"), node).await?;
        let recorded = self.recorded(&wwid)?;
        let marker_at = self.rng.u64(..recorded / 4096) * 4096;
        self.case(
            format!("round {round}: DeleteVolume while {disk} reports 0 bytes"),
            (vol, wwid, disk, file),
            0,
            recorded,
            "size of 0 bytes",
            marker_at,
        )
    }

    /// A volume whose LUN the array grows (the store records the growth,
    /// after a ControllerExpandVolume) and whose nodes then keep reading
    /// the old size; a marker in the grown tail.
    async fn stale_size_case(&mut self, round: usize, node: &str) -> anyhow::Result<Case> {
        let (vol, wwid, disk, file) = self.volume(&format!("stale{round}"), node).await?;
        let (old, new) = self.lab.grow_lun(&disk, GROWTH).await?;
        self.report.op();
        self.cl
            .controller
            .controller_expand_volume(ControllerExpandVolumeRequest {
                volume_id: vol.id.clone(),
                capacity_range: Some(CapacityRange {
                    required_bytes: new as i64,
                    limit_bytes: 0,
                }),
                secrets: Default::default(),
                volume_capability: Some(capability(false, "ext4", Mode::SingleNodeWriter)),
            })
            .await
            .with_context(|| format!("ControllerExpandVolume {} to {new} bytes", vol.id))?;
        let recorded = self.recorded(&wwid)?;
        ensure!(
            recorded == new,
            "after the array grew {disk} to {new} bytes and a ControllerExpandVolume, the store records {recorded}"
        );
        let marker_at = old + self.rng.u64(..GROWTH / 4096) * 4096;
        self.case(
            format!("round {round}: DeleteVolume while {disk} reports its old size {old} (grown to {new})"),
            (vol, wwid, disk, file),
            old,
            recorded,
            "the inventory records",
            marker_at,
        )
    }

    /// A fresh volume on `node`: it, its WWID, its lab disk and file.
    pub(super) async fn volume(
        &mut self,
        name: &str,
        node: &str,
    ) -> anyhow::Result<(Vol, String, String, PathBuf)> {
        let volume = self.create_ext4(name, node).await?;
        let vol = Vol {
            spec: Spec::new(name.to_owned(), "zero", node),
            id: volume.volume_id.clone(),
        };
        self.acked.insert(name.to_owned(), vol.clone());
        let wwid = volume.volume_context["wwid"].clone();
        let (disk, file) = lun_file(&self.lab, &wwid).context("the volume's LUN is a lab LUN")?;
        Ok((vol, wwid, disk, file))
    }

    /// Writes the tenant's marker (in the backing file: the array's
    /// content) and notes what must stay.
    fn case(
        &mut self,
        what: String,
        (vol, wwid, disk, file): (Vol, String, String, PathBuf),
        reported: u64,
        recorded: u64,
        refusal: &'static str,
        marker_at: u64,
    ) -> anyhow::Result<Case> {
        let marker = format!("{what}-{:016x}", self.rng.u64(..)).into_bytes();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&file)?
            .write_all_at(&marker, marker_at)?;
        let ends = ends_of(&file)?;
        Ok(Case {
            what,
            vol,
            wwid,
            disk,
            file,
            reported,
            recorded,
            refusal,
            marker_at,
            marker,
            ends,
            refused: None,
            said: String::new(),
            before: Vec::new(),
        })
    }

    pub(super) fn recorded(&self, wwid: &str) -> anyhow::Result<u64> {
        recorded_size(&self.lab.proxy_store(), wwid)?
            .with_context(|| format!("the store has no device {wwid}"))
    }

    /// The invariant of a wiped LUN: Available, it reads back as zeroes
    /// over the whole size the store records now, which is no less than
    /// `before` (what it recorded before the delete): from its backing
    /// file whole (the array's own content), and through the block device
    /// of every node that did not do the wipe, past its page cache, at
    /// both ends and ranges spread at random.
    pub(super) fn reads_back_zeroes(
        &mut self,
        what: &str,
        wwid: &str,
        file: &Path,
        before: u64,
    ) -> anyhow::Result<()> {
        let now = self.recorded(wwid)?;
        self.report.check(now >= before, || {
            format!("{what}: the store's recorded size went from {before} to {now} bytes")
        });
        let size = now.max(before);
        let back = read_back(file, size)?;
        self.report.check(back == Readback::Zeroes, || {
            format!(
                "{what}: the LUN is Available but does not read back as zeroes over its recorded {size} bytes: {back:?}"
            )
        });
        let log = std::fs::read_to_string(self.lab.config.dir.join("proxy.log"))?;
        let wiper = store::wiper(&log, wwid);
        let (offsets, len) = store::checked_offsets(size, &mut self.rng);
        let (reads, skipped) =
            store::node_read_back(&self.lab, wwid, size, wiper.as_deref(), (&offsets, len));
        for r in &reads {
            self.report.check(r.found == Readback::Zeroes, || {
                format!(
                    "{what}: the LUN is Available but node {} ({}) reads {:?} through {} over its recorded {size} bytes",
                    r.node, store::wiped_by(wiper.as_deref()), r.found, r.disk
                )
            });
        }
        self.other_node_reads
            .add(wiper.as_deref(), reads.len(), skipped);
        Ok(())
    }

    /// Waits up to `bound` until every node's view of `wwid` (its paths in
    /// the node's sysfs) reports `bytes`; `Err` names what they report.
    async fn nodes_report(
        &self,
        wwid: &str,
        bytes: u64,
        bound: Duration,
    ) -> anyhow::Result<Result<(), Vec<((String, String), u64)>>> {
        let start = Instant::now();
        let mut rescanned: Option<Instant> = None;
        loop {
            let sizes = self.path_sizes(wwid)?;
            if !sizes.is_empty() && sizes.iter().all(|(_, s)| *s == bytes) {
                return Ok(Ok(()));
            }
            if start.elapsed() > bound {
                return Ok(Err(sizes));
            }
            if rescanned.is_none_or(|t| t.elapsed() > Duration::from_secs(2)) {
                for (node, sd) in sizes.iter().filter(|(_, s)| *s != bytes).map(|(p, _)| p) {
                    let _ =
                        std::fs::write(self.sys_block(node)?.join(sd).join("device/rescan"), "1");
                }
                rescanned = Some(Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// For each path in `paths` still not at `bytes`: what the node's
    /// kernel stand-in knows of it (its record and loop device, the loop
    /// device's size, the rescan trigger left unread), so a path that kept
    /// its size says why.
    fn why_unchanged(&self, paths: &[((String, String), u64)], bytes: u64) -> String {
        let mut out = String::new();
        for ((node, sd), _) in paths.iter().filter(|(_, s)| *s != bytes) {
            let Some(n) = self.lab.nodes.iter().find(|n| &n.name == node) else {
                continue;
            };
            let record = crate::kernel::state::NodeState::lock(&n.root)
                .map(|l| l.state.disk(sd).map(|d| d.loop_device.clone()));
            let trigger =
                std::fs::read_to_string(n.root.join("sys/block").join(sd).join("device/rescan"));
            let said = match record {
                Ok(Some(dev)) => {
                    let name = dev.file_name().map(|f| f.to_string_lossy().into_owned());
                    let sectors = name
                        .and_then(|l| std::fs::read_to_string(format!("/sys/block/{l}/size")).ok());
                    format!(
                        "loop device {} at {} sectors",
                        dev.display(),
                        sectors.as_deref().map_or("?", str::trim)
                    )
                }
                Ok(None) => "no record of it in the stand-in's state".to_owned(),
                Err(e) => format!("the stand-in's state unreadable: {e}"),
            };
            out.push_str(&format!(
                "; {node}/{sd}: {said}, rescan trigger {:?}",
                trigger.map_err(|e| e.kind())
            ));
        }
        out
    }

    /// `sys/block` of node `name`'s device tree.
    fn sys_block(&self, name: &str) -> anyhow::Result<PathBuf> {
        let n = self
            .lab
            .nodes
            .iter()
            .find(|n| n.name == name)
            .with_context(|| format!("no node {name}"))?;
        Ok(n.root.join("sys/block"))
    }

    /// Each path of `wwid` on each node (`(node, sdX)`) and the size it
    /// reports.
    fn path_sizes(&self, wwid: &str) -> anyhow::Result<Vec<((String, String), u64)>> {
        let mut out = Vec::new();
        for n in &self.lab.nodes {
            let block = n.root.join("sys/block");
            let Ok(entries) = std::fs::read_dir(&block) else {
                continue;
            };
            for e in entries.flatten() {
                let dir = e.path();
                let id = std::fs::read_to_string(dir.join("device/wwid")).unwrap_or_default();
                if id.trim() != wwid {
                    continue;
                }
                let Ok(sectors) = std::fs::read_to_string(dir.join("size")) else {
                    continue;
                };
                let sectors: u64 = sectors.trim().parse().unwrap_or(u64::MAX);
                out.push((
                    (n.name.clone(), e.file_name().to_string_lossy().into_owned()),
                    sectors.saturating_mul(512),
                ));
            }
        }
        Ok(out)
    }
}

/// The part of a log line around `needle`, for the report.
fn excerpt(line: &str, needle: &str) -> String {
    let at = line.find(needle).unwrap_or(0);
    let start = line[..at]
        .char_indices()
        .rev()
        .nth(60)
        .map_or(0, |(i, _)| i);
    let end = line[at..]
        .char_indices()
        .nth(60)
        .map_or(line.len(), |(i, _)| at + i);
    format!("...{}...", &line[start..end])
}

/// The last `lines` lines of the log at `path` that mention `wwid`.
fn about(path: &Path, wwid: &str, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    crate::tail::last_lines(text.lines().filter(|l| l.contains(wwid)), lines)
}
