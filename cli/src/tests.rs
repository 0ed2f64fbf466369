//! The CLI over documents as the servers write them: the same output as
//! before it read them typed (the `.golden` files were printed by the
//! string-walking renderer from the same `.json` documents), and a clear
//! refusal of a document it cannot read.

use super::*;

const DOCUMENTS: [(&str, &str, &str); 4] = [
    (
        "agent",
        include_str!("testdata/agent.json"),
        include_str!("testdata/agent.golden"),
    ),
    (
        "proxy",
        include_str!("testdata/proxy.json"),
        include_str!("testdata/proxy.golden"),
    ),
    (
        "agent-empty",
        include_str!("testdata/agent-empty.json"),
        include_str!("testdata/agent-empty.golden"),
    ),
    (
        "proxy-empty",
        include_str!("testdata/proxy-empty.json"),
        include_str!("testdata/proxy-empty.golden"),
    ),
];

const COMMANDS: [Command; 5] = [
    Command::Status,
    Command::Devices,
    Command::Volumes,
    Command::Agents,
    Command::Errors,
];

fn endpoint() -> fetch::Endpoint {
    fetch::Endpoint::parse("127.0.0.1:9811").expect("endpoint")
}

fn parse(text: &str) -> Value {
    serde_json::from_str(text).expect("JSON")
}

/// Every command and format over `raw`, in the golden files' layout.
fn everything(raw: &Value) -> String {
    let doc = read_status(&endpoint(), raw).expect("a status document");
    let mut out = String::new();
    let not_ready = || Err(vec!["tls: expired".into(), "csi socket: missing".into()]);
    for ready in [Ok(()), not_ready()] {
        for output in [Output::Table, Output::Json] {
            for command in COMMANDS {
                if ready.is_err() && command != Command::Status {
                    continue;
                }
                out += &format!("==== {command:?} {output:?} ready={}\n", ready.is_ok());
                let asked = (command == Command::Status).then(|| ready.clone());
                match show(&endpoint(), raw.clone(), &doc, command, output, asked) {
                    Ok(text) => out += &text,
                    Err(e) => {
                        let Status::Agent(a) = &doc else {
                            panic!("{command:?} on the proxy: {e:#}")
                        };
                        assert!(e.to_string().contains("point --url at the proxy"), "{e:#}");
                        out += &format!("ERROR node {}\n", a.node);
                    }
                }
            }
        }
    }
    out
}

#[test]
fn tables_and_json_are_what_they_were() {
    for (name, json, golden) in DOCUMENTS {
        let out = everything(&parse(json));
        if out != golden {
            let line = out
                .lines()
                .zip(golden.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            panic!(
                "{name}: output differs from {name}.golden at line {}:\n{}",
                line + 1,
                out.lines()
                    .skip(line.saturating_sub(3))
                    .take(8)
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
    }
}

#[test]
fn a_document_the_server_writes_reads_back_whole() {
    for (name, json, _) in DOCUMENTS {
        let raw = parse(json);
        let doc = read_status(&endpoint(), &raw).expect(name);
        // What the server serialises (with its schema) is what the CLI reads.
        let written = serde_json::to_value(&doc).expect("write");
        assert_eq!(written["schema"], SCHEMA, "{name}");
        let mut without_schema = written.clone();
        without_schema
            .as_object_mut()
            .expect("object")
            .remove("schema");
        assert_eq!(without_schema, raw, "{name}: nothing lost or added");
        assert_eq!(
            read_status(&endpoint(), &written).expect(name),
            doc,
            "{name}"
        );
    }
}

#[test]
fn a_newer_schema_is_refused_with_what_to_do() {
    let mut raw = parse(DOCUMENTS[1].1);
    raw["schema"] = (SCHEMA + 1).into();
    // A newer document may have changed any field's shape.
    raw["devices"] = serde_json::json!({"by_wwid": {}});
    let e = read_status(&endpoint(), &raw).expect_err("newer schema");
    let text = format!("{e:#}");
    assert!(
        text.starts_with("http://127.0.0.1:9811/status: status schema 2 is newer")
            && text.contains("(schema 1)")
            && text.contains("use a csi-scsi CLI of the server's release or later"),
        "{text}"
    );
}

#[test]
fn other_documents_are_refused_by_what_is_wrong() {
    let e =
        read_status(&endpoint(), &serde_json::json!({"status": "ok"})).expect_err("no component");
    assert_eq!(
        e.to_string(),
        "http://127.0.0.1:9811 does not look like a csi-scsi status endpoint (no component in its /status)"
    );
    let e = read_status(&endpoint(), &serde_json::json!([1, 2])).expect_err("an array");
    assert!(e.to_string().contains("no component in its /status"), "{e}");
    let e = read_status(&endpoint(), &serde_json::json!({"component": "kubelet"}))
        .expect_err("another component");
    assert!(e.to_string().contains("of component \"kubelet\""), "{e}");
    let mut broken = parse(DOCUMENTS[0].1);
    broken["devices"] = "none".into();
    let e = read_status(&endpoint(), &broken).expect_err("a broken document");
    let text = format!("{e:#}");
    assert!(
        text.starts_with(
            "http://127.0.0.1:9811/status does not read as a schema 1 agent document: "
        ),
        "{text}"
    );
}

/// A reader off the server's machine is told that what it reads is cut.
#[test]
fn a_redacted_document_says_so() {
    for (name, json, _) in DOCUMENTS {
        let doc = read_status(&endpoint(), &parse(json)).expect(name);
        let full = render::status(&doc, &Ok(()));
        assert!(!full.contains("redacted"), "{name}: {full}");
        let cut = render::status(&doc.redacted(), &Ok(()));
        assert!(
            cut.lines()
                .any(|l| l.starts_with("view") && l.contains("redacted: this reader is not")),
            "{name}: {cut}"
        );
    }
}

/// A missing `--url` is a usage error (exit status 2, as the docs say)
/// that tells how to reach the proxy and an agent; there is no default
/// address, which on Kubernetes would reach nothing.
#[test]
fn a_missing_url_is_a_usage_error_that_says_where_the_endpoints_are() {
    let url = Cli::command()
        .get_arguments()
        .find(|a| a.get_id() == "url")
        .cloned()
        .expect("the --url argument");
    assert!(url.get_default_values().is_empty(), "--url has no default");
    assert_eq!(
        url.get_env().and_then(|e| e.to_str()),
        Some("CSI_SCSI_STATUS_URL")
    );
    let e = missing_url();
    assert_eq!(e.kind(), clap::error::ErrorKind::MissingRequiredArgument);
    assert_eq!(e.exit_code(), 2);
    let text = e.render().to_string();
    for needed in [
        "pass --url or set CSI_SCSI_STATUS_URL",
        "kubectl -n csi-scsi port-forward deploy/csi-scsi-controller 9812",
        "--url 127.0.0.1:9812",
        "--url <node address>:9811",
        "kubectl -n csi-scsi get pods -l app.kubernetes.io/name=csi-scsi-node -o wide",
    ] {
        assert!(text.contains(needed), "{needed:?} missing from:\n{text}");
    }
}

/// What the hint and docs/operations.md say is what deploy/ installs: the
/// controller's name and status port, the agents' label and that they
/// bind the node's address on 9811.
#[test]
fn the_hint_and_the_docs_name_what_the_manifests_install() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let read = |path: &str| {
        std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
    };
    let controller = read("deploy/base/controller.yaml");
    let node = read("deploy/base/node.yaml");
    let kustomization = read("deploy/base/kustomization.yaml");
    for (manifest, text, needed) in [
        ("kustomization.yaml", &kustomization, "namespace: csi-scsi"),
        ("controller.yaml", &controller, "name: csi-scsi-controller"),
        (
            "controller.yaml",
            &controller,
            "--status-listen=0.0.0.0:9812",
        ),
        ("node.yaml", &node, "app.kubernetes.io/name: csi-scsi-node"),
        ("node.yaml", &node, "hostNetwork: true"),
        ("node.yaml", &node, "--status-listen=$(POD_IP):9811"),
    ] {
        assert!(
            text.contains(needed),
            "deploy/base/{manifest} no longer has {needed:?}: fix WHERE in cli/src/main.rs and docs/operations.md"
        );
    }
    let operations = read("docs/operations.md");
    for needed in [
        "`--url` (env `CSI_SCSI_STATUS_URL`, no default)",
        "kubectl -n csi-scsi port-forward deploy/csi-scsi-controller 9812",
        "kubectl -n csi-scsi get pods -l app.kubernetes.io/name=csi-scsi-node -o wide",
    ] {
        assert!(
            operations.contains(needed),
            "docs/operations.md does not say {needed:?}"
        );
    }
}
