"""How fast weights.loader.SpanStream reads a flat dump's linear weights with O_DIRECT, page cache
dropped before each pass, for a few reader/step/ring shapes (results/spot-checks/reload-stream).

Run as root from the repo root: PYTHONPATH=toolkit .venv/bin/python experiments/span_stream_read.py FLAT_DIR
"""
import json
import os
import sys
import threading
import time

from coldstart.weights.loader import SpanStream

flat = sys.argv[1].rstrip("/") + "/"
idx = json.load(open(flat + "weights.index.json"))
ranges = sorted([(t["name"], t["offset"], t["nbytes"]) for t in idx["tensors"]
                 if t["name"].endswith("proj.weight") or t["name"] == "lm_head.weight"], key=lambda r: r[1])
tot = sum(r[2] for r in ranges)
for threads, step, ring in [(8, 1 << 20, 256 << 20), (4, 1 << 20, 256 << 20), (4, 4 << 20, 256 << 20),
                            (8, 2 << 20, 512 << 20), (16, 1 << 20, 256 << 20)]:
    for rep in range(2):
        os.system("sync; echo 3 > /proc/sys/vm/drop_caches")
        t = time.perf_counter()
        with SpanStream(flat + "weights.flat", ranges, ring=ring, threads=threads, step=step) as st:
            def consume():
                while (item := st.take()) is not None:
                    st.done(item[2])
            ths = [threading.Thread(target=consume) for _ in range(2)]
            for th in ths:
                th.start()
            for th in ths:
                th.join()
        dt = time.perf_counter() - t
        print(threads, step >> 20, ring >> 20, round(tot / 2**30 / dt, 2), "GiB/s", round(dt, 3), flush=True)
