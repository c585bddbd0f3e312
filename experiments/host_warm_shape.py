"""When and how hard should the host warm a snapshot while docker creates and starts the restore
container? results/container-avx512 showed the host warmer (8 readers x 8 MiB in flight from the
create call) delaying docker's own start call from 0.3-0.5 s to 1.3-2.5 s, which ate what the
warming saved.

Cold page cache (dropped before every start), one restore container at a time, in variants of the
host warmer: from the create call or from the moment docker's start call returns (``after_start``),
and its readers x chunk. For each start: seconds from the create call to the first completion
through the published port, the start call's return, the entrypoint's events, bytes read from the
disk. ``criu_runs`` (HostWarm) is off unless a variant says so, ``early`` on (its defaults); in bench-criu-runs.jsonl (code
8e9347d, when it was on by default) ``started-8x8M`` had it on.
One unmeasured restore first (the first on this node: verifies, records the profile).

    .venv/bin/python experiments/host_warm_shape.py --size bench --reps 3 \\
        --out results/spot-checks/host-warm-shape/bench.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from unittest import mock

from coldstart.bench.containers import bench_case, new_to_node, one_start
from coldstart.warm.residency import drop_caches
from coldstart.warm.snapshot import node_profile

MiB = 1 << 20
VARIANTS = {
    "none": None,  # the restore alone, no host warming
    "none-be": None,  # the same, its entrypoint's warmer in the normal I/O class (CONTAINER_ENV)
    "none-noverlap": None,  # the same, its map reload prepacking after populating (CONTAINER_ENV)
    "none-2x2": None,  # the same, its entrypoint's warmer 2 readers x 2 MiB (CONTAINER_ENV)
    "create-8x8M": {"after_start": False, "threads": 8, "chunk": 8 * MiB},
    "started-8x8M": {"after_start": True, "threads": 8, "chunk": 8 * MiB},
    "create-2x2M": {"after_start": False, "threads": 2, "chunk": 2 * MiB},
    "started-2x4M": {"after_start": True, "threads": 2, "chunk": 4 * MiB},
    # CRIU's own reads (ELF heads, page runs) asked for at the create call too, or explicitly not
    "started-8x8M-runs": {"after_start": True, "threads": 8, "chunk": 8 * MiB, "criu_runs": True},
    "started-8x8M-noruns": {"after_start": True, "threads": 8, "chunk": 8 * MiB, "criu_runs": False},
    # the entrypoint's files, the snapshot's metadata and the restore's helpers read first, from the
    # create call (HostWarm's ``early``, its default), or not
    "started-8x8M-early": {"after_start": True, "threads": 8, "chunk": 8 * MiB, "early": True},
    "started-8x8M-noearly": {"after_start": True, "threads": 8, "chunk": 8 * MiB, "early": False},
    # and then what CRIU reads rather than maps (ELF heads, page runs), still before the bulk reads
    "started-8x8M-earlycriu": {"after_start": True, "threads": 8, "chunk": 8 * MiB, "early": True,
                               "early_criu": True},
    # after the early files, only the weights from the host: CRIU's and the restored tree's reads
    # do not queue behind the host's reads of the pages
    "started-8x8M-early-weights": {"after_start": True, "threads": 8, "chunk": 8 * MiB, "early": True,
                                   "bulk": "weights"},
    # the bulk reads without the copy to user space (MADV_POPULATE_READ): the host's reads cost the
    # restore less CPU on 2 cores
    "started-8x8M-populate": {"after_start": True, "threads": 8, "chunk": 8 * MiB, "early": True,
                              "method": "populate"},
    "started-2x8M-populate": {"after_start": True, "threads": 2, "chunk": 8 * MiB, "early": True,
                              "method": "populate"},
    # the bulk reads in the normal I/O class (before the idle class became the warmer's default) or idle
    "started-8x8M-early-be": {"after_start": True, "threads": 8, "chunk": 8 * MiB, "early": True, "io_class": "be"},
    "started-8x8M-early-idle": {"after_start": True, "threads": 8, "chunk": 8 * MiB, "early": True,
                                "io_class": "idle"},
    # fewer, smaller reads in flight (idle class): on this disk 2 x 2-4 MiB read the weights at 1.8-2.0
    # GiB/s against 0.9-1.35 for 8 x 8 MiB, and a 4 KiB read beside them waited 5-7 ms (p90)
    # against 28-54
    "started-2x4M-early": {"after_start": True, "threads": 2, "chunk": 4 * MiB, "early": True},
    "started-2x2M-early": {"after_start": True, "threads": 2, "chunk": 2 * MiB, "early": True},
    # the restore's map reload prepacking only after the whole file is in (before: CONTAINER_ENV)
    "started-8x8M-early-noverlap": {"after_start": True, "threads": 8, "chunk": 8 * MiB, "early": True},
    "started-2x2M-early-noverlap": {"after_start": True, "threads": 2, "chunk": 2 * MiB, "early": True},
    # the bulk reads from the create call, now that they yield to everyone else's (idle class)
    "create-2x2M-early": {"after_start": False, "threads": 2, "chunk": 2 * MiB, "early": True},
    "create-2x2M-early-nowait": {"after_start": False, "threads": 2, "chunk": 2 * MiB, "early": True,
                                 "wait_early": False},
    # more bulk readers than the default's two (Intel AMX VM, 2026-12-05: the host warmer alone on a
    # dropped cache read the bench snapshot at 1.35-1.44 GiB/s with 2 x 2 MiB, 1.46-1.69 with 3 x 2 or 4 x 2)
    "create-3x2M-early-nowait": {"after_start": False, "threads": 3, "chunk": 2 * MiB, "early": True,
                                 "wait_early": False},
    "create-4x2M-early-nowait": {"after_start": False, "threads": 4, "chunk": 2 * MiB, "early": True,
                                 "wait_early": False},
    # idle, and asked for with WILLNEED (no copy to user space: 0.50 against 0.70 core-seconds per
    # 1.3 GB here) with 64 MiB ahead of what is resident
    "started-8x8M-early-willneed": {"after_start": True, "threads": 8, "chunk": 8 * MiB, "early": True,
                                    "io_class": "idle", "method": "willneed"},
    # the bulk reads with pread (the warmers' method before sendfile): a copy to user space per byte,
    # on the host's readers and on the entrypoint's (CONTAINER_ENV); the early reads stay sendfile
    "started-2x2M-early-pread": {"after_start": True, "threads": 2, "chunk": 2 * MiB, "early": True,
                                 "method": "pread"},
    # more readers now that a read costs no copy: the profile's short runs (~100 KiB) keep only two
    # requests in flight with 2 readers
    "started-3x2M-early": {"after_start": True, "threads": 3, "chunk": 2 * MiB, "early": True},
    "started-4x2M-early": {"after_start": True, "threads": 4, "chunk": 2 * MiB, "early": True},
    "started-4x1M-early": {"after_start": True, "threads": 4, "chunk": 1 * MiB, "early": True},
    "none-pread": None,  # the restore alone, its entrypoint's warmer reading with pread (CONTAINER_ENV)
    # the default shape, the entrypoint's read-ahead of CRIU's reads off (CONTAINER_ENV): with packed
    # handles kept, the hot child it asks for whole is 1.3 GB, queued beside the host's reads
    "started-2x2M-early-noahead": {"after_start": True, "threads": 2, "chunk": 2 * MiB, "early": True},
    # (bench-weights-order.jsonl, at 642a773: HostWarm's weights_reverse and weights_io_class="be",
    # removed after: no gain)
    # the default shape, its bulk reads in the normal I/O class
    "started-2x2M-early-be": {"after_start": True, "threads": 2, "chunk": 2 * MiB, "early": True, "io_class": "be"},
    # the default shape, and the entrypoint's own warmer too (CONTAINER_ENV: COLDSTART_HOST_WARMS=0), which
    # reads the hot child first and whole; its read-ahead then leaves the child out
    "started-2x2M-early-both": {"after_start": True, "threads": 2, "chunk": 2 * MiB, "early": True},
    # the restore alone, its read-ahead asking for the hot child too (CONTAINER_ENV:
    # COLDSTART_CRIU_READ_AHEAD=all), now that the hint reads all of it (fsutil.will_need)
    "none-aheadall": None,
    # the hot layout's child read whole, first and in file order, by the host and by the entrypoint
    # (CONTAINER_ENV and HOST_ENV: COLDSTART_WARM_HOT_FIRST=0), not the pages needed before the canary
    # first: the order before cdb5661
    "started-2x2M-early-nohotfirst": {"after_start": True, "threads": 2, "chunk": 2 * MiB, "early": True},
    "none-nohotfirst": None,
    # (hot-first/bench.jsonl, at cdb5661: the child's pages needed before the canary first, then the
    # rest of the child, then the profile's ranges; bench-late.jsonl compared it with "-hotlate", at
    # cdb5661 plus COLDSTART_WARM_HOT_FIRST=late: the profile's ranges before the rest of the child,
    # and the entrypoint's read-ahead asking only for the pages needed before the canary. "late" is
    # the default since, and the value is gone: these two now run the default.)
    "started-2x2M-early-hotlate": {"after_start": True, "threads": 2, "chunk": 2 * MiB, "early": True},
    "none-hotlate": None,
    # the rest of the child (the packed handles) read from its end (COLDSTART_WARM_HOT_FIRST=reverse, at
    # 4856f23 only; removed after: no gain, bench-reverse.jsonl): the handles are allocated top-down,
    # the first layer's at the highest addresses, so the file's order is the reverse of the forward
    # pass's
    "started-2x2M-early-reverse": {"after_start": True, "threads": 2, "chunk": 2 * MiB, "early": True},
    "none-reverse": None,
    # (early-threads/bench.jsonl, at c09967c only: the early files read by 4 readers, the default
    # then, against one, "-serial" with HostWarm's early_threads=1; removed after: no gain, 1.48 s
    # against 1.52, and read alone on an idle host 845 files took 0.13-0.16 s with 1, 4 or 8 readers)
    "started-2x2M-early-serial": {"after_start": True, "threads": 2, "chunk": 2 * MiB, "early": True},
    # (early-order/, at 48fb823 only: the entrypoint's files it loads after starting CRIU, numpy and the
    # warmer, read after the child's early pages, against "-latefirst" with them ahead; removed after:
    # no gain, bench 2.02 s against 2.00, tiny 1.44 s against 1.43)
    "started-2x2M-early-latefirst": {"after_start": True, "threads": 2, "chunk": 2 * MiB, "early": True},
    # (early-threads/*-zen5.jsonl, at 884699a only: the early files read by 4 readers, HostWarm's
    # early_threads=4, on the AMD Zen 5 host's 3 GiB/s disk; removed after: tiny 1.13 s against 1.21,
    # bench 1.35 against 1.31. The variant now runs the default.)
    "started-2x2M-early-4": {"after_start": True, "threads": 2, "chunk": 2 * MiB, "early": True},
}
# what the restore container's environment gets besides, per variant
CONTAINER_ENV = {"none-be": {"COLDSTART_WARM_IOPRIO": "be"}, "started-8x8M-early-be": {"COLDSTART_WARM_IOPRIO": "be"},
                 "started-8x8M-early-noverlap": {"COLDSTART_PREPACK_OVERLAP": "0"},
                 "started-2x2M-early-noverlap": {"COLDSTART_PREPACK_OVERLAP": "0"},
                 "none-noverlap": {"COLDSTART_PREPACK_OVERLAP": "0"},
                 "none-2x2": {"COLDSTART_WARM_SHAPE": "2x2"},
                 "none-pread": {"COLDSTART_WARM_METHOD": "pread"},
                 "started-2x2M-early-pread": {"COLDSTART_WARM_METHOD": "pread"},
                 "started-2x2M-early-noahead": {"COLDSTART_CRIU_READ_AHEAD": "0"},
                 "started-2x2M-early-both": {"COLDSTART_HOST_WARMS": "0"},
                 "none-aheadall": {"COLDSTART_CRIU_READ_AHEAD": "all"},
                 "started-2x2M-early-nohotfirst": {"COLDSTART_WARM_HOT_FIRST": "0"},
                 "none-nohotfirst": {"COLDSTART_WARM_HOT_FIRST": "0"},
                 "started-2x2M-early-hotlate": {"COLDSTART_WARM_HOT_FIRST": "late"},
                 "none-hotlate": {"COLDSTART_WARM_HOT_FIRST": "late"},
                 "started-2x2M-early-reverse": {"COLDSTART_WARM_HOT_FIRST": "reverse"},
                 "none-reverse": {"COLDSTART_WARM_HOT_FIRST": "reverse"}}
# what this process's environment (the host warmer's) gets besides, per variant
HOST_ENV = {"started-2x2M-early-nohotfirst": {"COLDSTART_WARM_HOT_FIRST": "0"},
            "started-2x2M-early-hotlate": {"COLDSTART_WARM_HOT_FIRST": "late"},
            "started-2x2M-early-reverse": {"COLDSTART_WARM_HOT_FIRST": "reverse"}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="bench")
    ap.add_argument("--layout", default="dumped", help="the snapshot's layout (coldstart checkpoint --layout)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/coldstart-bench-container"))
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    c, tag, layers, model, snap = bench_case(a.size, a.work, say=lambda m: print(m, flush=True), layout=a.layout)
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w") as out:
        # the first restore on this node: verifies, records the access profile the host warms from
        new_to_node(snap)  # with the snapshot still cached from the checkpoint, the restore would not record
        first = one_start(c, tag, "restore", model, snap, layers)
        meta = json.loads(node_profile(snap).read_text()).get("meta", {}) if node_profile(snap) else {}
        print(json.dumps({"first_on_node_s": first.get("first_token_s"), "profile": meta}), flush=True)
        out.write(json.dumps({"size": a.size, "variant": "first-on-node", "profile_meta": meta, **first}) + "\n")
        for rep in range(a.reps):
            for v in (variants if rep % 2 == 0 else variants[::-1]):
                drop_caches()
                shape = VARIANTS[v]
                method = "restore" if shape is None else "restore+hostwarm"
                with mock.patch.dict(os.environ, HOST_ENV.get(v, {})):
                    row = {"size": a.size, "variant": v, "shape": shape, "rep": rep,
                           **one_start(c, tag, method, model, snap, layers, host_warm=shape,
                                       env=CONTAINER_ENV.get(v))}
                ev = row.get("events") or {}
                print(json.dumps({"variant": v, "rep": rep, "first_token_s": row.get("first_token_s"),
                                  "started_s": row.get("started_s"), "entry_ready": ev.get("ENTRY_READY"),
                                  "restore_done": ev.get("RESTORE_DONE"), "weights": ev.get("WEIGHTS_LOADED"),
                                  "read_gib": round((row.get("disk_read_bytes") or 0) / 2**30, 2),
                                  "early": (row.get("host_warm") or {}).get("early"),
                                  "error": row.get("error")}), flush=True)
                out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
