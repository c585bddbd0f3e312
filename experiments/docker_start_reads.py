"""What a container's start reads from the disk after a dropped page cache, and when: the kernel's
page-cache insertions (tracefs filemap:mm_filemap_add_to_page_cache, CLOCK_MONOTONIC) during a start
of the restore's container running only the entrypoint's start (bench.containers.ENTRY_PROBE; our
bridge, a published port, the restore's capabilities and tmpfs), attributed to files by inode.

    PYTHONPATH=toolkit .venv/bin/python experiments/docker_start_reads.py IMAGE REPS [RUNTIME [SNAPSHOT]]

Per file, summed over REPS cold starts (MiB, and the median first read from the create call): the part
read before docker's start call returned, and the part after it until the probe exited. Files are
found by inode under the host's system directories and our dockerd's data root (the image's layers);
the rest is "?". Needs root, tracefs and our dockerd; RUNTIME: an OCI runtime the daemon knows
(default: coldstart's choice, docker_api.oci_runtime; "-" for that too); SNAPSHOT: the host warms
it from the create call as for a restore (containers.run.host_warm), cancelled when the probe exits."""
import collections
import re
import statistics
import sys
import time
from pathlib import Path

from coldstart.bench.containers import ENTRY_PROBE
from coldstart.containers import docker_api, run
from coldstart.warm.residency import drop_caches
from page_cache_trace import EVENT, TRACE, inode_names, kind, setup

LINE = re.compile(r"\s(\d+\.\d+): mm_filemap_add_to_page_cache: dev (\d+):(\d+) ino ([0-9a-f]+) .*ofs=(\d+) order=(\d+)")

img, reps = sys.argv[1], int(sys.argv[2])
c = docker_api.client(None)
rt = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] != "-" else docker_api.oci_runtime(c)
snap = Path(sys.argv[4]) if len(sys.argv) > 4 else None
layers = docker_api.image_layers(c, img)
net = docker_api.ensure_network(c)
setup(65536)

per = collections.defaultdict(lambda: {"before": 0, "after": 0, "first": []})  # (dev, ino) -> bytes, first read
for rep in range(reps):
    drop_caches()
    (TRACE / "trace").write_text("")
    EVENT.write_text("1")
    t0 = time.monotonic()
    warmer = run.host_warm(snap, layers) if snap else None
    ctr = c.containers.create(img, ["-c", ENTRY_PROBE], entrypoint=["python"], network=net, runtime=rt,
                              ports={"8000/tcp": ("127.0.0.1", 18556)}, tmpfs=run.STATE_TMPFS, shm_size=run.SHM_SIZE,
                              **run.RESTORE_SECURITY)
    ctr.start()
    started = time.monotonic()
    ctr.wait()
    if warmer is not None:
        warmer.cancel()
        warmer.wait()
    EVENT.write_text("0")
    ctr.remove()
    seen = set()
    for m in LINE.finditer((TRACE / "trace").read_text()):
        ts, dev, ino, order = float(m[1]), (int(m[2]), int(m[3])), int(m[4], 16), int(m[6])
        if ts < t0:
            continue
        f = per[(dev, ino)]
        f["before" if ts < started else "after"] += 4096 << order
        if (dev, ino) not in seen:
            seen.add((dev, ino))
            f["first"].append(ts - t0)
    print(f"rep {rep}: start call returned {started - t0:.3f} s after the create call", file=sys.stderr)

names = inode_names({ino for _, ino in per})

MiB = 1 << 20
rows = sorted(per.items(), key=lambda kv: -(kv[1]["before"] + kv[1]["after"]))
totals = collections.defaultdict(lambda: [0, 0])
for (dev, ino), f in rows:
    k = kind(names.get(ino, "?"))
    totals[k][0] += f["before"]
    totals[k][1] += f["after"]
print(f"runtime {rt or 'daemon default'}; host warming: {snap or 'none'}; {reps} cold starts; MiB read per start: "
      "before the start call returned / after")
for k, (b, a) in sorted(totals.items(), key=lambda kv: -sum(kv[1])):
    print(f"  {k:18} {b / MiB / reps:7.2f} / {a / MiB / reps:7.2f}")
print("files (MiB per start before / after; median first read from the create call, s):")
for (dev, ino), f in rows[:40]:
    print(f"  {f['before'] / MiB / reps:7.2f} / {f['after'] / MiB / reps:7.2f}  {statistics.median(f['first']):.3f}  "
          f"{names.get(ino, '?')} ({dev[0]}:{dev[1]})")
