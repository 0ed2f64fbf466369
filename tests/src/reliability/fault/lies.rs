//! Leg 5 of the fault suite, discovery reports that lie. A node's report
//! is what its kernel shows it, so the lies are told where the agent
//! reads them, in the nodes' device trees, on the paths of the Fibre
//! Channel LUN (`fc-1`, which names no array, unlike the lab's iSCSI
//! targets; its paths are left alone by rescans):
//!
//! - **A WWID of another array.** node-b's FC path says it is the pool
//!   LUN (array-c) the next CreateVolume would pick. The proxy must flag
//!   the conflict and merge nothing: the LUN keeps its target and gains no
//!   view through `fc-1`, and a CreateVolume does not bind it while the
//!   conflict stands. Once the path tells the truth again, the conflict
//!   is dropped.
//! - **An oversized report.** node-c's FC path reports a WWID nobody knows
//!   with a vendor string longer than the bound. The report is refused
//!   whole (the proxy logs why) and nothing of it is stored.
//!
//! Sizes that lie (0, or smaller than the recorded size) are the failing
//! disks' size faults ([`super::sizes`]): there the nodes report them
//! through discovery passes while the LUN still holds data, and the
//! recorded size must never shrink.

use super::*;

/// The lab's FC LUN.
const FC1: &str = "naa.600a098038303053453f463045727031";
/// The proxy's bound on a report's string fields, plus some.
const OVERSIZED: usize = 300;
/// Discovery passes (every 5 s) that must end after a lie is told before
/// it is judged: the first may have read the trees before, the second
/// began after.
const PASSES: usize = 2;
/// How long those passes may take.
const PASSES_BOUND: Duration = Duration::from_secs(30);

/// One lie told on one node's path: where, and what it said before.
struct Lie {
    attr: PathBuf,
    truth: String,
}

impl Suite {
    /// The lies, told at once, judged after [`PASSES`] discovery passes,
    /// then taken back.
    pub(super) async fn lies(&mut self) -> anyhow::Result<()> {
        let began = Instant::now();
        let db = self.lab.proxy_store();
        // The pool LUN the next CreateVolume picks: the smallest Available,
        // fewest wipe failures, then WWID (`policy::PreferenceKey`).
        let victim = store::run(
            &db,
            "SELECT wwid FROM devices WHERE target = 'array-c' AND phase = 'Available' \
             ORDER BY size_bytes, wipe_failures, wwid LIMIT 1",
        )?
        .trim()
        .to_owned();
        ensure!(!victim.is_empty(), "no Available pool LUN to lie about");
        let ghost = format!("naa.6{:031x}", self.rng.u128(..1 << 124));
        let (b, c) = (node_name(1), node_name(2));
        let lies = vec![
            self.tell(&b, "wwid", &victim)?,
            // The vendor first: the path is found by its WWID.
            self.tell(&c, "vendor", &"X".repeat(OVERSIZED))?,
            self.tell(&c, "wwid", &ghost)?,
        ];
        let log = self.lab.config.dir.join("proxy.log");
        let from = std::fs::metadata(&log).map_or(0, |m| m.len());
        let passes = self.passes_after(&log, from, PASSES).await;
        self.report
            .check(passes.is_ok(), || format!("lying reports: {passes:?}"));
        let text = std::fs::read(&log).unwrap_or_default();
        let text = String::from_utf8_lossy(text.get(from as usize..).unwrap_or_default());

        // The WWID of another array: flagged, nothing merged.
        let row = |sql: String| store::run(&db, &sql).map(|s| s.trim().to_owned());
        let conflicts = row(format!(
            "SELECT conflicts FROM devices WHERE wwid = '{victim}'"
        ))?;
        let flagged = conflicts.contains("fc-1");
        self.report.check(flagged, || {
            format!(
                "node {b} reports pool LUN {victim} through fc-1 (another array), but its device records no conflict: {conflicts:?}"
            )
        });
        let targets = row(format!(
            "SELECT target || ' ' || (SELECT group_concat(DISTINCT target) FROM device_nodes WHERE wwid = '{victim}') \
             FROM devices WHERE wwid = '{victim}'"
        ))?;
        self.report.check(targets == "array-c array-c", || {
            format!(
                "node {b}'s lie moved pool LUN {victim}: its target and its views' targets are {targets:?} (want array-c)"
            )
        });
        let fc1 = row(format!("SELECT target FROM devices WHERE wwid = '{FC1}'"))?;
        self.report.check(fc1 == "fc-1", || {
            format!("the FC LUN {FC1} is now known through {fc1:?}")
        });
        // ... and not bound while the conflict stands, though it is the
        // LUN a bind would pick.
        let (vol, wwid, _, file) = self.volume("lie-probe", &node_name(0)).await?;
        self.report.check(wwid != victim, || {
            format!(
                "CreateVolume bound pool LUN {victim} while node {b} reported its WWID through another array"
            )
        });

        // The oversized report: refused whole, nothing stored.
        let refused = text.lines().any(|l| {
            l.contains("discovery report refused")
                && l.contains(&format!("node={c}"))
                && l.contains("fc-1")
        });
        self.report.check(refused, || {
            format!("node {c}'s report of fc-1 with a {OVERSIZED}-byte vendor was not refused")
        });
        let stored = row(format!(
            "SELECT count(*) FROM devices WHERE wwid = '{ghost}' OR length(vendor) > 256"
        ))?;
        self.report.check(stored == "0", || {
            format!("node {c}'s oversized report was stored ({stored} device(s): {ghost} or a long vendor)")
        });

        // The truth again: the conflict goes, the probe's LUN is wiped.
        for lie in &lies {
            std::fs::write(&lie.attr, &lie.truth)?;
        }
        self.delete(&vol, "lie-probe").await;
        let from = std::fs::metadata(&log).map_or(0, |m| m.len());
        let passes = self.passes_after(&log, from, PASSES).await;
        let conflicts = row(format!(
            "SELECT conflicts FROM devices WHERE wwid = '{victim}'"
        ))?;
        self.report.check(passes.is_ok() && conflicts == "[]", || {
            format!(
                "pool LUN {victim}'s conflict stays once node {b} tells the truth: {conflicts:?} ({passes:?})"
            )
        });
        let recorded = self.recorded(&wwid)?;
        let wiped = self
            .phase_becomes(&wwid, "Available", Duration::from_secs(60))
            .await?;
        self.report.check(wiped.is_ok(), || {
            format!("lie-probe: its LUN {wwid} was not wiped: {wiped:?}")
        });
        if wiped.is_ok() {
            self.reads_back_zeroes("lie-probe", &wwid, &file, recorded)?;
        }
        self.report.note(format!(
            "lying reports: node {b} said its FC path was pool LUN {victim} (conflict flagged: {flagged}; dropped once it told the truth: {}), node {c} an oversized report (refused: {refused}); {} ms in all",
            conflicts == "[]",
            began.elapsed().as_millis()
        ));
        Ok(())
    }

    /// Makes node `node`'s FC path say `value` as its `attr` (`wwid`,
    /// `vendor`); what it said before is kept to take the lie back.
    fn tell(&mut self, node: &str, attr: &str, value: &str) -> anyhow::Result<Lie> {
        let n = self
            .lab
            .nodes
            .iter()
            .find(|n| n.name == node)
            .with_context(|| format!("no node {node}"))?;
        let block = n.root.join("sys/block");
        let disk = std::fs::read_dir(&block)?
            .flatten()
            .map(|e| e.path())
            .find(|d| std::fs::read_to_string(d.join("device/wwid")).is_ok_and(|w| w.trim() == FC1))
            .with_context(|| format!("node {node} has no path of the FC LUN {FC1}"))?;
        let attr = disk.join("device").join(attr);
        let truth = std::fs::read_to_string(&attr)
            .with_context(|| format!("reading {}", attr.display()))?;
        std::fs::write(&attr, format!("{value}\n"))?;
        self.report.fault();
        Ok(Lie { attr, truth })
    }

    /// Waits until the proxy's log `log` shows `passes` discovery passes
    /// ended after byte `from`; `Err` says how many it saw.
    async fn passes_after(&self, log: &Path, from: u64, passes: usize) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let text = std::fs::read(log).unwrap_or_default();
            let seen = String::from_utf8_lossy(text.get(from as usize..).unwrap_or_default())
                .lines()
                .filter(|l| l.contains("discovery pass"))
                .count();
            if seen >= passes {
                return Ok(());
            }
            if start.elapsed() > PASSES_BOUND {
                return Err(format!(
                    "{seen} discovery passes ended within {PASSES_BOUND:?}, {passes} awaited"
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
