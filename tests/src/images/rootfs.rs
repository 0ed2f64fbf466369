//! A root filesystem directory made of files from this machine. A host path
//! is copied to the same path in the root, replicating every symlink on the
//! way exactly as it is on the host (Debian 12 is merged-/usr: `/sbin ->
//! usr/sbin`, `/lib -> usr/lib`, `/lib64 -> usr/lib64`, and
//! `/usr/lib64/ld-linux-x86-64.so.2` is itself a symlink), so every name a
//! program or the dynamic loader uses resolves inside the image as it does
//! on the host. Each ELF file with a dynamic section brings the shared
//! libraries `ldd` says it loads, and theirs, until nothing new appears.
//!
//! Nothing is ever written through a symlink in the root: an absolute
//! target (`/lib/x86_64-linux-gnu/...`) means the host's file outside it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ffi::OsString;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, bail};

use crate::lab::net::sh;

/// More symlinks than this on one path is a loop (the kernel's limit).
const MAX_SYMLINKS: usize = 40;

/// A root filesystem being assembled.
#[derive(Debug)]
pub struct Rootfs {
    root: PathBuf,
    /// Regular files placed, by path in the root, with their source.
    files: BTreeMap<PathBuf, PathBuf>,
    /// ELF files (host paths) whose libraries are still to be resolved.
    pending: Vec<PathBuf>,
    /// Host files whose libraries were resolved.
    resolved: BTreeSet<PathBuf>,
}

impl Rootfs {
    /// An empty root at `root` (created; it must not exist or be empty).
    pub fn new(root: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(root)?;
        if std::fs::read_dir(root)?.next().is_some() {
            bail!("{} is not empty", root.display());
        }
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755))?;
        Ok(Self {
            root: root.to_owned(),
            files: BTreeMap::new(),
            pending: Vec::new(),
            resolved: BTreeSet::new(),
        })
    }

    /// The root directory.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// Copies host path `path` (absolute) to the same path in the root:
    /// every symlink on the way is recreated with its target and followed;
    /// the final regular file is copied with its mode; a final directory is
    /// copied whole, entry by entry in the same way.
    pub fn copy_host(&mut self, path: &Path) -> anyhow::Result<()> {
        if !path.is_absolute() {
            bail!("{}: host paths must be absolute", path.display());
        }
        let mut cur = PathBuf::from("/");
        let mut todo: VecDeque<OsString> = components(path);
        let mut links = 0;
        while let Some(name) = todo.pop_front() {
            if name == ".." {
                cur.pop();
                continue;
            }
            let host = cur.join(&name);
            let meta = std::fs::symlink_metadata(&host).with_context(|| {
                format!("{} (on the way to {})", host.display(), path.display())
            })?;
            let inside = self.inside(&host);
            if meta.file_type().is_symlink() {
                links += 1;
                if links > MAX_SYMLINKS {
                    bail!("{}: too many levels of symbolic links", path.display());
                }
                let target = std::fs::read_link(&host)?;
                self.place_symlink(&inside, &target)?;
                if target.is_absolute() {
                    cur = PathBuf::from("/");
                }
                for c in components(&target).into_iter().rev() {
                    todo.push_front(c);
                }
            } else if meta.is_dir() {
                self.place_dir(&inside, meta.permissions().mode() & 0o7777)?;
                cur = host;
                if todo.is_empty() {
                    let mut entries: Vec<OsString> = std::fs::read_dir(&cur)?
                        .map(|e| e.map(|e| e.file_name()))
                        .collect::<Result<_, _>>()?;
                    entries.sort();
                    for entry in entries {
                        self.copy_host(&cur.join(entry))?;
                    }
                }
            } else if meta.is_file() {
                if !todo.is_empty() {
                    bail!(
                        "{}: {} is a file, not a directory",
                        path.display(),
                        host.display()
                    );
                }
                self.place_file(&host, &inside, meta.permissions().mode() & 0o7777, false)?;
            } else {
                bail!(
                    "{}: {} is neither a file, a directory nor a symlink",
                    path.display(),
                    host.display()
                );
            }
        }
        Ok(())
    }

    /// Installs host file `source` at `dest` in the root (a binary built
    /// here: a cargo or Go build output), mode 0755; `strip` removes its
    /// symbols and debug information on the way. Missing parent
    /// directories are created (0755).
    pub fn install(&mut self, source: &Path, dest: &Path, strip: bool) -> anyhow::Result<()> {
        if !dest.is_absolute() {
            bail!("{}: paths in the image must be absolute", dest.display());
        }
        let source = std::fs::canonicalize(source)
            .with_context(|| format!("{} is missing", source.display()))?;
        let inside = self.inside(dest);
        if let Some(parent) = dest.parent() {
            self.mkdir(parent, 0o755)?;
        }
        self.place_file(&source, &inside, 0o755, strip)
    }

    /// Creates directory `dest` (and missing parents, 0755) in the root
    /// with mode `mode`, unless it is there already.
    pub fn mkdir(&mut self, dest: &Path, mode: u32) -> anyhow::Result<()> {
        if !dest.is_absolute() {
            bail!("{}: paths in the image must be absolute", dest.display());
        }
        let parts: Vec<OsString> = components(dest).into();
        let mut at = self.root.clone();
        for (i, part) in parts.iter().enumerate() {
            if part == ".." {
                bail!("{}: no .. in paths in the image", dest.display());
            }
            at.push(part);
            let last = i + 1 == parts.len();
            match std::fs::symlink_metadata(&at) {
                Ok(m) if m.file_type().is_symlink() => bail!(
                    "{} in the image: {} is a symlink (write the path it resolves to)",
                    dest.display(),
                    self.display(&at)
                ),
                Ok(m) if m.is_dir() => {}
                Ok(_) => bail!(
                    "{} in the image: {} is a file",
                    dest.display(),
                    self.display(&at)
                ),
                Err(_) => {
                    std::fs::create_dir(&at)?;
                    let m = if last { mode } else { 0o755 };
                    std::fs::set_permissions(&at, std::fs::Permissions::from_mode(m))?;
                }
            }
        }
        Ok(())
    }

    /// Copies the shared libraries of every ELF file placed so far, and
    /// theirs, until nothing new appears.
    pub fn resolve_libraries(&mut self) -> anyhow::Result<()> {
        while let Some(elf) = self.pending.pop() {
            if !self.resolved.insert(elf.clone()) {
                continue;
            }
            for lib in ldd(&elf)? {
                self.copy_host(&lib)
                    .with_context(|| format!("{}, which {} loads", lib.display(), elf.display()))?;
            }
        }
        Ok(())
    }

    /// The path in the root of absolute path `path`.
    fn inside(&self, path: &Path) -> PathBuf {
        self.root.join(path.strip_prefix("/").unwrap_or(path))
    }

    /// `path` (in the root) as the image sees it, for messages.
    fn display(&self, path: &Path) -> String {
        format!(
            "/{}",
            path.strip_prefix(&self.root).unwrap_or(path).display()
        )
    }

    fn place_symlink(&self, at: &Path, target: &Path) -> anyhow::Result<()> {
        match std::fs::symlink_metadata(at) {
            Ok(m) if m.file_type().is_symlink() => {
                let have = std::fs::read_link(at)?;
                if have != target {
                    bail!(
                        "{} -> {} in the image, but {} on the host",
                        self.display(at),
                        have.display(),
                        target.display()
                    );
                }
                Ok(())
            }
            Ok(_) => bail!(
                "{} is a symlink on the host but not in the image",
                self.display(at)
            ),
            Err(_) => Ok(symlink(target, at)?),
        }
    }

    fn place_dir(&self, at: &Path, mode: u32) -> anyhow::Result<()> {
        match std::fs::symlink_metadata(at) {
            Ok(m) if m.is_dir() && !m.file_type().is_symlink() => Ok(()),
            Ok(_) => bail!(
                "{} is a directory on the host but not in the image",
                self.display(at)
            ),
            Err(_) => {
                std::fs::create_dir(at)?;
                std::fs::set_permissions(at, std::fs::Permissions::from_mode(mode))?;
                Ok(())
            }
        }
    }

    fn place_file(
        &mut self,
        source: &Path,
        at: &Path,
        mode: u32,
        strip: bool,
    ) -> anyhow::Result<()> {
        match std::fs::symlink_metadata(at) {
            Ok(m) if m.is_file() && self.files.get(at).map(PathBuf::as_path) == Some(source) => {
                return Ok(());
            }
            Ok(_) => bail!(
                "{} in the image: already there (placing {})",
                self.display(at),
                source.display()
            ),
            Err(_) => {}
        }
        if strip {
            sh(
                "strip",
                &[
                    "-o",
                    &at.display().to_string(),
                    &source.display().to_string(),
                ],
            )
            .with_context(|| format!("stripping {}", source.display()))?;
        } else {
            std::fs::copy(source, at)
                .with_context(|| format!("copying {} into the image", source.display()))?;
        }
        std::fs::set_permissions(at, std::fs::Permissions::from_mode(mode))?;
        self.files.insert(at.to_owned(), source.to_owned());
        if is_dynamic_elf(source)? {
            self.pending.push(source.to_owned());
        }
        Ok(())
    }
}

/// The normal components of `path`, with `..` kept (`.` and the root dropped).
fn components(path: &Path) -> VecDeque<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_owned()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect()
}

/// Whether `path` is a 64-bit little-endian ELF file with a dynamic
/// section (an executable or library that loads shared libraries; a static
/// Go binary has none).
fn is_dynamic_elf(path: &Path) -> anyhow::Result<bool> {
    let mut head = [0u8; 64];
    let mut file = std::fs::File::open(path)?;
    let n = read_full(&mut file, &mut head)?;
    if n < 64 || &head[..4] != b"\x7fELF" {
        return Ok(false);
    }
    if head[4] != 2 || head[5] != 1 {
        bail!("{}: not a 64-bit little-endian ELF file", path.display());
    }
    let u16_at = |o: usize| u16::from_le_bytes([head[o], head[o + 1]]) as u64;
    let phoff = u64::from_le_bytes(head[32..40].try_into()?);
    let phentsize = u16_at(54);
    let phnum = u16_at(56);
    if phentsize < 4 {
        bail!("{}: bad ELF program header size", path.display());
    }
    let mut table = vec![0u8; usize::try_from(phentsize * phnum)?];
    file.seek(SeekFrom::Start(phoff))?;
    file.read_exact(&mut table)
        .with_context(|| format!("{}: truncated ELF program headers", path.display()))?;
    // p_type PT_DYNAMIC (2) in any program header.
    Ok(table
        .chunks_exact(usize::try_from(phentsize)?)
        .any(|h| u32::from_le_bytes([h[0], h[1], h[2], h[3]]) == 2))
}

fn read_full(file: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// The shared libraries `elf` loads, as `ldd` resolves them on this machine.
fn ldd(elf: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let out = sh("ldd", &[&elf.display().to_string()])?;
    parse_ldd(&out).with_context(|| format!("ldd {}", elf.display()))
}

/// Parses `ldd` output: `name => /path (0x...)`, `/path (0x...)` (the
/// loader), `linux-vdso.so.1 (0x...)` (in the kernel: skipped).
fn parse_ldd(out: &str) -> anyhow::Result<Vec<PathBuf>> {
    let mut libs = Vec::new();
    for line in out.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let path = match line.split_once(" => ") {
            Some((name, rest)) => {
                if rest.starts_with("not found") {
                    bail!("{name} not found");
                }
                rest
            }
            None => line,
        };
        let path = path.split(" (").next().unwrap_or_default().trim();
        if path.starts_with('/') {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ldd_output() -> anyhow::Result<()> {
        let out = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                   \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f2e)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f2e)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f2e)\n";
        assert_eq!(
            parse_ldd(out)?,
            [
                "/lib/x86_64-linux-gnu/libgcc_s.so.1",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
        assert!(parse_ldd("\tlibnope.so.1 => not found\n").is_err());
        Ok(())
    }

    /// A host tree with a merged-/usr-like chain: `/sbin -> usr/sbin`,
    /// `usr/sbin/tool -> real` (relative), `/lib64 -> usr/lib64`,
    /// `usr/lib64/ld.so -> <abs>/lib/x/ld.so` (absolute, through `/lib ->
    /// usr/lib`). The copy has every link with the same target and the
    /// final files with their modes.
    #[test]
    fn reproduces_a_symlink_chain() -> anyhow::Result<()> {
        let host = tempfile::tempdir()?;
        let h = host.path();
        for d in ["usr/sbin", "usr/lib/x", "usr/lib64"] {
            std::fs::create_dir_all(h.join(d))?;
        }
        symlink("usr/sbin", h.join("sbin"))?;
        symlink("usr/lib", h.join("lib"))?;
        symlink("usr/lib64", h.join("lib64"))?;
        std::fs::write(h.join("usr/sbin/real"), "#!tool\n")?;
        std::fs::write(h.join("usr/sbin/other"), "not asked for")?;
        std::fs::set_permissions(
            h.join("usr/sbin/real"),
            std::fs::Permissions::from_mode(0o4750),
        )?;
        symlink("real", h.join("usr/sbin/tool"))?;
        std::fs::write(h.join("usr/lib/x/ld.so"), "loader")?;
        let abs_target = h.join("lib/x/ld.so");
        symlink(&abs_target, h.join("usr/lib64/ld.so"))?;

        let out = tempfile::tempdir()?;
        let mut rootfs = Rootfs::new(&out.path().join("root"))?;
        rootfs.copy_host(&h.join("sbin/tool"))?;
        rootfs.copy_host(&h.join("lib64/ld.so"))?;
        // Twice is harmless.
        rootfs.copy_host(&h.join("sbin/tool"))?;
        rootfs.resolve_libraries()?;

        let r = rootfs.inside(h);
        let link = |p: &str| std::fs::read_link(r.join(p));
        assert_eq!(link("sbin")?, Path::new("usr/sbin"));
        assert_eq!(link("usr/sbin/tool")?, Path::new("real"));
        assert_eq!(link("lib64")?, Path::new("usr/lib64"));
        assert_eq!(link("usr/lib64/ld.so")?, abs_target);
        assert_eq!(link("lib")?, Path::new("usr/lib"));
        let real = std::fs::symlink_metadata(r.join("usr/sbin/real"))?;
        assert!(real.is_file());
        assert_eq!(real.permissions().mode() & 0o7777, 0o4750);
        assert_eq!(
            std::fs::read_to_string(r.join("usr/lib/x/ld.so"))?,
            "loader"
        );
        // Nothing else was copied.
        assert!(!r.join("usr/sbin/other").exists());
        assert_eq!(std::fs::read_dir(r.join("usr/lib"))?.count(), 1);
        Ok(())
    }

    #[test]
    fn never_writes_through_a_symlink() -> anyhow::Result<()> {
        let host = tempfile::tempdir()?;
        std::fs::create_dir_all(host.path().join("usr/bin"))?;
        symlink("usr/bin", host.path().join("bin"))?;
        std::fs::write(host.path().join("usr/bin/a"), "a")?;
        let out = tempfile::tempdir()?;
        let mut rootfs = Rootfs::new(&out.path().join("root"))?;
        rootfs.copy_host(&host.path().join("bin/a"))?;
        let err = rootfs
            .install(
                &host.path().join("usr/bin/a"),
                &host.path().join("bin/b"),
                false,
            )
            .expect_err("installed through the bin symlink");
        assert!(err.to_string().contains("is a symlink"), "{err:#}");
        Ok(())
    }

    #[test]
    fn copies_the_libraries_of_a_real_binary() -> anyhow::Result<()> {
        let out = tempfile::tempdir()?;
        let mut rootfs = Rootfs::new(&out.path().join("root"))?;
        // /bin/true: through /bin -> usr/bin; its libc and loader through
        // /lib -> usr/lib and /lib64 -> usr/lib64.
        rootfs.copy_host(Path::new("/bin/true"))?;
        rootfs.resolve_libraries()?;
        let r = rootfs.path();
        assert!(r.join("usr/bin/true").is_file());
        for lib in [
            "lib/x86_64-linux-gnu/libc.so.6",
            "lib64/ld-linux-x86-64.so.2",
        ] {
            // Resolve inside the root by hand (an absolute link would
            // lead the kernel to the host's file).
            let mut p = r.join(lib);
            for _ in 0..MAX_SYMLINKS {
                match std::fs::read_link(&p) {
                    Ok(t) if t.is_absolute() => p = rootfs.inside(&t),
                    Ok(t) => p = p.parent().context("parent")?.join(t),
                    Err(_) => break,
                }
            }
            assert!(
                std::fs::symlink_metadata(&p)?.is_file(),
                "{lib}: {}",
                p.display()
            );
        }
        Ok(())
    }
}
