import os, random, sys, time, statistics, json
from pathlib import Path
from coldstart.weights.loader import load_into, alloc_like_index
from coldstart.weights.format import read_index
from coldstart.weights.bench import fio_run
flat = Path("/var/cache/coldstart/bench-load/bench-seed0-95d15027027fd9c5/flat")
idx = read_index(flat)
dest = alloc_like_index(idx)
data = Path(idx.data_file)
size = data.stat().st_size
def drop():
    fd = os.open(data, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
    os.system("sync; echo 3 > /proc/sys/vm/drop_caches")
cells = {
 "fio-direct-j4-1M": lambda: fio_run(data, 1, 4, 1<<20),
 "fio-buf-j4-1M": lambda: fio_run(data, 0, 4, 1<<20),
 "fio-direct-j2-1M": lambda: fio_run(data, 1, 2, 1<<20),
 "ours-buf-t8": lambda: load_into(flat, dest, threads=8),
 "ours-buf-t2": lambda: load_into(flat, dest, threads=2),
 "ours-odirect-t4-1M": lambda: load_into(flat, dest, threads=4, direct=True),
 "ours-odirect-t8-1M": lambda: load_into(flat, dest, threads=8, direct=True),
 "ours-odirect-t2-1M": lambda: load_into(flat, dest, threads=2, direct=True),
}
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
res = {k: [] for k in cells}
rng = random.Random(0)
for r in range(reps):
    order = list(cells); rng.shuffle(order)
    for k in order:
        drop(); time.sleep(0.3)
        t0 = time.perf_counter(); out = cells[k](); dt = time.perf_counter() - t0
        if isinstance(out, tuple): gib = out[0] / out[1] / 2**30
        else: gib = out.gib_per_s
        res[k].append(gib)
    print(r, {k: round(v[-1], 2) for k, v in res.items()}, flush=True)
for k, v in res.items():
    print(f"{k:22s} median {statistics.median(v):.2f}  {[round(x,2) for x in v]}")
json.dump(res, open("/tmp/exp/odirect.json", "w"))
