//! One TCP connection to a portal and the sequence numbers that go with it
//! (CmdSN, ExpStatSN, task tags). Both the login phase and the full
//! feature phase send and receive through it.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::IscsiError;
use super::pdu::{self, IMMEDIATE, Pdu, RESERVED_TAG, op};

/// The MaxRecvDataSegmentLength we declare: no data segment the target
/// sends may be longer.
pub(crate) const OUR_MAX_RECV: usize = 256 * 1024;

/// How many unsolicited PDUs (NOP-In pings, async messages) we take while
/// waiting for one answer before calling the target broken.
const MAX_UNSOLICITED: usize = 64;

pub(crate) struct Connection {
    stream: TcpStream,
    pub(crate) portal: SocketAddr,
    /// CmdSN of the next non-immediate command (also carried by immediate
    /// ones, which do not advance it).
    pub(crate) cmd_sn: u32,
    /// ExpStatSN we acknowledge: last StatSN seen plus one.
    pub(crate) exp_stat_sn: u32,
    next_itt: u32,
    /// The target's declared MaxRecvDataSegmentLength (8192 until told).
    pub(crate) target_max_recv: usize,
}

impl Connection {
    /// Connects to `portal` within `timeout`.
    pub(crate) async fn connect(portal: SocketAddr, timeout: Duration) -> Result<Self, IscsiError> {
        let stream = match tokio::time::timeout(timeout, TcpStream::connect(portal)).await {
            Err(_) => return Err(IscsiError::Timeout(timeout)),
            Ok(Err(source)) => return Err(IscsiError::Unreachable { portal, source }),
            Ok(Ok(s)) => s,
        };
        stream.set_nodelay(true).map_err(IscsiError::Connection)?;
        Ok(Self {
            stream,
            portal,
            cmd_sn: 1,
            exp_stat_sn: 0,
            next_itt: 1,
            target_max_recv: 8192,
        })
    }

    /// A fresh Initiator Task Tag (never the reserved 0xffffffff).
    pub(crate) fn next_itt(&mut self) -> u32 {
        let itt = self.next_itt;
        self.next_itt = match self.next_itt.wrapping_add(1) {
            RESERVED_TAG => 1,
            n => n,
        };
        itt
    }

    /// Records a StatSN the target sent with a status.
    pub(crate) fn saw_stat_sn(&mut self, stat_sn: u32) {
        self.exp_stat_sn = stat_sn.wrapping_add(1);
    }

    pub(crate) async fn send(&mut self, pdu: &Pdu) -> Result<(), IscsiError> {
        if pdu.data.len() > self.target_max_recv {
            return Err(IscsiError::Protocol(format!(
                "our {}-byte data segment exceeds the target's MaxRecvDataSegmentLength {}",
                pdu.data.len(),
                self.target_max_recv
            )));
        }
        pdu::write_pdu(&mut self.stream, pdu).await
    }

    /// The next PDU that answers us. Target NOP-In pings are answered and
    /// asynchronous messages skipped on the way; a Reject is an error.
    pub(crate) async fn recv(&mut self) -> Result<Pdu, IscsiError> {
        for _ in 0..MAX_UNSOLICITED {
            let pdu = pdu::read_pdu(&mut self.stream, OUR_MAX_RECV).await?;
            match pdu.opcode() {
                op::NOP_IN if pdu.itt() == RESERVED_TAG => {
                    let ttt = pdu.u32_at(20);
                    if ttt != RESERVED_TAG {
                        self.answer_ping(&pdu, ttt).await?;
                    }
                }
                op::ASYNC_MESSAGE => {}
                op::REJECT => {
                    return Err(IscsiError::Protocol(format!(
                        "target rejected our PDU: reason {:#04x}",
                        pdu.bhs[2]
                    )));
                }
                _ => return Ok(pdu),
            }
        }
        Err(IscsiError::Protocol(format!(
            "more than {MAX_UNSOLICITED} unsolicited PDUs in a row"
        )))
    }

    /// NOP-Out answering a target's ping (RFC 7143 11.18): same TTT and
    /// LUN, reserved ITT, immediate, CmdSN not advanced.
    async fn answer_ping(&mut self, ping: &Pdu, ttt: u32) -> Result<(), IscsiError> {
        let mut out = Pdu::new(op::NOP_OUT | IMMEDIATE, pdu::FINAL);
        out.set_bytes(8, &ping.bhs[8..16]);
        out.set_itt(RESERVED_TAG);
        out.set_u32(20, ttt);
        out.set_u32(24, self.cmd_sn);
        out.set_u32(28, self.exp_stat_sn);
        out.data = ping.data.clone();
        self.send(&out).await
    }

    /// Closes the TCP connection (best effort).
    pub(crate) async fn close(mut self) {
        let _ = self.stream.shutdown().await;
    }
}

/// Runs `fut` within `timeout`; a failure that leaves the byte stream in an
/// unknown state marks the session `broken`.
pub(crate) async fn bounded<T>(
    broken: &mut bool,
    timeout: Duration,
    fut: impl Future<Output = Result<T, IscsiError>>,
) -> Result<T, IscsiError> {
    if *broken {
        return Err(IscsiError::SessionBroken);
    }
    let r = match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err(IscsiError::Timeout(timeout)),
    };
    if let Err(e) = &r
        && e.breaks_session()
    {
        *broken = true;
    }
    r
}
