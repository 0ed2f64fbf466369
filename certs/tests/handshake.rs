//! Real mutual-TLS handshakes over TCP on 127.0.0.1 between the configs the
//! crate builds (and hand-built impostors), plus reload of rotated material
//! laid out like a Kubernetes Secret volume.

#[path = "handshake/support.rs"]
mod support;

use std::time::Duration;

use csi_scsi_certs::{
    CertError, Identity, IdentityRejected, MaterialPaths, MaterialStore, Role,
    client_config_for_node, server_config, verify_proxy_chain,
};
use rustls::{AlertDescription, CertificateError, InvalidMessage};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use support::{
    Pki, SecretVolume, Server, TRUST_DOMAIN, agent, client_presenting, client_presenting_with,
    client_without_certificate, connect, dial_and_echo, expect_err, foreign_ca_error,
    handshake_kinds, identity_rejection, leaf_der, node, plain_server_config, presented_leaf,
    round_trip, rustls_error, serial_hex, within,
};

// === Handshakes ===

#[tokio::test]
async fn the_proxy_and_the_agent_it_dials_complete_a_handshake_and_exchange_data() {
    let pki = Pki::new();
    let agent_store = pki.store(agent("node-a"));
    let proxy_store = pki.store(Role::Proxy);
    let mut server = Server::spawn(server_config(agent_store).expect("server config")).await;

    let client = client_config_for_node(proxy_store, "node-a").expect("client config");
    let mut tls = connect(client, "node-a", server.addr)
        .await
        .expect("client handshake");
    server.next_handshake().await.expect("server handshake");

    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    for msg in [&b"hello agent"[..], b"second message"] {
        assert_eq!(round_trip(&mut tls, msg).await.expect("round trip"), msg);
    }
}

#[tokio::test]
async fn the_agent_refuses_a_client_that_presents_no_certificate() {
    let pki = Pki::new();
    let mut server =
        Server::spawn(server_config(pki.store(agent("node-a"))).expect("config")).await;

    let client = client_without_certificate(pki.ca.cert_pem());
    let client_err = expect_err(dial_and_echo(client, "node-a", server.addr).await, "client");

    let server_err = expect_err(server.next_handshake().await, "server");
    assert!(
        matches!(
            rustls_error(&server_err),
            rustls::Error::NoCertificatesPresented
        ),
        "server error: {server_err:?}"
    );
    assert!(
        server_err.to_string().contains("peer sent no certificates"),
        "server error text: {server_err}"
    );
    assert_eq!(
        rustls_error(&client_err),
        &rustls::Error::AlertReceived(AlertDescription::CertificateRequired)
    );
}

#[tokio::test]
async fn the_agent_refuses_a_proxy_certificate_from_another_ca() {
    let pki = Pki::new();
    let mut server =
        Server::spawn(server_config(pki.store(agent("node-a"))).expect("config")).await;

    // A CA for the same trust domain (same identity, different signer) and
    // one for another domain.
    for domain in [TRUST_DOMAIN, "elsewhere.test"] {
        let rogue = Pki::in_domain(domain);
        let rogue_proxy = rogue.issue(&Identity::Proxy);
        let client = client_presenting(pki.ca.cert_pem(), &rogue_proxy);
        let client_err = expect_err(dial_and_echo(client, "node-a", server.addr).await, domain);

        let (cause, alert) = foreign_ca_error(&pki.ca, &rogue.ca);
        if domain != TRUST_DOMAIN {
            assert_eq!(cause, CertificateError::UnknownIssuer);
        }
        let server_err = expect_err(server.next_handshake().await, domain);
        assert_eq!(
            rustls_error(&server_err),
            &rustls::Error::InvalidCertificate(cause),
            "{domain}"
        );
        assert_eq!(
            rustls_error(&client_err),
            &rustls::Error::AlertReceived(alert),
            "{domain}"
        );
    }
}

#[tokio::test]
async fn the_proxy_dialling_node_a_refuses_node_b_even_with_a_valid_certificate() {
    let pki = Pki::new();
    let mut server =
        Server::spawn(server_config(pki.store(agent("node-b"))).expect("config")).await;

    let client = client_config_for_node(pki.store(Role::Proxy), "node-a").expect("client config");
    // SNI says node-a too: the address, not the name, is what went wrong.
    let client_err = expect_err(connect(client, "node-a", server.addr).await, "client");

    let rejected = identity_rejection(rustls_error(&client_err));
    let expected = pki.uri(&node("node-a"));
    let presented = pki.uri(&node("node-b"));
    assert_eq!(
        rejected,
        &IdentityRejected::WrongNode {
            expected: expected.clone(),
            presented: presented.clone(),
        }
    );
    let text = client_err.to_string();
    assert!(
        text.contains(&expected) && text.contains(&presented),
        "{text}"
    );

    let server_err = expect_err(server.next_handshake().await, "server");
    assert_eq!(
        rustls_error(&server_err),
        &rustls::Error::AlertReceived(AlertDescription::CertificateUnknown)
    );
}

#[tokio::test]
async fn the_proxy_refuses_an_agent_certificate_from_another_ca() {
    let pki = Pki::new();
    let rogue = Pki::new();
    let mut server =
        Server::spawn(server_config(rogue.store(agent("node-a"))).expect("config")).await;

    let client = client_config_for_node(pki.store(Role::Proxy), "node-a").expect("client config");
    let client_err = expect_err(connect(client, "node-a", server.addr).await, "client");

    let (cause, alert) = foreign_ca_error(&pki.ca, &rogue.ca);
    assert_eq!(
        rustls_error(&client_err),
        &rustls::Error::InvalidCertificate(cause)
    );
    let server_err = expect_err(server.next_handshake().await, "server");
    assert_eq!(
        rustls_error(&server_err),
        &rustls::Error::AlertReceived(alert)
    );
}

#[tokio::test]
async fn the_agent_refuses_another_agents_certificate_as_not_the_proxy() {
    let pki = Pki::new();
    let mut server =
        Server::spawn(server_config(pki.store(agent("node-a"))).expect("config")).await;

    // An agent's server certificate (serverAuth only) used as a client one.
    let other_agent = pki.issue(&node("node-a"));
    let client = client_presenting(pki.ca.cert_pem(), &other_agent);
    let client_err = expect_err(dial_and_echo(client, "node-a", server.addr).await, "client");

    let server_err = expect_err(server.next_handshake().await, "server");
    assert_eq!(
        identity_rejection(rustls_error(&server_err)),
        &IdentityRejected::NotProxy {
            expected: pki.uri(&Identity::Proxy),
            presented: pki.uri(&node("node-a")),
        }
    );
    assert_eq!(
        rustls_error(&client_err),
        &rustls::Error::AlertReceived(AlertDescription::CertificateUnknown)
    );
}

#[tokio::test]
async fn the_agent_refuses_an_expired_proxy_certificate() {
    let pki = Pki::new();
    let mut server =
        Server::spawn(server_config(pki.store(agent("node-a"))).expect("config")).await;

    let expired_proxy = pki.issue_expired(&Identity::Proxy);
    let client = client_presenting(pki.ca.cert_pem(), &expired_proxy);
    let client_err = expect_err(dial_and_echo(client, "node-a", server.addr).await, "client");

    let server_err = expect_err(server.next_handshake().await, "server");
    assert!(
        matches!(
            rustls_error(&server_err),
            rustls::Error::InvalidCertificate(
                CertificateError::Expired | CertificateError::ExpiredContext { .. }
            )
        ),
        "server error: {server_err:?}"
    );
    assert_eq!(
        rustls_error(&client_err),
        &rustls::Error::AlertReceived(AlertDescription::CertificateExpired)
    );
}

#[tokio::test]
async fn a_plaintext_http2_client_gets_no_session_and_no_plaintext_reply() {
    let pki = Pki::new();
    let mut server =
        Server::spawn(server_config(pki.store(agent("node-a"))).expect("config")).await;

    let mut tcp = tokio::net::TcpStream::connect(server.addr)
        .await
        .expect("connect");
    tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .expect("write preface");

    let server_err = expect_err(server.next_handshake().await, "server");
    assert_eq!(
        rustls_error(&server_err),
        &rustls::Error::InvalidMessage(InvalidMessage::InvalidContentType)
    );
    // All the client gets back is one plaintext TLS record, a fatal
    // decode_error alert, then EOF: nothing an HTTP/2 client could use.
    let mut reply = Vec::new();
    within("read reply", tcp.read_to_end(&mut reply))
        .await
        .expect("read until the server closes");
    let decode_error = u8::from(AlertDescription::DecodeError);
    assert_eq!(reply, [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, decode_error]);
}

#[tokio::test]
async fn during_a_ca_rotation_peers_trusting_both_cas_accept_certificates_from_either() {
    // Also covers two CAs of one domain with the same subject name (as
    // CAs were named before their names got a unique tag): webpki tries
    // every trusted CA of that name, not just the first.
    let old = Pki::new();
    let new = Pki::new();
    let bundle = format!("{}{}", old.ca.cert_pem(), new.ca.cert_pem());
    let load = |pki: &Pki, name: &str, role: Role| {
        let mut issued = pki.issue(&role.identity());
        issued.ca_pem.clone_from(&bundle);
        let dir = old.write(name, &issued);
        MaterialStore::load(MaterialPaths::in_dir(&dir), role, old.domain.clone())
            .expect("load material")
    };
    let agent_old = load(&old, "agent-old", agent("node-a"));
    let proxy_new = load(&new, "proxy-new", Role::Proxy);
    let agent_new = load(&new, "agent-new", agent("node-a"));
    let proxy_old = load(&old, "proxy-old", Role::Proxy);

    for (agent_store, proxy_store) in [(agent_old, proxy_new), (agent_new, proxy_old)] {
        let mut server = Server::spawn(server_config(agent_store).expect("config")).await;
        let client = client_config_for_node(proxy_store, "node-a").expect("client config");
        let echoed = dial_and_echo(client, "node-a", server.addr).await;
        server.next_handshake().await.expect("server handshake");
        assert_eq!(echoed.expect("client handshake and echo"), b"ping");
    }
}

#[tokio::test]
async fn every_connection_is_a_full_handshake_so_no_resumed_session_skips_the_checks() {
    use rustls::HandshakeKind::{Full, Resumed};
    let pki = Pki::new();
    let proxy = pki.issue(&Identity::Proxy);
    // Control: a plain rustls server with default session settings lets
    // these clients resume, so resumption would show below.
    let mut control = Server::spawn(plain_server_config(
        pki.ca.cert_pem(),
        &pki.issue(&node("node-a")),
    ))
    .await;
    let mut agent_server =
        Server::spawn(server_config(pki.store(agent("node-a"))).expect("config")).await;

    for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
        let client = client_presenting_with(pki.ca.cert_pem(), &proxy, &[version]);
        let what = format!("{:?}", version.version);
        assert_eq!(
            handshake_kinds(&client, &mut control).await,
            [Full, Resumed],
            "{what}"
        );
        assert_eq!(
            handshake_kinds(&client, &mut agent_server).await,
            [Full, Full],
            "{what}"
        );
    }

    // The proxy's config does not try to resume either.
    let client = client_config_for_node(pki.store(Role::Proxy), "node-a").expect("client config");
    assert_eq!(handshake_kinds(&client, &mut control).await, [Full, Full]);
}

// === Rotation ===

#[tokio::test]
async fn after_reload_new_connections_see_the_rotated_certificate_and_old_ones_keep_working() {
    let pki = Pki::new();
    let first = pki.issue(&node("node-a"));
    let mut volume = SecretVolume::create(&pki.dir.path().join("agent"), &first);
    let store = MaterialStore::load(volume.paths(), agent("node-a"), pki.domain.clone())
        .expect("load agent material");
    assert_eq!(
        store.current().serial(),
        serial_hex(&leaf_der(&first.cert_pem))
    );
    let mut server = Server::spawn(server_config(store.clone()).expect("config")).await;
    let client = client_config_for_node(pki.store(Role::Proxy), "node-a").expect("client config");

    let mut before = connect(client.clone(), "node-a", server.addr)
        .await
        .expect("handshake");
    server.next_handshake().await.expect("server handshake");
    assert_eq!(presented_leaf(&before), leaf_der(&first.cert_pem));
    // Take in any session tickets, so a resumption could happen next.
    assert_eq!(
        round_trip(&mut before, b"old").await.expect("round trip"),
        b"old"
    );

    let second = pki.issue(&node("node-a"));
    volume.rotate_to(&second);
    let generation = store.subscribe();
    assert!(
        store.reload().expect("reload rotated material"),
        "reload saw no change"
    );
    assert!(
        generation.has_changed().expect("store alive"),
        "no change published"
    );
    let second_der = leaf_der(&second.cert_pem);
    assert_eq!(store.current().serial(), serial_hex(&second_der));
    assert!(
        !store.reload().expect("reload again"),
        "unchanged files reloaded"
    );

    let mut after = connect(client, "node-a", server.addr)
        .await
        .expect("handshake");
    server.next_handshake().await.expect("server handshake");
    assert_eq!(presented_leaf(&after), second_der);
    assert_eq!(
        after.get_ref().1.handshake_kind(),
        Some(rustls::HandshakeKind::Full)
    );
    assert_eq!(
        round_trip(&mut after, b"new").await.expect("round trip"),
        b"new"
    );

    assert_eq!(
        round_trip(&mut before, b"still here")
            .await
            .expect("old connection"),
        b"still here"
    );
    assert_eq!(presented_leaf(&before), leaf_der(&first.cert_pem));
}

#[tokio::test]
async fn the_watcher_picks_up_a_secret_volume_rotation_by_itself() {
    let pki = Pki::new();
    let first = pki.issue(&node("node-a"));
    let mut volume = SecretVolume::create(&pki.dir.path().join("agent"), &first);
    let store = MaterialStore::load(volume.paths(), agent("node-a"), pki.domain.clone())
        .expect("load agent material");
    store.watch(Duration::from_millis(200));
    let mut server = Server::spawn(server_config(store.clone()).expect("config")).await;
    let client = client_config_for_node(pki.store(Role::Proxy), "node-a").expect("client config");

    let mut before = connect(client.clone(), "node-a", server.addr)
        .await
        .expect("handshake");
    server.next_handshake().await.expect("server handshake");
    assert_eq!(presented_leaf(&before), leaf_der(&first.cert_pem));
    // Take in any session tickets, so a resumption could happen next.
    assert_eq!(
        round_trip(&mut before, b"old").await.expect("round trip"),
        b"old"
    );

    let second = pki.issue(&node("node-a"));
    let second_der = leaf_der(&second.cert_pem);
    volume.rotate_to(&second);
    let want = serial_hex(&second_der);
    within("watcher reload", async {
        while store.current().serial() != want {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;

    let mut after = connect(client, "node-a", server.addr)
        .await
        .expect("handshake");
    server.next_handshake().await.expect("server handshake");
    assert_eq!(presented_leaf(&after), second_der);
    assert_eq!(
        after.get_ref().1.handshake_kind(),
        Some(rustls::HandshakeKind::Full)
    );
    assert_eq!(
        round_trip(&mut after, b"new").await.expect("round trip"),
        b"new"
    );
    assert_eq!(
        round_trip(&mut before, b"old")
            .await
            .expect("old connection"),
        b"old"
    );
}

#[tokio::test]
async fn bad_rotated_files_are_refused_and_the_old_certificate_stays_in_use() {
    let pki = Pki::new();
    let first = pki.issue(&node("node-a"));
    let mut volume = SecretVolume::create(&pki.dir.path().join("agent"), &first);
    let store = MaterialStore::load(volume.paths(), agent("node-a"), pki.domain.clone())
        .expect("load agent material");
    let old_serial = store.current().serial().to_owned();
    let mut server = Server::spawn(server_config(store.clone()).expect("config")).await;
    let client = client_config_for_node(pki.store(Role::Proxy), "node-a").expect("client config");

    // Garbage in place of the certificate.
    volume.update("this is not a certificate\n", &first.key_pem, &first.ca_pem);
    match store.reload() {
        Err(CertError::BadPem { path, .. }) => assert_eq!(path, volume.paths().cert),
        other => panic!("expected BadPem for tls.crt, got {other:?}"),
    }
    assert_eq!(store.current().serial(), old_serial);

    // A new certificate with the old key.
    let second = pki.issue(&node("node-a"));
    volume.update(&second.cert_pem, &first.key_pem, &second.ca_pem);
    match store.reload() {
        Err(CertError::KeyMismatch { cert, key }) => {
            assert_eq!(cert, volume.paths().cert);
            assert_eq!(key, volume.paths().key);
        }
        other => panic!("expected a key mismatch, got {other:?}"),
    }
    assert_eq!(store.current().serial(), old_serial);
    // The same bad files are reported once, not at every poll.
    assert!(matches!(store.reload(), Ok(false)));

    // Handshakes still present the old certificate.
    let tls = connect(client.clone(), "node-a", server.addr)
        .await
        .expect("handshake");
    server.next_handshake().await.expect("server handshake");
    assert_eq!(presented_leaf(&tls), leaf_der(&first.cert_pem));

    // Fixing the files recovers.
    volume.rotate_to(&second);
    assert!(store.reload().expect("reload fixed material"));
    assert_eq!(
        store.current().serial(),
        serial_hex(&leaf_der(&second.cert_pem))
    );
    let tls = connect(client, "node-a", server.addr)
        .await
        .expect("handshake");
    server.next_handshake().await.expect("server handshake");
    assert_eq!(presented_leaf(&tls), leaf_der(&second.cert_pem));
}

// === Loading ===

#[test]
fn an_agent_refuses_to_load_a_certificate_naming_another_node() {
    let pki = Pki::new();
    let dir = pki.write("agent", &pki.issue(&node("node-b")));
    let paths = MaterialPaths::in_dir(&dir);

    match MaterialStore::load(paths.clone(), agent("node-a"), pki.domain.clone()) {
        Err(CertError::WrongIdentity {
            path,
            expected,
            found,
        }) => {
            assert_eq!(path, paths.cert);
            assert_eq!(expected, pki.uri(&node("node-a")));
            assert_eq!(found, pki.uri(&node("node-b")));
        }
        other => panic!("expected WrongIdentity, got {other:?}"),
    }
}

#[test]
fn the_proxy_refuses_to_load_an_agent_certificate() {
    let pki = Pki::new();
    let dir = pki.write("proxy", &pki.issue(&node("node-a")));

    match MaterialStore::load(MaterialPaths::in_dir(&dir), Role::Proxy, pki.domain.clone()) {
        Err(CertError::WrongIdentity {
            expected, found, ..
        }) => {
            assert_eq!(expected, pki.uri(&Identity::Proxy));
            assert_eq!(found, pki.uri(&node("node-a")));
        }
        other => panic!("expected WrongIdentity, got {other:?}"),
    }
}

#[test]
fn material_with_an_expired_own_certificate_is_refused_as_untrusted() {
    let pki = Pki::new();
    for (name, role) in [("agent", agent("node-a")), ("proxy", Role::Proxy)] {
        let dir = pki.write(name, &pki.issue_expired(&role.identity()));
        match MaterialStore::load(MaterialPaths::in_dir(&dir), role, pki.domain.clone()) {
            Err(CertError::Untrusted {
                source:
                    rustls::Error::InvalidCertificate(
                        CertificateError::Expired | CertificateError::ExpiredContext { .. },
                    ),
                ..
            }) => {}
            other => panic!("{name}: expected Untrusted(expired), got {other:?}"),
        }
    }
}

#[test]
fn material_whose_certificate_another_ca_signed_is_refused_as_untrusted() {
    let pki = Pki::new();
    let rogue = Pki::new();
    let mut issued = rogue.issue(&node("node-a"));
    issued.ca_pem = pki.ca.cert_pem().to_owned();
    let dir = pki.write("agent", &issued);

    let (cause, _) = foreign_ca_error(&pki.ca, &rogue.ca);
    match MaterialStore::load(
        MaterialPaths::in_dir(&dir),
        agent("node-a"),
        pki.domain.clone(),
    ) {
        Err(CertError::Untrusted {
            source: rustls::Error::InvalidCertificate(found),
            ..
        }) => assert_eq!(found, cause),
        other => panic!("expected Untrusted({cause:?}), got {other:?}"),
    }
}

/// A certificate the CA signed that names both `a` and `b` (as a careless
/// or compromised issuer might), presented as `a`'s agent certificate.
fn two_node_certificate(pki: &Pki, a: &str, b: &str) -> csi_scsi_certs::IssuedCertificate {
    use rcgen::{CertificateParams, ExtendedKeyUsagePurpose, Issuer, KeyPair, SanType};
    let ca_key = KeyPair::from_pem(pki.ca.key_pem()).expect("CA key");
    let issuer = Issuer::from_ca_cert_pem(pki.ca.cert_pem(), ca_key).expect("issuer");
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(vec![a.to_owned()]).expect("params");
    for n in [a, b] {
        let uri = pki.uri(&node(n));
        params
            .subject_alt_names
            .push(SanType::URI(uri.as_str().try_into().expect("uri")));
    }
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, &issuer).expect("sign");
    let mut issued = pki.issue(&node(a));
    issued.cert_pem = cert.pem();
    issued.key_pem = key.serialize_pem();
    issued
}

#[tokio::test]
async fn the_proxy_refuses_an_agent_certificate_that_names_more_than_one_node() {
    let pki = Pki::new();
    let both = two_node_certificate(&pki, "node-a", "node-b");
    let mut server = Server::spawn(plain_server_config(pki.ca.cert_pem(), &both)).await;
    // Dialling either node: the certificate names it, and another one too.
    for dialled in ["node-a", "node-b"] {
        let client =
            client_config_for_node(pki.store(Role::Proxy), dialled).expect("client config");
        let err = expect_err(connect(client, dialled, server.addr).await, "client");
        assert!(
            matches!(
                identity_rejection(rustls_error(&err)),
                IdentityRejected::WrongNode { .. }
            ),
            "{err}"
        );
        let _ = server.next_handshake().await;
    }
}

#[test]
fn a_node_name_that_reads_as_an_ip_address_is_refused_at_issue_time() {
    let pki = Pki::new();
    let err = pki
        .ca
        .issue(&node("198.18.0.7"), csi_scsi_certs::Validity::days(1))
        .expect_err("an IP-shaped node name");
    assert!(err.to_string().contains("IP address"), "{err}");
}

// === Enrolment ===

/// An agent store for `node` enrolled through a CSR, the CA naming
/// `node_uid`.
fn enrolled_store(pki: &Pki, node: &str, node_uid: Option<&str>) -> std::sync::Arc<MaterialStore> {
    let dir = pki
        .dir
        .path()
        .join(format!("enrolled-{node}-{}", node_uid.unwrap_or("none")));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("ca.crt"), pki.ca.cert_pem()).expect("ca");
    let (store, why) = MaterialStore::load_or_enrol(
        MaterialPaths::in_dir(&dir),
        agent(node),
        pki.domain.clone(),
        None,
    )
    .expect("enrolling store");
    assert!(why.is_some() && !store.current().is_enrolled());
    let key = csi_scsi_certs::PendingKey::generate(node).expect("key");
    let signed = pki
        .ca
        .sign_agent_csr(
            key.csr_pem(),
            node,
            node_uid,
            csi_scsi_certs::Validity::lasting(Duration::from_secs(3600)),
        )
        .expect("signed");
    let issued = key
        .accept(&signed.cert_pem, &signed.ca_pem)
        .expect("accepted");
    store.install(&issued).expect("installed");
    assert!(store.current().is_enrolled());
    assert_eq!(store.current().node_uid(), node_uid);
    store
}

#[tokio::test]
async fn an_enrolling_agent_is_trusted_only_once_its_signed_certificate_is_installed() {
    let pki = Pki::new();
    let dir = pki.dir.path().join("enrolling");
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("ca.crt"), pki.ca.cert_pem()).expect("ca");
    let (store, _) = MaterialStore::load_or_enrol(
        MaterialPaths::in_dir(&dir),
        agent("node-a"),
        pki.domain.clone(),
        None,
    )
    .expect("enrolling store");
    let mut server = Server::spawn(server_config(store.clone()).expect("config")).await;
    // The stand-in certificate: a proxy refuses it.
    let client = client_config_for_node(pki.store(Role::Proxy), "node-a").expect("client config");
    expect_err(
        connect(client.clone(), "node-a", server.addr).await,
        "client",
    );
    let _ = server.next_handshake().await;
    // The enrolment client (it trusts nothing the agent says) gets through.
    let enrolment =
        csi_scsi_certs::enrolment_client_config(pki.store(Role::Proxy)).expect("config");
    connect(enrolment, "node-a", server.addr)
        .await
        .expect("enrolment handshake");
    server.next_handshake().await.expect("server side");

    // A CSR asking for node-b still gets a node-a certificate: the names
    // are the signer's.
    let key = csi_scsi_certs::PendingKey::generate("node-b").expect("key");
    let signed = pki
        .ca
        .sign_agent_csr(
            key.csr_pem(),
            "node-a",
            None,
            csi_scsi_certs::Validity::lasting(Duration::from_secs(3600)),
        )
        .expect("signed");
    let other = csi_scsi_certs::PendingKey::generate("node-a").expect("key");
    // Another key's certificate is refused before anything is written.
    assert!(other.accept(&signed.cert_pem, &signed.ca_pem).is_err());
    let issued = key
        .accept(&signed.cert_pem, &signed.ca_pem)
        .expect("accept");
    // The certificate names node-a whatever the CSR said: node-a's store
    // takes it.
    store.install(&issued).expect("installed");
    assert!(dir.join("tls.crt").exists() && dir.join("tls.key").exists());
    connect(client, "node-a", server.addr)
        .await
        .expect("a proxy trusts the installed certificate");
    server.next_handshake().await.expect("server side");
}

#[tokio::test]
async fn a_certificate_issued_to_a_deleted_node_of_the_same_name_is_refused() {
    let pki = Pki::new();
    let store = enrolled_store(&pki, "node-a", Some("uid-old"));
    let mut server = Server::spawn(server_config(store).expect("config")).await;
    // The Node was deleted and created again: a new UID.
    let client = csi_scsi_certs::client_config_for_node_uid(
        pki.store(Role::Proxy),
        "node-a",
        Some("uid-new"),
    )
    .expect("client config");
    let err = expect_err(connect(client, "node-a", server.addr).await, "client");
    assert_eq!(
        identity_rejection(rustls_error(&err)),
        &IdentityRejected::StaleNode {
            node: "node-a".into(),
            expected: "uid-new".into(),
            presented: "uid-old".into(),
        }
    );
    let _ = server.next_handshake().await;
    // The same UID: accepted.
    let client = csi_scsi_certs::client_config_for_node_uid(
        pki.store(Role::Proxy),
        "node-a",
        Some("uid-old"),
    )
    .expect("client config");
    connect(client, "node-a", server.addr)
        .await
        .expect("current node");
    server.next_handshake().await.expect("server side");
}

// === The agent's check of every request ===

#[test]
fn a_remembered_proxy_chain_is_refused_once_it_expires_or_the_ca_rotates_away() {
    let pki = Pki::new();
    let first = pki.issue(&node("node-a"));
    let mut volume = SecretVolume::create(&pki.dir.path().join("agent"), &first);
    let store = MaterialStore::load(volume.paths(), agent("node-a"), pki.domain.clone())
        .expect("load agent material");
    // A proxy certificate with two seconds left.
    let short = pki
        .ca
        .issue(
            &Identity::Proxy,
            csi_scsi_certs::Validity::lasting(Duration::from_secs(2)),
        )
        .expect("issue");
    let leaf = leaf_der(&short.cert_pem);
    verify_proxy_chain(&store, std::slice::from_ref(&leaf)).expect("the proxy");
    verify_proxy_chain(&store, std::slice::from_ref(&leaf)).expect("the proxy, again");
    // Another leaf is checked in full, whatever was accepted before.
    let other_ca = Pki::new();
    let foreign = leaf_der(&other_ca.issue(&Identity::Proxy).cert_pem);
    let err = verify_proxy_chain(&store, &[foreign]).expect_err("another CA");
    assert!(
        matches!(err, rustls::Error::InvalidCertificate(_)),
        "{err:?}"
    );
    let agent_leaf = leaf_der(&first.cert_pem);
    let err = verify_proxy_chain(&store, &[agent_leaf]).expect_err("not the proxy");
    assert!(
        matches!(err, rustls::Error::InvalidCertificate(_)),
        "{err:?}"
    );
    // Past its notAfter, the very leaf accepted twice is expired.
    std::thread::sleep(Duration::from_millis(3100));
    let err = verify_proxy_chain(&store, std::slice::from_ref(&leaf)).expect_err("expired");
    assert!(
        matches!(
            err,
            rustls::Error::InvalidCertificate(
                CertificateError::Expired | CertificateError::ExpiredContext { .. }
            )
        ),
        "{err:?}"
    );

    // A proxy certificate valid for a day, accepted; then the agent's
    // trust moves to another CA: the same leaf is refused at once.
    let proxy = leaf_der(&pki.issue(&Identity::Proxy).cert_pem);
    verify_proxy_chain(&store, std::slice::from_ref(&proxy)).expect("the proxy");
    volume.rotate_to(&other_ca.issue(&node("node-a")));
    assert!(store.reload().expect("reload"), "rotated");
    let err = verify_proxy_chain(&store, std::slice::from_ref(&proxy)).expect_err("old CA");
    assert!(
        matches!(err, rustls::Error::InvalidCertificate(_)),
        "{err:?}"
    );
}
