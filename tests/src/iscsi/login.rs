//! The login phase (RFC 7143 section 6): SecurityNegotiation (AuthMethod
//! None or CHAP, optionally mutual) -> LoginOperationalNegotiation ->
//! FullFeaturePhase, on one connection, with the login status mapped to
//! [`IscsiError`].

use super::IscsiError;
use super::chap::{self, Chap};
use super::conn::Connection;
use super::pdu::{self, IMMEDIATE, Pdu, op};

/// Transit bit of a Login PDU's byte 1.
const TRANSIT: u8 = 0x80;
/// Continue bit: the text does not fit this PDU.
const CONTINUE: u8 = 0x40;

/// Login stages (CSG/NSG).
const SECURITY: u8 = 0;
const OPERATIONAL: u8 = 1;
const FULL_FEATURE: u8 = 3;

/// How many request/response rounds one stage may take before we call the
/// target's negotiation runaway.
const MAX_ROUNDS: usize = 8;
/// Largest total text one login response may carry across continuations.
const MAX_TEXT: usize = 64 * 1024;

/// What the caller wants from the login.
pub(crate) struct LoginRequest<'a> {
    pub(crate) initiator_iqn: &'a str,
    /// `None` for a discovery session.
    pub(crate) target_iqn: Option<&'a str>,
    pub(crate) chap: Option<&'a Chap>,
}

/// What a successful login established.
#[derive(Debug, Clone)]
pub(crate) struct LoginOutcome {
    pub(crate) tsih: u16,
    pub(crate) isid: [u8; 6],
    /// Every key the target sent during the login, in order (CHAP values
    /// excluded).
    pub(crate) target_keys: Vec<(String, String)>,
}

/// The fields of a Login Response that drive the state machine.
struct Answer {
    transit: bool,
    nsg: u8,
    keys: Vec<(String, String)>,
}

struct Login<'c> {
    conn: &'c mut Connection,
    itt: u32,
    isid: [u8; 6],
    tsih: u16,
    seen: Vec<(String, String)>,
}

/// Logs in on `conn`. On success the connection is in full feature phase.
pub(crate) async fn login(
    conn: &mut Connection,
    req: &LoginRequest<'_>,
) -> Result<LoginOutcome, IscsiError> {
    let itt = conn.next_itt();
    // ISID type 10b ("random"): 0x80, then 24 random bits (B and C), then
    // the qualifier D.
    let r = chap::random_bytes::<3>()?;
    let isid = [0x80, r[0], r[1], r[2], 0x00, 0x01];
    let mut login = Login {
        conn,
        itt,
        isid,
        tsih: 0,
        seen: Vec::new(),
    };
    login.security(req).await?;
    login.operational(req.target_iqn.is_none()).await?;
    if req.target_iqn.is_some() && login.tsih == 0 {
        return Err(IscsiError::Protocol(
            "login completed without a TSIH".into(),
        ));
    }
    Ok(LoginOutcome {
        tsih: login.tsih,
        isid,
        target_keys: login.seen,
    })
}

impl Login<'_> {
    /// SecurityNegotiation up to the transit to LoginOperationalNegotiation.
    async fn security(&mut self, req: &LoginRequest<'_>) -> Result<(), IscsiError> {
        let session_type = if req.target_iqn.is_some() {
            "Normal"
        } else {
            "Discovery"
        };
        let mut keys = vec![
            kv("InitiatorName", req.initiator_iqn),
            kv("SessionType", session_type),
        ];
        if let Some(t) = req.target_iqn {
            keys.push(kv("TargetName", t));
        }
        let Some(chap) = req.chap else {
            keys.push(kv("AuthMethod", "None"));
            let a = self.exchange(SECURITY, Some(OPERATIONAL), &keys).await?;
            if let Some(m) = value(&a.keys, "AuthMethod")
                && m != "None"
            {
                return Err(IscsiError::AuthenticationFailed(Some(format!(
                    "the target wants AuthMethod {m}, we offered None"
                ))));
            }
            return self.finish_security(a).await;
        };
        // Mutual CHAP must not fall back to no authentication at all.
        let offer = if chap.mutual.is_some() {
            "CHAP"
        } else {
            "CHAP,None"
        };
        keys.push(kv("AuthMethod", offer));
        let a = self.exchange(SECURITY, None, &keys).await?;
        match value(&a.keys, "AuthMethod") {
            Some("CHAP") => {}
            Some("None") if chap.mutual.is_none() => {
                // The target needs no authentication: move on.
                return self.finish_security(a).await;
            }
            other => {
                return Err(IscsiError::AuthenticationFailed(Some(format!(
                    "the target answered AuthMethod={} to our offer {offer}",
                    other.unwrap_or("<nothing>")
                ))));
            }
        }
        let a = self
            .exchange(SECURITY, None, &[kv("CHAP_A", chap::ALGORITHM_MD5)])
            .await?;
        if value(&a.keys, "CHAP_A") != Some(chap::ALGORITHM_MD5) {
            return Err(IscsiError::AuthenticationFailed(Some(
                "the target does not do CHAP with MD5".into(),
            )));
        }
        let id = chap::parse_identifier(required(&a.keys, "CHAP_I")?)?;
        let challenge = chap::parse_binary(required(&a.keys, "CHAP_C")?)?;
        let ours = chap::response(id, chap.password.as_bytes(), &challenge);
        let mut keys = vec![
            kv("CHAP_N", &chap.username),
            kv("CHAP_R", &chap::encode_hex(&ours)),
        ];
        let mutual = match &chap.mutual {
            None => None,
            Some((user, secret)) => {
                let [our_id, c @ ..] = chap::random_bytes::<17>()?;
                if c[..] == challenge[..] {
                    return Err(IscsiError::Protocol("challenge collision".into()));
                }
                keys.push(kv("CHAP_I", &our_id.to_string()));
                keys.push(kv("CHAP_C", &chap::encode_hex(&c)));
                Some((user, chap::response(our_id, secret.as_bytes(), &c)))
            }
        };
        let a = self.exchange(SECURITY, Some(OPERATIONAL), &keys).await?;
        if let Some((user, expected)) = mutual {
            let name = value(&a.keys, "CHAP_N");
            let resp = value(&a.keys, "CHAP_R")
                .map(chap::parse_binary)
                .transpose()?;
            if name != Some(user.as_str()) || resp.as_deref() != Some(&expected[..]) {
                return Err(IscsiError::AuthenticationFailed(Some(
                    "the target failed mutual CHAP".into(),
                )));
            }
        }
        self.finish_security(a).await
    }

    /// Repeats empty transit requests until the target leaves the security
    /// stage.
    async fn finish_security(&mut self, mut a: Answer) -> Result<(), IscsiError> {
        for _ in 0..MAX_ROUNDS {
            if a.transit {
                return match a.nsg {
                    OPERATIONAL => Ok(()),
                    n => Err(IscsiError::Protocol(format!(
                        "target moved from security to stage {n}, we asked for 1"
                    ))),
                };
            }
            a = self.exchange(SECURITY, Some(OPERATIONAL), &[]).await?;
        }
        Err(IscsiError::Protocol(
            "security negotiation does not end".into(),
        ))
    }

    /// LoginOperationalNegotiation up to FullFeaturePhase.
    async fn operational(&mut self, discovery: bool) -> Result<(), IscsiError> {
        let ours = operational_keys(discovery);
        let mut keys: Vec<(String, String)> = ours.iter().map(|(k, v)| kv(k, v)).collect();
        for _ in 0..MAX_ROUNDS {
            let a = self
                .exchange(OPERATIONAL, Some(FULL_FEATURE), &keys)
                .await?;
            for (k, v) in &a.keys {
                match k.as_str() {
                    "HeaderDigest" | "DataDigest" if v != "None" => {
                        return Err(IscsiError::Protocol(format!("target insists on {k}={v}")));
                    }
                    "MaxRecvDataSegmentLength" => {
                        let n: usize = v.parse().map_err(|_| {
                            IscsiError::Protocol(format!("bad MaxRecvDataSegmentLength {v:?}"))
                        })?;
                        self.conn.target_max_recv = n.clamp(512, 0x00ff_ffff);
                    }
                    _ => {}
                }
            }
            if a.transit {
                return match a.nsg {
                    FULL_FEATURE => Ok(()),
                    n => Err(IscsiError::Protocol(format!(
                        "target moved to stage {n}, we asked for full feature"
                    ))),
                };
            }
            // The target wants another round: answer what it proposed
            // that we did not offer (our value if we know the key).
            keys = a
                .keys
                .iter()
                .filter(|(k, _)| !is_declarative(k) && !ours.iter().any(|(o, _)| o == k))
                .map(|(k, _)| (k.clone(), "NotUnderstood".to_owned()))
                .collect();
        }
        Err(IscsiError::Protocol(
            "operational negotiation does not end".into(),
        ))
    }

    /// One Login Request (plus continuations) and its complete answer.
    /// `next` is `Some(nsg)` to ask for a stage transition.
    async fn exchange(
        &mut self,
        csg: u8,
        next: Option<u8>,
        keys: &[(String, String)],
    ) -> Result<Answer, IscsiError> {
        let flags = match next {
            Some(nsg) => TRANSIT | (csg << 2) | nsg,
            None => csg << 2,
        };
        self.send(flags, pdu::encode_text(keys)).await?;
        let mut text = Vec::new();
        for _ in 0..MAX_ROUNDS * 4 {
            let rsp = self.conn.recv().await?;
            if rsp.opcode() != op::LOGIN_RESPONSE {
                return Err(IscsiError::Protocol(format!(
                    "expected a Login Response, got opcode {:#04x}",
                    rsp.opcode()
                )));
            }
            if rsp.itt() != self.itt {
                return Err(IscsiError::Protocol(
                    "Login Response for another task".into(),
                ));
            }
            self.conn.saw_stat_sn(rsp.u32_at(24));
            let (class, detail) = (rsp.bhs[36], rsp.bhs[37]);
            if (class, detail) != (0, 0) {
                return Err(IscsiError::from_login_status(class, detail));
            }
            if rsp.bhs[3] != 0 {
                return Err(IscsiError::Protocol(format!(
                    "target speaks iSCSI version {}, we speak 0",
                    rsp.bhs[3]
                )));
            }
            if text.len() + rsp.data.len() > MAX_TEXT {
                return Err(IscsiError::Protocol("login text too long".into()));
            }
            text.extend_from_slice(&rsp.data);
            let f = rsp.flags();
            if f & CONTINUE != 0 {
                // More text follows: ask for it without transiting.
                self.send(csg << 2, Vec::new()).await?;
                continue;
            }
            self.tsih = rsp.u16_at(14);
            let keys = pdu::decode_text(&text)?;
            for (k, v) in &keys {
                if !k.starts_with("CHAP_") {
                    self.seen.push((k.clone(), v.clone()));
                }
            }
            return Ok(Answer {
                transit: f & TRANSIT != 0,
                nsg: f & 0x03,
                keys,
            });
        }
        Err(IscsiError::Protocol(
            "login response continues forever".into(),
        ))
    }

    async fn send(&mut self, flags: u8, data: Vec<u8>) -> Result<(), IscsiError> {
        let mut p = Pdu::new(op::LOGIN_REQUEST | IMMEDIATE, flags);
        p.set_bytes(8, &self.isid);
        p.set_u16(14, self.tsih);
        p.set_itt(self.itt);
        p.set_u16(20, 0); // CID
        p.set_u32(24, self.conn.cmd_sn);
        p.set_u32(28, self.conn.exp_stat_sn);
        p.data = data;
        self.conn.send(&p).await
    }
}

/// The keys we offer in LoginOperationalNegotiation. A discovery session
/// only carries the connection-level ones.
fn operational_keys(discovery: bool) -> Vec<(&'static str, &'static str)> {
    let mut keys = vec![
        ("HeaderDigest", "None"),
        ("DataDigest", "None"),
        ("MaxRecvDataSegmentLength", MAX_RECV_TEXT),
        ("DefaultTime2Wait", "0"),
        ("DefaultTime2Retain", "0"),
    ];
    if !discovery {
        keys.extend([
            ("MaxConnections", "1"),
            ("InitialR2T", "Yes"),
            ("ImmediateData", "No"),
            ("MaxBurstLength", "262144"),
            ("FirstBurstLength", "65536"),
            ("MaxOutstandingR2T", "1"),
            ("DataPDUInOrder", "Yes"),
            ("DataSequenceInOrder", "Yes"),
            ("ErrorRecoveryLevel", "0"),
        ]);
    }
    keys
}

/// [`super::conn::OUR_MAX_RECV`] as text.
const MAX_RECV_TEXT: &str = "262144";
const _: () = assert!(super::conn::OUR_MAX_RECV == 262_144);

/// Keys a target declares without expecting an answer.
fn is_declarative(k: &str) -> bool {
    matches!(
        k,
        "TargetAlias"
            | "TargetAddress"
            | "TargetPortalGroupTag"
            | "MaxRecvDataSegmentLength"
            | "InitiatorAlias"
            | "TargetName"
    )
}

fn kv(k: &str, v: &str) -> (String, String) {
    (k.to_owned(), v.to_owned())
}

fn value<'a>(keys: &'a [(String, String)], key: &str) -> Option<&'a str> {
    keys.iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

fn required<'a>(keys: &'a [(String, String)], key: &str) -> Result<&'a str, IscsiError> {
    value(keys, key).ok_or_else(|| IscsiError::Protocol(format!("target did not send {key}")))
}
