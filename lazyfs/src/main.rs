//! coldstart-lazyfs: mount a tree published to an OCI registry (toolkit/coldstart/registry/artifact.py)
//! read-only, fetching its chunks on first read and verifying each against its BLAKE3 digest before
//! any byte of it is returned. Chunks land in a content-addressed cache directory shared by every
//! mount on the node; with --prefetch all, background workers fill it in the index's order (the
//! order of first access) while reads that miss jump the queue with fetches of their own; with
//! --prefetch profiled, only the chunks the access profile names. With
//! --cache-max-bytes the cache is kept under a bound, never evicting a chunk a live mount uses.
//!
//! SIGUSR1 widens the prefetch to every chunk (the restore sends it after its first token, so that
//! the whole tree is on the node and the workload no longer depends on the registry or the link).
//!
//! Runs in the foreground until SIGTERM/SIGINT or `fusermount3 -u`, then unmounts and exits 0.
//! The Python side (the lazy stage) owns this command line.

mod auth;
mod cache;
mod fs;
mod index;
mod log;
mod store;

use std::fs::OpenOptions;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use fuser::{MountOption, Session, SessionACL};

use crate::index::Index;
use crate::log::say;
use crate::store::{Registry, Store};

/// The bdi readahead set after mounting, so a sequential reader keeps several 1 MiB requests in
/// flight. Measured here (512 MiB file, chunks cached, 2 cores): 128 KiB (the default) 1.0 GB/s,
/// 1 MiB 1.4 GB/s, 4-32 MiB 1.6-1.7 GB/s. Not more: an mmap fault reads around itself this much.
const READ_AHEAD_KB: u32 = 8 << 10;

#[derive(Parser)]
#[command(name = "coldstart-lazyfs", about = "Read-only lazy FUSE mount of a coldstart tree in an OCI registry")]
struct Args {
    /// The tree's index (JSON, Index.to_bytes() of coldstart.registry.artifact)
    #[arg(long)]
    index: PathBuf,
    /// http://HOST:PORT or https://HOST:PORT
    #[arg(long)]
    registry: String,
    /// PEM certificates to check an https:// registry against (default: the node's trust store)
    #[arg(long)]
    ca_file: Option<PathBuf>,
    /// Repository name in the registry
    #[arg(long)]
    repo: String,
    /// Node-local chunk cache (shared by every mount on the node)
    #[arg(long)]
    cache: PathBuf,
    /// Bound on the bytes of the cache's chunks (0: none); chunks a live mount uses are kept beyond it
    #[arg(long, default_value_t = 0)]
    cache_max_bytes: u64,
    #[arg(long)]
    mountpoint: PathBuf,
    #[arg(long, value_enum, default_value_t = Prefetch::All)]
    prefetch: Prefetch,
    /// Read workers
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    threads: u16,
    /// Limit for one registry request, seconds
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    timeout_s: u64,
    /// Written ({"pid": N}) once the mount serves
    #[arg(long)]
    ready_file: Option<PathBuf>,
    /// Append the log here instead of stderr
    #[arg(long)]
    log_file: Option<PathBuf>,
    /// The mount's readahead: what one page fault or sequential read asks for beyond the page it needs
    #[arg(long, default_value_t = READ_AHEAD_KB)]
    read_ahead_kb: u32,
}

#[derive(Clone, Copy, PartialEq, ValueEnum)]
enum Prefetch {
    All,
    /// only the chunks the access profile names (a runtime tree: gigabytes a restore never reads)
    Profiled,
    None,
}

fn main() {
    // Before any thread exists, so every thread inherits the mask and only main takes the signals.
    let signals = block_signals();
    let args = Args::parse();
    if let Err(e) = run(args, &signals) {
        if log::to_file() {
            say!("error: {e}");
        }
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args, signals: &libc::sigset_t) -> Result<(), String> {
    if let Some(p) = &args.log_file {
        let f = OpenOptions::new().create(true).append(true).open(p);
        log::init(Box::new(f.map_err(|e| format!("cannot open log file {}: {e}", p.display()))?));
    }
    if !args.registry.starts_with("http://") && !args.registry.starts_with("https://") {
        return Err(format!("--registry {}: expected http://HOST[:PORT] or https://HOST[:PORT]", args.registry));
    }
    let raw = std::fs::read(&args.index).map_err(|e| format!("cannot read index {}: {e}", args.index.display()))?;
    let index = Arc::new(Index::parse(&raw).map_err(|e| format!("malformed index {}: {e}", args.index.display()))?);
    if !args.mountpoint.is_dir() {
        return Err(format!("mountpoint {}: not a directory", args.mountpoint.display()));
    }
    let reg = Registry {
        url: args.registry.clone(),
        repo: args.repo.clone(),
        auth: std::env::var("COLDSTART_LAZYFS_AUTH").ok().filter(|h| !h.is_empty()),
        creds: auth::Creds::from_env(),
        ca_file: args.ca_file.clone(),
        timeout: Duration::from_secs(args.timeout_s),
    };
    let store =
        Arc::new(Store::new(index.clone(), &args.cache, reg, args.cache_max_bytes).map_err(|e| format!("cache: {e}"))?);

    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::RO,
        MountOption::NoAtime,
        MountOption::FSName(format!("coldstart-lazyfs:{}", args.repo)),
        // the kernel checks modes itself; other users (a container's) may read what the modes allow
        MountOption::DefaultPermissions,
    ];
    config.acl = SessionACL::All;
    let filesystem = fs::LazyFs::new(index.clone(), store.clone(), args.threads as usize);
    let session = Session::new(filesystem, &args.mountpoint, &config)
        .map_err(|e| format!("cannot mount {}: {e}", args.mountpoint.display()))?;
    let mut bg = Some(session.spawn().map_err(|e| format!("cannot start the FUSE session: {e}"))?);
    let mp = args.mountpoint.display();
    match raise_readahead(&args.mountpoint, args.read_ahead_kb) {
        Ok(p) => say!("readahead {} KiB ({p})", args.read_ahead_kb),
        Err(e) => say!("readahead left as is: {e}"),
    }
    let pack_bytes: u64 = index.packs.iter().map(|p| p.size).sum();
    say!(
        "mounted {mp}: {} inodes, {} chunks of up to {} bytes in {} packs ({} bytes), {}/v2/{}, cache {} (bound {})",
        index.len(),
        index.chunks.len(),
        index.chunk_size,
        index.packs.len(),
        pack_bytes,
        args.registry,
        args.repo,
        args.cache.display(),
        match store.max_bytes() {
            0 => "none".to_string(),
            n => format!("{n} bytes"),
        }
    );

    let stop = Arc::new(AtomicBool::new(false));
    let streams = (args.threads as usize / 2).clamp(1, 4);
    let mut prefetching_all = false;
    match args.prefetch {
        Prefetch::All => {
            start_prefetch(&store, &stop, streams, index.chunks.len());
            prefetching_all = true;
        }
        Prefetch::Profiled => start_prefetch(&store, &stop, streams, index.profiled),
        Prefetch::None => {}
    }
    if let Some(p) = &args.ready_file {
        if let Err(e) = write_ready(p) {
            stop.store(true, Relaxed);
            let _ = bg.take().unwrap().umount_and_join();
            store.unpin_all();
            return Err(format!("cannot write ready file {}: {e}", p.display()));
        }
    }

    let why = loop {
        if bg.as_ref().unwrap().guard.is_finished() {
            break "unmounted".to_string();
        }
        match wait_signal(signals, Duration::from_millis(200)) {
            Some(libc::SIGUSR1) if !prefetching_all => {
                // chunks already in the cache are skipped: this fetches what the first pass left
                say!("SIGUSR1: prefetching every chunk ({})", index.chunks.len());
                start_prefetch(&store, &stop, streams, index.chunks.len());
                prefetching_all = true;
            }
            Some(libc::SIGUSR1) => {}
            Some(sig) => break format!("signal {sig}"),
            None => {}
        }
    };
    stop.store(true, Relaxed);
    let bg = bg.take().unwrap();
    if why == "unmounted" {
        let _ = bg.join();
    } else if let Err(e) = bg.umount_and_join() {
        // busy (open files): detach now; the connection closes when this process exits
        say!("unmount {mp}: {e}; detaching it lazily");
        let c = std::ffi::CString::new(args.mountpoint.as_os_str().as_encoded_bytes()).unwrap();
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
    let s = &store.stats;
    say!(
        "exit ({why}): chunks fetched {}, bytes fetched {}, cache hits {}, verification failures {}, fetch errors {}",
        s.fetched_chunks.load(Relaxed),
        s.fetched_bytes.load(Relaxed),
        s.hits.load(Relaxed),
        s.verify_failures.load(Relaxed),
        s.fetch_errors.load(Relaxed)
    );
    // its chunks become evictable (a crashed daemon's pins are removed by the next one to start)
    store.unpin_all();
    // prefetch workers may be inside a request; they hold nothing that needs them to finish
    std::process::exit(0);
}

/// Background workers that fill the cache in index order; the last one out logs the total.
fn start_prefetch(store: &Arc<Store>, stop: &Arc<AtomicBool>, streams: usize, end: usize) {
    let cursor = Arc::new(Mutex::new(0usize));
    let live = Arc::new(AtomicUsize::new(streams));
    let (bytes, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let t0 = Instant::now();
    for i in 0..streams {
        let (store, stop, cursor, live) = (store.clone(), stop.clone(), cursor.clone(), live.clone());
        let (bytes, failed) = (bytes.clone(), failed.clone());
        thread::Builder::new()
            .name(format!("prefetch-{i}"))
            .spawn(move || {
                let (b, f) = store.prefetch(&cursor, end, &stop);
                bytes.fetch_add(b, Relaxed);
                failed.fetch_add(f, Relaxed);
                if live.fetch_sub(1, Relaxed) == 1 && !stop.load(Relaxed) {
                    say!(
                        "prefetch done: {} bytes fetched in {:.2} s, {} chunks failed (fetched on demand later)",
                        bytes.load(Relaxed),
                        t0.elapsed().as_secs_f64(),
                        failed.load(Relaxed)
                    );
                }
            })
            .expect("spawn a prefetch worker");
    }
}

/// Raise the mount's bdi readahead (root only; the kernel's FUSE init cannot raise it).
fn raise_readahead(mp: &Path, kb: u32) -> Result<String, String> {
    let dev = std::fs::metadata(mp).map_err(|e| e.to_string())?.dev();
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let p = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    std::fs::write(&p, kb.to_string()).map_err(|e| format!("{p}: {e}"))?;
    Ok(p)
}

/// Temp file then rename: a reader never sees half a file.
fn write_ready(path: &Path) -> std::io::Result<()> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, format!("{{\"pid\": {}}}\n", std::process::id()))?;
    std::fs::rename(&tmp, path)
}

fn block_signals() -> libc::sigset_t {
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn wait_signal(set: &libc::sigset_t, timeout: Duration) -> Option<i32> {
    let ts = libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as _ };
    let sig = unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &ts) };
    (sig > 0).then_some(sig)
}
