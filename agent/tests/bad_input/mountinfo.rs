//! The mount table (`/proc/self/mountinfo`): a table the kernel would
//! print, with every byte a path may hold escaped as the kernel escapes it,
//! parses back to its mounts; a malformed line costs only itself; and no
//! text panics the parser.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use csi_scsi_agent::host::block::DeviceNumber;
use csi_scsi_agent::host::mountinfo::{Mount, MountTable};
use proptest::prelude::*;
use proptest::sample::Index;

use crate::support::{config, hostile_text, mutate};

/// The kernel's `mangle()` of a mountinfo field: space, tab, newline and
/// backslash as three-digit octal escapes.
fn escape(bytes: &[u8]) -> String {
    let mut out = Vec::with_capacity(bytes.len());
    for &b in bytes {
        if matches!(b, b' ' | b'\t' | b'\n' | b'\\') {
            out.extend_from_slice(format!("\\{b:03o}").as_bytes());
        } else {
            out.push(b);
        }
    }
    // Paths are arbitrary bytes; mountinfo is read lossily as UTF-8, so
    // generated paths are kept to valid UTF-8 (see `path_bytes`).
    String::from_utf8(out).unwrap_or_default()
}

/// An absolute path whose components hold every character a path may:
/// blanks, tabs, newlines, backslashes (and things that look like escapes),
/// `-` (the field separator), non-ASCII.
fn path_bytes() -> impl Strategy<Value = Vec<u8>> {
    let component = prop_oneof![
        "[a-z0-9._-]{1,12}",
        "[ \t\n\\\\a-z-]{1,6}",
        Just("\\040".to_owned()),
        Just("-".to_owned()),
        "[^/\0]{1,6}",
    ];
    prop::collection::vec(component, 0..5).prop_map(|cs| format!("/{}", cs.join("/")).into_bytes())
}

fn option() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9_]{0,8}(=[a-z0-9]{1,6})?"
}

fn mount() -> impl Strategy<Value = Mount> {
    (
        (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()),
        (path_bytes(), path_bytes()),
        prop::collection::vec(option(), 1..4),
        prop::collection::vec(
            prop_oneof![
                "(shared|master|propagate_from):[0-9]{1,4}",
                Just("unbindable".to_owned())
            ],
            0..3,
        ),
        "[a-z0-9]{1,8}(\\.[a-z0-9 ]{1,8})?",
        prop_oneof![
            "/dev/[a-z]{2,4}[0-9]{0,2}",
            "[^\n\r\0]{0,16}",
            Just("none".to_owned())
        ],
        prop::collection::vec(option(), 1..4),
    )
        .prop_map(
            |(
                (id, parent, major, minor),
                (root, mp),
                options,
                optional,
                fs_type,
                source,
                super_options,
            )| Mount {
                id,
                parent,
                device: DeviceNumber { major, minor },
                root: PathBuf::from(OsString::from_vec(root)),
                mount_point: PathBuf::from(OsString::from_vec(mp)),
                options,
                optional,
                fs_type,
                source,
                super_options,
            },
        )
}

/// The line the kernel prints for `m`.
fn line(m: &Mount) -> String {
    let mut fields = vec![
        m.id.to_string(),
        m.parent.to_string(),
        format!("{}:{}", m.device.major, m.device.minor),
        escape(m.root.as_os_str().as_encoded_bytes()),
        escape(m.mount_point.as_os_str().as_encoded_bytes()),
        m.options.join(","),
    ];
    fields.extend(m.optional.iter().cloned());
    fields.push("-".to_owned());
    fields.push(escape(m.fs_type.as_bytes()));
    fields.push(escape(m.source.as_bytes()));
    fields.push(m.super_options.join(","));
    fields.join(" ")
}

fn table(mounts: &[Mount]) -> String {
    mounts.iter().map(|m| line(m) + "\n").collect()
}

/// Whether `want` appears in `got` in order (other entries may be between).
fn is_subsequence(want: &[Mount], got: &[Mount]) -> bool {
    let mut it = got.iter();
    want.iter().all(|w| it.any(|g| g == w))
}

/// A line that is not quite a mountinfo line (or is not one at all); never
/// holds a newline, so it is one line.
fn junk_line(valid: String) -> impl Strategy<Value = String> {
    prop_oneof![
        hostile_text(),
        (any::<Index>(), crate::support::nasty_char(), 0u8..9)
            .prop_map(move |(at, c, op)| mutate(&valid, at, c, op)),
        Just(String::new()),
        Just("22 27 0:21 / /proc rw,relatime proc proc rw".to_owned()),
        Just("25 27 0:6 /".to_owned()),
    ]
    .prop_map(|j| j.replace('\n', " "))
}

proptest! {
    #![proptest_config(config(1024))]

    /// A table the kernel could print parses back to its mounts, paths
    /// byte for byte.
    #[test]
    fn mount_tables_round_trip(mounts in prop::collection::vec(mount(), 0..8)) {
        let text = table(&mounts);
        let parsed = MountTable::parse(&text);
        prop_assert_eq!(parsed.mounts(), &mounts[..], "table:\n{}", text);
        for m in &mounts {
            let at = parsed.mount_at(&m.mount_point).map(|m| m.mount_point.clone());
            prop_assert_eq!(at.as_deref(), Some(m.mount_point.as_path()));
        }
    }

    /// A malformed line (or one of any text at all) among good ones costs
    /// only itself: every good mount is still there, in order.
    #[test]
    fn a_bad_line_costs_only_itself(
        (mounts, junk, at) in prop::collection::vec(mount(), 1..6).prop_flat_map(|mounts| {
            let sample = line(&mounts[0]);
            (Just(mounts), prop::collection::vec(junk_line(sample), 1..4), prop::collection::vec(any::<Index>(), 3))
        }),
    ) {
        let mut lines: Vec<String> = mounts.iter().map(line).collect();
        for (j, i) in junk.iter().zip(&at) {
            let k = i.index(lines.len() + 1);
            lines.insert(k, j.clone());
        }
        let text = lines.join("\n");
        let parsed = MountTable::parse(&text);
        prop_assert!(is_subsequence(&mounts, parsed.mounts()), "lost a good mount in:\n{}", text);
    }

    /// No text panics the parser or its queries, and whatever it returns
    /// has a mount point and a filesystem type.
    #[test]
    fn any_text_parses_without_panicking(text in prop_oneof![
        hostile_text(),
        prop::collection::vec(hostile_text(), 0..6).prop_map(|l| l.join("\n")),
        (prop::collection::vec(mount(), 1..3), any::<Index>(), crate::support::nasty_char(), 0u8..9)
            .prop_map(|(m, at, c, op)| mutate(&table(&m), at, c, op)),
    ]) {
        let parsed = MountTable::parse(&text);
        for m in parsed.mounts() {
            prop_assert!(!m.mount_point.as_os_str().is_empty());
            prop_assert!(!m.fs_type.is_empty());
            let _ = m.read_only();
            let _ = m.filesystem_read_only();
            let _ = parsed.mounts_of(m.device).count();
            let _ = parsed.mounts_under(&m.mount_point).count();
        }
        let _ = parsed.mount_at(Path::new("/"));
    }
}
