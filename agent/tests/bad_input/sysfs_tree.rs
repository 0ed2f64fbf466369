//! The sysfs readers (SCSI disks, multipath maps, iSCSI sessions, FC hosts
//! and remote ports) over generated trees: entry names one edit away from
//! the kernel's (`host3`, `rport-3:0-1`, `session7`, `sdb`, `3:0:0:1`) and
//! attributes of arbitrary bytes or near misses. Nothing panics; what is
//! read is well formed; a malformed entry is skipped, not fatal; a name
//! that is not one path component is refused before any path is built.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::path::Path;
use std::time::Duration;

use csi_scsi_agent::host::Host;
use csi_scsi_agent::host::command::CommandRunner;
use csi_scsi_agent::host::fc::{self, Wwpn};
use csi_scsi_agent::host::sysfs::{self, Hctl};
use csi_scsi_contract::Wwid;
use proptest::prelude::*;
use proptest::sample::select;

use crate::generators::canonical_wwid;
use crate::support::{config, hostile_text, near_miss, valid_or_near};

/// One directory of the tree, with its attribute files.
#[derive(Clone, Debug)]
struct Entry {
    class: &'static str,
    name: String,
    attrs: Vec<(&'static str, Vec<u8>)>,
}

/// A file name the filesystem accepts, as close to `name` as possible.
fn file_name(name: &str) -> String {
    let mut s: String = name.replace(['/', '\0'], "_");
    while s.len() > 200 {
        s.pop();
    }
    if s.is_empty() || s == "." || s == ".." {
        "x".to_owned()
    } else {
        s
    }
}

/// An attribute: a near miss of `valid` (with the kernel's newline), or
/// arbitrary bytes.
fn attr(valid: Vec<&'static str>) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => valid_or_near(select(valid.into_iter().map(str::to_owned).collect::<Vec<_>>()))
            .prop_map(|s| format!("{s}\n").into_bytes()),
        1 => prop::collection::vec(any::<u8>(), 0..64),
        1 => hostile_text().prop_map(String::into_bytes),
    ]
}

fn wwpn_attr() -> impl Strategy<Value = Vec<u8>> {
    attr(vec![
        "0x500a0981891b8dc5",
        "0x21000024ff3b1c2e",
        "0x5006016046e0a1b2",
        "50:0a:09:81:89:1b:8d:c5",
    ])
}

fn name(valid: Vec<&'static str>) -> impl Strategy<Value = String> {
    valid_or_near(select(
        valid.into_iter().map(str::to_owned).collect::<Vec<_>>(),
    ))
    .prop_map(|n| file_name(&n))
}

fn fc_host() -> impl Strategy<Value = Entry> {
    (
        name(vec!["host3", "host10"]),
        wwpn_attr(),
        wwpn_attr(),
        attr(vec!["Online", "Linkdown"]),
    )
        .prop_map(|(name, p, n, s)| Entry {
            class: "class/fc_host",
            name,
            attrs: vec![("port_name", p), ("node_name", n), ("port_state", s)],
        })
}

fn remote_port() -> impl Strategy<Value = Entry> {
    (
        name(vec!["rport-3:0-1", "rport-10:0-12"]),
        wwpn_attr(),
        attr(vec!["0", "1", "-1", "4294967296"]),
        attr(vec!["FCP Target", "FCP Initiator"]),
    )
        .prop_map(|(name, p, t, r)| Entry {
            class: "class/fc_remote_ports",
            name,
            attrs: vec![("port_name", p), ("scsi_target_id", t), ("roles", r)],
        })
}

fn fc_transport() -> impl Strategy<Value = Entry> {
    (name(vec!["target3:0:1", "target10:0:2"]), wwpn_attr()).prop_map(|(name, p)| Entry {
        class: "class/fc_transport",
        name,
        attrs: vec![("port_name", p)],
    })
}

fn iscsi_session() -> impl Strategy<Value = Entry> {
    (
        name(vec!["session7", "session12"]),
        attr(vec!["iqn.2003-01.org.linux-iscsi.array-a:lun0", ""]),
        attr(vec!["LOGGED_IN", "FAILED"]),
        attr(vec!["1", "-1"]),
    )
        .prop_map(|(name, t, s, g)| Entry {
            class: "class/iscsi_session",
            name,
            attrs: vec![("targetname", t), ("state", s), ("tpgt", g)],
        })
}

fn scsi_host() -> impl Strategy<Value = Entry> {
    name(vec!["host3", "host0"]).prop_map(|name| Entry {
        class: "class/scsi_host",
        name,
        attrs: Vec::new(),
    })
}

/// A block device: a SCSI disk (`device` a link to a directory named by
/// its address, with identity and state) or a dm map.
fn block() -> impl Strategy<Value = (Entry, Option<(String, Entry)>)> {
    let wwid = canonical_wwid()
        .prop_filter("fits", |c| c.len() <= 256)
        .boxed();
    let wwid_text = prop_oneof![
        wwid.clone(),
        near_miss(wwid.clone()),
        Just("iqn.2003-01.org.linux-iscsi.array-a:lun0".to_owned()),
        hostile_text(),
    ]
    .prop_map(|s| format!("{s}\n").into_bytes());
    let uuid = prop_oneof![
        wwid.clone().prop_map(|w| format!(
            "mpath-{}",
            Wwid::parse(&w).map(|w| w.udev_serial()).unwrap_or(w)
        )),
        near_miss(Just("mpath-36001405d27e5d898829468b90ce4ef8c".to_owned())),
        Just("LVM-abc".to_owned()),
    ]
    .prop_map(String::into_bytes);
    let page = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..80),
        prop::collection::vec(any::<u8>(), 12..40).prop_map(|mut b| {
            b[0] = 0;
            b[1] = 0x83;
            b
        }),
    ];
    let disk = (
        name(vec!["sdb", "sdaa"]),
        name(vec!["3:0:0:1", "10:0:2:18446744073709551615"]),
        attr(vec!["0", "14", "5"]),
        wwid_text,
        page,
        attr(vec!["2097152", "0", "18446744073709551615"]),
        attr(vec!["0", "1"]),
        attr(vec!["running", "offline"]),
        attr(vec!["LIO-ORG "]),
    )
        .prop_map(|(name, hctl, ty, wwid, vpd, size, ro, state, vendor)| {
            (
                Entry {
                    class: "block",
                    name,
                    attrs: vec![("size", size), ("ro", ro)],
                },
                Some((
                    hctl.clone(),
                    Entry {
                        class: "devices",
                        name: hctl,
                        attrs: vec![
                            ("type", ty),
                            ("wwid", wwid),
                            ("vpd_pg83", vpd),
                            ("state", state),
                            ("vendor", vendor),
                        ],
                    },
                )),
            )
        });
    let map = (
        name(vec!["dm-3", "dm-12"]),
        uuid,
        attr(vec!["mpatha"]),
        attr(vec!["2097152"]),
        attr(vec!["0", "1"]),
    )
        .prop_map(|(name, uuid, alias, size, suspended)| {
            (
                Entry {
                    class: "block",
                    name,
                    attrs: vec![
                        ("dm/uuid", uuid),
                        ("dm/name", alias),
                        ("size", size),
                        ("dm/suspended", suspended),
                    ],
                },
                None,
            )
        });
    prop_oneof![2 => disk, 1 => map]
}

#[derive(Clone, Debug)]
struct Tree {
    entries: Vec<Entry>,
    blocks: Vec<(Entry, Option<(String, Entry)>)>,
}

fn tree() -> impl Strategy<Value = Tree> {
    (
        prop::collection::vec(
            prop_oneof![
                fc_host(),
                remote_port(),
                fc_transport(),
                iscsi_session(),
                scsi_host()
            ],
            0..8,
        ),
        prop::collection::vec(block(), 0..5),
    )
        .prop_map(|(entries, blocks)| Tree { entries, blocks })
}

fn write_attrs(dir: &Path, attrs: &[(&str, Vec<u8>)]) {
    for (name, bytes) in attrs {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("mkdir attr parent");
        }
        std::fs::write(&path, bytes).expect("write attr");
    }
}

/// Writes `tree` under `root`.
fn build(root: &Path, tree: &Tree) {
    for e in &tree.entries {
        let dir = root.join(e.class).join(&e.name);
        std::fs::create_dir_all(&dir).expect("mkdir entry");
        write_attrs(&dir, &e.attrs);
    }
    for (i, (b, device)) in tree.blocks.iter().enumerate() {
        let dir = root.join("block").join(&b.name);
        std::fs::create_dir_all(&dir).expect("mkdir block");
        write_attrs(&dir, &b.attrs);
        if let Some((hctl, d)) = device {
            // Like the kernel: block/sdX/device -> ../../devices/.../H:C:T:L
            let dev = root
                .join(format!("devices/platform/host{i}/session{i}/target{i}"))
                .join(hctl);
            std::fs::create_dir_all(&dev).expect("mkdir device");
            write_attrs(&dev, &d.attrs);
            let link = dir.join("device");
            if !link.exists() {
                std::os::unix::fs::symlink(&dev, &link).expect("device link");
            }
        }
    }
}

fn host_at(root: &Path) -> Host {
    Host {
        sysfs: root.to_owned(),
        dev: root.join("dev"),
        mountinfo: root.join("mountinfo"),
        kubelet_dir: root.join("kubelet"),
        iscsi_nodes: std::path::PathBuf::from("/nonexistent/iscsi/nodes"),
        tools: BTreeMap::new(),
        runner: CommandRunner::new(Duration::from_secs(5)),
    }
}

fn check_wwid(w: &Wwid) -> Result<(), TestCaseError> {
    prop_assert_eq!(Wwid::parse(w.as_str()), Ok(w.clone()));
    Ok(())
}

/// `rport-H:C-N` as `(H, C)`, the oracle for remote port names.
fn rport(name: &str) -> Option<(u32, u32)> {
    let (hc, n) = name.strip_prefix("rport-")?.rsplit_once('-')?;
    let (h, c) = hc.split_once(':')?;
    n.parse::<u32>().ok()?;
    Some((h.parse().ok()?, c.parse().ok()?))
}

proptest! {
    #![proptest_config(config(256))]

    /// Every reader over a generated tree returns well-formed values and
    /// skips what is malformed; none panics.
    #[test]
    fn sysfs_readers_survive_any_tree(tree in tree(), probe in any::<u64>()) {
        let dir = tempfile::tempdir().expect("tempdir");
        build(dir.path(), &tree);
        let host = host_at(dir.path());

        // An entry read back must be one written under a name that says so.
        let named = |class: &str, prefix: &str, n: u32| {
            tree.entries.iter().any(|e| {
                e.class == class && e.name.strip_prefix(prefix).and_then(|s| s.parse::<u32>().ok()) == Some(n)
            })
        };
        for h in fc::fc_hosts(&host).map_err(|e| TestCaseError::fail(e.to_string()))? {
            prop_assert!(named("class/fc_host", "host", h.host_no), "{h:?}");
            if let Some(p) = h.port_name {
                prop_assert_eq!(Wwpn::parse(&p.to_0x()), Ok(p));
            }
        }
        for p in fc::remote_ports(&host).map_err(|e| TestCaseError::fail(e.to_string()))? {
            prop_assert_eq!(rport(&p.name), Some((p.host_no, p.channel)), "{}", p.name);
        }
        for w in [format!("{probe:016x}"), "500a0981891b8dc5".to_owned()] {
            let w = Wwpn::parse(&w).map_err(|e| TestCaseError::fail(e.to_string()))?;
            fc::target_addresses(&host, w).map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
        for s in sysfs::iscsi_sessions(&host).map_err(|e| TestCaseError::fail(e.to_string()))? {
            prop_assert!(named("class/iscsi_session", "session", s.sid), "{s:?}");
            prop_assert!(!s.target.is_empty() && s.target.trim() == s.target);
        }
        let hosts = sysfs::scsi_hosts(&host).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(hosts.windows(2).all(|w| w[0] <= w[1]));

        let has_block = !tree.blocks.is_empty();
        let disks = match sysfs::scsi_disks(&host) {
            Ok(d) => d,
            Err(e) => {
                prop_assert!(!has_block && e.kind() == ErrorKind::NotFound, "{e}");
                Vec::new()
            }
        };
        for d in &disks {
            check_wwid(&d.wwid)?;
            prop_assert_eq!(Hctl::parse(&d.hctl.to_string()), Some(d.hctl));
            prop_assert!(!d.kernel_name.is_empty() && !d.kernel_name.contains('/'));
        }
        let maps = sysfs::multipath_maps(&host).unwrap_or_default();
        for m in &maps {
            prop_assert!(m.kernel_name.starts_with("dm-"));
            check_wwid(&m.wwid)?;
        }
        let luns = sysfs::group_luns(disks.clone(), maps.clone());
        prop_assert!(luns.windows(2).all(|w| w[0].wwid < w[1].wwid));
        for l in &luns {
            prop_assert!(l.paths.iter().all(|p| p.wwid == l.wwid));
            prop_assert!(l.map.as_ref().is_none_or(|m| m.wwid == l.wwid));
            let _ = l.size_bytes();
            let _ = l.device_kernel_name();
        }
        for (b, _) in &tree.blocks {
            if let Ok(Some(w)) = sysfs::block_wwid(&host, &b.name) {
                check_wwid(&w)?;
            }
            let _ = sysfs::block_size(&host, &b.name);
            let _ = sysfs::block_read_only(&host, &b.name);
            let _ = sysfs::holders(&host, &b.name);
        }
        if let Some(w) = disks.first().map(|d| d.wwid.clone()) {
            let found = sysfs::disks_with_wwid(&host, &w).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(found.iter().all(|d| d.wwid == w) && !found.is_empty());
        }
    }

    /// A disk whose `wwid` attribute is garbled (any bytes, invalid UTF-8,
    /// a label) is still listed, with the LUN designator of its
    /// `vpd_pg83`; a valid `wwid` attribute wins.
    #[test]
    fn a_garbled_wwid_attribute_falls_back_to_the_vpd_page(
        attr in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..40),
            Just(b"vol=data\xff\xfe\n".to_vec()),
            canonical_wwid().prop_filter("fits", |c| c.len() <= 256).prop_map(|c| format!("{c}\n").into_bytes()),
        ],
        naa in prop::collection::vec(any::<u8>(), 16),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut page = vec![0, 0x83, 0, 20, 0x01, 0x03, 0, 16];
        page.extend_from_slice(&naa);
        let tree = Tree {
            entries: Vec::new(),
            blocks: vec![(
                Entry {
                    class: "block",
                    name: "sdb".to_owned(),
                    attrs: vec![("size", b"2048\n".to_vec()), ("ro", b"0\n".to_vec())],
                },
                Some(("3:0:0:1".to_owned(), Entry {
                    class: "devices",
                    name: "3:0:0:1".to_owned(),
                    attrs: vec![("type", b"0\n".to_vec()), ("wwid", attr.clone()), ("vpd_pg83", page)],
                })),
            )],
        };
        build(dir.path(), &tree);
        let host = host_at(dir.path());
        let from_attr = std::str::from_utf8(&attr).ok().and_then(|t| Wwid::parse(t.trim()).ok());
        let hex: String = naa.iter().map(|b| format!("{b:02x}")).collect();
        let want = from_attr.map_or(format!("naa.{hex}"), |w| w.to_string());
        let disks = sysfs::scsi_disks(&host).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(disks.len(), 1, "disk skipped with wwid attribute {:?}", String::from_utf8_lossy(&attr));
        prop_assert_eq!(disks[0].wwid.as_str(), want.as_str());
        prop_assert_eq!(sysfs::block_wwid(&host, "sdb").ok().flatten().map(|w| w.to_string()), Some(want));
    }

    /// A kernel name that is not one path component (`..`, a `/`, a NUL,
    /// empty) is refused by every function that builds a path from it,
    /// with an error naming it, before anything is read or written.
    #[test]
    fn device_names_outside_one_component_are_refused(
        name in prop_oneof![
            Just(String::new()), Just(".".to_owned()), Just("..".to_owned()),
            "(\\.\\./){1,3}[a-z]{1,6}", "[a-z]{1,4}/[a-z]{1,4}", "sd[a-z]\0", "/[a-z]{1,8}",
        ],
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let host = host_at(&dir.path().join("sys"));
        // Files a traversal would reach: none may be touched.
        std::fs::create_dir_all(dir.path().join("sys/block")).expect("mkdir");
        let shown = format!("{name:?}");
        let refused = |r: Result<(), std::io::Error>| -> Result<(), TestCaseError> {
            match r {
                Err(e) => {
                    prop_assert_eq!(e.kind(), ErrorKind::InvalidInput, "{}", e);
                    prop_assert!(e.to_string().contains(&shown), "{e} does not name {shown}");
                    Ok(())
                }
                Ok(()) => Err(TestCaseError::fail(format!("{shown} accepted"))),
            }
        };
        refused(sysfs::holders(&host, &name).map(|_| ()))?;
        refused(sysfs::delete_path(&host, &name).map(|_| ()))?;
        refused(sysfs::rescan_device(&host, &name))?;
        refused(sysfs::block_wwid(&host, &name).map(|_| ()))?;
        refused(sysfs::block_size(&host, &name).map(|_| ()))?;
        refused(sysfs::block_read_only(&host, &name).map(|_| ()))?;
        prop_assert_eq!(sysfs::scsi_disk(&host, &name).map_err(|e| TestCaseError::fail(e.to_string()))?, None);
    }
}
