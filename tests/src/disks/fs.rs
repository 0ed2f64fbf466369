//! The FUSE filesystem behind the lab's failing disks: one flat directory,
//! one file per LUN, each read and write passed to the LUN's backing file
//! unless a fault says otherwise. Files are opened in direct-I/O mode, so
//! no page cache sits between a loop device and the backing file.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo, LockOwner, OpenFlags,
    ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request,
    WriteFlags,
};

use super::fault::{Fault, Io, Verdict, judge};

/// One disk: its name in the directory and its backing file.
pub(super) struct Disk {
    pub(super) name: String,
    pub(super) file: File,
}

/// What one disk is going through now.
#[derive(Default)]
pub(super) struct DiskState {
    pub(super) faults: Vec<Fault>,
    /// I/Os waiting out a stall.
    pub(super) waiting: usize,
    /// I/Os failed with EIO since mount.
    pub(super) failed: u64,
}

/// The disks and their states, shared by the FUSE threads and the
/// harness's fault control.
pub(super) struct Shared {
    pub(super) disks: Vec<Disk>,
    pub(super) state: Mutex<Vec<DiskState>>,
    /// Notified on every heal.
    pub(super) healed: Condvar,
}

/// The filesystem.
pub(super) struct DiskFs(pub(super) Arc<Shared>);

const ROOT: INodeNo = INodeNo::ROOT;
/// Nothing is cached: sizes change when the array grows a LUN.
const NO_CACHE: Duration = Duration::ZERO;

// === impl Shared ===

impl Shared {
    fn index(&self, ino: INodeNo) -> Option<usize> {
        let i = usize::try_from(u64::from(ino).checked_sub(2)?).ok()?;
        (i < self.disks.len()).then_some(i)
    }

    /// Waits while `i` stalls this I/O, then returns the verdict.
    fn verdict(&self, i: usize, io: Io, offset: u64, len: u64) -> Verdict {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut waited = false;
        loop {
            match judge(&state[i].faults, io, offset, len) {
                Verdict::Wait => {
                    if !waited {
                        state[i].waiting += 1;
                        waited = true;
                    }
                    state = self.healed.wait(state).unwrap_or_else(|p| p.into_inner());
                }
                v => {
                    if waited {
                        state[i].waiting -= 1;
                    }
                    if v == Verdict::Fail {
                        state[i].failed += 1;
                    }
                    return v;
                }
            }
        }
    }

    /// Whether an I/O would wait now (so it must not run on a FUSE thread).
    fn stalls(&self, i: usize) -> bool {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state[i].faults.contains(&Fault::Stall)
    }

    fn attr(&self, ino: INodeNo) -> Option<FileAttr> {
        let (kind, size, perm, nlink) = if ino == ROOT {
            (FileType::Directory, 0, 0o755, 2)
        } else {
            let i = self.index(ino)?;
            let reported = {
                let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
                state[i].faults.iter().find_map(|f| match f {
                    Fault::Size(n) => Some(*n),
                    _ => None,
                })
            };
            let size = match reported {
                Some(n) => n,
                None => self.disks[i].file.metadata().ok()?.len(),
            };
            (FileType::RegularFile, size, 0o600, 1)
        };
        Some(FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: SystemTime::UNIX_EPOCH,
            mtime: SystemTime::UNIX_EPOCH,
            ctime: SystemTime::UNIX_EPOCH,
            crtime: SystemTime::UNIX_EPOCH,
            kind,
            perm,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            flags: 0,
            blksize: 4096,
        })
    }

    fn read(&self, i: usize, offset: u64, size: u32, reply: ReplyData) {
        if self.verdict(i, Io::Read, offset, u64::from(size)) == Verdict::Fail {
            return reply.error(Errno::EIO);
        }
        let mut buf = vec![0u8; size as usize];
        let mut done = 0;
        while done < buf.len() {
            match self.disks[i]
                .file
                .read_at(&mut buf[done..], offset + done as u64)
            {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return reply.error(e.into()),
            }
        }
        reply.data(&buf[..done]);
    }

    fn write(&self, i: usize, offset: u64, data: &[u8], reply: ReplyWrite) {
        if self.verdict(i, Io::Write, offset, data.len() as u64) == Verdict::Fail {
            return reply.error(Errno::EIO);
        }
        match self.disks[i].file.write_all_at(data, offset) {
            Ok(()) => reply.written(u32::try_from(data.len()).unwrap_or(u32::MAX)),
            Err(e) => reply.error(e.into()),
        }
    }

    fn allocate(&self, i: usize, offset: u64, length: u64, mode: i32, reply: ReplyEmpty) {
        if self.verdict(i, Io::Write, offset, length) == Verdict::Fail {
            return reply.error(Errno::EIO);
        }
        let flags = nix::fcntl::FallocateFlags::from_bits_truncate(mode);
        let (Ok(offset), Ok(length)) = (i64::try_from(offset), i64::try_from(length)) else {
            return reply.error(Errno::EINVAL);
        };
        match nix::fcntl::fallocate(self.disks[i].file.as_fd(), flags, offset, length) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(Errno::from_i32(e as i32)),
        }
    }
}

// === impl DiskFs ===

impl DiskFs {
    /// Runs `io` here, or on a thread of its own when the disk stalls (a
    /// stalled I/O must not hold a FUSE thread: the other disks go on).
    fn serve(&self, i: usize, io: impl FnOnce(&Shared) + Send + 'static) {
        if self.0.stalls(i) {
            let shared = self.0.clone();
            std::thread::spawn(move || io(&shared));
        } else {
            io(&self.0);
        }
    }
}

impl Filesystem for DiskFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let found = (parent == ROOT)
            .then(|| {
                self.0
                    .disks
                    .iter()
                    .position(|d| OsStr::new(&d.name) == name)
            })
            .flatten()
            .and_then(|i| self.0.attr(INodeNo(i as u64 + 2)));
        match found {
            Some(attr) => reply.entry(&NO_CACHE, &attr, fuser::Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.0.attr(ino) {
            Some(attr) => reply.attr(&NO_CACHE, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.0.index(ino) {
            Some(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(i) = self.0.index(ino) else {
            return reply.error(Errno::ENOENT);
        };
        self.serve(i, move |s| s.read(i, offset, size, reply));
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let Some(i) = self.0.index(ino) else {
            return reply.error(Errno::ENOENT);
        };
        if self.0.stalls(i) {
            let data = data.to_vec();
            self.serve(i, move |s| s.write(i, offset, &data, reply));
        } else {
            self.0.write(i, offset, data, reply);
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let Some(i) = self.0.index(ino) else {
            return reply.error(Errno::ENOENT);
        };
        self.serve(i, move |s| s.allocate(i, offset, length, mode, reply));
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let Some(i) = self.0.index(ino) else {
            return reply.error(Errno::ENOENT);
        };
        self.serve(i, move |s| {
            // Past every byte range: only a stall or an unmapped LUN applies.
            if s.verdict(i, Io::Write, u64::MAX - 1, 1) == Verdict::Fail {
                return reply.error(Errno::EIO);
            }
            match s.disks[i].file.sync_data() {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e.into()),
            }
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (ROOT, FileType::Directory, "."),
            (ROOT, FileType::Directory, ".."),
        ]
        .into_iter()
        .chain(self.0.disks.iter().enumerate().map(|(i, d)| {
            (
                INodeNo(i as u64 + 2),
                FileType::RegularFile,
                d.name.as_str(),
            )
        }));
        for (n, (ino, kind, name)) in entries.enumerate().skip(offset as usize) {
            if reply.add(ino, n as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }
}
