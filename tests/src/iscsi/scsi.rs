//! The SCSI side (SPC-4, SBC-3): the CDBs this initiator sends, the parsing
//! of what comes back (standard INQUIRY, VPD pages, READ CAPACITY(16),
//! REPORT LUNS, sense data), and the LUN address encoding. Pure functions:
//! every parser takes untrusted bytes and fails with
//! [`IscsiError::Protocol`] instead of panicking.

use super::IscsiError;

/// A 16-byte CDB field (shorter CDBs are zero padded, as in the iSCSI BHS).
pub(crate) type Cdb = [u8; 16];

/// Peripheral device type of a disk (direct access block device).
pub const TYPE_DISK: u8 = 0x00;
/// Peripheral device type of a storage array controller (tgt's LUN 0).
pub const TYPE_CONTROLLER: u8 = 0x0c;

/// The standard INQUIRY data of a logical unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StdInquiry {
    /// T10 VENDOR IDENTIFICATION, trailing spaces removed.
    pub vendor: String,
    /// PRODUCT IDENTIFICATION, trailing spaces removed.
    pub model: String,
    /// PRODUCT REVISION LEVEL, trailing spaces removed.
    pub revision: String,
    /// PERIPHERAL DEVICE TYPE (0x00 disk, 0x0c controller, ...).
    pub device_type: u8,
    /// PERIPHERAL QUALIFIER (0 = connected, 1 = not connected, 3 = no LU).
    pub qualifier: u8,
    /// The raw bytes as returned: Linux's sysfs `vendor`, `model` and `rev`
    /// hold the space-padded fields (`%.8s`, `%.16s`, `%.4s`) of these.
    pub raw: Vec<u8>,
}

impl StdInquiry {
    /// Whether this is a connected disk (what the lab exposes as a block
    /// device; tgt's LUN 0 controller is not).
    pub fn is_disk(&self) -> bool {
        self.qualifier == 0 && self.device_type == TYPE_DISK
    }
}

/// One designation descriptor of VPD page 0x83.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Designator {
    /// PROTOCOL IDENTIFIER (valid when `piv`).
    pub protocol_id: u8,
    /// CODE SET: 1 binary, 2 ASCII, 3 UTF-8.
    pub code_set: u8,
    /// PIV bit.
    pub piv: bool,
    /// ASSOCIATION: 0 logical unit, 1 target port, 2 target device.
    pub association: u8,
    /// DESIGNATOR TYPE: 1 T10 vendor ID, 2 EUI-64, 3 NAA, 4 relative
    /// target port, 5 target port group, 8 SCSI name string, ...
    pub designator_type: u8,
    /// The designator bytes.
    pub value: Vec<u8>,
}

/// INQUIRY (6), standard data or one VPD page.
pub(crate) fn inquiry_cdb(vpd_page: Option<u8>, alloc: u16) -> Cdb {
    let mut c = [0u8; 16];
    c[0] = 0x12;
    if let Some(page) = vpd_page {
        c[1] = 0x01; // EVPD
        c[2] = page;
    }
    c[3..5].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// READ CAPACITY (16): SERVICE ACTION IN (16), service action 0x10.
pub(crate) fn read_capacity16_cdb(alloc: u32) -> Cdb {
    let mut c = [0u8; 16];
    c[0] = 0x9e;
    c[1] = 0x10;
    c[10..14].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// REPORT LUNS, SELECT REPORT 0 (all LUNs but well-known ones).
pub(crate) fn report_luns_cdb(alloc: u32) -> Cdb {
    let mut c = [0u8; 16];
    c[0] = 0xa0;
    c[6..10].copy_from_slice(&alloc.to_be_bytes());
    c
}

fn short(what: &str, need: usize, got: usize) -> IscsiError {
    IscsiError::Protocol(format!("{what}: {got} bytes, need at least {need}"))
}

fn ascii_field(b: &[u8]) -> String {
    String::from_utf8_lossy(b)
        .trim_end_matches([' ', '\0'])
        .to_owned()
}

/// Parses standard INQUIRY data (at least the 36 bytes every device sends).
pub(crate) fn parse_std_inquiry(b: &[u8]) -> Result<StdInquiry, IscsiError> {
    if b.len() < 36 {
        return Err(short("standard INQUIRY data", 36, b.len()));
    }
    Ok(StdInquiry {
        vendor: ascii_field(&b[8..16]),
        model: ascii_field(&b[16..32]),
        revision: ascii_field(&b[32..36]),
        device_type: b[0] & 0x1f,
        qualifier: b[0] >> 5,
        raw: b.to_vec(),
    })
}

/// The full length (header included) a VPD page says it has.
pub(crate) fn vpd_page_len(b: &[u8]) -> Result<usize, IscsiError> {
    if b.len() < 4 {
        return Err(short("VPD page header", 4, b.len()));
    }
    Ok(4 + usize::from(u16::from_be_bytes([b[2], b[3]])))
}

/// The unit serial number of VPD page 0x80, trailing spaces removed.
pub fn parse_unit_serial(page: &[u8]) -> Result<String, IscsiError> {
    let len = vpd_page_len(page)?;
    if page[1] != 0x80 {
        return Err(IscsiError::Protocol(format!(
            "page {:#04x} is not 0x80",
            page[1]
        )));
    }
    let body = page
        .get(4..len)
        .ok_or_else(|| short("VPD page 0x80", len, page.len()))?;
    Ok(ascii_field(body).trim_start().to_owned())
}

/// The designation descriptors of VPD page 0x83.
pub fn parse_designators(page: &[u8]) -> Result<Vec<Designator>, IscsiError> {
    let len = vpd_page_len(page)?;
    if page[1] != 0x83 {
        return Err(IscsiError::Protocol(format!(
            "page {:#04x} is not 0x83",
            page[1]
        )));
    }
    let mut body = page
        .get(4..len)
        .ok_or_else(|| short("VPD page 0x83", len, page.len()))?;
    let mut out = Vec::new();
    while !body.is_empty() {
        if body.len() < 4 {
            return Err(short("designation descriptor header", 4, body.len()));
        }
        let dlen = usize::from(body[3]);
        let value = body
            .get(4..4 + dlen)
            .ok_or_else(|| short("designation descriptor", 4 + dlen, body.len()))?;
        out.push(Designator {
            protocol_id: body[0] >> 4,
            code_set: body[0] & 0x0f,
            piv: body[1] & 0x80 != 0,
            association: (body[1] >> 4) & 0x03,
            designator_type: body[1] & 0x0f,
            value: value.to_vec(),
        });
        body = &body[4 + dlen..];
    }
    Ok(out)
}

/// READ CAPACITY (16) data: (capacity in bytes, logical block length).
pub(crate) fn parse_read_capacity16(b: &[u8]) -> Result<(u64, u32), IscsiError> {
    if b.len() < 12 {
        return Err(short("READ CAPACITY (16) data", 12, b.len()));
    }
    let mut lba = [0u8; 8];
    lba.copy_from_slice(&b[0..8]);
    let last_lba = u64::from_be_bytes(lba);
    let block = u32::from_be_bytes([b[8], b[9], b[10], b[11]]);
    let bytes = last_lba
        .checked_add(1)
        .and_then(|n| n.checked_mul(u64::from(block)))
        .ok_or_else(|| {
            IscsiError::Protocol(format!(
                "capacity overflows: last LBA {last_lba}, block length {block}"
            ))
        })?;
    Ok((bytes, block))
}

/// REPORT LUNS data: the LUNs in it, and the allocation length the full
/// list needs (to ask again when ours was too small).
pub(crate) fn parse_report_luns(b: &[u8]) -> Result<(Vec<u64>, usize), IscsiError> {
    if b.len() < 8 {
        return Err(short("REPORT LUNS data", 8, b.len()));
    }
    let list_len = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let luns = b[8..]
        .chunks_exact(8)
        .take(list_len / 8)
        .map(|c| {
            let mut l = [0u8; 8];
            l.copy_from_slice(c);
            lun_from_wire(l)
        })
        .collect();
    Ok((luns, list_len.saturating_add(8)))
}

/// A LUN number as Linux prints it (H:C:T:**L**, `scsilun_to_int`) from
/// the 8-byte SAM LUN structure: each 2-byte level shifted in, so a
/// peripheral-addressed LUN 5 is 5, a flat-addressed LUN 300 is 0x412c.
pub fn lun_from_wire(l: [u8; 8]) -> u64 {
    (0..4).fold(0u64, |acc, i| {
        let level = u64::from(u16::from_be_bytes([l[2 * i], l[2 * i + 1]]));
        acc | level << (16 * i)
    })
}

/// The inverse of [`lun_from_wire`] (Linux `int_to_scsilun`). Numbers below
/// 256 are peripheral-device addressed, the form tgt uses.
pub fn lun_to_wire(lun: u64) -> [u8; 8] {
    let mut l = [0u8; 8];
    for i in 0..4 {
        let level = (lun >> (16 * i)) & 0xffff;
        l[2 * i..2 * i + 2].copy_from_slice(&(level as u16).to_be_bytes());
    }
    l
}

/// (sense key, ASC, ASCQ) from fixed (0x70/0x71) or descriptor (0x72/0x73)
/// sense data; `None` if it is neither or too short.
pub(crate) fn parse_sense(s: &[u8]) -> Option<(u8, u8, u8)> {
    match s.first()? & 0x7f {
        0x70 | 0x71 if s.len() >= 14 => Some((s[2] & 0x0f, s[12], s[13])),
        0x70 | 0x71 if s.len() >= 3 => Some((s[2] & 0x0f, 0, 0)),
        0x72 | 0x73 if s.len() >= 4 => Some((s[1] & 0x0f, s[2], s[3])),
        _ => None,
    }
}

/// Lowercase hex of `b`, for logs and test output.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lun_encoding_round_trips() {
        for lun in [0u64, 1, 255, 0x412c, 0x0001_0002] {
            assert_eq!(lun_from_wire(lun_to_wire(lun)), lun);
        }
        assert_eq!(lun_to_wire(5), [0, 5, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn report_luns() {
        let mut b = vec![0, 0, 0, 16, 0, 0, 0, 0];
        b.extend_from_slice(&[0; 8]);
        b.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
        let (luns, need) = parse_report_luns(&b).unwrap_or_default();
        assert_eq!(luns, vec![0, 1]);
        assert_eq!(need, 24);
        // A list longer than what was returned: what fits, and the need.
        let (luns, need) = parse_report_luns(&b[..16]).unwrap_or_default();
        assert_eq!((luns, need), (vec![0], 24));
        assert!(parse_report_luns(&b[..4]).is_err());
    }

    #[test]
    fn capacity() {
        let mut b = [0u8; 32];
        b[7] = 0xff; // last LBA 255
        b[10] = 0x02; // 512-byte blocks
        assert_eq!(parse_read_capacity16(&b).ok(), Some((256 * 512, 512)));
        let mut o = [0xffu8; 32];
        o[8..12].copy_from_slice(&512u32.to_be_bytes());
        assert!(parse_read_capacity16(&o).is_err());
        assert!(parse_read_capacity16(&b[..8]).is_err());
    }

    #[test]
    fn designators_and_bad_pages() {
        let page = [
            0x00, 0x83, 0x00, 0x0c, // header, 12 bytes of descriptors
            0x01, 0x03, 0x00, 0x08, 0x60, 1, 2, 3, 4, 5, 6, 7, // NAA
        ];
        let d = parse_designators(&page).unwrap_or_default();
        assert_eq!(d.len(), 1);
        assert_eq!(
            (d[0].code_set, d[0].designator_type, d[0].association),
            (1, 3, 0)
        );
        assert_eq!(d[0].value, [0x60, 1, 2, 3, 4, 5, 6, 7]);
        // Descriptor running past the page; page running past the buffer.
        let mut bad = page;
        bad[7] = 0x20;
        assert!(parse_designators(&bad).is_err());
        assert!(parse_designators(&page[..10]).is_err());
        assert!(parse_designators(&[0, 0x80, 0, 0]).is_err());
    }

    #[test]
    fn serial_and_inquiry() {
        let p = [0, 0x80, 0, 6, b'S', b'N', b'-', b'A', b' ', b' '];
        assert_eq!(parse_unit_serial(&p).ok().as_deref(), Some("SN-A"));
        let mut inq = vec![0u8; 36];
        inq[8..16].copy_from_slice(b"ACME    ");
        inq[16..32].copy_from_slice(b"LUNA            ");
        inq[32..36].copy_from_slice(b"0001");
        let s = parse_std_inquiry(&inq);
        assert!(s.as_ref().is_ok_and(|s| s.vendor == "ACME" && s.is_disk()));
        assert!(parse_std_inquiry(&inq[..20]).is_err());
    }

    #[test]
    fn sense_formats() {
        let mut fixed = [0u8; 18];
        fixed[0] = 0x70;
        fixed[2] = 0x05;
        fixed[12] = 0x25;
        assert_eq!(parse_sense(&fixed), Some((5, 0x25, 0)));
        assert_eq!(
            parse_sense(&[0x72, 0x06, 0x3f, 0x0e]),
            Some((6, 0x3f, 0x0e))
        );
        assert_eq!(parse_sense(&[0x72]), None);
        assert_eq!(parse_sense(&[]), None);
    }
}
