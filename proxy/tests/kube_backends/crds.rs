//! The checked-in CRDs equal what the Rust types generate.

use std::path::Path;

#[test]
fn checked_in_crds_equal_the_generated_ones() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
    let files = csi_scsi_proxy::resources::crd_files().unwrap();
    let fix = "regenerate with `cargo run -p csi-scsi-proxy --bin crdgen -- --write deploy/crds`";
    for (name, yaml) in &files {
        let path = dir.join(name);
        let on_disk = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; {fix}", path.display()));
        assert!(
            on_disk == *yaml,
            "{} differs from the Rust types; {fix}",
            path.display()
        );
    }
    // No stale CRD file lingers beside them.
    let mut listed: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".csi-scsi.io.yaml"))
        .collect();
    listed.sort();
    let mut expected: Vec<String> = files.iter().map(|(n, _)| n.clone()).collect();
    expected.sort();
    assert_eq!(
        listed, expected,
        "deploy/crds holds CRDs the types do not generate; {fix}"
    );
}

#[test]
fn the_crds_are_the_three_kinds_with_status_subresources() {
    let crds = csi_scsi_proxy::resources::crds();
    let names: Vec<_> = crds
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    assert_eq!(
        names,
        [
            "scsitargets.csi-scsi.io",
            "scsidevices.csi-scsi.io",
            "pendingresizerequests.csi-scsi.io"
        ]
    );
    let scopes: Vec<_> = crds.iter().map(|c| c.spec.scope.as_str()).collect();
    assert_eq!(scopes, ["Cluster", "Cluster", "Namespaced"]);
    for crd in &crds {
        let v = &crd.spec.versions[0];
        assert_eq!(v.name, "v1alpha1");
        assert!(
            v.subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some(),
            "{:?} has no status subresource",
            crd.metadata.name
        );
    }
    let columns: Vec<_> = crds[1].spec.versions[0]
        .additional_printer_columns
        .iter()
        .flatten()
        .filter(|c| c.priority.unwrap_or(0) == 0)
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        columns,
        ["LUN", "Serial", "Phase", "Size", "PV", "Published", "Age"]
    );
    // Every column's path is one the schema has, and none is a list that
    // grows with the nodes that see the LUN.
    let schema = serde_json::to_value(&crds[1].spec.versions[0].schema).unwrap();
    for c in crds[1].spec.versions[0]
        .additional_printer_columns
        .iter()
        .flatten()
    {
        let mut at = &schema["openAPIV3Schema"];
        // `metadata` is the server's, not in the schema.
        for field in c.json_path.trim_start_matches('.').split('.') {
            if field == "metadata" {
                break;
            }
            at = &at["properties"][field];
        }
        assert!(
            !at.is_null(),
            "column {} names {}: not in the schema",
            c.name,
            c.json_path
        );
        assert!(
            !c.json_path.contains("nodeNames") && !c.json_path.contains(".nodes"),
            "column {} lists every node that sees the LUN",
            c.name
        );
    }
}
