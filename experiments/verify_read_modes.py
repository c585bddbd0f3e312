"""The digest check of a whole snapshot on a dropped page cache, alone, by how it reads: what it costs in
wall time and CPU (a node's first restore runs it beside the restore on the same cores).

Modes: alloc (integrity.check_file's way: a new 1 MiB bytes object per pread), reuse (preadv into one
buffer per reader), direct (O_DIRECT into one aligned buffer per reader: no page cache), mmap (the file
mapped, each chunk hashed from the mapping), mmap-pop (the same, each chunk populated first with
MADV_POPULATE_READ). Every chunk of every file (no node record), THREADS readers per file, files
smallest first; the page cache dropped before each run.

    PYTHONPATH=toolkit .venv/bin/python experiments/verify_read_modes.py SNAPSHOT MODE THREADS
"""
import mmap, os, sys, time, resource
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import xxhash
from coldstart.pipeline.manifest import read_manifest
from coldstart.pipeline.integrity import CHUNK, READ, _is_hole, _zero_digest
from coldstart.warm.residency import drop_caches
snap = Path(sys.argv[1]); mode = sys.argv[2]; threads = int(sys.argv[3])
m = read_manifest(snap)
files = sorted(((r, fe) for r, fe in m.files.items() if not r.startswith("checkpoint-logs/")), key=lambda kv: kv[1].size)
import threading
tls = threading.local()
MAPS = {}
def buf():
    b = getattr(tls, "b", None)
    if b is None:
        b = tls.b = mmap.mmap(-1, READ)
    return b
def check(fd, i, size, want):
    h = xxhash.xxh3_64(); off, end = i * CHUNK, min((i + 1) * CHUNK, size)
    if _is_hole(fd, off, end):
        return want == _zero_digest(end - off)
    if mode.startswith("mmap"):
        mm = MAPS[fd]
        if mode == "mmap-pop":
            mm.madvise(22, off, end - off)
        ok = xxhash.xxh3_64(memoryview(mm)[off:end]).hexdigest() == want
        return ok
    if mode == "alloc":
        while off < end:
            b = os.pread(fd, min(READ, end - off), off); h.update(b); off += len(b)
    else:
        b = buf(); v = memoryview(b)
        while off < end:
            want_n = min(READ, end - off)
            n = os.preadv(fd, [v[:(want_n + 4095) & ~4095] if mode == "direct" else v[:want_n]], off)
            n = min(n, want_n)
            if n <= 0: return False
            h.update(v[:n]); off += n
        v.release()
    return h.hexdigest() == want
drop_caches()
r0 = resource.getrusage(resource.RUSAGE_SELF); t0 = time.monotonic(); bad = 0
for rel, fe in files:
    flags = os.O_RDONLY | (os.O_DIRECT if mode == "direct" else 0)
    fd = os.open(snap / rel, flags)
    if mode.startswith("mmap") and fe.size:
        MAPS[fd] = mmap.mmap(fd, fe.size, prot=mmap.PROT_READ)
    with ThreadPoolExecutor(threads) as pool:
        ok = list(pool.map(lambda i: check(fd, i, fe.size, fe.chunks[i]), range(len(fe.chunks))))
    MAPS.pop(fd, None)
    os.close(fd); bad += ok.count(False)
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(f"{mode} t{threads}: {time.monotonic()-t0:.2f} s, user {r1.ru_utime-r0.ru_utime:.2f} sys {r1.ru_stime-r0.ru_stime:.2f} bad {bad}")
