//! The FUSE side: a read-only tree answered from the index, file bytes from the store.
//!
//! Metadata (lookup, getattr, readdir, readlink) is in memory and answered on the session thread.
//! Reads may wait on the network, so they go to a worker pool and are answered from there (fuser's
//! replies can be moved to another thread): the session loop never blocks on I/O. The tree never
//! changes, so the kernel may keep attributes, entries and pages for as long as it likes.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEntry, ReplyOpen, ReplyStatfs,
    Request,
};

use crate::index::{chunk_span, Index, Kind, Node};
use crate::log::say;
use crate::store::Store;

/// Immutable tree: cache attributes and entries "forever" (a year).
const TTL: Duration = Duration::from_secs(365 * 86400);
/// A fixed mtime: 2000-01-01, not the epoch, which some tools (zip) refuse.
const MTIME_S: u64 = 946_684_800;
/// Per-request cap asked of the kernel. fuser derives max_pages from max(max_write, max_readahead);
/// the kernel clamps it to fs.fuse.max_pages_limit (256 pages = 1 MiB by default, raise the sysctl
/// for bigger requests).
const MAX_REQUEST: u32 = 16 << 20;
/// Readahead requests the kernel may have outstanding at once (the pool serves them in parallel).
const MAX_BACKGROUND: u16 = 64;

type Job = Box<dyn FnOnce() + Send>;

pub struct LazyFs {
    index: Arc<Index>,
    store: Arc<Store>,
    pool: Mutex<mpsc::Sender<Job>>,
}

impl LazyFs {
    pub fn new(index: Arc<Index>, store: Arc<Store>, threads: usize) -> LazyFs {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads {
            let rx = rx.clone();
            thread::Builder::new()
                .name(format!("read-{i}"))
                .spawn(move || loop {
                    let job = rx.lock().unwrap().recv();
                    match job {
                        Ok(job) => job(),
                        Err(_) => return, // the filesystem is gone
                    }
                })
                .expect("spawn a read worker");
        }
        LazyFs { index, store, pool: Mutex::new(tx) }
    }

    fn attr(&self, ino: u64, n: &Node) -> FileAttr {
        let (kind, size, nlink) = match &n.kind {
            Kind::Dir { children } => {
                let subdirs =
                    children.iter().filter(|c| matches!(self.index.node(**c).unwrap().kind, Kind::Dir { .. }));
                (FileType::Directory, 0, 2 + subdirs.count() as u32)
            }
            Kind::File { size, .. } => (FileType::RegularFile, *size, 1),
            Kind::Symlink { target } => (FileType::Symlink, target.len() as u64, 1),
            Kind::Socket => (FileType::Socket, 0, 1),
            Kind::Fifo => (FileType::NamedPipe, 0, 1),
        };
        let t = UNIX_EPOCH + Duration::from_secs(MTIME_S);
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind,
            perm: n.mode,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }
}

/// Answer a read of bytes [offset, offset + size) of a file, clipped at its end.
fn serve_read(index: &Index, store: &Store, n: &Node, offset: u64, size: u32, reply: ReplyData) {
    let Kind::File { size: fsize, chunks, starts } = &n.kind else { unreachable!() };
    let end = (offset + size as u64).min(*fsize);
    if offset >= end {
        return reply.data(&[]);
    }
    let span = chunk_span(starts, offset, end);
    let Ok(data) = store.chunks(&chunks[span.clone()]) else {
        return reply.error(Errno::EIO); // the store logged why
    };
    // the part of the file's k-th chunk that the read covers
    let piece = |k: usize| -> std::ops::Range<usize> {
        let start = starts[k];
        let a = offset.max(start) - start;
        let b = end.min(start + index.chunks[chunks[k] as usize].size as u64) - start;
        a as usize..b as usize
    };
    if data.len() == 1 {
        // the common case (requests no larger than chunks): no copy
        return reply.data(&data[0][piece(span.start)]);
    }
    let mut out = Vec::with_capacity((end - offset) as usize);
    for (k, bytes) in span.zip(&data) {
        out.extend_from_slice(&bytes[piece(k)]);
    }
    reply.data(&out);
}

impl Filesystem for LazyFs {
    fn init(&mut self, _req: &Request, cfg: &mut KernelConfig) -> io::Result<()> {
        // The kernel offers its bdi's readahead (128 KiB) and takes no more than it offered; take
        // all of it here, main.rs raises the bdi's read_ahead_kb after the mount.
        if let Err(most) = cfg.set_max_readahead(u32::MAX) {
            let _ = cfg.set_max_readahead(most);
        }
        if let Err(most) = cfg.set_max_write(MAX_REQUEST) {
            let _ = cfg.set_max_write(most);
        }
        let _ = cfg.set_max_background(MAX_BACKGROUND);
        let _ = cfg.set_congestion_threshold(MAX_BACKGROUND * 3 / 4);
        // optional: the kernel keeps readlink answers in its page cache
        let _ = cfg.add_capabilities(InitFlags::FUSE_CACHE_SYMLINKS);
        say!(
            "kernel FUSE {}.{}: max_pages {}, parallel reads (async read) {}",
            cfg.kernel_abi().0,
            cfg.kernel_abi().1,
            if cfg.capabilities().contains(InitFlags::FUSE_MAX_PAGES) { "on" } else { "off" },
            if cfg.capabilities().contains(InitFlags::FUSE_ASYNC_READ) { "on" } else { "off" },
        );
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.index.lookup(parent.0, name.as_bytes()) {
            Some(ino) => reply.entry(&TTL, &self.attr(ino, self.index.node(ino).unwrap()), Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.index.node(ino.0) {
            Some(n) => reply.attr(&TTL, &self.attr(ino.0, n)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.index.node(ino.0).map(|n| &n.kind) {
            Some(Kind::Symlink { target }) => reply.data(target.as_bytes()),
            Some(_) => reply.error(Errno::EINVAL),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.index.node(ino.0).map(|n| &n.kind) {
            None => reply.error(Errno::ENOENT),
            Some(Kind::Dir { .. }) => reply.error(Errno::EISDIR),
            Some(_) if flags.acc_mode() != OpenAccMode::O_RDONLY => reply.error(Errno::EROFS),
            // the bytes never change: keep the page cache across opens
            Some(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
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
        if !matches!(self.index.node(ino.0).map(|n| &n.kind), Some(Kind::File { .. })) {
            return reply.error(Errno::EISDIR);
        }
        let (index, store) = (self.index.clone(), self.store.clone());
        let job: Job = Box::new(move || serve_read(&index, &store, index.node(ino.0).unwrap(), offset, size, reply));
        if let Err(mpsc::SendError(job)) = self.pool.lock().unwrap().send(job) {
            drop(job); // no workers: dropping the reply answers EIO
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.index.node(ino.0).map(|n| &n.kind) {
            Some(Kind::Dir { .. }) => {
                reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR)
            }
            Some(_) => reply.error(Errno::ENOTDIR),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let Some(n) = self.index.node(ino.0) else { return reply.error(Errno::ENOENT) };
        let Kind::Dir { children } = &n.kind else { return reply.error(Errno::ENOTDIR) };
        // position i: ".", "..", then the children; an entry's offset is the position after it
        let dots = [(ino.0, FileType::Directory, "."), (n.parent, FileType::Directory, "..")];
        let kids = children.iter().map(|&c| {
            let cn = self.index.node(c).unwrap();
            let kind = match cn.kind {
                Kind::Dir { .. } => FileType::Directory,
                Kind::File { .. } => FileType::RegularFile,
                Kind::Symlink { .. } => FileType::Symlink,
                Kind::Socket => FileType::Socket,
                Kind::Fifo => FileType::NamedPipe,
            };
            (c, kind, cn.name.as_str())
        });
        for (i, (ino, kind, name)) in dots.into_iter().chain(kids).enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let blocks = self.index.file_bytes().div_ceil(4096);
        reply.statfs(blocks, 0, 0, self.index.len(), 0, 4096, 255, 4096);
    }
}
