import os, random, sys, time, statistics, json, mmap
from pathlib import Path
import torch
from coldstart.weights.loader import load_into, alloc_like_index
from coldstart.weights.format import read_index, torch_dtype, align_up
from coldstart.weights.bench import fio_run
flat = Path("/var/cache/coldstart/bench-load/bench-seed0-95d15027027fd9c5/flat")
idx = read_index(flat)
dest = alloc_like_index(idx)
# page-aligned destination laid out like torch would (each tensor its own 4K-aligned block)
tot = sum(align_up(e.nbytes, 4096) for e in idx.tensors)
arena = mmap.mmap(-1, tot)
adest, pos = {}, 0
for e in idx.tensors:
    t = torch.frombuffer(arena, dtype=torch.uint8, count=e.nbytes, offset=pos).view(torch_dtype(e.dtype)).view(e.shape)
    t.zero_(); adest[e.name] = t; pos += align_up(e.nbytes, 4096)
data = Path(idx.data_file)
def drop():
    fd = os.open(data, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
    os.system("sync; echo 3 > /proc/sys/vm/drop_caches")
cells = {
 "fio-direct-j4-1M": lambda: fio_run(data, 1, 4, 1<<20),
 "fio-direct-j2-1M": lambda: fio_run(data, 1, 2, 1<<20),
 "fio-buf-j2-1M": lambda: fio_run(data, 0, 2, 1<<20),
 "ours-buf-t8": lambda: load_into(flat, dest, threads=8),
 "ours-odirect-t4-bounce": lambda: load_into(flat, dest, threads=4, direct=True),
 "ours-odirect-t2-aligned": lambda: load_into(flat, adest, threads=2, direct=True),
 "ours-odirect-t4-aligned": lambda: load_into(flat, adest, threads=4, direct=True),
 "ours-buf-t8-aligned": lambda: load_into(flat, adest, threads=8),
}
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
res = {k: [] for k in cells}
rng = random.Random(1)
for r in range(reps):
    order = list(cells); rng.shuffle(order)
    for k in order:
        drop(); time.sleep(0.3)
        out = cells[k]()
        gib = out[0] / out[1] / 2**30 if isinstance(out, tuple) else out.gib_per_s
        res[k].append(gib)
    print(r, {k: round(v[-1], 2) for k, v in res.items()}, flush=True)
for k, v in res.items():
    print(f"{k:26s} median {statistics.median(v):.2f}  {[round(x,2) for x in v]}")
for k in res["ours-odirect-t2-aligned"], :
    pass
