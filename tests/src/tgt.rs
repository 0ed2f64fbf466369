//! A real userspace iSCSI target for tests and the lab: one `tgtd` process
//! per [`Tgtd`], configured through `tgtadm` on its own control port, stopped
//! when dropped. tgtd keeps no state across restarts, so every instance
//! starts empty.
//!
//! Things tgtd does that callers must know:
//! - The control port (`-C N`) only names tgtd's Unix management socket
//!   (`/var/run/tgtd/socket.N`); it is not a TCP port. Two tgtd processes
//!   need two control ports and two portals.
//! - Every target has a LUN 0 of type controller (0x0c); disks start at 1.
//! - Without `scsi_id`/`scsi_sn`, tgt derives a LUN's identity from the
//!   target id and LUN number, so the same (tid, lun) on two tgtd instances
//!   (or across restarts) looks like the same device. [`Tgtd::add_lun`]
//!   always sets them.
//! - tgtd reads a backing file's size when the LUN is created and never
//!   again: growing the file is invisible to initiators until the LUN is
//!   re-created ([`Tgtd::refresh_lun_size`]).
//! - An initiator ACL refusal is answered at login with status 0x0203
//!   (target not found), not 0x0202; see `crate::iscsi::IscsiError`.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long one `tgtadm` call may take.
const TGTADM_TIMEOUT: Duration = Duration::from_secs(10);
/// How long tgtd may take to start answering.
const START_TIMEOUT: Duration = Duration::from_secs(15);

/// What went wrong driving tgtd.
#[derive(Debug, thiserror::Error)]
pub enum TgtError {
    /// tgtd or tgtadm could not be run.
    #[error("running {program}: {source}")]
    Spawn {
        /// The program.
        program: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Another tgtd already answers on this control port.
    #[error("a tgtd already answers on control port {0}")]
    ControlPortInUse(u16),
    /// tgtd exited (or never answered) while starting; its log is attached.
    #[error("tgtd did not start: {reason}; log:\n{log}")]
    NotStarted {
        /// Why we gave up.
        reason: String,
        /// The daemon's output.
        log: String,
    },
    /// A tgtadm command failed.
    #[error("tgtadm {args}: exit {status}: {stderr}")]
    Tgtadm {
        /// The arguments, space separated.
        args: String,
        /// Exit status text.
        status: String,
        /// What it printed.
        stderr: String,
    },
    /// A tgtadm command took too long.
    #[error("tgtadm {0} timed out")]
    Timeout(String),
    /// A parameter tgt would silently truncate or misparse.
    #[error("invalid {what} {value:?}: {why}")]
    InvalidParameter {
        /// Which parameter.
        what: &'static str,
        /// Its value.
        value: String,
        /// The rule it breaks.
        why: &'static str,
    },
    /// The LUN was not added through this harness.
    #[error("unknown LUN {lun} of target {tid}")]
    UnknownLun {
        /// Target id.
        tid: u32,
        /// LUN.
        lun: u64,
    },
}

/// The identity a LUN reports.
///
/// What tgt (1.0.85) puts in VPD page 0x83, all at association 0 (the
/// logical unit), none with PIV, in this order:
/// 1. a T10 vendor ID designator (type 1, ASCII): `scsi_id`, NUL-padded to
///    36 bytes (no separate vendor field: the whole of `scsi_id`);
/// 2. an 8-byte NAA 3 ("locally assigned") designator:
///    `0x3 << 60 | tid << 32 | lun`. It ignores `scsi_id`, so the same
///    (tid, LUN) on two tgtd instances has the same NAA 3;
/// 3. a 16-byte NAA 6 designator built from the *hex digits* of
///    `scsi_id` ([`tgt_naa6`]): each character is read as one hex digit
///    (anything else counts as 0), the digits right-aligned in 128 bits,
///    the top nibble forced to 6.
///
/// Hosts (udev's `scsi_id`, multipath, this driver's agent) take the NAA 6
/// as the WWID. So give each LUN a `scsi_id` of 32 hex digits starting
/// with `6` ([`LunIdentity::lab`] does): the NAA 6 is then exactly
/// `naa.<scsi_id>`. Two ids without hex digits (say `disk-x` and `disk-y`)
/// collide. `scsi_sn` is VPD page 0x80 (right-aligned in 36 bytes,
/// space-padded); `vendor_id` and `product_id` the standard INQUIRY fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LunIdentity {
    /// At most 36 characters (tgt's limit).
    pub scsi_id: String,
    /// At most 36 characters (tgt's limit).
    pub scsi_sn: String,
    /// At most 8 characters.
    pub vendor_id: String,
    /// At most 16 characters.
    pub product_id: String,
}

/// The INQUIRY vendor of every lab LUN ([`LunIdentity::lab`]).
const LAB_VENDOR: &str = "CSISCSI";
/// The INQUIRY product of every lab LUN.
const LAB_PRODUCT: &str = "LAB-LUN";

impl LunIdentity {
    /// The lab's identity for LUN number `n` of a given `array` (a small
    /// number naming the storage system): `scsi_id` is 32 hex digits
    /// `6001405` + array (5 digits) + n (20 digits), so the NAA 6 WWID is
    /// unique per (array, n); `scsi_sn` is `SN<array>-<n>`.
    pub fn lab(array: u32, n: u64) -> Self {
        Self {
            scsi_id: format!("6001405{:05x}{n:020x}", array & 0xf_ffff),
            scsi_sn: format!("SN{array}-{n}"),
            vendor_id: LAB_VENDOR.to_owned(),
            product_id: LAB_PRODUCT.to_owned(),
        }
    }

    fn params(&self) -> Result<String, TgtError> {
        let fields = [
            ("scsi_id", &self.scsi_id, 36),
            ("scsi_sn", &self.scsi_sn, 36),
            ("vendor_id", &self.vendor_id, 8),
            ("product_id", &self.product_id, 16),
        ];
        let mut out = Vec::new();
        for (what, value, max) in fields {
            let bad = |why| TgtError::InvalidParameter {
                what,
                value: value.clone(),
                why,
            };
            if value.is_empty() || value.len() > max {
                return Err(bad("empty or longer than tgt keeps (36/36/8/16)"));
            }
            if !value
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b',' && b != b'=')
            {
                return Err(bad("must be printable ASCII without spaces, ',' or '='"));
            }
            out.push(format!("{what}={value}"));
        }
        Ok(out.join(","))
    }
}

/// The 16-byte NAA 6 designator tgt derives from `scsi_id` (see
/// [`LunIdentity`]).
pub fn tgt_naa6(scsi_id: &str) -> [u8; 16] {
    let (mut hi, mut lo) = (0u64, 0u64);
    for c in scsi_id.chars().take(36) {
        hi = (hi << 4) | (lo >> 60);
        lo = (lo << 4) | u64::from(c.to_digit(16).unwrap_or(0));
    }
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&hi.to_be_bytes());
    out[8..].copy_from_slice(&lo.to_be_bytes());
    out[0] = (out[0] & 0x0f) | 0x60;
    out
}

/// The 8-byte NAA 3 designator tgt gives LUN `lun` of target `tid`.
pub fn tgt_naa3(tid: u32, lun: u64) -> [u8; 8] {
    ((0x3u64 << 60) | (u64::from(tid) << 32) | (lun & 0xffff_ffff)).to_be_bytes()
}

/// A running tgtd.
#[derive(Debug)]
pub struct Tgtd {
    child: Option<Child>,
    control_port: u16,
    portal: SocketAddr,
    log: PathBuf,
    targets: HashSet<u32>,
    luns: HashMap<(u32, u64), (PathBuf, LunIdentity)>,
    accounts: HashSet<String>,
}

impl Tgtd {
    /// Starts `tgtd -f -C control_port --iscsi portal=ip:port` with its
    /// output in `log`, and waits until `tgtadm` gets answers from it and
    /// the portal accepts connections.
    pub async fn start(
        control_port: u16,
        portal: SocketAddr,
        log: &Path,
    ) -> Result<Self, TgtError> {
        if tgtadm_raw(control_port, &["--op", "show", "--mode", "sys"])
            .await
            .is_ok()
        {
            return Err(TgtError::ControlPortInUse(control_port));
        }
        let spawn_err = |source| TgtError::Spawn {
            program: "tgtd",
            source,
        };
        let out = File::create(log).map_err(spawn_err)?;
        let err = out.try_clone().map_err(spawn_err)?;
        let child = Command::new("tgtd")
            .arg("-f")
            .args(["-C", &control_port.to_string()])
            .args(["--iscsi", &format!("portal={portal}")])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(spawn_err)?;
        let mut t = Self {
            child: Some(child),
            control_port,
            portal,
            log: log.to_owned(),
            targets: HashSet::new(),
            luns: HashMap::new(),
            accounts: HashSet::new(),
        };
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = t.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                t.child = None;
                return Err(t.not_started(format!("tgtd exited with {status}")));
            }
            let answers = t.tgtadm(&["--op", "show", "--mode", "sys"]).await.is_ok();
            if answers && tokio::net::TcpStream::connect(portal).await.is_ok() {
                return Ok(t);
            }
            if tokio::time::Instant::now() > deadline {
                return Err(t.not_started(format!("no answer within {START_TIMEOUT:?}")));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Starts a tgtd on 127.0.0.1 with a free portal port and a random
    /// control port in 20000..32000 (so parallel tests do not clash),
    /// trying again with other ports if one is taken meanwhile.
    pub async fn start_local(log: &Path) -> Result<Self, TgtError> {
        let mut last = None;
        for _ in 0..5 {
            let portal = SocketAddr::from(([127, 0, 0, 1], crate::daemon::free_port()));
            match Self::start(random_control_port(), portal, log).await {
                Ok(t) => return Ok(t),
                Err(e @ (TgtError::ControlPortInUse(_) | TgtError::NotStarted { .. })) => {
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or(TgtError::ControlPortInUse(0)))
    }

    fn not_started(&self, reason: String) -> TgtError {
        TgtError::NotStarted {
            reason,
            log: self.log(),
        }
    }

    /// Closes every connection to target `tid` (`--op delete --mode
    /// conn`), as an array dropping its sessions does; initiators
    /// reconnect unless the ACL now refuses them. Returns how many.
    pub async fn drop_connections(&mut self, tid: u32) -> Result<usize, TgtError> {
        let t = tid.to_string();
        let shown = tgtadm_raw(
            self.control_port,
            &["--op", "show", "--mode", "conn", "--tid", &t],
        )
        .await?;
        let mut dropped = 0;
        let mut session = None;
        for line in shown.lines().map(str::trim) {
            if let Some(sid) = line.strip_prefix("Session:") {
                session = Some(sid.trim().to_owned());
            } else if let (Some(cid), Some(sid)) = (line.strip_prefix("Connection:"), &session) {
                self.tgtadm(&[
                    "--op",
                    "delete",
                    "--mode",
                    "conn",
                    "--tid",
                    &t,
                    "--sid",
                    sid,
                    "--cid",
                    cid.trim(),
                ])
                .await?;
                dropped += 1;
            }
        }
        Ok(dropped)
    }

    /// Adds a portal (`ip:port`) it listens on too.
    pub async fn add_portal(&mut self, portal: &str) -> Result<(), TgtError> {
        self.tgtadm(&[
            "--mode",
            "portal",
            "--op",
            "new",
            "--param",
            &format!("portal={portal}"),
        ])
        .await
    }

    /// The iSCSI portal it listens on.
    pub fn portal(&self) -> SocketAddr {
        self.portal
    }

    /// Its management control port.
    pub fn control_port(&self) -> u16 {
        self.control_port
    }

    /// tgtd's output so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The process id (0 once stopped).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// Creates target `tid` (>= 1) named `iqn`. It has LUN 0 (the
    /// controller) and refuses every initiator until bound.
    pub async fn add_target(&mut self, tid: u32, iqn: &str) -> Result<(), TgtError> {
        let t = tid.to_string();
        self.tgtadm(&["--op", "new", "--mode", "target", "--tid", &t, "-T", iqn])
            .await?;
        self.targets.insert(tid);
        Ok(())
    }

    /// Deletes target `tid` (forcing out logged-in sessions).
    pub async fn remove_target(&mut self, tid: u32) -> Result<(), TgtError> {
        let t = tid.to_string();
        self.tgtadm(&["--op", "delete", "--mode", "target", "--tid", &t, "--force"])
            .await?;
        self.targets.remove(&tid);
        self.luns.retain(|(x, _), _| *x != tid);
        Ok(())
    }

    /// Adds LUN `lun` (>= 1) of target `tid`, backed by `backing_file`
    /// (the rdwr backing store), with `identity`.
    pub async fn add_lun(
        &mut self,
        tid: u32,
        lun: u64,
        backing_file: &Path,
        identity: &LunIdentity,
    ) -> Result<(), TgtError> {
        add_lun_at(self.control_port, tid, lun, backing_file, identity).await?;
        self.luns
            .insert((tid, lun), (backing_file.to_owned(), identity.clone()));
        Ok(())
    }

    /// Removes LUN `lun` of target `tid`.
    pub async fn remove_lun(&mut self, tid: u32, lun: u64) -> Result<(), TgtError> {
        remove_lun_at(self.control_port, tid, lun).await?;
        self.luns.remove(&(tid, lun));
        Ok(())
    }

    /// Makes tgtd see a grown (or shrunk) backing file: it caches the size
    /// from when the LUN was created, so the LUN is removed and added again
    /// with the same file and identity. Initiators see the new size; their
    /// sessions get a UNIT ATTENTION (POWER ON, RESET OR BUS DEVICE RESET
    /// OCCURRED, 0x29/0x00) on their next command to it, which
    /// `crate::iscsi::Session` retries as the Linux midlayer does.
    pub async fn refresh_lun_size(&mut self, tid: u32, lun: u64) -> Result<(), TgtError> {
        let (file, identity) = self
            .luns
            .get(&(tid, lun))
            .cloned()
            .ok_or(TgtError::UnknownLun { tid, lun })?;
        self.remove_lun(tid, lun).await?;
        self.add_lun(tid, lun, &file, &identity).await
    }

    /// Lets every initiator in (`-I ALL`).
    pub async fn bind_all(&mut self, tid: u32) -> Result<(), TgtError> {
        self.acl("bind", tid, "-I", "ALL").await
    }

    /// Removes the `-I ALL` rule.
    pub async fn unbind_all(&mut self, tid: u32) -> Result<(), TgtError> {
        self.acl("unbind", tid, "-I", "ALL").await
    }

    /// Lets initiators connecting from `ip` (or a CIDR `ip/len`) in.
    pub async fn bind_initiator_address(&mut self, tid: u32, ip: &str) -> Result<(), TgtError> {
        self.acl("bind", tid, "-I", ip).await
    }

    /// Lets the initiator named `iqn` in (`-Q`).
    pub async fn bind_initiator_name(&mut self, tid: u32, iqn: &str) -> Result<(), TgtError> {
        self.acl("bind", tid, "-Q", iqn).await
    }

    /// Removes an initiator-name rule.
    pub async fn unbind_initiator_name(&mut self, tid: u32, iqn: &str) -> Result<(), TgtError> {
        self.acl("unbind", tid, "-Q", iqn).await
    }

    async fn acl(&mut self, op: &str, tid: u32, flag: &str, who: &str) -> Result<(), TgtError> {
        let t = tid.to_string();
        self.tgtadm(&["--op", op, "--mode", "target", "--tid", &t, flag, who])
            .await
    }

    /// Requires CHAP on target `tid`: the initiator must log in as `user`
    /// with `password` (an incoming account; accounts are global to tgtd,
    /// one is created the first time a user name is used).
    pub async fn add_chap(&mut self, tid: u32, user: &str, password: &str) -> Result<(), TgtError> {
        self.account(tid, user, password, false).await
    }

    /// Mutual CHAP on target `tid`: the target answers the initiator's
    /// challenge as `user` with `password` (tgt's `--outgoing` account; at
    /// most one per target).
    pub async fn add_mutual_chap(
        &mut self,
        tid: u32,
        user: &str,
        password: &str,
    ) -> Result<(), TgtError> {
        self.account(tid, user, password, true).await
    }

    async fn account(
        &mut self,
        tid: u32,
        user: &str,
        password: &str,
        outgoing: bool,
    ) -> Result<(), TgtError> {
        if !self.accounts.contains(user) {
            self.tgtadm(&[
                "--op",
                "new",
                "--mode",
                "account",
                "--user",
                user,
                "--password",
                password,
            ])
            .await?;
            self.accounts.insert(user.to_owned());
        }
        let t = tid.to_string();
        let mut args = vec![
            "--op", "bind", "--mode", "account", "--tid", &t, "--user", user,
        ];
        if outgoing {
            args.push("--outgoing");
        }
        self.tgtadm(&args).await
    }

    /// Runs `tgtadm -C <port> --lld iscsi <args>` against this tgtd.
    pub async fn tgtadm(&self, args: &[&str]) -> Result<(), TgtError> {
        tgtadm_raw(self.control_port, args).await.map(|_| ())
    }

    /// `tgtadm --op show --mode target`: tgtd's view of targets, LUNs,
    /// sessions, accounts and ACLs (for failure messages).
    pub async fn show(&self) -> Result<String, TgtError> {
        tgtadm_raw(self.control_port, &["--op", "show", "--mode", "target"]).await
    }

    /// Stops tgtd. It ignores SIGTERM; its own way out is to delete every
    /// target (`--force` drops the sessions) and then the system
    /// (`--op delete --mode system`). That is tried first, bounded, then
    /// SIGTERM and SIGKILL. Synchronous, so that `Drop` can call it.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let port = self.control_port.to_string();
        let mut tids: Vec<u32> = self.targets.drain().collect();
        tids.sort_unstable();
        for tid in tids {
            let t = tid.to_string();
            tgtadm_blocking(
                &port,
                &["--op", "delete", "--mode", "target", "--tid", &t, "--force"],
            );
        }
        tgtadm_blocking(&port, &["--op", "delete", "--mode", "system"]);
        if !wait_exit(&mut child, Duration::from_secs(2)) {
            signal(child.id(), "TERM");
            if !wait_exit(&mut child, Duration::from_millis(500)) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        // tgtd leaves its control socket and its lock behind, one pair per
        // control port: thousands after many runs.
        for suffix in ["", ".lock"] {
            let _ = std::fs::remove_file(format!("/var/run/tgtd/socket.{port}{suffix}"));
        }
    }
}

/// Waits up to `limit` for `child` to exit.
fn wait_exit(child: &mut Child, limit: Duration) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if child.try_wait().ok().flatten().is_some() {
            return true;
        }
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs tgtadm without an async runtime (for `Drop`), killed after
/// [`TGTADM_TIMEOUT`]; the outcome is ignored (best effort).
fn tgtadm_blocking(port: &str, args: &[&str]) {
    let spawned = Command::new("tgtadm")
        .args(["-C", port, "--lld", "iscsi"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    if let Ok(mut c) = spawned
        && !wait_exit(&mut c, TGTADM_TIMEOUT)
    {
        let _ = c.kill();
        let _ = c.wait();
    }
}

impl Drop for Tgtd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Adds LUN `lun` of target `tid` on the tgtd at `control_port`: the rdwr
/// backing store `backing_file`, then its identity (deleted again when
/// tgtd refuses the identity, so no LUN is left without it).
async fn add_lun_at(
    control_port: u16,
    tid: u32,
    lun: u64,
    backing_file: &Path,
    identity: &LunIdentity,
) -> Result<(), TgtError> {
    let params = identity.params()?;
    let backing = backing_file
        .to_str()
        .ok_or_else(|| TgtError::InvalidParameter {
            what: "backing file",
            value: backing_file.display().to_string(),
            why: "not UTF-8",
        })?;
    let (t, l) = (tid.to_string(), lun.to_string());
    let base = ["--mode", "logicalunit", "--tid", &t, "--lun", &l];
    let new = [
        &["--op", "new"][..],
        &base,
        &["--bstype", "rdwr", "-b", backing],
    ]
    .concat();
    tgtadm_raw(control_port, &new).await?;
    let update = [&["--op", "update"][..], &base, &["--params", &params]].concat();
    if let Err(e) = tgtadm_raw(control_port, &update).await {
        let delete = [&["--op", "delete"][..], &base].concat();
        let _ = tgtadm_raw(control_port, &delete).await;
        return Err(e);
    }
    Ok(())
}

/// Removes LUN `lun` of target `tid` on the tgtd at `control_port`.
async fn remove_lun_at(control_port: u16, tid: u32, lun: u64) -> Result<(), TgtError> {
    let (t, l) = (tid.to_string(), lun.to_string());
    let args = [
        "--op",
        "delete",
        "--mode",
        "logicalunit",
        "--tid",
        &t,
        "--lun",
        &l,
    ];
    tgtadm_raw(control_port, &args).await.map(|_| ())
}

/// A disk LUN as `tgtadm --op show --mode target` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShownLun {
    /// Its target.
    pub tid: u32,
    /// Its number.
    pub lun: u64,
    /// `SCSI ID` (the NAA 6 WWID is `naa.<scsi_id>`, see [`LunIdentity`]).
    pub scsi_id: String,
    /// `SCSI SN`.
    pub scsi_sn: String,
    /// `Backing store path`.
    pub backing_file: PathBuf,
}

/// The disk LUNs (backed by a file) of `tgtadm --op show --mode target`.
pub fn parse_show(text: &str) -> Vec<ShownLun> {
    let mut out = Vec::new();
    let (mut tid, mut lun) = (None, None);
    let (mut id, mut sn) = (String::new(), String::new());
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("Target ") {
            tid = rest.split(':').next().and_then(|t| t.trim().parse().ok());
        } else if let Some(n) = line.strip_prefix("LUN: ") {
            lun = n.trim().parse().ok();
        } else if let Some(v) = line.strip_prefix("SCSI ID: ") {
            id = v.trim().to_owned();
        } else if let Some(v) = line.strip_prefix("SCSI SN: ") {
            sn = v.trim().to_owned();
        } else if let Some(path) = line.strip_prefix("Backing store path: ")
            && path.starts_with('/')
            && let (Some(tid), Some(lun)) = (tid, lun)
        {
            out.push(ShownLun {
                tid,
                lun,
                scsi_id: id.clone(),
                scsi_sn: sn.clone(),
                backing_file: PathBuf::from(path),
            });
        }
    }
    out
}

/// The disk LUNs of the tgtd at `control_port` (another process's: a kept
/// lab's).
pub async fn shown_luns(control_port: u16) -> Result<Vec<ShownLun>, TgtError> {
    let text = tgtadm_raw(control_port, &["--op", "show", "--mode", "target"]).await?;
    Ok(parse_show(&text))
}

/// Makes the tgtd at `control_port` see the grown backing file of `lun`,
/// as [`Tgtd::refresh_lun_size`] does for its own, with the identity tgtd
/// shows plus the vendor and product every lab LUN has
/// ([`LunIdentity::lab`]; tgtadm does not show them).
pub async fn refresh_shown_lun(control_port: u16, lun: &ShownLun) -> Result<(), TgtError> {
    let identity = LunIdentity {
        scsi_id: lun.scsi_id.clone(),
        scsi_sn: lun.scsi_sn.clone(),
        vendor_id: LAB_VENDOR.to_owned(),
        product_id: LAB_PRODUCT.to_owned(),
    };
    remove_lun_at(control_port, lun.tid, lun.lun).await?;
    add_lun_at(control_port, lun.tid, lun.lun, &lun.backing_file, &identity).await
}

/// A control port in 20000..32000 (tgtd refuses numbers above 32767),
/// different on every call.
pub fn random_control_port() -> u16 {
    use std::hash::BuildHasher;
    let r = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
    20000 + (r % 12000) as u16
}

/// Runs tgtadm with a timeout; its stdout on success.
async fn tgtadm_raw(control_port: u16, args: &[&str]) -> Result<String, TgtError> {
    let port = control_port.to_string();
    let shown = args.join(" ");
    let mut cmd = tokio::process::Command::new("tgtadm");
    cmd.args(["-C", &port, "--lld", "iscsi"])
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let out = match tokio::time::timeout(TGTADM_TIMEOUT, cmd.output()).await {
        Err(_) => return Err(TgtError::Timeout(shown)),
        Ok(Err(source)) => {
            return Err(TgtError::Spawn {
                program: "tgtadm",
                source,
            });
        }
        Ok(Ok(out)) => out,
    };
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(TgtError::Tgtadm {
            args: shown,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// Sends a signal with kill(1): the harness stays free of unsafe code.
fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tgtadm --op show --mode target` of a lab's tgtd (trimmed).
    const SHOWN: &str = "\
Target 1: iqn.2026-11.io.csi-scsi.lab:array-a
    System information:
        Driver: iscsi
        State: ready
    I_T nexus information:
    LUN information:
        LUN: 0
            Type: controller
            SCSI ID: IET     00010000
            SCSI SN: beaf10
            Size: 0 MB, Block size: 1
            Backing store type: null
            Backing store path: None
            Backing store flags: 
        LUN: 1
            Type: disk
            SCSI ID: 60014050000100000000000000000001
            SCSI SN: SN1-1
            Size: 537 MB, Block size: 512
            Backing store type: rdwr
            Backing store path: /tmp/e2e-lab/luns/a1.img
            Backing store flags: 
Target 3: iqn.2026-11.io.csi-scsi.lab:array-c
    LUN information:
        LUN: 0
            Type: controller
            Backing store path: None
        LUN: 12
            Type: disk
            SCSI ID: 6001405000030000000000000000000c
            SCSI SN: SN3-12
            Backing store path: /tmp/e2e-lab/luns/c12.img
";

    #[test]
    fn show_lists_the_disk_luns_with_their_target_identity_and_file() {
        let luns = parse_show(SHOWN);
        assert_eq!(
            luns,
            [
                ShownLun {
                    tid: 1,
                    lun: 1,
                    scsi_id: "60014050000100000000000000000001".into(),
                    scsi_sn: "SN1-1".into(),
                    backing_file: "/tmp/e2e-lab/luns/a1.img".into(),
                },
                ShownLun {
                    tid: 3,
                    lun: 12,
                    scsi_id: "6001405000030000000000000000000c".into(),
                    scsi_sn: "SN3-12".into(),
                    backing_file: "/tmp/e2e-lab/luns/c12.img".into(),
                },
            ]
        );
    }
}
