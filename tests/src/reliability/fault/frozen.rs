//! Leg 6 of the fault suite, a frozen leader with a wipe in flight. The
//! proxy (the old leader) is told to delete a volume; its release worker
//! sends the Wipe on a connection whose packets are dropped (it sits in
//! the socket, unacknowledged: in flight; a connection the proxy would
//! open meanwhile has its SYN dropped), and the process is frozen
//! (SIGSTOP), as a paused container or a stalled VM is. The suite then
//! plays the leader that took over: a call in a later epoch to every
//! node fences it, and the LUN's new tenant writes data. Thawed, the old
//! leader's Wipe arrives: every agent must refuse it, and the new tenant's
//! data stays. Embedded mode has no election (its proxy is always epoch
//! 0), so the new leader is this suite at the agent API; the frozen one is
//! the real proxy. The agents remember the later epoch, so this leg runs
//! last: after it, this lab's proxy can wipe nothing.

use std::os::unix::fs::FileExt;

use csi_scsi_contract::LEADER_EPOCH_HEADER;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::*;

/// The agents' API port.
const AGENT_PORT: u16 = 9810;
/// The epoch the suite leads in (the embedded proxy's is 0).
const NEW_EPOCH: u64 = 1;
/// How long the frozen leader stays frozen after the fence.
const FROZEN_FOR: Duration = Duration::from_millis(500);
/// How long the thawed leader's Wipe may take to be refused.
const REFUSED_BOUND: Duration = Duration::from_secs(45);

/// An iptables rule in the OUTPUT chain, removed on drop.
struct Dropped(Vec<String>);

impl Dropped {
    /// Drops the packets matching `rule` (iptables match arguments).
    fn new(rule: &[&str]) -> anyhow::Result<Self> {
        let rule: Vec<String> = rule
            .iter()
            .map(|s| (*s).to_owned())
            .chain(["-j", "DROP", "-w"].map(String::from))
            .collect();
        let mut args = vec!["-I", "OUTPUT"];
        args.extend(rule.iter().map(String::as_str));
        sh("iptables", &args)?;
        Ok(Self(rule))
    }

    /// Drops what the proxy sends from local port `port`.
    fn from_port(port: u16) -> anyhow::Result<Self> {
        Self::new(&["-p", "tcp", "--sport", &port.to_string()])
    }
}

impl Drop for Dropped {
    fn drop(&mut self) {
        let mut args = vec!["-D", "OUTPUT"];
        args.extend(self.0.iter().map(String::as_str));
        sh_quiet("iptables", &args);
    }
}

/// A frozen process, thawed on drop whatever happens.
struct Frozen(u32);

impl Frozen {
    fn new(pid: u32) -> anyhow::Result<Self> {
        kill(Pid::from_raw(pid as i32), Signal::SIGSTOP)?;
        Ok(Self(pid))
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.0 as i32), Signal::SIGCONT);
    }
}

impl Suite {
    /// The leg: see the module's description.
    pub(super) async fn frozen_leader(&mut self) -> anyhow::Result<()> {
        let began = Instant::now();
        let pid = self.proxy_alive().context("the proxy runs")?;
        let (vol, wwid, _, file) = self.volume("frozen", &node_name(0)).await?;
        let size = self.recorded(&wwid)?;
        // The proxy talks to every agent over a connection it keeps; drop
        // its packets (not the links: the new leader must get through).
        let ports: Vec<u16> = agent_sockets(pid, "established")?
            .into_iter()
            .map(|s| s.0)
            .collect();
        ensure!(
            !ports.is_empty(),
            "the proxy has no connection to an agent to hold a call in"
        );
        let dropped = ports
            .iter()
            .map(|p| Dropped::from_port(*p))
            .collect::<anyhow::Result<Vec<_>>>()?;
        // A connection it opens now stays unopened too (its SYN dropped):
        // the call waits in the process either way.
        let unopened = Dropped::new(&["-p", "tcp", "--dport", &AGENT_PORT.to_string(), "--syn"])?;
        let log = self.lab.config.dir.join("proxy.log");
        let from = std::fs::metadata(&log).map_or(0, |m| m.len());
        // DeleteVolume answers at once and wakes a release worker, which
        // reads the LUN Releasing and sends its Wipe.
        self.delete(&vol, "frozen").await;
        let start = Instant::now();
        let (mut queued, mut opening) = (0, 0);
        while start.elapsed() < Duration::from_secs(5) && queued == 0 && opening == 0 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            queued = agent_sockets(pid, "established")?
                .iter()
                .filter(|s| ports.contains(&s.0))
                .map(|s| s.1)
                .sum();
            opening = agent_sockets(pid, "syn-sent")?.len();
        }
        let frozen = Frozen::new(pid)?;
        self.report.fault();
        self.report.check(queued > 0 || opening > 0, || {
            "frozen leader: nothing was in flight on the proxy's agent connections when it froze".into()
        });
        // The new leader connects.
        drop(unopened);
        // The new leader: every node sees its epoch.
        let store = MaterialStore::load(
            MaterialPaths::in_dir(&self.lab.config.dir.join("pki/proxy-tls")),
            Role::Proxy,
            TrustDomain::new(TRUST_DOMAIN)?,
        )?;
        for n in &self.lab.nodes {
            let channel = csi_scsi_daemon::agent_channel(
                &n.api.to_string(),
                &n.name,
                store.clone(),
                Duration::from_secs(5),
            )?;
            let mut request = Request::new(StatusRequest {});
            request.set_timeout(PATIENT);
            request
                .metadata_mut()
                .insert(LEADER_EPOCH_HEADER, NEW_EPOCH.to_string().parse()?);
            self.report.op();
            AgentClient::new(channel)
                .status(request)
                .await
                .with_context(|| format!("the new leader's Status on {}", n.name))?;
        }
        // ... and re-bound the LUN: its new tenant's data, at both ends
        // and in between.
        let marker = format!("new tenant {:016x}", self.rng.u64(..)).into_bytes();
        let at = [0, self.rng.u64(1..size / 4096 - 1) * 4096, size - 4096];
        let f = std::fs::OpenOptions::new().write(true).open(&file)?;
        for a in at {
            f.write_all_at(&marker, a)?;
        }
        f.sync_all()?;
        tokio::time::sleep(FROZEN_FOR).await;
        // Thaw: the held Wipe goes out.
        drop(dropped);
        drop(frozen);
        let thawed = Instant::now();
        let refusal = "epoch 0";
        let mut said = None;
        while thawed.elapsed() < REFUSED_BOUND && said.is_none() {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let text = std::fs::read(&log).unwrap_or_default();
            let text = String::from_utf8_lossy(text.get(from as usize..).unwrap_or_default());
            said = text
                .lines()
                .find(|l| l.contains(&wwid) && l.contains(refusal))
                .map(str::to_owned);
        }
        let refused_in = thawed.elapsed();
        self.report.check(said.is_some(), || {
            format!(
                "frozen leader: no wipe of {wwid} was refused for its epoch within {REFUSED_BOUND:?} of the thaw"
            )
        });
        let mut intact = true;
        let mut back = vec![0u8; marker.len()];
        let f = std::fs::File::open(&file)?;
        for a in at {
            f.read_exact_at(&mut back, a)?;
            intact &= back == marker;
        }
        self.report.check(intact, || {
            format!("frozen leader: its wipe of {wwid} erased the new tenant's data")
        });
        let phase = store::run(
            &self.lab.proxy_store(),
            &format!("SELECT phase FROM devices WHERE wwid = '{wwid}'"),
        )?;
        self.report.check(phase.trim() != "Available", || {
            format!("frozen leader: {wwid} went Available though no wipe of it was admitted")
        });
        self.report.note(format!(
            "frozen leader: {queued} bytes in flight on its agent connections ({opening} being opened) when it froze; fenced by epoch {NEW_EPOCH} on every node; thawed, its wipe of the re-bound LUN was refused in {} ms, the new tenant's data intact: {intact}; {} ms in all; {}",
            refused_in.as_millis(),
            began.elapsed().as_millis(),
            said.map_or_else(String::new, |l| {
                let at = l.find(refusal).unwrap_or(0);
                format!("\"...{}...\"", &l[at.saturating_sub(120)..(at + 40).min(l.len())])
            })
        ));
        Ok(())
    }
}

/// The proxy `pid`'s connections to agent APIs in TCP state `state`
/// (`established`, `syn-sent`): local port and bytes not yet
/// acknowledged (Send-Q).
fn agent_sockets(pid: u32, state: &str) -> anyhow::Result<Vec<(u16, u64)>> {
    let out = sh(
        "ss",
        &[
            "-tnpH",
            "state",
            state,
            &format!("( dport = :{AGENT_PORT} )"),
        ],
    )?;
    Ok(out
        .lines()
        .filter(|l| l.contains(&format!("pid={pid},")))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let queued = f.get(1)?.parse().ok()?;
            let port = f.get(2)?.rsplit(':').next()?.parse().ok()?;
            Some((port, queued))
        })
        .collect())
}
