//! The documents say what the code does. Each test reads a document an
//! operator reads and checks it against the code (or the manifests) that
//! it describes, so the two cannot drift apart unnoticed:
//!
//! - `docs/parameters.md`'s parameter table names exactly the keys the
//!   proxy's parser accepts (`parameters::KEYS`), each value it lists is
//!   accepted, and the StorageClasses in `deploy/examples/` parse;
//! - `docs/operations.md`'s readiness table names every readiness check
//!   the daemons define, and only those;
//! - every "Kubernetes 1.N or newer" in the README and `docs/` names the
//!   chart's minimum (`kubeVersion` in `deploy/chart/csi-scsi/Chart.yaml`),
//!   as do the support tables.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use csi_scsi_proxy::parameters::{
    self, ClassParameters, InvalidParameter, KEYS, PROVISIONER_PREFIX,
};

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The lines of the section of `doc` under the heading `heading` (up to
/// the next heading of the same or a higher level; a `#` line in a code
/// block is no heading).
fn section<'a>(doc: &'a str, heading: &str) -> Vec<&'a str> {
    let level = heading.chars().take_while(|c| *c == '#').count();
    let mut lines = doc.lines().skip_while(|l| l.trim_end() != heading);
    assert!(lines.next().is_some(), "no heading {heading:?}");
    let mut in_code = false;
    lines
        .take_while(|l| {
            if l.trim_start().starts_with("```") {
                in_code = !in_code;
            }
            let hashes = l.chars().take_while(|c| *c == '#').count();
            in_code || !(hashes > 0 && hashes <= level && l[hashes..].starts_with(' '))
        })
        .collect()
}

/// The cells of a Markdown table row (`| a | b |`), trimmed; `None` for
/// a line that is no row, or the header's rule.
fn cells(line: &str) -> Option<Vec<&str>> {
    let inner = line.trim().strip_prefix('|')?.strip_suffix('|')?;
    let cells: Vec<&str> = inner.split(" | ").map(str::trim).collect();
    if cells
        .iter()
        .all(|c| c.chars().all(|ch| ch == '-' || ch == ' '))
    {
        return None;
    }
    Some(cells)
}

/// The `code spans` of `text`, in order.
fn code_spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// The rows of the first table in `lines` whose first cell is one code
/// span: that span and the row's cells.
fn keyed_rows<'a>(lines: &[&'a str]) -> Vec<(&'a str, Vec<&'a str>)> {
    lines
        .iter()
        .filter_map(|l| cells(l))
        .filter_map(|row| {
            let key = row[0].strip_prefix('`')?.strip_suffix('`')?;
            (!key.contains('`')).then_some((key, row))
        })
        .collect()
}

// === docs/parameters.md ===

#[test]
fn the_parameter_table_names_exactly_the_keys_the_proxy_accepts() {
    let doc = read(&root().join("docs/parameters.md"));
    let rows = keyed_rows(&section(&doc, "## Parameters"));
    assert!(!rows.is_empty(), "no parameter table under '## Parameters'");

    let documented: BTreeSet<&str> = rows
        .iter()
        .map(|(key, _)| *key)
        .filter(|k| !k.starts_with(PROVISIONER_PREFIX))
        .collect();
    let accepted: BTreeSet<&str> = KEYS.into_iter().collect();
    assert_eq!(
        documented, accepted,
        "docs/parameters.md's table (left) and parameters::KEYS (right) differ"
    );

    for (key, row) in &rows {
        let values = code_spans(row[1]);
        assert!(!values.is_empty(), "{key}: no `value` listed");
        for value in values {
            if key.starts_with(PROVISIONER_PREFIX) {
                // The provisioner strips it and passes the filesystem in
                // the volume capability, which the proxy checks so.
                assert_eq!(
                    *key, "csi.storage.k8s.io/fstype",
                    "a provisioner key the proxy does not read: say how it is used"
                );
                parameters::fs_type(value)
                    .unwrap_or_else(|e| panic!("{key}: documented value {value:?} refused: {e}"));
                continue;
            }
            let one = HashMap::from([(key.to_string(), value.to_string())]);
            ClassParameters::parse(&one)
                .unwrap_or_else(|e| panic!("{key}: documented value {value:?} refused: {e}"));
        }
    }
}

/// The document says `mkfsOptions` is no StorageClass parameter: the
/// proxy refuses it like any unknown key.
#[test]
fn mkfs_options_are_refused_as_the_document_says() {
    let doc = read(&root().join("docs/parameters.md"));
    assert!(
        doc.contains("`mkfsOptions` is **not** a StorageClass parameter"),
        "docs/parameters.md no longer says mkfsOptions is refused: update this test"
    );
    let asked = HashMap::from([("mkfsOptions".to_owned(), "-m 0".to_owned())]);
    assert_eq!(
        ClassParameters::parse(&asked).err(),
        Some(InvalidParameter::Unknown("mkfsOptions".into()))
    );
}

#[test]
fn the_example_storage_classes_parse() {
    let dir = root().join("deploy/examples");
    let mut classes = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = read(&path);
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for doc in docs
            .iter()
            .filter(|d| d["kind"] == "StorageClass" && d["provisioner"] == "csi-scsi.io")
        {
            classes += 1;
            let params: HashMap<String, String> =
                serde_json::from_value(doc["parameters"].clone()).unwrap_or_default();
            ClassParameters::parse(&params).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            if let Some(fs) = params.get("csi.storage.k8s.io/fstype") {
                parameters::fs_type(fs).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            }
        }
    }
    assert!(
        classes > 0,
        "no csi-scsi.io StorageClass in {}",
        dir.display()
    );
}

// === docs/operations.md: readiness checks ===

/// Every readiness check the daemons define: its name and the crate
/// (`daemon`, `proxy`, `agent`) that defines it. Read from the sources
/// (most checks are private to their binary): each `impl ... Check for
/// <type>` outside test code, and the literal its `name()` returns.
fn defined_checks() -> BTreeMap<String, &'static str> {
    let mut out = BTreeMap::new();
    for krate in ["daemon", "proxy", "agent"] {
        let mut files = Vec::new();
        rust_files(&root().join(krate).join("src"), &mut files);
        for file in files {
            if file.file_name().is_some_and(|n| n == "tests.rs") {
                continue;
            }
            let text = read(&file);
            // A test's stand-in check is none the binaries register.
            let lines: Vec<&str> = text
                .lines()
                .take_while(|l| l.trim() != "#[cfg(test)]")
                .collect();
            for (i, line) in lines.iter().enumerate() {
                let line = line.trim();
                let is_check_impl = line.starts_with("impl")
                    && (line.contains(" Check for ") || line.contains("::Check for "));
                // The one forwarding impl (`Box<C>`) names no check.
                if !is_check_impl || line.contains("Check for Box<") {
                    continue;
                }
                let name = lines[i..]
                    .iter()
                    .position(|l| l.trim() == "fn name(&self) -> &str {")
                    .and_then(|at| lines.get(i + at + 1))
                    .map(|l| l.trim())
                    .and_then(|l| l.strip_prefix('"')?.strip_suffix('"'))
                    .unwrap_or_else(|| {
                        panic!(
                            "{}:{}: {line}: its name() is not a literal this test can read",
                            file.display(),
                            i + 1
                        )
                    });
                let before = out.insert(name.to_owned(), krate);
                assert!(before.is_none(), "two checks named {name:?}");
            }
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn the_readiness_table_names_every_check_the_code_defines() {
    let defined = defined_checks();
    // The source reading itself is checked: these exist today.
    for known in ["tls", "csi-socket", "leader", "kubelet-registration"] {
        assert!(
            defined.contains_key(known),
            "{known} not found: {defined:?}"
        );
    }
    let doc = read(&root().join("docs/operations.md"));
    let rows = keyed_rows(&section(&doc, "### Readiness checks"));
    let documented: BTreeSet<&str> = rows.iter().map(|(name, _)| *name).collect();
    let in_code: BTreeSet<&str> = defined.keys().map(String::as_str).collect();
    assert_eq!(
        documented, in_code,
        "docs/operations.md's readiness table (left) and the checks in daemon/, proxy/ and agent/ (right) differ"
    );
    // A check of one binary's crate is that binary's.
    for (name, row) in rows {
        let binary = row[1];
        match defined[name] {
            "proxy" => assert!(binary.starts_with("proxy"), "{name}: {binary}"),
            "agent" => assert!(binary.starts_with("agent"), "{name}: {binary}"),
            _ => assert!(
                ["both", "agent", "proxy"]
                    .iter()
                    .any(|b| binary.starts_with(b)),
                "{name}: {binary}"
            ),
        }
    }
}

// === The minimum Kubernetes version ===

/// The chart's minimum minor (`kubeVersion: ">=1.N.0-0"`).
fn minimum_minor() -> u32 {
    let chart = read(&root().join("deploy/chart/csi-scsi/Chart.yaml"));
    let line = chart
        .lines()
        .find_map(|l| l.strip_prefix("kubeVersion:"))
        .expect("Chart.yaml has a kubeVersion");
    let version = line.trim().trim_matches('"').strip_prefix(">=1.").unwrap();
    version.split('.').next().unwrap().parse().unwrap()
}

/// The minor of `1.N` at the start of `text`, and the rest.
fn minor_at(text: &str) -> Option<(u32, &str)> {
    let rest = text.strip_prefix("1.")?;
    let digits = rest.chars().take_while(char::is_ascii_digit).count();
    Some((rest[..digits].parse().ok()?, &rest[digits..]))
}

/// Every document an adopter reads, with its path.
fn documents() -> Vec<(String, String)> {
    let mut out = vec![("README.md".to_owned(), read(&root().join("README.md")))];
    for entry in std::fs::read_dir(root().join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            let name = format!("docs/{}", path.file_name().unwrap().to_string_lossy());
            out.push((name, read(&path)));
        }
    }
    out.sort();
    out
}

#[test]
fn every_minimum_kubernetes_version_the_documents_state_is_the_charts() {
    let min = minimum_minor();
    let mut wrong = Vec::new();
    for (name, text) in documents() {
        // Lines wrap anywhere: read the words as one line.
        let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
        for (at, _) in flat.match_indices("Kubernetes ") {
            let after = &flat[at + "Kubernetes ".len()..];
            let (at_least, after) = match after.strip_prefix("≥ ").or(after.strip_prefix(">= ")) {
                Some(rest) => (true, rest),
                None => (false, after),
            };
            let Some((minor, rest)) = minor_at(after) else {
                continue;
            };
            // "1.N or newer", "1.N+", "1.N to 1.M": a floor.
            let floor = at_least
                || [
                    " or newer",
                    " or later",
                    " and later",
                    " and newer",
                    "+",
                    " to 1.",
                ]
                .iter()
                .any(|s| rest.starts_with(s));
            if floor && minor != min {
                let context: String = flat[at..].chars().take(60).collect();
                wrong.push(format!(
                    "{name}: \"{context}...\" (the chart's minimum is 1.{min})"
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "documents state another minimum Kubernetes version:\n{}",
        wrong.join("\n")
    );
}

/// The support tables (`docs/kubernetes.md`'s matrix, `docs/compatibility.md`,
/// any other): a row `Kubernetes 1.N ...` that says "oldest supported" names
/// the chart's minimum, and a row `Kubernetes ≤ 1.N` or `Kubernetes 1.N and
/// older` that says "not supported" the minor below it.
#[test]
fn the_support_tables_start_at_the_charts_minimum() {
    let min = minimum_minor();
    let (mut oldest, mut unsupported) = (0, 0);
    for (name, text) in documents() {
        for row in text.lines().filter_map(cells) {
            let Some(first) = row[0].strip_prefix("Kubernetes ") else {
                continue;
            };
            let says = |what: &str| row[1..].iter().any(|c| c.contains(what));
            if says("oldest supported") {
                oldest += 1;
                let (minor, _) = minor_at(first).expect("a minor");
                assert_eq!(minor, min, "{name}: {}", row.join(" | "));
            }
            let below = first
                .strip_prefix("≤ ")
                .and_then(minor_at)
                .or_else(|| minor_at(first).filter(|(_, rest)| rest.starts_with(" and older")));
            if let Some((minor, _)) = below.filter(|_| says("not supported")) {
                unsupported += 1;
                assert_eq!(minor + 1, min, "{name}: {}", row.join(" | "));
                if says("kubeVersion") {
                    assert!(
                        says(&format!("`>=1.{min}.0-0`")),
                        "{name} quotes another kubeVersion than the chart's: {}",
                        row.join(" | ")
                    );
                }
            }
        }
    }
    assert!(
        oldest > 0,
        "no support table names the oldest supported minor"
    );
    assert!(
        unsupported > 0,
        "no support table names the minors not supported"
    );
}
