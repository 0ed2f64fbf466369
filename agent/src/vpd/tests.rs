use std::path::{Path, PathBuf};

use super::*;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

fn page(name: &str) -> Vec<u8> {
    let path = fixture(&format!("sysfs/vpd/{name}"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The logical-unit NAA that sg_inq / sg_vpd printed for the same page.
fn decoded_lun_naa(decode: &str) -> String {
    let text = std::fs::read_to_string(fixture(&format!("tools/sg_inq/{decode}")))
        .expect("decode fixture");
    // sg_inq: "[0x6000402001f45eb566d41cd100000000]" after the first descriptor.
    if let Some(start) = text.find("[0x") {
        let rest = &text[start + 3..];
        return rest[..rest.find(']').expect("closing bracket")].to_owned();
    }
    // sg_vpd: "Addressed logical unit:" then the designator line, then "0x...".
    let lu = &text[text.find("Addressed logical unit:").expect("LU section")..];
    let line = lu
        .lines()
        .find(|l| l.trim().starts_with("0x"))
        .expect("hex line");
    line.trim().trim_start_matches("0x").to_owned()
}

#[test]
fn nexsan_pages_match_the_sg_inq_decodes() {
    for (file, decode, rtp) in [
        (
            "nexsan-satabeast-lun-a.vpd_pg83",
            "sg_inq-p0x83-nexsan-lun-a.txt",
            1u8,
        ),
        (
            "nexsan-satabeast-lun-b.vpd_pg83",
            "sg_inq-p0x83-nexsan-lun-b.txt",
            2u8,
        ),
    ] {
        let id = parse_device_identification(&page(file)).expect(file);
        assert_eq!(id.layout, PageLayout::Descriptors);
        assert!(!id.truncated);
        assert_eq!(id.peripheral, 0);
        assert_eq!(id.designators.len(), 3, "{file}");
        let naa = &id.designators[0];
        assert_eq!(naa.designator_type, DesignatorType::Naa);
        assert_eq!(naa.association, Association::LogicalUnit);
        assert_eq!(naa.code_set, CodeSet::Binary);
        assert_eq!(hex(&naa.identifier), decoded_lun_naa(decode));
        // "Relative target port: 0x1" / "Target port group: 0x1", target port association.
        assert_eq!(
            id.designators[1].designator_type,
            DesignatorType::RelativeTargetPort
        );
        assert_eq!(id.designators[1].association, Association::TargetPort);
        assert_eq!(id.designators[1].identifier, vec![0, 0, 0, rtp]);
        assert_eq!(
            id.designators[2].designator_type,
            DesignatorType::TargetPortGroup
        );
        assert_eq!(id.designators[2].identifier, vec![0, 0, 0, rtp]);
        let wwid = id.lun_wwid().expect("wwid");
        assert_eq!(wwid.as_str(), format!("naa.{}", decoded_lun_naa(decode)));
    }
}

#[test]
fn infinibox_picks_the_naa5_not_the_scsi_name_labels() {
    let id = parse_device_identification(&page("infinibox-lun.vpd_pg83")).expect("parse");
    let kinds: Vec<_> = id
        .designators
        .iter()
        .map(|d| (d.designator_type, d.association))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (DesignatorType::Naa, Association::LogicalUnit),
            (DesignatorType::VendorSpecific, Association::LogicalUnit),
            (DesignatorType::RelativeTargetPort, Association::TargetPort),
            (DesignatorType::TargetPortGroup, Association::TargetPort),
            (DesignatorType::ScsiNameString, Association::LogicalUnit),
            (DesignatorType::ScsiNameString, Association::LogicalUnit),
        ]
    );
    // Values as sg_inq printed them.
    // Descriptor length 23 = 4 + "ip=251.252.253.254" + a NUL.
    assert_eq!(id.designators[1].identifier, b"ip=251.252.253.254\0");
    assert_eq!(id.designators[2].identifier, vec![0, 0, 0x20, 0x03]);
    assert_eq!(id.designators[4].code_set, CodeSet::Utf8);
    assert_eq!(
        id.designators[4].identifier,
        b"host=just_for_test_host_name\0"
    );
    assert_eq!(id.designators[5].identifier, b"vol=VGX15S \0");
    assert_eq!(
        id.lun_wwid().map(|w| w.to_string()),
        Some(format!(
            "naa.{}",
            decoded_lun_naa("sg_inq-p0x83-infinibox.txt")
        ))
    );
    assert_eq!(
        id.lun_wwid().expect("wwid").as_str(),
        "naa.5742b0f010300000"
    );
    // The labels are not identities even on their own.
    assert!(id.designators[4].to_wwid().is_err());
    assert!(id.designators[5].to_wwid().is_err());
}

#[test]
fn hex_fixtures_hold_the_same_bytes_as_the_raw_pages() {
    for name in [
        "emc-symmetrix-old-malformed.vpd_pg83",
        "seagate-sas-disk.vpd_pg83",
        "synthetic-all-designator-types.vpd_pg83",
        "synthetic-all-designator-types-with-LF.vpd_pg83",
        "synthetic-scsi-name-injection.vpd_pg83",
    ] {
        let text = std::fs::read_to_string(fixture(&format!("sysfs/vpd/{name}.hex"))).expect("hex");
        let bytes: Vec<u8> = text
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .flat_map(str::split_whitespace)
            .map(|h| u8::from_str_radix(h, 16).expect("hex byte"))
            .collect();
        assert_eq!(bytes, page(name), "{name}");
    }
}

#[test]
fn seagate_sas_disk_ignores_target_port_and_device_designators() {
    let id = parse_device_identification(&page("seagate-sas-disk.vpd_pg83")).expect("parse");
    assert_eq!(id.designators.len(), 5);
    let port = &id.designators[1];
    assert_eq!(
        (port.designator_type, port.association),
        (DesignatorType::Naa, Association::TargetPort)
    );
    // PIV set, protocol 6 = SAS ("transport: Serial Attached SCSI Protocol").
    assert_eq!(port.protocol_id, Some(6));
    assert_eq!(hex(&port.identifier), "5000c5003011cb29");
    let device = &id.designators[3];
    assert_eq!(device.association, Association::TargetDevice);
    assert_eq!(hex(&device.identifier), "5000c5003011cb28");
    let name = &id.designators[4];
    assert_eq!(name.designator_type, DesignatorType::ScsiNameString);
    assert_eq!(
        name.identifier.strip_suffix(b"\0\0\0\0"),
        Some(&b"naa.5000C5003011CB28"[..])
    );
    let wwid = id.lun_wwid().expect("wwid");
    assert_eq!(
        wwid.as_str(),
        format!("naa.{}", decoded_lun_naa("sg_vpd-di-seagate-sas-disk.txt"))
    );
    assert_eq!(wwid.as_str(), "naa.5000c5003011cb2b");
}

#[test]
fn old_emc_symmetrix_page_without_descriptor_header_is_special_cased() {
    let id =
        parse_device_identification(&page("emc-symmetrix-old-malformed.vpd_pg83")).expect("parse");
    assert_eq!(id.layout, PageLayout::LegacyEmcNaa);
    assert_eq!(
        id.lun_wwid().map(|w| w.to_string()).as_deref(),
        Some("naa.6006048000123456789abcdef0123456")
    );
    // The corrected later model quoted in the .hex file parses the standard way.
    let dmx = [
        0x00, 0x83, 0x00, 0x14, 0x01, 0x03, 0x00, 0x10, 0x60, 0x06, 0x04, 0x80, 0x00, 0x01, 0x90,
        0x10, 0x31, 0x89, 0x53, 0x30, 0x30, 0x34, 0x38, 0x34,
    ];
    let id = parse_device_identification(&dmx).expect("dmx");
    assert_eq!(id.layout, PageLayout::Descriptors);
    assert_eq!(
        id.lun_wwid().map(|w| w.to_string()).as_deref(),
        Some("naa.60060480000190103189533030343834")
    );
}

#[test]
fn synthetic_page_with_every_designator_type_prefers_naa6() {
    let id = parse_device_identification(&page("synthetic-all-designator-types.vpd_pg83"))
        .expect("parse");
    let types: Vec<_> = id.designators.iter().map(|d| d.designator_type).collect();
    assert_eq!(
        types,
        vec![
            DesignatorType::VendorSpecific,
            DesignatorType::T10VendorId,
            DesignatorType::Eui64,
            DesignatorType::Eui64,
            DesignatorType::Eui64,
            DesignatorType::Naa,
            DesignatorType::Naa,
            DesignatorType::RelativeTargetPort,
            DesignatorType::TargetPortGroup,
            DesignatorType::LogicalUnitGroup,
            DesignatorType::Md5LogicalUnit,
            DesignatorType::ScsiNameString,
            DesignatorType::ProtocolSpecific,
            DesignatorType::ProtocolSpecific,
            DesignatorType::Uuid,
        ]
    );
    assert!(!id.truncated);
    assert_eq!(
        id.lun_wwid().map(|w| w.to_string()).as_deref(),
        Some("naa.6122334455667788aabbccddeeffeedd")
    );
    // Each identity type converts on its own.
    let wwids: Vec<String> = id
        .designators
        .iter()
        .filter_map(|d| d.to_wwid().ok())
        .map(|w| w.to_string())
        .collect();
    assert_eq!(
        wwids,
        vec![
            "t10.ABC_XYZ123456789",
            "eui.1122334455667788",
            "eui.112233445566778800000123",
            "eui.0123456789abcdef1122334455667788",
            "naa.5122334455667788",
            "naa.6122334455667788aabbccddeeffeedd",
            "name.iqn.5886.com.acme.diskarrays-sn-a8675309",
        ]
    );
    // The SCSI name string names the target device (association 2), not the LUN.
    assert_eq!(id.designators[11].association, Association::TargetDevice);
}

#[test]
fn control_characters_refuse_that_designator_only() {
    let id = parse_device_identification(&page("synthetic-all-designator-types-with-LF.vpd_pg83"))
        .expect("parse");
    let t10 = &id.designators[1];
    assert_eq!(t10.designator_type, DesignatorType::T10VendorId);
    assert!(
        t10.to_wwid().is_err(),
        "T10 id with a line feed must be refused"
    );
    assert!(
        id.designators[11].to_wwid().is_err(),
        "SCSI name with a line feed must be refused"
    );
    // The NAA is unaffected.
    assert_eq!(
        id.lun_wwid().map(|w| w.to_string()).as_deref(),
        Some("naa.6122334455667788aabbccddeeffeedd")
    );
}

#[test]
fn scsi_name_injection_page_yields_no_identity() {
    let id = parse_device_identification(&page("synthetic-scsi-name-injection.vpd_pg83"))
        .expect("parse");
    assert_eq!(id.designators.len(), 1);
    assert_eq!(
        id.designators[0].designator_type,
        DesignatorType::ScsiNameString
    );
    assert_eq!(id.designators[0].association, Association::LogicalUnit);
    // Three zero pad bytes after the descriptor are not a truncation.
    assert!(!id.truncated);
    assert_eq!(id.lun_wwid(), None);
    assert_eq!(
        lun_wwid(&page("synthetic-scsi-name-injection.vpd_pg83")),
        Ok(None)
    );
}

#[test]
fn only_the_logical_unit_association_identifies_a_lun() {
    // A target-port NAA alone (association 1).
    let page = [
        0x00, 0x83, 0x00, 0x0c, 0x01, 0x13, 0x00, 0x08, 0x50, 0, 0xc5, 0, 0x30, 0x11, 0xcb, 0x29,
    ];
    assert_eq!(lun_wwid(&page), Ok(None));
}

#[test]
fn ranking_is_naa6_naa5_eui_t10_name_whatever_the_page_order() {
    fn desc(byte0: u8, byte1: u8, id: &[u8]) -> Vec<u8> {
        let mut d = vec![byte0, byte1, 0, u8::try_from(id.len()).expect("short")];
        d.extend_from_slice(id);
        d
    }
    fn page_of(descs: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = descs.concat();
        let mut p = vec![0, 0x83];
        p.extend_from_slice(&u16::try_from(body.len()).expect("short").to_be_bytes());
        p.extend(body);
        p
    }
    let name = desc(0x03, 0x08, b"iqn.2001-04.com.example:lun1\0\0\0\0");
    let t10 = desc(0x02, 0x01, b"LIO-ORG 1234");
    let eui16 = desc(0x01, 0x02, &[0x11; 16]);
    let naa5 = desc(0x01, 0x03, &[0x50, 1, 2, 3, 4, 5, 6, 7]);
    let naa6 = desc(
        0x01,
        0x03,
        &[0x60, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
    );
    let pick = |descs: &[Vec<u8>]| {
        lun_wwid(&page_of(descs))
            .expect("parse")
            .map(|w| w.to_string())
    };
    assert_eq!(
        pick(&[
            name.clone(),
            t10.clone(),
            eui16.clone(),
            naa5.clone(),
            naa6.clone()
        ])
        .as_deref(),
        Some("naa.600102030405060708090a0b0c0d0e0f")
    );
    assert_eq!(
        pick(&[name.clone(), t10.clone(), eui16.clone(), naa5.clone()]).as_deref(),
        Some("naa.5001020304050607")
    );
    assert_eq!(
        pick(&[name.clone(), t10.clone(), eui16.clone()]).as_deref(),
        Some("eui.11111111111111111111111111111111")
    );
    assert_eq!(
        pick(&[name.clone(), t10.clone()]).as_deref(),
        Some("t10.LIO-ORG_1234")
    );
    assert_eq!(
        pick(&[name]).as_deref(),
        Some("name.iqn.2001-04.com.example:lun1")
    );
    // NAA as hex text (ASCII code set) is accepted too.
    let naa_text = desc(0x02, 0x03, b"600a0980383030523824476f6b5a4e57");
    assert_eq!(
        pick(&[naa_text]).as_deref(),
        Some("naa.600a0980383030523824476f6b5a4e57")
    );
}

#[test]
fn truncated_pages_keep_the_complete_designators_and_never_panic() {
    let full = page("infinibox-lun.vpd_pg83");
    for cut in 0..=full.len() {
        let prefix = &full[..cut];
        match parse_device_identification(prefix) {
            Err(VpdError::TooShort { len }) => assert!(cut < 4 && len == cut),
            Err(other) => panic!("cut {cut}: {other}"),
            Ok(id) => {
                assert_eq!(id.truncated, cut < full.len(), "cut {cut}");
                // The NAA-5 descriptor is complete from byte 16 on.
                let want = (cut >= 16).then(|| "naa.5742b0f010300000".to_owned());
                assert_eq!(id.lun_wwid().map(|w| w.to_string()), want, "cut {cut}");
            }
        }
    }
}

#[test]
fn random_bytes_never_panic() {
    // A small deterministic generator: the parser must survive anything.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..5000 {
        let len = usize::try_from(next() % 80).expect("small");
        let mut bytes: Vec<u8> = (0..len).map(|_| next().to_le_bytes()[0]).collect();
        if let Some(b) = bytes.get_mut(1) {
            *b = if next() % 2 == 0 { 0x83 } else { 0x80 };
        }
        let _ = parse_device_identification(&bytes).map(|id| id.lun_wwid());
        let _ = parse_unit_serial(&bytes);
    }
}

#[test]
fn wrong_page_codes_are_refused() {
    assert_eq!(
        parse_device_identification(&page("infinibox-controller-lun0.vpd_pg80")),
        Err(VpdError::WrongPage {
            expected: 0x83,
            found: 0x80
        })
    );
    assert!(matches!(
        parse_unit_serial(&page("nexsan-satabeast-lun-a.vpd_pg83")),
        Err(VpdError::WrongPage { .. })
    ));
}

#[test]
fn unit_serial_is_trimmed_of_nuls_and_blanks() {
    assert_eq!(
        parse_unit_serial(&page("infinibox-controller-lun0.vpd_pg80")),
        Ok(Some("742b0f0000075360000000000000000".to_owned()))
    );
    assert_eq!(
        parse_unit_serial(b"\x00\x80\x00\x08  AB C \x00\x00"),
        Ok(Some("AB C".to_owned()))
    );
    assert_eq!(parse_unit_serial(b"\x00\x80\x00\x04    "), Ok(None));
    assert_eq!(parse_unit_serial(b"\x00\x80\x00\x00"), Ok(None));
    // Page length beyond the bytes present: what is there.
    assert_eq!(
        parse_unit_serial(b"\x00\x80\x00\x40abc"),
        Ok(Some("abc".to_owned()))
    );
    assert_eq!(
        parse_unit_serial(b"\x00\x80\x00\x05ab\ncd"),
        Err(VpdError::UnprintableSerial)
    );
    assert_eq!(
        parse_unit_serial(b"\x00\x80"),
        Err(VpdError::TooShort { len: 2 })
    );
}
