//! SCSI Vital Product Data pages as the kernel caches them in sysfs
//! (`device/vpd_pg83`, `device/vpd_pg80`): the Device Identification page
//! (0x83), whose logical-unit designator is a LUN's only stable identity, and
//! the Unit Serial Number page (0x80).
//!
//! Pure parsing of untrusted bytes: every read is bounded, nothing panics, a
//! page longer than the bytes present is parsed as far as it goes, and an
//! identifier with control characters is refused rather than passed on.

use csi_scsi_contract::{InvalidWwid, Wwid, WwidKind};

/// Code set of a designator (descriptor byte 0, low nibble).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodeSet {
    /// 1: binary.
    Binary,
    /// 2: ASCII printable characters.
    Ascii,
    /// 3: UTF-8.
    Utf8,
    /// Any other value (reserved by SPC).
    Reserved(u8),
}

/// What a designator names (descriptor byte 1, bits 5-4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Association {
    /// 0: the addressed logical unit: the only association that identifies a LUN.
    LogicalUnit,
    /// 1: the target port the page was read through.
    TargetPort,
    /// 2: the target device that contains the logical unit.
    TargetDevice,
    /// 3: reserved.
    Reserved,
}

/// Designator type (descriptor byte 1, low nibble).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DesignatorType {
    /// 0: vendor specific (labels such as `vol=...`, never an identity).
    VendorSpecific,
    /// 1: T10 vendor ID (8-byte vendor + vendor-specific text).
    T10VendorId,
    /// 2: EUI-64 based (8, 12 or 16 bytes).
    Eui64,
    /// 3: NAA (8 or 16 bytes).
    Naa,
    /// 4: relative target port.
    RelativeTargetPort,
    /// 5: target port group.
    TargetPortGroup,
    /// 6: logical unit group.
    LogicalUnitGroup,
    /// 7: MD5 logical unit identifier.
    Md5LogicalUnit,
    /// 8: SCSI name string (UTF-8, NUL padded).
    ScsiNameString,
    /// 9: protocol specific port identifier.
    ProtocolSpecific,
    /// 0xa: UUID.
    Uuid,
    /// Any other value (reserved by SPC).
    Reserved(u8),
}

/// One designation descriptor of page 0x83.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Designator {
    /// Protocol identifier (byte 0, high nibble), when PIV is set.
    pub protocol_id: Option<u8>,
    /// How the identifier bytes are encoded.
    pub code_set: CodeSet,
    /// What the designator names.
    pub association: Association,
    /// Its type.
    pub designator_type: DesignatorType,
    /// The identifier bytes (NUL padding of text types included).
    pub identifier: Vec<u8>,
}

/// How page 0x83 was laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageLayout {
    /// Designation descriptors, as SPC-3 and later define them.
    Descriptors,
    /// The old EMC Symmetrix page: a 16-byte NAA 6 identifier directly after
    /// the page header, without a descriptor header (sg_inq special-cases it
    /// the same way).
    LegacyEmcNaa,
}

/// A parsed Device Identification page (0x83).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceIdentification {
    /// Byte 0: peripheral qualifier and device type (0 = disk, 0x0c = array controller).
    pub peripheral: u8,
    /// The designators in page order.
    pub designators: Vec<Designator>,
    /// Standard or legacy layout.
    pub layout: PageLayout,
    /// The page length promised more bytes than were present, or a descriptor
    /// ran past the end: what was read is kept, the rest is lost.
    pub truncated: bool,
}

/// Why a VPD page could not be parsed at all.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VpdError {
    /// Fewer bytes than the 4-byte page header.
    #[error("VPD page is {len} bytes, shorter than its 4-byte header")]
    TooShort {
        /// Bytes present.
        len: usize,
    },
    /// The page code (byte 1) is not the page asked for.
    #[error("expected VPD page {expected:#04x}, found page {found:#04x}")]
    WrongPage {
        /// The page code wanted.
        expected: u8,
        /// The page code present.
        found: u8,
    },
    /// The unit serial number has control characters or non-ASCII bytes.
    #[error("unit serial number has bytes outside printable ASCII")]
    UnprintableSerial,
}

/// Parses a Device Identification page (0x83) into its designators.
/// Malformed descriptors end the walk with a warning (a descriptor that runs
/// past the page cannot be stepped over); only a missing header is an error.
pub fn parse_device_identification(page: &[u8]) -> Result<DeviceIdentification, VpdError> {
    let body = page_body(page, 0x83)?;
    let mut out = DeviceIdentification {
        peripheral: page.first().copied().unwrap_or(0),
        designators: Vec::new(),
        layout: PageLayout::Descriptors,
        truncated: body.truncated,
    };
    if let Some(naa) = legacy_emc_naa(body.bytes) {
        out.layout = PageLayout::LegacyEmcNaa;
        out.designators.push(Designator {
            protocol_id: None,
            code_set: CodeSet::Binary,
            association: Association::LogicalUnit,
            designator_type: DesignatorType::Naa,
            identifier: naa.to_vec(),
        });
        return Ok(out);
    }
    let mut rest = body.bytes;
    while !rest.is_empty() {
        let Some((header, after)) = rest.split_first_chunk::<4>() else {
            // Fewer than 4 bytes left: padding when zero (the kernel and some
            // arrays round the page up), garbage otherwise.
            if rest.iter().any(|&b| b != 0) {
                tracing::warn!(trailing = ?rest, "VPD page 0x83 ends in a partial descriptor header; ignored");
            }
            break;
        };
        let len = usize::from(header[3]);
        let Some(identifier) = after.get(..len) else {
            tracing::warn!(
                declared = len,
                present = after.len(),
                "VPD page 0x83 descriptor runs past the end of the page; the rest of the page is ignored"
            );
            out.truncated = true;
            break;
        };
        let piv = header[1] & 0x80 != 0;
        out.designators.push(Designator {
            protocol_id: piv.then_some(header[0] >> 4),
            code_set: CodeSet::from_nibble(header[0] & 0x0f),
            association: Association::from_bits((header[1] >> 4) & 0x03),
            designator_type: DesignatorType::from_nibble(header[1] & 0x0f),
            identifier: identifier.to_vec(),
        });
        rest = &after[len..];
    }
    if out.truncated {
        tracing::warn!(
            declared = body.declared,
            present = body.bytes.len(),
            "VPD page 0x83 is truncated; using the designators that were complete"
        );
    }
    Ok(out)
}

/// The LUN's WWID from a raw page 0x83: [`DeviceIdentification::lun_wwid`]
/// of [`parse_device_identification`]. `Ok(None)` when the page carries no
/// usable logical-unit designator.
pub fn lun_wwid(page: &[u8]) -> Result<Option<Wwid>, VpdError> {
    Ok(parse_device_identification(page)?.lun_wwid())
}

/// Parses a Unit Serial Number page (0x80): the serial with NULs and blanks
/// trimmed at both ends. `Ok(None)` when it is empty.
pub fn parse_unit_serial(page: &[u8]) -> Result<Option<String>, VpdError> {
    let body = page_body(page, 0x80)?;
    let trimmed = trim_nul_blank(body.bytes);
    if trimmed.is_empty() {
        return Ok(None);
    }
    if !trimmed.iter().all(|b| (0x20..=0x7e).contains(b)) {
        return Err(VpdError::UnprintableSerial);
    }
    // All bytes are printable ASCII, so this is valid UTF-8.
    Ok(Some(String::from_utf8_lossy(trimmed).into_owned()))
}

/// A page's bytes after its header, bounded by both the declared page length
/// and the bytes present.
struct PageBody<'a> {
    bytes: &'a [u8],
    declared: usize,
    truncated: bool,
}

// === impl DeviceIdentification ===

impl DeviceIdentification {
    /// The LUN's identity: the best logical-unit (association 0) designator
    /// that makes a valid [`Wwid`]. Order: NAA (NAA 6 registered extended,
    /// then NAA 5 registered, then other NAA), EUI-64 (16, 12, then 8 bytes),
    /// T10 vendor ID, SCSI name string; the first in page order wins a tie.
    ///
    /// This is udev's `scsi_id` order (which names `/dev/disk/by-id/scsi-*`
    /// and the multipath map), not the kernel's `scsi_vpd_lun_id`, which
    /// ranks a SCSI name string first: arrays put labels there (InfiniBox's
    /// `host=...`, `vol=...` at association 0), which are not identities.
    /// A designator that does not make a valid WWID (control characters,
    /// bad length) is refused with a warning and the next one is tried.
    pub fn lun_wwid(&self) -> Option<Wwid> {
        let mut ranked: Vec<(u8, &Designator)> = self
            .designators
            .iter()
            .filter(|d| d.association == Association::LogicalUnit)
            .filter_map(|d| d.identity_rank().map(|r| (r, d)))
            .collect();
        // Stable: equal ranks keep page order.
        ranked.sort_by_key(|(rank, _)| std::cmp::Reverse(*rank));
        for (_, d) in ranked {
            match d.to_wwid() {
                Ok(w) => return Some(w),
                Err(e) => {
                    tracing::warn!(designator = ?d.designator_type, error = %e, "refusing a VPD 0x83 designator")
                }
            }
        }
        None
    }
}

// === impl Designator ===

impl Designator {
    /// How good an identity this designator is (higher is better); `None`
    /// for types that never identify a LUN.
    fn identity_rank(&self) -> Option<u8> {
        match self.designator_type {
            DesignatorType::Naa => Some(match self.identifier.first().map(|b| b >> 4) {
                Some(6) => 40,
                Some(5) => 35,
                _ => 30,
            }),
            DesignatorType::Eui64 => Some(match self.identifier.len() {
                16 => 23,
                12 => 22,
                _ => 21,
            }),
            DesignatorType::T10VendorId => Some(10),
            DesignatorType::ScsiNameString => Some(5),
            _ => None,
        }
    }

    /// This designator as a [`Wwid`], if it is an identity type and valid.
    pub fn to_wwid(&self) -> Result<Wwid, InvalidWwid> {
        let kind = match self.designator_type {
            DesignatorType::Naa => WwidKind::Naa,
            DesignatorType::Eui64 => WwidKind::Eui,
            DesignatorType::T10VendorId => WwidKind::T10,
            DesignatorType::ScsiNameString => WwidKind::Name,
            _ => {
                return Err(InvalidWwid {
                    input: format!("{:02x?}", self.identifier),
                    reason: "designator type is not a logical-unit identity",
                });
            }
        };
        let binary_id = matches!(kind, WwidKind::Naa | WwidKind::Eui);
        if binary_id && matches!(self.code_set, CodeSet::Ascii | CodeSet::Utf8) {
            // Some old arrays give NAA/EUI as hex text (scsi_id accepts it).
            let text = String::from_utf8_lossy(&self.identifier);
            let prefix = if kind == WwidKind::Naa {
                "naa."
            } else {
                "eui."
            };
            return Wwid::parse(&format!("{prefix}{}", text.trim_end_matches('\0')));
        }
        Wwid::from_designator(kind, &self.identifier)
    }
}

// === impl CodeSet, Association, DesignatorType ===

impl CodeSet {
    fn from_nibble(n: u8) -> Self {
        match n {
            1 => Self::Binary,
            2 => Self::Ascii,
            3 => Self::Utf8,
            other => Self::Reserved(other),
        }
    }
}

impl Association {
    fn from_bits(n: u8) -> Self {
        match n {
            0 => Self::LogicalUnit,
            1 => Self::TargetPort,
            2 => Self::TargetDevice,
            _ => Self::Reserved,
        }
    }
}

impl DesignatorType {
    fn from_nibble(n: u8) -> Self {
        match n {
            0 => Self::VendorSpecific,
            1 => Self::T10VendorId,
            2 => Self::Eui64,
            3 => Self::Naa,
            4 => Self::RelativeTargetPort,
            5 => Self::TargetPortGroup,
            6 => Self::LogicalUnitGroup,
            7 => Self::Md5LogicalUnit,
            8 => Self::ScsiNameString,
            9 => Self::ProtocolSpecific,
            0xa => Self::Uuid,
            other => Self::Reserved(other),
        }
    }
}

/// The page's body after checking the header's page code.
fn page_body(page: &[u8], code: u8) -> Result<PageBody<'_>, VpdError> {
    let Some((header, rest)) = page.split_first_chunk::<4>() else {
        return Err(VpdError::TooShort { len: page.len() });
    };
    if header[1] != code {
        return Err(VpdError::WrongPage {
            expected: code,
            found: header[1],
        });
    }
    let declared = usize::from(u16::from_be_bytes([header[2], header[3]]));
    let truncated = declared > rest.len();
    let bytes = rest.get(..declared).unwrap_or(rest);
    Ok(PageBody {
        bytes,
        declared,
        truncated,
    })
}

/// The 16-byte NAA of an old EMC Symmetrix page, if `body` is one. A real
/// descriptor header has a reserved (zero) byte 2; EMC's NAA 6 with OUI
/// 0x006048 puts 0x04 there, and its page holds exactly those 16 bytes.
fn legacy_emc_naa(body: &[u8]) -> Option<&[u8; 16]> {
    let naa: &[u8; 16] = body.try_into().ok()?;
    (naa[0] >> 4 == 6 && naa[2] != 0).then_some(naa)
}

/// `bytes` without NULs and ASCII blanks at either end.
fn trim_nul_blank(bytes: &[u8]) -> &[u8] {
    let keep = |b: &u8| *b != 0 && !b.is_ascii_whitespace();
    let start = bytes.iter().position(keep).unwrap_or(bytes.len());
    let end = bytes.iter().rposition(keep).map_or(start, |i| i + 1);
    bytes.get(start..end).unwrap_or(&[])
}

#[cfg(test)]
mod tests;
