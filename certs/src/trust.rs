//! A trust bundle (`ca.crt`): one or more CA certificates, several during a
//! CA rotation. What both sides compare and report about it lives here: a
//! digest that names the bundle (the proxy re-enrols an agent whose bundle
//! is not the signer's) and the earliest expiry among its CAs.

use std::time::SystemTime;

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

/// The SHA-256 (hex) of a bundle's certificates, DER, in order: the same
/// certificates give the same digest however the PEM is wrapped or
/// commented. `None` when the PEM holds no certificate.
pub fn trust_digest(pem: &[u8]) -> Option<String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .ok()?;
    if certs.is_empty() {
        return None;
    }
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for c in &certs {
        // Length-prefixed, so two bundles never concatenate alike.
        ctx.update(&(c.len() as u64).to_be_bytes());
        ctx.update(c);
    }
    Some(
        ctx.finish()
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
    )
}

/// The earliest notAfter among the bundle's certificates: when the first of
/// them stops being trusted. `None` when none parses.
pub fn earliest_expiry(pem: &[u8]) -> Option<SystemTime> {
    CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .filter_map(|c| crate::material::serial_and_expiry(&c).map(|(_, t)| t))
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CertificateAuthority, TrustDomain, Validity};

    fn ca(days: u32) -> String {
        let domain = TrustDomain::new("csi-scsi.local").expect("valid domain");
        CertificateAuthority::create(&domain, Validity::days(days))
            .expect("a CA")
            .cert_pem()
            .to_owned()
    }

    #[test]
    fn the_digest_names_the_certificates_in_order_not_their_wrapping() {
        let (a, b) = (ca(10), ca(20));
        let ab = format!("{a}{b}");
        let ab_commented = format!("# rotation, step 1\n{a}\n\n{b}\n");
        assert_eq!(
            trust_digest(ab.as_bytes()),
            trust_digest(ab_commented.as_bytes())
        );
        assert_ne!(
            trust_digest(ab.as_bytes()),
            trust_digest(format!("{b}{a}").as_bytes())
        );
        assert_ne!(trust_digest(ab.as_bytes()), trust_digest(a.as_bytes()));
        assert_eq!(trust_digest(b"no certificate here"), None);
    }

    #[test]
    fn the_earliest_expiry_is_the_first_ca_to_lapse() {
        let (short, long) = (ca(10), ca(400));
        let both = format!("{long}{short}");
        let earliest = earliest_expiry(both.as_bytes()).expect("an expiry");
        let left = earliest
            .duration_since(SystemTime::now())
            .expect("in the future")
            .as_secs();
        assert!((9 * 86_400..=10 * 86_400).contains(&left), "{left}");
        assert_eq!(earliest_expiry(b""), None);
    }

    #[test]
    fn a_bundle_signs_with_its_first_ca_and_only_with_that_cas_key() {
        let domain = TrustDomain::new("csi-scsi.local").expect("valid domain");
        let (old, new) = (
            CertificateAuthority::create(&domain, Validity::days(10)).expect("a CA"),
            CertificateAuthority::create(&domain, Validity::days(10)).expect("a CA"),
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let (crt, key) = (dir.path().join("ca.crt"), dir.path().join("ca.key"));
        let bundle = format!("{}{}", new.cert_pem(), old.cert_pem());
        std::fs::write(&crt, &bundle).expect("write");
        // The old key with the new CA first: refused, nothing to sign with.
        std::fs::write(&key, old.key_pem()).expect("write");
        let refused = CertificateAuthority::load(&crt, &key).err();
        assert!(
            matches!(refused, Some(crate::CertError::KeyMismatch { .. })),
            "{refused:?}"
        );
        // The new key: loads; the whole bundle is the trust handed out.
        std::fs::write(&key, new.key_pem()).expect("write");
        let ca = CertificateAuthority::load(&crt, &key).expect("the bundle loads");
        assert_eq!(
            ca.trust_digest(),
            trust_digest(bundle.as_bytes()).expect("digest")
        );
        assert_eq!(
            ca.not_after(),
            earliest_expiry(new.cert_pem().as_bytes()).expect("expiry")
        );
        // A bundle with a broken second certificate: refused.
        std::fs::write(
            &crt,
            format!(
                "{}-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n",
                new.cert_pem()
            ),
        )
        .expect("write");
        assert!(CertificateAuthority::load(&crt, &key).is_err());
        // also_trusting adds a CA once.
        let again = ca.also_trusting(old.cert_pem(), &crt).expect("bundle");
        assert_eq!(
            again.trust_digest(),
            trust_digest(bundle.as_bytes()).expect("digest")
        );
    }
}
