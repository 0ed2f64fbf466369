//! The lab's iSCSI initiator against a real userspace target: each test
//! starts its own tgtd on 127.0.0.1 (free portal port, random control
//! port), backs LUNs with sparse files, and logs in over real TCP.
//!
//! What tgtd 1.0.85 answers, as these tests pin it:
//! - wrong CHAP secret, or no CHAP offered to a target that requires it:
//!   login status class 2 detail 1 (authentication failure);
//! - an initiator excluded by an ACL (by name `-Q` or by address `-I`), or
//!   a target with no ACL at all: class 2 detail 3 (target not found), the
//!   same answer as for a target that does not exist. tgtd never sends
//!   detail 2 (authorization failure);
//! - VPD page 0x83: see `csi_scsi_tests::tgt::LunIdentity`; in short a T10
//!   designator holding `scsi_id`, an NAA 3 from (tid, LUN), and an NAA 6
//!   from the hex digits of `scsi_id`, all at association 0.
#![allow(clippy::unwrap_used)]
#![warn(clippy::assertions_on_result_states)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use csi_scsi_tests::iscsi::{
    self, Chap, Designator, IscsiError, Session, TYPE_CONTROLLER, parse_designators,
    parse_unit_serial,
};
use csi_scsi_tests::tgt::{LunIdentity, Tgtd, tgt_naa3, tgt_naa6};
use tempfile::TempDir;

const INITIATOR: &str = "iqn.2025-01.org.csi-scsi.lab:node-a";
const TIMEOUT: Duration = Duration::from_secs(10);
const MIB: u64 = 1024 * 1024;

struct Fixture {
    dir: TempDir,
    tgtd: Tgtd,
}

impl Fixture {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let tgtd = Tgtd::start_local(&dir.path().join("tgtd.log"))
            .await
            .unwrap();
        Self { dir, tgtd }
    }

    fn portal(&self) -> SocketAddr {
        self.tgtd.portal()
    }

    /// A sparse backing file of `size` bytes.
    fn backing(&self, name: &str, size: u64) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::File::create(&path).unwrap().set_len(size).unwrap();
        path
    }

    /// Target `tid` open to every initiator, with one LUN per `(lun, size)`
    /// (identity [`LunIdentity::lab`] of `(tid, lun)`).
    async fn open_target(&mut self, tid: u32, luns: &[(u64, u64)]) -> String {
        let iqn = target_iqn(tid);
        self.tgtd.add_target(tid, &iqn).await.unwrap();
        for &(lun, size) in luns {
            let file = self.backing(&format!("t{tid}-lun{lun}.img"), size);
            self.tgtd
                .add_lun(tid, lun, &file, &LunIdentity::lab(tid, lun))
                .await
                .unwrap();
        }
        self.tgtd.bind_all(tid).await.unwrap();
        iqn
    }

    async fn login(
        &self,
        iqn: &str,
        initiator: &str,
        chap: Option<&Chap>,
    ) -> Result<Session, IscsiError> {
        iscsi::login(self.portal(), iqn, initiator, chap, TIMEOUT).await
    }
}

fn target_iqn(tid: u32) -> String {
    format!("iqn.2025-01.org.csi-scsi.lab:array-{tid}")
}

fn file_size(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().len()
}

/// The association-0 designators of type `ty`.
fn lu_designators(ds: &[Designator], ty: u8) -> Vec<Vec<u8>> {
    ds.iter()
        .filter(|d| d.association == 0 && d.designator_type == ty)
        .map(|d| d.value.clone())
        .collect()
}

#[tokio::test]
async fn login_without_chap_reads_luns_identity_and_size() {
    let mut f = Fixture::start().await;
    let iqn = f.open_target(1, &[(1, 64 * MIB), (2, 32 * MIB)]).await;
    let mut s = f.login(&iqn, INITIATOR, None).await.unwrap();
    assert_ne!(s.tsih(), 0);
    assert_eq!(s.target_portal_group_tag(), Some(1));

    // LUN 0 is tgt's controller: listed, but not a disk.
    assert_eq!(s.report_luns().await.unwrap(), vec![0, 1, 2]);
    let ctl = s.inquiry(0).await.unwrap();
    assert_eq!(ctl.device_type, TYPE_CONTROLLER);
    assert!(!ctl.is_disk());

    for (lun, file) in [(1, "t1-lun1.img"), (2, "t1-lun2.img")] {
        let inq = s.inquiry(lun).await.unwrap();
        assert!(inq.is_disk(), "{inq:?}");
        assert_eq!(
            (inq.vendor.as_str(), inq.model.as_str()),
            ("CSISCSI", "LAB-LUN")
        );
        assert_eq!(&inq.raw[8..16], b"CSISCSI ", "sysfs-style padded vendor");

        let (bytes, block) = s.read_capacity16(lun).await.unwrap();
        assert_eq!(bytes, file_size(&f.dir.path().join(file)));
        assert_eq!(block, 512);

        let supported = s.vpd_page(lun, 0x00).await.unwrap();
        assert!(supported[4..].contains(&0x80) && supported[4..].contains(&0x83));

        let pg80 = s.vpd_page(lun, 0x80).await.unwrap();
        println!("LUN {lun} VPD 0x80: {}", iscsi::hex(&pg80));
        assert_eq!(parse_unit_serial(&pg80).unwrap(), format!("SN1-{lun}"));
    }

    // An unsupported VPD page is CHECK CONDITION, ILLEGAL REQUEST, INVALID
    // FIELD IN CDB, and the session goes on.
    let e = s.vpd_page(1, 0x99).await.unwrap_err();
    assert!(
        matches!(
            e,
            IscsiError::ScsiCheckCondition {
                sense_key: 5,
                asc: 0x24,
                ascq: 0
            }
        ),
        "{e:?}"
    );
    // READ CAPACITY of the controller: ILLEGAL REQUEST, INVALID COMMAND
    // OPERATION CODE.
    let e = s.read_capacity16(0).await.unwrap_err();
    assert!(
        matches!(
            e,
            IscsiError::ScsiCheckCondition {
                sense_key: 5,
                asc: 0x20,
                ..
            }
        ),
        "{e:?}"
    );
    s.logout().await.unwrap();
}

/// What tgt puts in VPD page 0x83, as this test prints it for LUN 1 of
/// target 1 with `scsi_id` 60014050000100000000000000000001:
///
/// ```text
/// 00830048                          disk, page 0x83, 72 bytes follow
/// 02010024 363030...3031 00000000   T10 vendor ID (code set ASCII, assoc 0,
///                                   type 1), 36 bytes: scsi_id, NUL-padded
/// 01030008 3000000100000001         NAA 3 (binary, assoc 0, type 3):
///                                   0x3 << 60 | tid << 32 | lun
/// 01030010 60014050000100000000000000000001
///                                   NAA 6 (binary, assoc 0, type 3): the
///                                   hex digits of scsi_id, top nibble 6
/// ```
#[tokio::test]
async fn vpd_0x83_designators_follow_scsi_id_and_differ_between_luns() {
    let mut f = Fixture::start().await;
    let iqn = f.open_target(1, &[(1, 16 * MIB), (2, 16 * MIB)]).await;
    let mut s = f.login(&iqn, INITIATOR, None).await.unwrap();
    let mut naa6s = Vec::new();
    for lun in [1u64, 2] {
        let page = s.vpd_page(lun, 0x83).await.unwrap();
        println!("LUN {lun} VPD 0x83: {}", iscsi::hex(&page));
        assert_eq!(&page[..2], &[0x00, 0x83]);
        let ds = parse_designators(&page).unwrap();
        assert!(ds.iter().all(|d| d.association == 0 && !d.piv), "{ds:?}");
        let id = LunIdentity::lab(1, lun);

        let t10 = lu_designators(&ds, 1);
        assert_eq!(t10.len(), 1);
        assert_eq!(t10[0].len(), 36);
        assert_eq!(&t10[0][..id.scsi_id.len()], id.scsi_id.as_bytes());
        assert!(t10[0][id.scsi_id.len()..].iter().all(|&b| b == 0));

        let naa = lu_designators(&ds, 3);
        assert_eq!(
            naa,
            vec![tgt_naa3(1, lun).to_vec(), tgt_naa6(&id.scsi_id).to_vec()]
        );
        // With a 32-hex-digit scsi_id starting with 6, the NAA 6 *is* it.
        assert_eq!(iscsi::hex(&naa[1]), id.scsi_id);
        naa6s.push(naa[1].clone());
    }
    assert_ne!(naa6s[0], naa6s[1]);
    s.logout().await.unwrap();
}

#[tokio::test]
async fn scsi_ids_without_hex_digits_collide_in_naa6() {
    // Why LunIdentity::lab uses hex: tgt reads scsi_id as hex digits.
    assert_eq!(tgt_naa6("disk-x"), tgt_naa6("disk-y"));
    assert_ne!(tgt_naa6("id-a"), tgt_naa6("id-b"));
    assert_eq!(
        iscsi::hex(&tgt_naa6("id-a")),
        format!("6{}d0a", "0".repeat(28))
    );
    // Same (tid, LUN) on two arrays: the NAA 3 collides, the NAA 6 does not.
    assert_ne!(
        tgt_naa6(&LunIdentity::lab(1, 1).scsi_id),
        tgt_naa6(&LunIdentity::lab(2, 1).scsi_id)
    );
}

#[tokio::test]
async fn chap_right_secret_logs_in_wrong_secret_is_authentication_failed() {
    let mut f = Fixture::start().await;
    let iqn = f.open_target(1, &[(1, 8 * MIB)]).await;
    f.tgtd.add_chap(1, "node-a", "s3cret-s3cret").await.unwrap();
    let good = Chap {
        username: "node-a".into(),
        password: "s3cret-s3cret".into(),
        mutual: None,
    };
    let mut s = f.login(&iqn, INITIATOR, Some(&good)).await.unwrap();
    assert_eq!(s.report_luns().await.unwrap(), vec![0, 1]);
    s.logout().await.unwrap();

    let wrong = Chap {
        password: "not-the-secret".into(),
        ..good.clone()
    };
    let e = f.login(&iqn, INITIATOR, Some(&wrong)).await.unwrap_err();
    assert!(matches!(e, IscsiError::AuthenticationFailed(None)), "{e:?}");
    assert!(f.tgtd.log().contains("wrong secret"), "{}", f.tgtd.log());

    let unknown_user = Chap {
        username: "node-b".into(),
        ..good.clone()
    };
    let e = f
        .login(&iqn, INITIATOR, Some(&unknown_user))
        .await
        .unwrap_err();
    assert!(matches!(e, IscsiError::AuthenticationFailed(None)), "{e:?}");

    // No CHAP offered to a target that requires it.
    let e = f.login(&iqn, INITIATOR, None).await.unwrap_err();
    assert!(matches!(e, IscsiError::AuthenticationFailed(None)), "{e:?}");

    // Credentials offered to a target without accounts: it picks None.
    let open = f.open_target(2, &[(1, 8 * MIB)]).await;
    f.login(&open, INITIATOR, Some(&good))
        .await
        .unwrap()
        .logout()
        .await
        .unwrap();
    // Redacted in logs.
    assert!(!format!("{good:?}").contains("s3cret"));
}

#[tokio::test]
async fn mutual_chap_checks_the_target() {
    let mut f = Fixture::start().await;
    let iqn = f.open_target(1, &[(1, 8 * MIB)]).await;
    f.tgtd
        .add_chap(1, "node-a", "initiator-secret")
        .await
        .unwrap();
    f.tgtd
        .add_mutual_chap(1, "array-1", "target-secret-1")
        .await
        .unwrap();
    let mutual = Chap {
        username: "node-a".into(),
        password: "initiator-secret".into(),
        mutual: Some(("array-1".into(), "target-secret-1".into())),
    };
    let mut s = f.login(&iqn, INITIATOR, Some(&mutual)).await.unwrap();
    assert_eq!(s.inquiry(1).await.unwrap().vendor, "CSISCSI");
    s.logout().await.unwrap();

    // The target does not know the secret we expect: we refuse it.
    let impostor = Chap {
        mutual: Some(("array-1".into(), "another-secret".into())),
        ..mutual.clone()
    };
    let e = f.login(&iqn, INITIATOR, Some(&impostor)).await.unwrap_err();
    assert!(
        matches!(e, IscsiError::AuthenticationFailed(Some(_))),
        "{e:?}"
    );

    // Mutual CHAP never falls back to no authentication.
    let open = f.open_target(2, &[(1, 8 * MIB)]).await;
    let e = f.login(&open, INITIATOR, Some(&mutual)).await.unwrap_err();
    assert!(matches!(e, IscsiError::AuthenticationFailed(_)), "{e:?}");
}

#[tokio::test]
async fn initiator_acl_refusal_is_target_not_found() {
    let mut f = Fixture::start().await;
    let other = "iqn.2025-01.org.csi-scsi.lab:node-b";
    let iqn = target_iqn(1);
    f.tgtd.add_target(1, &iqn).await.unwrap();
    let file = f.backing("acl.img", 8 * MIB);
    f.tgtd
        .add_lun(1, 1, &file, &LunIdentity::lab(1, 1))
        .await
        .unwrap();

    // No ACL at all: nobody gets in.
    let e = f.login(&iqn, INITIATOR, None).await.unwrap_err();
    assert!(matches!(e, IscsiError::TargetNotFound), "{e:?}");

    // Name ACL for another initiator: we are refused, it is let in.
    f.tgtd.bind_initiator_name(1, other).await.unwrap();
    let e = f.login(&iqn, INITIATOR, None).await.unwrap_err();
    assert!(matches!(e, IscsiError::TargetNotFound), "{e:?}");
    f.login(&iqn, other, None)
        .await
        .unwrap()
        .logout()
        .await
        .unwrap();

    // Address ACL for another address (we connect from 127.0.0.1).
    f.tgtd.unbind_initiator_name(1, other).await.unwrap();
    f.tgtd.bind_initiator_address(1, "127.0.0.2").await.unwrap();
    let e = f.login(&iqn, INITIATOR, None).await.unwrap_err();
    assert!(matches!(e, IscsiError::TargetNotFound), "{e:?}");
    f.tgtd.bind_initiator_address(1, "127.0.0.1").await.unwrap();
    f.login(&iqn, INITIATOR, None)
        .await
        .unwrap()
        .logout()
        .await
        .unwrap();

    // A target that does not exist answers the same.
    let e = f
        .login("iqn.2025-01.org.csi-scsi.lab:nope", INITIATOR, None)
        .await
        .unwrap_err();
    assert!(matches!(e, IscsiError::TargetNotFound), "{e:?}");
}

#[tokio::test]
async fn growth_shows_after_refresh_lun_size() {
    let mut f = Fixture::start().await;
    let iqn = f.open_target(1, &[(1, 64 * MIB)]).await;
    let file = f.dir.path().join("t1-lun1.img");
    let mut s = f.login(&iqn, INITIATOR, None).await.unwrap();
    assert_eq!(s.read_capacity16(1).await.unwrap().0, 64 * MIB);

    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(96 * MIB)
        .unwrap();
    // tgtd cached the size when the LUN was created.
    assert_eq!(s.read_capacity16(1).await.unwrap().0, 64 * MIB);

    f.tgtd.refresh_lun_size(1, 1).await.unwrap();
    // The logged-in session sees it (through a UNIT ATTENTION, retried)...
    assert_eq!(s.read_capacity16(1).await.unwrap(), (96 * MIB, 512));
    // ...with the identity unchanged...
    let page = s.vpd_page(1, 0x83).await.unwrap();
    let naa = lu_designators(&parse_designators(&page).unwrap(), 3);
    assert_eq!(naa[1], tgt_naa6(&LunIdentity::lab(1, 1).scsi_id));
    s.logout().await.unwrap();
    // ...and so does a new one.
    let mut s = f.login(&iqn, INITIATOR, None).await.unwrap();
    assert_eq!(s.read_capacity16(1).await.unwrap().0, file_size(&file));
    s.logout().await.unwrap();
}

#[tokio::test]
async fn sendtargets_lists_every_target_with_its_portal() {
    let mut f = Fixture::start().await;
    let a = f.open_target(1, &[(1, 8 * MIB)]).await;
    let b = f.open_target(2, &[(1, 8 * MIB)]).await;
    let mut found = iscsi::sendtargets(f.portal(), INITIATOR, None, TIMEOUT)
        .await
        .unwrap();
    found.sort();
    let portal = format!("{},1", f.portal());
    assert_eq!(found, vec![(a, vec![portal.clone()]), (b, vec![portal])]);
}

#[tokio::test]
async fn unreachable_portal_and_silent_target() {
    let closed = SocketAddr::from(([127, 0, 0, 1], csi_scsi_tests::daemon::free_port()));
    let e = iscsi::login(closed, &target_iqn(1), INITIATOR, None, TIMEOUT)
        .await
        .unwrap_err();
    assert!(
        matches!(e, IscsiError::Unreachable { portal, .. } if portal == closed),
        "{e:?}"
    );

    // Accepts the connection, never answers the login.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent = listener.local_addr().unwrap();
    let hold = tokio::spawn(async move {
        let (sock, _) = listener.accept().await.unwrap();
        tokio::time::sleep(Duration::from_secs(30)).await;
        drop(sock);
    });
    let e = iscsi::login(
        silent,
        &target_iqn(1),
        INITIATOR,
        None,
        Duration::from_millis(300),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, IscsiError::Timeout(_)), "{e:?}");
    hold.abort();
}

#[tokio::test]
async fn garbage_from_the_portal_is_a_protocol_error() {
    // A "target" that answers the login with a Data-In PDU that claims a
    // 16 MiB data segment: refused before anything is allocated.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let serve = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut req = [0u8; 48];
        sock.read_exact(&mut req).await.unwrap();
        let mut bhs = [0u8; 48];
        bhs[0] = 0x25;
        bhs[5..8].copy_from_slice(&[0xff, 0xff, 0xff]);
        sock.write_all(&bhs).await.unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
    });
    let e = iscsi::login(addr, &target_iqn(1), INITIATOR, None, TIMEOUT)
        .await
        .unwrap_err();
    assert!(matches!(e, IscsiError::Protocol(_)), "{e:?}");
    serve.abort();
}
