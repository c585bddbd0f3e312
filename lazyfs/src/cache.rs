//! The node cache's housekeeping: pins, and the size bound (--cache-max-bytes).
//!
//! Several daemons share CACHE/chunks without a lock. Each keeps a pin dir of its own,
//! CACHE/pins/<pid>-<random>/, holding a hard link to every chunk file it has served or prefetched,
//! and reads chunks through those links (store.rs). A chunk file whose link count is 1 is thus used
//! by no live mount and may be evicted; one with more is never, and should its chunks/ name go
//! anyway (a race with a mount pinning it), that mount still reads it through its own link. Links
//! cost no bytes. A daemon removes its pin dir at a clean exit; the next one to start removes those
//! of dead pids (daemons sharing a cache share a pid namespace: they run on the host).
//!
//! With a bound, a background thread keeps the bytes under chunks/ below it: an estimate grows with
//! this daemon's writes, which wake the thread once it passes the bound, and a rescan every minute
//! catches the other daemons' writes. Over the bound, the least recently used unpinned files go
//! (mtime: store.rs touches a file when it serves it) until 10% under it. Reads never wait for it.

use std::collections::hash_map::RandomState;
use std::fs;
use std::hash::BuildHasher;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, SystemTime};

use crate::log::say;

/// Without a wake-up, rescan this often: other daemons write to the same cache.
const RESCAN: Duration = Duration::from_secs(60);
/// A pass stats every chunk file: at most one this often, however fast chunks arrive (the bound is
/// then passed by at most what arrives meanwhile).
const MIN_GAP: Duration = Duration::from_secs(2);
/// A temp file this old was left by a killed writer (writing one chunk takes far less).
const STALE_TMP: Duration = Duration::from_secs(60);

/// A fresh pin dir: the pid tells whether its owner is alive, the random part keeps a reused pid
/// from finding a dead daemon's links.
pub fn make_pin_dir(cache: &Path) -> Result<PathBuf, String> {
    let random = RandomState::new().hash_one(std::process::id());
    let dir = cache.join("pins").join(format!("{}-{random:016x}", std::process::id()));
    fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    Ok(dir)
}

pub struct Bound {
    max: u64,             // 0: no bound
    bytes: AtomicU64,     // estimate of the bytes under chunks/
    next_pass: AtomicU64, // a write that takes the estimate past this wakes the thread
    wake: mpsc::Sender<()>,
}

impl Bound {
    /// Start the housekeeping thread: it clears what dead daemons left (pin dirs, temp files),
    /// then, with a bound (`max` > 0), keeps chunks/ under it until the process exits.
    pub fn start(cache: &Path, max: u64) -> Arc<Bound> {
        let (wake, woken) = mpsc::channel();
        let bound = Arc::new(Bound { max, bytes: AtomicU64::new(0), next_pass: AtomicU64::new(u64::MAX), wake });
        let (me, chunks, pins) = (bound.clone(), cache.join("chunks"), cache.join("pins"));
        thread::Builder::new()
            .name("cache".into())
            .spawn(move || loop {
                remove_dead_pins(&pins);
                me.pass(&chunks);
                if me.max == 0 {
                    return;
                }
                thread::sleep(MIN_GAP);
                match woken.recv_timeout(RESCAN) {
                    Ok(()) => while woken.try_recv().is_ok() {}, // one pass answers every write so far
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
            })
            .expect("spawn the cache thread");
        bound
    }

    /// This daemon added `n` bytes to chunks/.
    pub fn wrote(&self, n: u64) {
        if self.bytes.fetch_add(n, Relaxed) + n > self.next_pass.load(Relaxed) {
            let _ = self.wake.send(());
        }
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    /// Scan chunks/ (dropping stale temp files); over the bound, remove the least recently used
    /// files no mount pins until 10% under it. Sets the estimate to what is left.
    fn pass(&self, chunks: &Path) {
        let (mut total, mut pinned) = (0u64, 0u64);
        let mut unpinned = Vec::new(); // (mtime, size, path)
        for sub in fs::read_dir(chunks).into_iter().flatten().flatten() {
            for e in fs::read_dir(sub.path()).into_iter().flatten().flatten() {
                let Ok(md) = e.metadata() else { continue };
                let mtime = md.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                if e.file_name().as_bytes().starts_with(b".") {
                    // a temp file (store.rs): old ones were left by a writer that was killed
                    if mtime.elapsed().is_ok_and(|age| age > STALE_TMP) {
                        let _ = fs::remove_file(e.path());
                    }
                    continue;
                }
                total += md.len();
                if md.nlink() > 1 {
                    pinned += md.len();
                } else {
                    unpinned.push((mtime, md.len(), e.path()));
                }
            }
        }
        let slack = self.max / 10;
        if self.max > 0 && total > self.max {
            unpinned.sort();
            let (mut files, mut freed) = (0u64, 0u64);
            for (_, size, path) in unpinned {
                if total - freed <= self.max - slack {
                    break;
                }
                // a mount may have pinned it since the scan. The race the other way (pinned just
                // after this check) is harmless: that mount reads through its own link.
                if fs::metadata(&path).is_ok_and(|m| m.nlink() == 1) && fs::remove_file(&path).is_ok() {
                    files += 1;
                    freed += size;
                }
            }
            total -= freed;
            say!(
                "cache eviction: {files} files, {freed} bytes removed; {total} bytes left under chunks/ \
                 (bound {}), {pinned} of them pinned by live mounts",
                self.max
            );
        }
        self.bytes.store(total, Relaxed);
        // pinned bytes over the bound stay: the next pass waits until there is something new to evict
        self.next_pass.store(if self.max == 0 { u64::MAX } else { self.max.max(total + slack) }, Relaxed);
    }
}

/// Remove the pin dirs of daemons that died without cleaning up: their links would keep those
/// chunks from eviction forever.
fn remove_dead_pins(pins: &Path) {
    for e in fs::read_dir(pins).into_iter().flatten().flatten() {
        let name = e.file_name();
        let pid = name.to_str().and_then(|n| n.split('-').next()).and_then(|p| p.parse::<i32>().ok());
        if pid.is_some_and(|p| p > 0 && !alive(p)) && fs::remove_dir_all(e.path()).is_ok() {
            say!("removed the pins of dead daemon {}", name.to_string_lossy());
        }
    }
}

fn alive(pid: i32) -> bool {
    // a zombie (killed, its parent not yet told) holds no links it could still read
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')').is_some_and(|(_, state)| !state.trim_start().starts_with('Z'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_evicts_the_oldest_unpinned_files_until_under_the_bound() {
        let cache = std::env::temp_dir().join(format!("lazyfs-cache-test-{}", std::process::id()));
        let (chunks, pins) = (cache.join("chunks/ab"), cache.join("pins/1-0"));
        fs::create_dir_all(&chunks).unwrap();
        fs::create_dir_all(&pins).unwrap();
        // five 100-byte files, "a" the least recently used; "b" pinned by a mount
        for (i, name) in ["a", "b", "c", "d", "e"].iter().enumerate() {
            let p = chunks.join(name);
            fs::write(&p, [0u8; 100]).unwrap();
            let t = SystemTime::now() - Duration::from_secs(1000 - i as u64);
            fs::File::options().write(true).open(&p).unwrap().set_modified(t).unwrap();
        }
        fs::hard_link(chunks.join("b"), pins.join("b")).unwrap();
        fs::write(chunks.join(".c.1-0.tmp"), b"being written").unwrap();
        fs::write(chunks.join(".d.1-1.tmp"), b"left by a killed writer").unwrap();
        let old = SystemTime::now() - Duration::from_secs(120);
        fs::File::options().write(true).open(chunks.join(".d.1-1.tmp")).unwrap().set_modified(old).unwrap();
        let (wake, _woken) = mpsc::channel();
        let bound = Bound { max: 300, bytes: AtomicU64::new(0), next_pass: AtomicU64::new(0), wake };
        bound.pass(&cache.join("chunks"));
        let left: Vec<_> = ["a", "b", "c", "d", "e"].into_iter().filter(|n| chunks.join(n).exists()).collect();
        // 500 > 300: a and c go (b is pinned), 300 is not 10% under, so d goes too
        assert_eq!(left, ["b", "e"]);
        assert_eq!(bound.bytes.load(Relaxed), 200);
        assert!(chunks.join(".c.1-0.tmp").exists() && !chunks.join(".d.1-1.tmp").exists());
        fs::remove_dir_all(&cache).unwrap();
    }
}
