//! Chunks: the node-local cache, the registry, and the rule that no byte is used before its BLAKE3
//! digest matched.
//!
//! A chunk stored compressed (a zstd frame in its pack) is decompressed as it arrives, before the
//! check: the cache and everything above it hold chunks as the files' bytes.
//!
//! A chunk's bytes come from, in order: a small memo of chunks served lately (already verified, in
//! memory); the cache file CACHE/chunks/<2 hex>/<hex>, read through this daemon's pin link to it
//! (cache.rs: a pinned file is never evicted) and verified again on every read since a file can be
//! damaged after it was written (a corrupt one is deleted and fetched again); or a Range GET of its
//! pack. Cache files are only ever written after verification, to a temp file in the same
//! directory, pinned, and renamed, so any number of daemons on the node share the directory
//! without locks.
//! A chunk being fetched is in the in-flight map: whoever wants it meanwhile waits for that one
//! fetch instead of starting another. Consecutive chunks of one pack travel in one GET.

use std::collections::{HashMap, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use crate::auth::{self, Creds};
use crate::cache::{make_pin_dir, Bound};
use crate::index::{Chunk, Codec, Index};
use crate::log::say;

/// A chunk's verified bytes: shared, immutable, from `off` to the end of their buffer (a direct
/// read leaves them at an aligned offset).
#[derive(Clone)]
pub struct Bytes {
    buf: Arc<Vec<u8>>,
    off: usize,
}

impl From<Vec<u8>> for Bytes {
    fn from(buf: Vec<u8>) -> Bytes {
        Bytes { buf: Arc::new(buf), off: 0 }
    }
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[self.off..]
    }
}

/// Largest range GET: consecutive missing chunks are fetched together up to this many bytes.
pub const MAX_RUN: usize = 8 << 20;
/// The memo spares a re-read and re-hash when requests are smaller than chunks (the kernel's
/// first reads of a file, mmap faults): a few recent chunks.
const MEMO_CHUNKS: usize = 64;
const MEMO_BYTES: usize = 64 << 20;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// A chunk whose fetch just failed fails again at once for this long: the kernel retries a failed
/// readahead with a read of its own right away, which would otherwise wait out a second timeout.
const FAILED_FOR: Duration = Duration::from_secs(2);
/// A cache file's mtime says when it was last used (eviction takes the oldest first); refreshing
/// it on every read would cost a syscall per read for no better order.
const TOUCH_EVERY_S: u64 = 60;

#[derive(Default)]
pub struct Stats {
    pub fetched_chunks: AtomicU64,
    pub fetched_bytes: AtomicU64,
    pub hits: AtomicU64,
    pub verify_failures: AtomicU64,
    pub fetch_errors: AtomicU64,
}

pub struct Registry {
    pub url: String, // http(s)://host:port
    pub repo: String,
    pub auth: Option<String>, // the Authorization header to start with
    pub creds: Option<Creds>, // to answer a 401 (an expired token) with
    pub ca_file: Option<PathBuf>,
    pub timeout: Duration,
}

struct Flight {
    done: Mutex<Option<Result<Bytes, String>>>,
    cv: Condvar,
}

pub struct Store {
    index: Arc<Index>,
    dir: PathBuf,  // CACHE/chunks
    pins: PathBuf, // CACHE/pins/<pid>-<random>, this daemon's links (cache.rs)
    pinned: Vec<AtomicBool>,
    next_touch: Vec<AtomicU64>, // seconds since t0 from which a chunk's mtime may be touched again
    t0: Instant,
    bound: Arc<Bound>,
    http: ureq::Agent,
    blobs: String, // {registry}/v2/{repo}/blobs/
    repo: String,
    auth: RwLock<Option<String>>,
    creds: Option<Creds>,
    reauth: Mutex<()>,  // one renewal at a time; the others then use its header
    patience: Duration, // how long a waiter trusts someone else's fetch
    flights: Mutex<HashMap<u32, Arc<Flight>>>,
    memo: Mutex<VecDeque<(u32, Bytes)>>,
    failed: Mutex<HashMap<u32, Instant>>,
    tmp_seq: AtomicU64,
    pub stats: Stats,
}

impl Store {
    /// `max_bytes`: the bound on the cache's chunks/ (0: none).
    pub fn new(index: Arc<Index>, cache: &Path, reg: Registry, max_bytes: u64) -> Result<Store, String> {
        let dir = cache.join("chunks");
        fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let pins = make_pin_dir(cache)?;
        let http: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(reg.timeout))
            .timeout_connect(Some(CONNECT_TIMEOUT.min(reg.timeout)))
            .http_status_as_error(false)
            // a registry may send blob reads elsewhere (307 to storage); the token stays with the registry
            .max_redirects(5)
            .redirect_auth_headers(ureq::config::RedirectAuthHeaders::SameHost)
            .max_idle_connections(64)
            .max_idle_connections_per_host(32)
            .tls_config(ureq::tls::TlsConfig::builder().root_certs(root_certs(reg.ca_file.as_deref())?).build())
            .build()
            .into();
        let n = index.chunks.len();
        Ok(Store {
            index,
            dir,
            pins,
            pinned: (0..n).map(|_| AtomicBool::new(false)).collect(),
            next_touch: (0..n).map(|_| AtomicU64::new(0)).collect(),
            t0: Instant::now(),
            bound: Bound::start(cache, max_bytes),
            http,
            blobs: format!("{}/v2/{}/blobs/", reg.url.trim_end_matches('/'), reg.repo),
            repo: reg.repo,
            auth: RwLock::new(reg.auth),
            creds: reg.creds,
            reauth: Mutex::new(()),
            patience: reg.timeout * 2 + Duration::from_secs(5),
            flights: Mutex::new(HashMap::new()),
            memo: Mutex::new(VecDeque::new()),
            failed: Mutex::new(HashMap::new()),
            tmp_seq: AtomicU64::new(0),
            stats: Stats::default(),
        })
    }

    /// The verified bytes of chunks `cis` (a read's chunks, in file order). Missing ones are
    /// fetched right away, grouped into runs: a read never queues behind the prefetch.
    pub fn chunks(&self, cis: &[u32]) -> Result<Vec<Bytes>, String> {
        let mut out: Vec<Option<Bytes>> = vec![None; cis.len()];
        let mut mine = Vec::new(); // positions in cis this call fetches
        let mut theirs = Vec::new(); // (position, flight) fetched by someone else
        let mut refused = None;
        for (i, &ci) in cis.iter().enumerate() {
            if let Some(b) = self.memo_get(ci).or_else(|| self.read_cached(ci)) {
                self.stats.hits.fetch_add(1, Relaxed);
                out[i] = Some(b);
                continue;
            }
            if self.failed.lock().unwrap().get(&ci).is_some_and(|t| t.elapsed() < FAILED_FOR) {
                refused = Some(format!("chunk {ci}: its fetch failed just now"));
                break;
            }
            match self.claim(ci) {
                Ok(()) => match self.read_cached(ci) {
                    // written by another fetch (or daemon) between our look and our claim
                    Some(b) => {
                        self.finish(ci, Ok(b.clone()));
                        out[i] = Some(b);
                    }
                    None => mine.push(i),
                },
                Err(f) => theirs.push((i, f)),
            }
        }
        let mine_cis: Vec<u32> = mine.iter().map(|&i| cis[i]).collect();
        if let Some(e) = refused {
            // release what this call claimed: a claimed chunk must always be finished
            for &ci in &mine_cis {
                self.finish(ci, Err(e.clone()));
            }
            return Err(e);
        }
        let mut fetched = Vec::new();
        for run in self.runs(&mine_cis) {
            fetched.extend(self.fetch_run(&run));
        }
        for (&i, r) in mine.iter().zip(fetched) {
            out[i] = Some(r?);
        }
        for (i, f) in theirs {
            out[i] = Some(self.wait(cis[i], &f)?);
        }
        let out: Vec<Bytes> = out.into_iter().map(|b| b.expect("every chunk resolved")).collect();
        for (&ci, b) in cis.iter().zip(&out) {
            self.memo_put(ci, b);
        }
        Ok(out)
    }

    /// One prefetch worker: claim the next run of chunks not yet cached nor in flight, in index
    /// order (`cursor` is shared by the workers), fetch it, repeat until `end` chunks are done or
    /// `stop`. Returns (bytes fetched, chunks that failed).
    pub fn prefetch(&self, cursor: &Mutex<usize>, end: usize, stop: &AtomicBool) -> (u64, u64) {
        let end = end.min(self.index.chunks.len());
        let (mut bytes, mut failed) = (0u64, 0u64);
        while !stop.load(Relaxed) {
            let run = {
                let mut cur = cursor.lock().unwrap();
                let mut want = Vec::new();
                let mut size = 0;
                while *cur < end {
                    let ci = *cur as u32;
                    let c = &self.index.chunks[ci as usize];
                    if let Some(&prev) = want.last() {
                        if !self.follows(prev, ci) || size + c.stored > MAX_RUN {
                            break;
                        }
                    }
                    *cur += 1;
                    if self.pin(ci) {
                        if want.is_empty() {
                            continue;
                        }
                        break;
                    }
                    size += c.stored;
                    want.push(ci);
                }
                let mut flights = self.flights.lock().unwrap();
                want.retain(|ci| !flights.contains_key(ci));
                for &ci in &want {
                    flights.insert(ci, new_flight());
                }
                want
            };
            if run.is_empty() {
                if *cursor.lock().unwrap() >= end {
                    break;
                }
                continue;
            }
            for sub in self.runs(&run) {
                for (ci, r) in sub.iter().zip(self.fetch_run(&sub)) {
                    match r {
                        Ok(_) => bytes += self.index.chunks[*ci as usize].stored as u64,
                        Err(_) => failed += 1,
                    }
                }
            }
        }
        (bytes, failed)
    }

    /// Claim `ci` for fetching: Ok if this caller now owns its flight, Err(flight) to wait on.
    fn claim(&self, ci: u32) -> Result<(), Arc<Flight>> {
        let mut flights = self.flights.lock().unwrap();
        if let Some(f) = flights.get(&ci) {
            return Err(f.clone());
        }
        flights.insert(ci, new_flight());
        Ok(())
    }

    /// Publish a claimed chunk's outcome to its waiters and forget the flight.
    fn finish(&self, ci: u32, r: Result<Bytes, String>) {
        if let Some(f) = self.flights.lock().unwrap().remove(&ci) {
            *f.done.lock().unwrap() = Some(r);
            f.cv.notify_all();
        }
    }

    fn wait(&self, ci: u32, f: &Flight) -> Result<Bytes, String> {
        let deadline = Instant::now() + self.patience;
        let mut done = f.done.lock().unwrap();
        while done.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("chunk {ci}: gave up waiting for its fetch"));
            }
            done = f.cv.wait_timeout(done, left).unwrap().0;
        }
        done.clone().unwrap()
    }

    /// Whether chunk `b` sits right after chunk `a` in the same pack (one GET can carry both).
    fn follows(&self, a: u32, b: u32) -> bool {
        let (x, y) = (&self.index.chunks[a as usize], &self.index.chunks[b as usize]);
        x.pack == y.pack && x.offset + x.stored as u64 == y.offset
    }

    /// Split chunks into runs that one GET each can fetch.
    fn runs(&self, cis: &[u32]) -> Vec<Vec<u32>> {
        let mut out: Vec<Vec<u32>> = Vec::new();
        let mut size = 0;
        for &ci in cis {
            let c = self.index.chunks[ci as usize].stored;
            match out.last_mut() {
                Some(run) if self.follows(*run.last().unwrap(), ci) && size + c <= MAX_RUN => {
                    run.push(ci);
                    size += c;
                }
                _ => {
                    out.push(vec![ci]);
                    size = c;
                }
            }
        }
        out
    }

    /// Fetch one run of claimed chunks with one GET, verify each chunk (a mismatch is fetched once
    /// more on its own), cache the good ones, and finish every flight. Results in run order.
    fn fetch_run(&self, run: &[u32]) -> Vec<Result<Bytes, String>> {
        let ix = &self.index;
        let (first, last) = (&ix.chunks[run[0] as usize], &ix.chunks[*run.last().unwrap() as usize]);
        let pack = first.pack;
        let got = self.get_range(pack, first.offset, last.offset + last.stored as u64);
        let mut out = Vec::with_capacity(run.len());
        for &ci in run {
            let c = &ix.chunks[ci as usize];
            let r = match &got {
                Err(e) => Err(e.clone()),
                Ok(buf) => {
                    let at = (c.offset - first.offset) as usize;
                    self.verified(ci, &buf[at..at + c.stored])
                }
            };
            match &r {
                Ok(b) => {
                    self.put_cache(ci, b);
                    self.stats.fetched_chunks.fetch_add(1, Relaxed);
                }
                Err(_) => {
                    let mut failed = self.failed.lock().unwrap();
                    failed.retain(|_, t| t.elapsed() < FAILED_FOR);
                    failed.insert(ci, Instant::now());
                }
            }
            self.finish(ci, r.clone());
            out.push(r);
        }
        if got.is_ok() {
            self.stats.fetched_bytes.fetch_add(last.offset + last.stored as u64 - first.offset, Relaxed);
        }
        out
    }

    /// The chunk's bytes from its stored form `data` (decompressed if it is a frame) if their digest
    /// matches; else one refetch of the chunk alone.
    fn verified(&self, ci: u32, data: &[u8]) -> Result<Bytes, String> {
        let c = &self.index.chunks[ci as usize];
        let pack = &self.index.packs[c.pack].digest;
        if let Some(b) = decoded(c, data) {
            return Ok(Bytes::from(b));
        }
        self.stats.verify_failures.fetch_add(1, Relaxed);
        say!("chunk blake3:{} from pack {pack} failed verification; fetching it again", c.hash.to_hex());
        let again = self.get_range(c.pack, c.offset, c.offset + c.stored as u64)?;
        self.stats.fetched_bytes.fetch_add(c.stored as u64, Relaxed);
        if let Some(b) = decoded(c, &again) {
            return Ok(Bytes::from(b));
        }
        self.stats.verify_failures.fetch_add(1, Relaxed);
        let e = format!("chunk blake3:{} from pack {pack} failed verification twice: EIO", c.hash.to_hex());
        say!("{e}");
        Err(e)
    }

    /// GET bytes [a, b) of a pack.
    fn get_range(&self, pack: usize, a: u64, b: u64) -> Result<Vec<u8>, String> {
        let p = &self.index.packs[pack];
        let url = format!("{}{}", self.blobs, p.digest);
        let what = format!("GET {url} bytes {a}-{}", b - 1);
        let fail = |e: String| {
            self.stats.fetch_errors.fetch_add(1, Relaxed);
            say!("{what}: {e}");
            e
        };
        let mut attempt = 0;
        let mut resp = loop {
            let sent = self.auth.read().unwrap().clone();
            let mut req = self.http.get(&url).header("Range", format!("bytes={a}-{}", b - 1));
            if let Some(h) = &sent {
                req = req.header("Authorization", h);
            }
            let resp = req.call().map_err(|e| fail(e.to_string()))?;
            if resp.status().as_u16() != 401 || attempt == 1 {
                break resp;
            }
            attempt += 1;
            let challenge = resp.headers().get("www-authenticate").and_then(|v| v.to_str().ok()).unwrap_or("");
            self.renew_auth(challenge, sent).map_err(fail)?;
        };
        let status = resp.status().as_u16();
        if status == 401 {
            return Err(fail("the registry refused the renewed credentials (HTTP 401)".into()));
        }
        // 200 carries the whole blob: fine only when that is what was asked for
        if status != 206 && !(status == 200 && a == 0 && b == p.size) {
            return Err(fail(format!("registry answered HTTP {status}")));
        }
        let want = (b - a) as usize;
        let body = resp.body_mut().with_config().limit(want as u64).read_to_vec().map_err(|e| fail(e.to_string()))?;
        if body.len() != want {
            return Err(fail(format!("got {} bytes, wanted {want}", body.len())));
        }
        Ok(body)
    }

    /// Answer a 401 to a request sent with `sent`: unless another thread has renewed the header
    /// since, ask the registry's auth scheme for a new one.
    fn renew_auth(&self, challenge: &str, sent: Option<String>) -> Result<(), String> {
        let _one = self.reauth.lock().unwrap();
        if *self.auth.read().unwrap() != sent {
            return Ok(());
        }
        let header = auth::answer(&self.http, challenge, self.creds.as_ref(), &self.repo)?;
        let scheme = header.split(' ').next().unwrap_or("").to_string();
        *self.auth.write().unwrap() = Some(header);
        say!("the registry answered 401: {scheme} credentials renewed");
        Ok(())
    }

    /// The bound on the cache (0: none), for the log.
    pub fn max_bytes(&self) -> u64 {
        self.bound.max()
    }

    /// Remove this daemon's pin dir (at exit): its chunks become evictable.
    pub fn unpin_all(&self) {
        let _ = fs::remove_dir_all(&self.pins);
    }

    fn path(&self, ci: u32) -> PathBuf {
        let hex = self.index.chunks[ci as usize].hash.to_hex();
        self.dir.join(&hex[..2]).join(hex.as_str())
    }

    fn pin_path(&self, ci: u32) -> PathBuf {
        self.pins.join(self.index.chunks[ci as usize].hash.to_hex().as_str())
    }

    /// Make sure this daemon holds a link to chunk `ci`'s cache file; false if the cache lacks it.
    fn pin(&self, ci: u32) -> bool {
        if self.pinned[ci as usize].load(Relaxed) {
            return true;
        }
        match fs::hard_link(self.path(ci), self.pin_path(ci)) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return false,
            _ => self.pinned[ci as usize].store(true, Relaxed),
        }
        true
    }

    /// The cache file's bytes if present and intact, read through this daemon's pin (made now if
    /// need be); a damaged file is removed (and counted).
    fn read_cached(&self, ci: u32) -> Option<Bytes> {
        if !self.pin(ci) {
            return None;
        }
        let pin = self.pin_path(ci);
        let Ok(data) = read_direct(&pin, self.index.chunks[ci as usize].size) else {
            // the link is gone (the pin dir removed under us): look in chunks/ again next time
            self.pinned[ci as usize].store(false, Relaxed);
            return None;
        };
        if blake3::hash(&data) == self.index.chunks[ci as usize].hash {
            self.touch(ci, &pin);
            return Some(data);
        }
        self.stats.verify_failures.fetch_add(1, Relaxed);
        let path = self.path(ci);
        say!("cache file {} is corrupt: removed, fetching the chunk again", path.display());
        self.pinned[ci as usize].store(false, Relaxed);
        let _ = fs::remove_file(&pin);
        let _ = fs::remove_file(&path);
        None
    }

    /// Mark the chunk's file as just used (its mtime, shared by every link), at most once a minute.
    fn touch(&self, ci: u32, pin: &Path) {
        let now = self.t0.elapsed().as_secs();
        if self.next_touch[ci as usize].load(Relaxed) <= now {
            self.next_touch[ci as usize].store(now + TOUCH_EVERY_S, Relaxed);
            let _ = fs::File::open(pin).and_then(|f| f.set_modified(SystemTime::now()));
        }
    }

    fn put_cache(&self, ci: u32, data: &[u8]) {
        if self.pin(ci) {
            return; // already cached (by another daemon, or by another fetch of ours)
        }
        let path = self.path(ci);
        let dir = path.parent().unwrap();
        let tmp = dir.join(format!(
            ".{}.{}-{}.tmp",
            path.file_name().unwrap().to_string_lossy(),
            std::process::id(),
            self.tmp_seq.fetch_add(1, Relaxed)
        ));
        let r = fs::create_dir_all(dir).and_then(|_| fs::write(&tmp, data));
        // pinned before it has its chunks/ name: no eviction pass ever sees it unpinned
        let pinned = r.is_ok() && fs::hard_link(&tmp, self.pin_path(ci)).is_ok();
        match r.and_then(|_| fs::rename(&tmp, &path)) {
            Ok(()) => self.bound.wrote(data.len() as u64),
            Err(e) => {
                // still served from memory; only the next read pays the fetch again
                let _ = fs::remove_file(&tmp);
                say!("cannot cache {}: {e}", path.display());
            }
        }
        self.pinned[ci as usize].store(pinned, Relaxed);
    }

    fn memo_get(&self, ci: u32) -> Option<Bytes> {
        let memo = self.memo.lock().unwrap();
        memo.iter().find(|(c, _)| *c == ci).map(|(_, b)| b.clone())
    }

    fn memo_put(&self, ci: u32, b: &Bytes) {
        let mut memo = self.memo.lock().unwrap();
        if memo.iter().any(|(c, _)| *c == ci) {
            return;
        }
        memo.push_back((ci, b.clone()));
        while memo.len() > MEMO_CHUNKS || memo.iter().map(|(_, b)| b.len()).sum::<usize>() > MEMO_BYTES {
            memo.pop_front();
        }
    }
}

/// A chunk's bytes from its stored form if they match its digest: a zstd frame must decode to
/// exactly the chunk's size (a larger output is cut off, never allocated) before it is hashed.
fn decoded(c: &Chunk, data: &[u8]) -> Option<Vec<u8>> {
    let out = match c.codec {
        Codec::Raw => data.to_vec(),
        Codec::Zstd => zstd::bulk::decompress(data, c.size).ok()?,
        Codec::ZstdBg2 => ungroup2(&zstd::bulk::decompress(data, c.size).ok()?),
    };
    (out.len() == c.size && blake3::hash(&out) == c.hash).then_some(out)
}

/// The even bytes, then the odd ones (how "zstd-bg2" frames hold a chunk), back in their places.
fn ungroup2(planes: &[u8]) -> Vec<u8> {
    let h = planes.len().div_ceil(2);
    let (even, odd) = planes.split_at(h);
    let mut out = vec![0u8; planes.len()];
    for (i, b) in even.iter().enumerate() {
        out[2 * i] = *b;
    }
    for (i, b) in odd.iter().enumerate() {
        out[2 * i + 1] = *b;
    }
    out
}

/// A cache file's bytes read around the page cache (O_DIRECT) where the filesystem allows it: the
/// kernel keeps what the mount served in the mount's own page cache, so a buffered read here would
/// hold every chunk twice in memory and pay for the second copy's page-cache inserts (a quarter of
/// the daemon's time on a cached sequential read). The bytes land at an aligned offset of their
/// buffer, kept as is (no copy). Falls back to a buffered read (tmpfs refuses O_DIRECT).
fn read_direct(path: &Path, size: usize) -> std::io::Result<Bytes> {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;

    const ALIGN: usize = 4096;
    let buffered = || fs::read(path).map(Bytes::from);
    let Ok(f) = fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path) else {
        return buffered();
    };
    let want = size.div_ceil(ALIGN).max(1) * ALIGN + ALIGN; // one block more: a longer file shows
    let mut buf: Vec<u8> = Vec::with_capacity(want + ALIGN);
    let off = buf.as_ptr().align_offset(ALIGN);
    let mut got = 0usize;
    loop {
        // SAFETY: off + want <= capacity; the kernel writes at most want - got bytes there
        let n = unsafe {
            libc::pread(f.as_raw_fd(), buf.as_mut_ptr().add(off + got).cast(), want - got, got as libc::off_t)
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EINVAL) => return buffered(),
                _ => return Err(e),
            }
        }
        got += n as usize;
        if n == 0 || got % ALIGN != 0 || got == want {
            break; // a short read is the end of the file
        }
    }
    // SAFETY: the first off + got bytes are initialized (padding zeroed, the rest read)
    unsafe {
        std::ptr::write_bytes(buf.as_mut_ptr(), 0, off);
        buf.set_len(off + got);
    }
    Ok(Bytes { buf: Arc::new(buf), off })
}

fn new_flight() -> Arc<Flight> {
    Arc::new(Flight { done: Mutex::new(None), cv: Condvar::new() })
}

/// The certificates an https:// registry is checked against: `ca_file` (PEM) if given, else the
/// node's trust store (/etc/ssl/certs/ca-certificates.crt: where a fleet installs its own CA),
/// else the bundled Mozilla roots.
fn root_certs(ca_file: Option<&Path>) -> Result<ureq::tls::RootCerts, String> {
    const SYSTEM: &str = "/etc/ssl/certs/ca-certificates.crt";
    let path = match ca_file {
        Some(p) => p.to_path_buf(),
        None if Path::new(SYSTEM).is_file() => PathBuf::from(SYSTEM),
        None => return Ok(ureq::tls::RootCerts::WebPki),
    };
    let pem = fs::read(&path).map_err(|e| format!("CA file {}: {e}", path.display()))?;
    let certs: Vec<_> = ureq::tls::parse_pem(&pem)
        .filter_map(|item| match item {
            Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
            _ => None,
        })
        .collect();
    if certs.is_empty() {
        return Err(format!("CA file {}: no PEM certificate in it", path.display()));
    }
    Ok(ureq::tls::RootCerts::Specific(Arc::new(certs)))
}

#[cfg(test)]
mod tests {
    use super::ungroup2;

    #[test]
    fn ungroup2_puts_even_then_odd_bytes_back_in_place() {
        assert_eq!(ungroup2(b"acebd"), b"abcde".to_vec());
        assert_eq!(ungroup2(b"acbd"), b"abcd".to_vec());
        assert_eq!(ungroup2(b""), Vec::<u8>::new());
    }
}
