//! The mount table, read from the mountinfo file under the host's
//! configurable path (`/proc/self/mountinfo`), never from `mount` output.
//! Mounts are matched to devices by `major:minor`, never by the source
//! string: the same disk can be mounted through any of its device nodes.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use super::Host;
use super::block::DeviceNumber;

/// One line of mountinfo (see proc(5)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Unique mount ID.
    pub id: u32,
    /// ID of the parent mount.
    pub parent: u32,
    /// `st_dev` of the filesystem (for a block-device filesystem, the device's number).
    pub device: DeviceNumber,
    /// The directory (or file) of the filesystem that forms the root of this mount.
    pub root: PathBuf,
    /// Where it is mounted, in this mount namespace.
    pub mount_point: PathBuf,
    /// Per-mount options (`rw`, `ro`, `nosuid`, ...).
    pub options: Vec<String>,
    /// Optional fields (`shared:N`, `master:N`, ...).
    pub optional: Vec<String>,
    /// Filesystem type (`ext4`, `xfs`, `tmpfs`).
    pub fs_type: String,
    /// Filesystem-specific source (`/dev/sdb`, `none`).
    pub source: String,
    /// Superblock options (`rw`, `ro`, `errors=remount-ro`, ...).
    pub super_options: Vec<String>,
}

/// The parsed mount table, in mountinfo order (parents before children).
#[derive(Debug, Clone, Default)]
pub struct MountTable {
    mounts: Vec<Mount>,
}

// === impl Mount ===

impl Mount {
    /// Whether this mount point is read-only (per-mount `ro`).
    pub fn read_only(&self) -> bool {
        self.options.iter().any(|o| o == "ro")
    }

    /// Whether the filesystem itself is read-only (superblock `ro`), e.g.
    /// after `errors=remount-ro` fired.
    pub fn filesystem_read_only(&self) -> bool {
        self.super_options.iter().any(|o| o == "ro")
    }
}

// === impl MountTable ===

impl MountTable {
    /// Reads and parses the host's mountinfo file.
    pub fn read(host: &Host) -> std::io::Result<Self> {
        use std::io::Read;
        // A proc file reports no size: read in large steps, not the small
        // growing ones a general read starts with.
        let mut bytes = Vec::with_capacity(64 << 10);
        std::fs::File::open(&host.mountinfo)?.read_to_end(&mut bytes)?;
        Ok(Self::parse(&String::from_utf8_lossy(&bytes)))
    }

    /// Parses mountinfo text; malformed lines are skipped (a table we
    /// cannot read fully still answers for the lines we can).
    pub fn parse(text: &str) -> Self {
        let mounts = text
            .lines()
            .filter_map(|line| {
                let parsed = parse_line(line);
                if parsed.is_none() && !line.trim().is_empty() {
                    tracing::debug!(line, "skipping malformed mountinfo line");
                }
                parsed
            })
            .collect();
        Self { mounts }
    }

    /// Every mount, in table order.
    pub fn mounts(&self) -> &[Mount] {
        &self.mounts
    }

    /// The mount visible at `path` (the last one stacked there), if `path`
    /// is a mount point.
    pub fn mount_at(&self, path: &Path) -> Option<&Mount> {
        self.mounts.iter().rev().find(|m| m.mount_point == path)
    }

    /// Every mount of the filesystem on device `device`.
    pub fn mounts_of(&self, device: DeviceNumber) -> impl Iterator<Item = &Mount> {
        self.mounts.iter().filter(move |m| m.device == device)
    }

    /// Every mount whose mount point lies strictly under `dir`.
    pub fn mounts_under<'a>(&'a self, dir: &'a Path) -> impl Iterator<Item = &'a Mount> + 'a {
        self.mounts
            .iter()
            .filter(move |m| m.mount_point != dir && m.mount_point.starts_with(dir))
    }
}

/// `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`
fn parse_line(line: &str) -> Option<Mount> {
    // Fields are separated by single spaces; spaces inside paths are
    // escaped as \040, so splitting on ' ' is exact.
    let fields: Vec<&str> = line.trim_end_matches(['\n', '\r']).split(' ').collect();
    let sep = fields.iter().position(|f| *f == "-")?;
    let (head, tail) = fields.split_at(sep);
    let [id, parent, devno, root, mount_point, options, optional @ ..] = head else {
        return None;
    };
    let [_, fs_type, source, super_options] = tail else {
        return None;
    };
    let (major, minor) = devno.split_once(':')?;
    let device = DeviceNumber {
        major: major.parse().ok()?,
        minor: minor.parse().ok()?,
    };
    if fs_type.is_empty() || mount_point.is_empty() {
        return None;
    }
    Some(Mount {
        id: id.parse().ok()?,
        parent: parent.parse().ok()?,
        device,
        root: unescape(root),
        mount_point: unescape(mount_point),
        options: split_options(options),
        optional: optional
            .iter()
            .filter(|f| !f.is_empty())
            .map(|f| (*f).to_owned())
            .collect(),
        fs_type: unescape_text(fs_type),
        source: unescape_text(source),
        super_options: split_options(super_options),
    })
}

fn split_options(options: &str) -> Vec<String> {
    options
        .split(',')
        .filter(|o| !o.is_empty())
        .map(unescape_text)
        .collect()
}

/// Undoes the kernel's octal escapes (`\040` space, `\011` tab, `\012`
/// newline, `\134` backslash); a backslash not followed by three octal
/// digits is kept as it is.
fn unescape_bytes(s: &str) -> Vec<u8> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(digits) = bytes.get(i + 1..i + 4)
            && digits.iter().all(|d| (b'0'..=b'7').contains(d))
        {
            let value = digits
                .iter()
                .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
            if let Ok(byte) = u8::try_from(value) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

fn unescape(s: &str) -> PathBuf {
    PathBuf::from(OsString::from_vec(unescape_bytes(s)))
}

fn unescape_text(s: &str) -> String {
    String::from_utf8_lossy(&unescape_bytes(s)).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
43 27 7:0 / /var/lib/kubelet/plugins/csi/pv\\040one/globalmount rw,relatime - ext4 /dev/sdb rw
44 27 7:0 / /var/lib/kubelet/pods/p1/volumes/pv\\040one/mount ro,nosuid,relatime shared:5 master:2 - ext4 /dev/sdb rw
45 27 254:0 /tmp/dev/sdc /var/lib/kubelet/pods/p2/dev/tab\\011and\\134back rw - ext4 /dev/vda rw
";

    #[test]
    fn fields_are_parsed_with_devices_by_number() {
        let table = MountTable::parse(SAMPLE);
        assert_eq!(table.mounts().len(), 5);
        let root = &table.mounts()[1];
        assert_eq!(root.id, 27);
        assert_eq!(root.parent, 1);
        assert_eq!(
            root.device,
            DeviceNumber {
                major: 254,
                minor: 0
            }
        );
        assert_eq!(root.root, Path::new("/"));
        assert_eq!(root.mount_point, Path::new("/"));
        assert_eq!(root.optional, vec!["shared:1"]);
        assert_eq!(root.fs_type, "ext4");
        assert_eq!(root.source, "/dev/vda");
        assert_eq!(root.super_options, vec!["rw", "discard"]);
        assert_eq!(
            table.mounts_of(DeviceNumber { major: 7, minor: 0 }).count(),
            2
        );
    }

    #[test]
    fn octal_escapes_in_paths_are_decoded() {
        let table = MountTable::parse(SAMPLE);
        let staged = table
            .mount_at(Path::new("/var/lib/kubelet/plugins/csi/pv one/globalmount"))
            .expect("escaped space decoded");
        assert_eq!(staged.id, 43);
        let bound = &table.mounts()[4];
        assert_eq!(
            bound.mount_point,
            Path::new("/var/lib/kubelet/pods/p2/dev/tab\tand\\back")
        );
        assert_eq!(bound.root, Path::new("/tmp/dev/sdc"));
    }

    #[test]
    fn several_optional_fields_and_read_only_mounts_are_understood() {
        let table = MountTable::parse(SAMPLE);
        let published = &table.mounts()[3];
        assert_eq!(published.optional, vec!["shared:5", "master:2"]);
        assert!(published.read_only());
        assert!(!published.filesystem_read_only());
        assert_eq!(published.options, vec!["ro", "nosuid", "relatime"]);
    }

    #[test]
    fn malformed_lines_are_skipped_and_the_rest_is_kept() {
        let text = "\
garbage
22 27 0:21 / /proc rw,relatime proc proc rw
23 27 x:1 / /sys rw - sysfs sysfs rw
24 27 0:6 / /dev rw - devtmpfs
25 27 0:6 /
26 27 0:23 / /dev/shm rw,nosuid - tmpfs tmpfs rw,size=10k

27 1 254:0 / / rw - ext4 /dev/vda ro,errors=remount-ro
";
        let table = MountTable::parse(text);
        let points: Vec<_> = table
            .mounts()
            .iter()
            .map(|m| m.mount_point.clone())
            .collect();
        assert_eq!(points, vec![PathBuf::from("/dev/shm"), PathBuf::from("/")]);
        assert!(table.mounts()[1].filesystem_read_only());
    }

    #[test]
    fn the_last_mount_stacked_on_a_path_is_the_visible_one() {
        let text = "\
27 1 254:0 / / rw - ext4 /dev/vda rw
30 27 7:0 / /mnt rw - ext4 /dev/sdb rw
31 30 7:1 / /mnt rw - xfs /dev/sdc rw
";
        let table = MountTable::parse(text);
        assert_eq!(table.mount_at(Path::new("/mnt")).map(|m| m.id), Some(31));
        assert_eq!(table.mounts_under(Path::new("/")).count(), 2);
    }

    #[test]
    fn a_backslash_without_three_octal_digits_is_kept() {
        assert_eq!(unescape_text("a\\09b\\"), "a\\09b\\");
        assert_eq!(unescape_text("\\101\\102"), "AB");
    }
}
