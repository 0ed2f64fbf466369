//! A logged-in normal session in full feature phase: READ-direction SCSI
//! commands (one at a time) with their Data-In and status, and Logout.

use std::net::SocketAddr;
use std::time::Duration;

use super::IscsiError;
use super::conn::{Connection, bounded};
use super::pdu::{FINAL, IMMEDIATE, Pdu, RESERVED_TAG, op};
use super::scsi::{self, Cdb, StdInquiry};

/// Read flag of a SCSI Command PDU.
const READ: u8 = 0x40;
/// Task attribute SIMPLE.
const ATTR_SIMPLE: u8 = 0x01;
/// Data-In flags.
const DATA_IN_STATUS: u8 = 0x01;
/// SCSI status GOOD and CHECK CONDITION.
const GOOD: u8 = 0x00;
const CHECK_CONDITION: u8 = 0x02;
/// Sense key UNIT ATTENTION.
const UNIT_ATTENTION: u8 = 0x06;
/// How many UNIT ATTENTIONs a command is retried through (as the Linux
/// midlayer does: a new LUN, a LUN change or a reset each queue one per
/// I_T nexus).
const UA_RETRIES: usize = 4;
/// Largest data-in buffer a command may ask for.
const MAX_TRANSFER: u32 = 1024 * 1024;
/// Largest VPD page (PAGE LENGTH is 16 bits; INQUIRY allocation too).
const VPD_ALLOC: u16 = u16::MAX;

/// A logged-in iSCSI session (one connection) to one target.
pub struct Session {
    conn: Connection,
    target_iqn: String,
    tsih: u16,
    isid: [u8; 6],
    target_keys: Vec<(String, String)>,
    timeout: Duration,
    broken: bool,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("portal", &self.conn.portal)
            .field("target", &self.target_iqn)
            .field("tsih", &self.tsih)
            .field("broken", &self.broken)
            .finish()
    }
}

impl Session {
    pub(crate) fn new(
        conn: Connection,
        target_iqn: &str,
        outcome: super::login::LoginOutcome,
        timeout: Duration,
    ) -> Self {
        Self {
            conn,
            target_iqn: target_iqn.to_owned(),
            tsih: outcome.tsih,
            isid: outcome.isid,
            target_keys: outcome.target_keys,
            timeout,
            broken: false,
        }
    }

    /// The portal this session is connected to.
    pub fn portal(&self) -> SocketAddr {
        self.conn.portal
    }

    /// The target's IQN.
    pub fn target_iqn(&self) -> &str {
        &self.target_iqn
    }

    /// The Target Session Identifying Handle the target assigned.
    pub fn tsih(&self) -> u16 {
        self.tsih
    }

    /// The ISID we chose (6 bytes, random format).
    pub fn isid(&self) -> [u8; 6] {
        self.isid
    }

    /// The target's TargetPortalGroupTag, if it declared one.
    pub fn target_portal_group_tag(&self) -> Option<u16> {
        self.target_key("TargetPortalGroupTag")
            .and_then(|v| v.parse().ok())
    }

    /// A key the target sent during login (its last value), e.g.
    /// `TargetAlias` or a negotiated `MaxBurstLength`.
    pub fn target_key(&self, key: &str) -> Option<&str> {
        self.target_keys
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// REPORT LUNS: every LUN of the target, in Linux numbering
    /// ([`scsi::lun_from_wire`]). Includes tgt's LUN 0 controller: callers
    /// that want disks check [`StdInquiry::is_disk`].
    pub async fn report_luns(&mut self) -> Result<Vec<u64>, IscsiError> {
        let mut alloc: u32 = 4096;
        loop {
            // REPORT LUNS is addressed to LUN 0 (always present).
            let data = self.read(0, scsi::report_luns_cdb(alloc), alloc).await?;
            let (luns, need) = scsi::parse_report_luns(&data)?;
            if need <= alloc as usize || alloc >= MAX_TRANSFER {
                return Ok(luns);
            }
            alloc = u32::try_from(need)
                .unwrap_or(MAX_TRANSFER)
                .min(MAX_TRANSFER);
        }
    }

    /// Standard INQUIRY of `lun`.
    pub async fn inquiry(&mut self, lun: u64) -> Result<StdInquiry, IscsiError> {
        let data = self.read(lun, scsi::inquiry_cdb(None, 255), 255).await?;
        scsi::parse_std_inquiry(&data)
    }

    /// VPD page `page` of `lun`: the bytes exactly as the device returns
    /// them, header included and cut to the page's own length (what Linux
    /// keeps in `/sys/.../vpd_pg83` and `vpd_pg80`).
    pub async fn vpd_page(&mut self, lun: u64, page: u8) -> Result<Vec<u8>, IscsiError> {
        let alloc = VPD_ALLOC;
        let mut data = self
            .read(lun, scsi::inquiry_cdb(Some(page), alloc), u32::from(alloc))
            .await?;
        let len = scsi::vpd_page_len(&data)?;
        if data[1] != page {
            return Err(IscsiError::Protocol(format!(
                "asked for VPD page {page:#04x}, got {:#04x}",
                data[1]
            )));
        }
        if len > data.len() {
            return Err(IscsiError::Protocol(format!(
                "VPD page {page:#04x} claims {len} bytes, the device returned {}",
                data.len()
            )));
        }
        data.truncate(len);
        Ok(data)
    }

    /// READ CAPACITY (16): (capacity in bytes, logical block length).
    pub async fn read_capacity16(&mut self, lun: u64) -> Result<(u64, u32), IscsiError> {
        let data = self.read(lun, scsi::read_capacity16_cdb(32), 32).await?;
        scsi::parse_read_capacity16(&data)
    }

    /// Logs the session out (reason "close the session") and closes the
    /// connection.
    pub async fn logout(mut self) -> Result<(), IscsiError> {
        let r = bounded(&mut self.broken, self.timeout, logout(&mut self.conn)).await;
        self.conn.close().await;
        r
    }

    /// Runs a READ-direction command, retrying through UNIT ATTENTIONs.
    async fn read(&mut self, lun: u64, cdb: Cdb, alloc: u32) -> Result<Vec<u8>, IscsiError> {
        let mut attempt = 0;
        loop {
            let r = bounded(
                &mut self.broken,
                self.timeout,
                execute_read(&mut self.conn, lun, &cdb, alloc),
            )
            .await;
            match r {
                Err(IscsiError::ScsiCheckCondition {
                    sense_key: UNIT_ATTENTION,
                    ..
                }) if attempt < UA_RETRIES => attempt += 1,
                r => return r,
            }
        }
    }
}

/// Sends one SCSI Command (read) and collects its Data-In and status.
async fn execute_read(
    conn: &mut Connection,
    lun: u64,
    cdb: &Cdb,
    alloc: u32,
) -> Result<Vec<u8>, IscsiError> {
    let alloc = alloc.min(MAX_TRANSFER);
    let itt = conn.next_itt();
    let mut p = Pdu::new(op::SCSI_COMMAND, FINAL | READ | ATTR_SIMPLE);
    p.set_bytes(8, &scsi::lun_to_wire(lun));
    p.set_itt(itt);
    p.set_u32(20, alloc);
    p.set_u32(24, conn.cmd_sn);
    p.set_u32(28, conn.exp_stat_sn);
    p.set_bytes(32, cdb);
    conn.send(&p).await?;
    conn.cmd_sn = conn.cmd_sn.wrapping_add(1);

    let mut data: Vec<u8> = Vec::new();
    let mut data_sn: u32 = 0;
    loop {
        let rsp = conn.recv().await?;
        if rsp.itt() != itt {
            return Err(IscsiError::Protocol(format!(
                "answer (opcode {:#04x}) for task {:#x}, ours is {itt:#x}",
                rsp.opcode(),
                rsp.itt()
            )));
        }
        match rsp.opcode() {
            op::DATA_IN => {
                let flags = rsp.flags();
                if rsp.u32_at(36) != data_sn {
                    return Err(IscsiError::Protocol(format!(
                        "Data-In DataSN {} out of order, expected {data_sn}",
                        rsp.u32_at(36)
                    )));
                }
                data_sn = data_sn.wrapping_add(1);
                // DataPDUInOrder=Yes and DataSequenceInOrder=Yes: each
                // segment starts where the previous ended.
                let offset = rsp.u32_at(40) as usize;
                if offset != data.len() {
                    return Err(IscsiError::Protocol(format!(
                        "Data-In at offset {offset}, expected {}",
                        data.len()
                    )));
                }
                if data.len() + rsp.data.len() > alloc as usize {
                    return Err(IscsiError::Protocol(format!(
                        "target sent more than the {alloc} bytes asked for"
                    )));
                }
                data.extend_from_slice(&rsp.data);
                if flags & DATA_IN_STATUS != 0 {
                    if flags & FINAL == 0 {
                        return Err(IscsiError::Protocol(
                            "Data-In with status but not final".into(),
                        ));
                    }
                    conn.saw_stat_sn(rsp.u32_at(24));
                    return match rsp.bhs[3] {
                        GOOD => Ok(data),
                        status => Err(IscsiError::ScsiStatus {
                            response: 0,
                            status,
                        }),
                    };
                }
            }
            op::SCSI_RESPONSE => {
                conn.saw_stat_sn(rsp.u32_at(24));
                let (response, status) = (rsp.bhs[2], rsp.bhs[3]);
                return match (response, status) {
                    (0, GOOD) => Ok(data),
                    (0, CHECK_CONDITION) => Err(check_condition(&rsp.data)),
                    (response, status) => Err(IscsiError::ScsiStatus { response, status }),
                };
            }
            op::R2T => {
                return Err(IscsiError::Protocol("R2T for a read command".into()));
            }
            other => {
                return Err(IscsiError::Protocol(format!(
                    "unexpected opcode {other:#04x} during a command"
                )));
            }
        }
    }
}

/// The error for CHECK CONDITION from a SCSI Response's data segment
/// (SenseLength, then sense data).
fn check_condition(seg: &[u8]) -> IscsiError {
    let sense = seg
        .get(0..2)
        .map(|l| usize::from(u16::from_be_bytes([l[0], l[1]])))
        .and_then(|len| seg.get(2..2 + len));
    match sense.and_then(scsi::parse_sense) {
        Some((sense_key, asc, ascq)) => IscsiError::ScsiCheckCondition {
            sense_key,
            asc,
            ascq,
        },
        None => IscsiError::Protocol("CHECK CONDITION without usable sense data".into()),
    }
}

/// Logout Request (close the session) and its response.
async fn logout(conn: &mut Connection) -> Result<(), IscsiError> {
    let itt = conn.next_itt();
    let mut p = Pdu::new(op::LOGOUT_REQUEST | IMMEDIATE, FINAL); // reason 0
    p.set_itt(itt);
    p.set_u16(20, 0); // CID
    p.set_u32(24, conn.cmd_sn);
    p.set_u32(28, conn.exp_stat_sn);
    conn.send(&p).await?;
    let rsp = conn.recv().await?;
    if rsp.opcode() != op::LOGOUT_RESPONSE || rsp.itt() != itt {
        return Err(IscsiError::Protocol(format!(
            "expected our Logout Response, got opcode {:#04x} task {:#x}",
            rsp.opcode(),
            rsp.itt()
        )));
    }
    conn.saw_stat_sn(rsp.u32_at(24));
    match rsp.bhs[2] {
        0 => Ok(()),
        r => Err(IscsiError::Protocol(format!(
            "logout refused: response {r}"
        ))),
    }
}

/// Text Request/Response exchange (with continuation), e.g. SendTargets.
pub(crate) async fn text_exchange(
    conn: &mut Connection,
    keys: &[(String, String)],
) -> Result<Vec<(String, String)>, IscsiError> {
    const CONTINUE: u8 = 0x40;
    const MAX_TEXT: usize = 1024 * 1024;
    const MAX_ROUNDS: usize = 256;
    let itt = conn.next_itt();
    let mut ttt = RESERVED_TAG;
    let mut request = super::pdu::encode_text(keys);
    let mut text = Vec::new();
    for _ in 0..MAX_ROUNDS {
        let mut p = Pdu::new(op::TEXT_REQUEST | IMMEDIATE, FINAL);
        p.set_itt(itt);
        p.set_u32(20, ttt);
        p.set_u32(24, conn.cmd_sn);
        p.set_u32(28, conn.exp_stat_sn);
        p.data = std::mem::take(&mut request);
        conn.send(&p).await?;
        let rsp = conn.recv().await?;
        if rsp.opcode() != op::TEXT_RESPONSE || rsp.itt() != itt {
            return Err(IscsiError::Protocol(format!(
                "expected our Text Response, got opcode {:#04x} task {:#x}",
                rsp.opcode(),
                rsp.itt()
            )));
        }
        conn.saw_stat_sn(rsp.u32_at(24));
        if text.len() + rsp.data.len() > MAX_TEXT {
            return Err(IscsiError::Protocol("text response too long".into()));
        }
        text.extend_from_slice(&rsp.data);
        let flags = rsp.flags();
        if flags & FINAL != 0 && flags & CONTINUE == 0 {
            return super::pdu::decode_text(&text);
        }
        ttt = rsp.u32_at(20);
    }
    Err(IscsiError::Protocol(
        "text response continues forever".into(),
    ))
}

/// Logout helper for a discovery connection.
pub(crate) async fn logout_conn(conn: &mut Connection) -> Result<(), IscsiError> {
    logout(conn).await
}
