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
from safetensors.torch import load_file
stfile = next(Path("/var/cache/coldstart/models/bench-seed0").glob("*.safetensors"))
class R: pass
def st():
    t0=time.perf_counter(); d=load_file(stfile)
    for k,v in d.items(): dest[k].copy_(v)
    r=R(); r.gib_per_s = sum(v.nbytes for v in d.values())/(time.perf_counter()-t0)/2**30; return r
def drop():
    fd = os.open(stfile, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
    fd = os.open(data, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
    os.system("sync; echo 3 > /proc/sys/vm/drop_caches")
cells = {
 "fio-direct-j4-1M": lambda: fio_run(data, 1, 4, 1<<20),
 "fio-buf-j4-16M": lambda: fio_run(data, 0, 4, 16<<20),
 "ours-buf-t8": lambda: load_into(flat, dest, threads=8),
 "ours-odirect-t8-8M(old)": lambda: load_into(flat, dest, threads=8, direct=True, read_bytes=8<<20),
 "ours-odirect-t8-1M": lambda: load_into(flat, dest, threads=8, direct=True),
 "ours-odirect-t4-1M": lambda: load_into(flat, dest, threads=4, direct=True),
 "safetensors": lambda: st(),
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
