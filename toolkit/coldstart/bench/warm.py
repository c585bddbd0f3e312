"""Warming benchmarks: cold -> resident per mode (`coldstart bench warm`), and the harness for the
issue-5 restore benchmark (restore -> first token per warming mode), which the pipeline plugs into.

Every round runs every variant once, side by side (the machine is shared and noisy); we report
medians, the device's measured sequential bandwidth and the bytes actually read from the device.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from coldstart.errors import ColdstartError
from coldstart.state import cache_root
from coldstart.warm.residency import evict, evict_all, expand_paths, resident_bytes

GiB = 1 << 30


# -- device facts
def block_device(path: Path) -> str:
    """Kernel name of the block device holding ``path`` (for /proc/diskstats)."""
    st = os.stat(path)
    link = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    if not link.exists():
        raise ColdstartError(f"{path}: not on a block device (st_dev {os.major(st.st_dev)}:{os.minor(st.st_dev)})")
    return link.resolve().name


def device_read_bytes(dev: str) -> int:
    """Bytes read from ``dev`` since boot (/proc/diskstats: sectors read x 512)."""
    with open("/proc/diskstats") as f:
        for line in f:
            parts = line.split()
            if parts[2] == dev:
                return int(parts[5]) * 512
    raise ColdstartError(f"block device {dev} not in /proc/diskstats")


def self_read_bytes() -> int:
    """Bytes this process (its threads and its reaped children, e.g. vmtouch) made the storage
    layer read: /proc/self/io read_bytes. Unlike diskstats it excludes other processes' I/O."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def drop_count() -> int:
    """How many times anyone wrote drop_caches since boot (other benchmarks on this shared host)."""
    with open("/proc/vmstat") as f:
        for line in f:
            if line.startswith("drop_pagecache "):
                return int(line.split()[1])
    return 0


def sequential_bandwidth(path: Path, *, size: int | None = None) -> dict:
    """The device's sequential read bandwidth, measured with fio (O_DIRECT, 8 MiB blocks, QD 16):
    no page cache involved, so it is the physics floor the warmers are held to."""
    fio = shutil.which("fio")
    if fio is None:
        raise ColdstartError("fio not found (apt-get install fio): cannot measure the device bandwidth")
    size = size or os.path.getsize(path)
    cmd = [fio, "--name=seqread", f"--filename={path}", "--rw=read", "--bs=8M", "--direct=1",
           "--ioengine=libaio", "--iodepth=16", "--readonly", f"--size={size}", "--output-format=json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise ColdstartError(f"fio failed: {out.stderr.strip().splitlines()[-1] if out.stderr else out.returncode}")
    job = json.loads(out.stdout)["jobs"][0]["read"]
    return {"bw_bytes_s": job["bw_bytes"], "gib_s": round(job["bw_bytes"] / GiB, 3), "bytes": job["io_bytes"],
            "tool": "fio --direct=1 --bs=8M --iodepth=16 --ioengine=libaio"}


def buffered_bandwidth(path: Path) -> dict:
    """The device's sequential read bandwidth through the page cache (fio, buffered, 2 jobs on
    disjoint halves, 1 MiB reads, the kernel's readahead): on this virtual disk the best a
    sequential reader gets, about twice O_DIRECT with one job. ``path`` must be evicted first."""
    from coldstart.bench.weights import fio_run

    if shutil.which("fio") is None:
        raise ColdstartError("fio not found (apt-get install fio): cannot measure the device bandwidth")
    nbytes, secs = fio_run(Path(path), direct=0, numjobs=2, bs=1 << 20)
    return {"bw_bytes_s": nbytes / secs, "gib_s": round(nbytes / secs / GiB, 3), "bytes": nbytes,
            "tool": "fio --direct=0 --numjobs=2 --bs=1M --ioengine=psync (disjoint halves)"}


def probe_file(files: list[Path]) -> Path:
    """The file to measure the disk on: the largest that is not sparse. The hot layout's parent
    images are the longest files of a snapshot but mostly holes (the bench model's kept snapshot:
    2.0 GB long, 0.79 GB on the disk), and a hole reads as zeros without touching the disk: the disk
    looked up to twice as fast as it was (results/spot-checks/disk-variance)."""
    stats = [(p, p.stat()) for p in files]
    dense = [(p, st) for p, st in stats if st.st_blocks * 512 >= 0.9 * st.st_size]
    return max(dense or stats, key=lambda f: f[1].st_size if dense else f[1].st_blocks)[0]


def best_bandwidth(path: Path) -> dict:
    """Both sequential figures (O_DIRECT QD16 8 MiB, buffered 2 jobs 1 MiB), the file evicted
    before each; ``bw_bytes_s`` is the higher one: the floor must not be lax."""
    evict(path)
    od = sequential_bandwidth(path)
    evict(path)
    bu = buffered_bandwidth(path)
    evict(path)
    return {"bw_bytes_s": max(od["bw_bytes_s"], bu["bw_bytes_s"]), "odirect_bytes_s": od["bw_bytes_s"],
            "buffered_bytes_s": bu["bw_bytes_s"], "gib_s": round(max(od["gib_s"], bu["gib_s"]), 3),
            "odirect_gib_s": od["gib_s"], "buffered_gib_s": bu["gib_s"]}


def host_cpu_busy_s() -> float:
    """CPU-seconds the whole host spent busy since boot (/proc/stat: all but idle and iowait),
    kernel work included (page-cache fills, I/O completions): on a 2-core host the cold restore's
    extra I/O handling is CPU the restore itself then does not get."""
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    busy = sum(vals[:8]) - vals[3] - vals[4]  # user nice system idle iowait irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


def drop_caches(files: list[Path] | None = None) -> None:
    """Cold case: evict ``files`` (posix_fadvise DONTNEED) or, with None, the whole page cache."""
    if files is None:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
    else:
        evict_all(files)


def make_bench_file(size_gib: float) -> Path:
    """A weights-sized file of random bytes, made once per machine (warming is content-blind)."""
    size = int(size_gib * GiB) // 4096 * 4096
    d = cache_root() / "bench" / "warm"
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"weights-{size}.bin"
    if p.exists() and p.stat().st_size == size:
        return p
    tmp = p.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        left = size
        while left:
            n = min(left, 64 << 20)
            f.write(os.urandom(n))
            left -= n
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
    return p


# -- the warm -> resident benchmark
WARM_VARIANTS: dict[str, dict] = {
    "vmtouch": {"mode": "vmtouch"},
    "native": {"mode": "native"},
    "native-willneed": {"mode": "native", "method": "willneed"},
    "native-1thread": {"mode": "native", "threads": 1},
}


def _median(xs: list[float]) -> float:
    return round(statistics.median(xs), 4) if xs else float("nan")


def run_warm_bench(*, files: list[Path] | None, size_gib: float, runs: int, out: Path, modes: list[str],
                   echo: Callable[[str], None] = print) -> list[dict]:
    from coldstart.warm import make_warmer

    for m in modes:
        if m not in WARM_VARIANTS:
            raise ColdstartError(f"unknown warm bench mode {m!r} (choose from {', '.join(WARM_VARIANTS)})")
    paths = expand_paths(files) if files else [make_bench_file(size_gib)]
    total = sum(p.stat().st_size for p in paths)
    dev = block_device(paths[0])
    rows: list[dict] = []
    bws: list[dict] = []
    for rnd in range(runs):
        # the device's bandwidth is measured in every round too: the disk is shared and its speed
        # drifts, so each round's times are held against that round's physics
        drop_caches(paths)
        bw = sequential_bandwidth(paths[0])
        bws.append(bw)
        rows.append({"round": rnd, "mode": "fio-odirect", "seconds": round(total / bw["bw_bytes_s"], 4), "bytes": total,
                     "gib_s": bw["gib_s"], "tool": bw["tool"]})
        echo(f"round {rnd} {'fio-odirect':16s} device {dev}: sequential read {bw['gib_s']} GiB/s")
        for m in modes:
            drop_caches(paths)
            before = sum(resident_bytes(p)[0] for p in paths)
            k0, d0, p0 = drop_count(), device_read_bytes(dev), self_read_bytes()
            t0 = time.monotonic()
            w = make_warmer(paths, **WARM_VARIANTS[m]).start()
            st = w.wait()
            secs = time.monotonic() - t0
            d1, p1 = device_read_bytes(dev), self_read_bytes()
            after = sum(resident_bytes(p)[0] for p in paths)
            # clean = every byte was read once by us (an external drop_caches mid-warm makes us, or
            # the kernel's readahead, read pages again); what other benchmarks evict *after* the
            # warm does not change its time. Spoilt rows stay in the jsonl, out of the medians.
            clean = (p1 - p0) <= 1.05 * total and not st.errors
            row = {"round": rnd, "mode": m, "seconds": round(secs, 4), "bytes": total,
                   "resident_before": before, "resident_after": after, "device_read_bytes": d1 - d0,
                   "proc_read_bytes": p1 - p0, "clean": clean, "drops_during": drop_count() - k0,
                   "gib_s": round(total / GiB / secs, 3), "errors": st.errors}
            rows.append(row)
            echo(f"round {rnd} {m:16s} {secs:7.3f} s  {row['gib_s']:6.2f} GiB/s  read by us {(p1 - p0) / GiB:.2f} GiB"
                 f" (device total {(d1 - d0) / GiB:.2f})  resident {after / GiB:.2f}/{total / GiB:.2f} GiB"
                 f"{'' if clean else '  [spoilt: bytes read again]'}")
    bw_med = statistics.median(b["bw_bytes_s"] for b in bws)
    _write(out, "warm_bench", rows, {"device": dev, "bandwidth_median_bytes_s": bw_med, "bandwidth": bws,
                                     "bytes": total, "files": [str(p) for p in paths]},
           _warm_table(rows, modes, total, bws[0]["tool"], bw_med))
    return rows


def rerender_warm_table(out: Path) -> str:
    """Rebuild warm_bench.md from warm_bench.jsonl (after a change of the table's rules)."""
    lines = (out / "warm_bench.jsonl").read_text().splitlines()
    meta = json.loads(lines[0])["meta"]
    rows = [json.loads(x) for x in lines[1:]]
    for r in rows:
        if "proc_read_bytes" in r:
            r["clean"] = r["proc_read_bytes"] <= 1.05 * r["bytes"] and not r.get("errors")
    modes = list(dict.fromkeys(r["mode"] for r in rows if r["mode"] != "fio-odirect"))
    table = _warm_table(rows, modes, meta["bytes"], meta["bandwidth"][0]["tool"], meta["bandwidth_median_bytes_s"])
    from coldstart.fsutil import write_atomic

    write_atomic(out / "warm_bench.md", table)
    return table


def _warm_table(rows: list[dict], modes: list[str], total: int, tool: str, bw_med: float) -> str:
    n = len({r["round"] for r in rows})
    phys = {r["round"]: r["seconds"] for r in rows if r["mode"] == "fio-odirect"}
    lines = [f"Cold -> fully resident, {total / GiB:.2f} GiB, median of {n} rounds, every mode once per round "
             f"(page cache of the files dropped before each case). Physics = bytes / the device's sequential "
             f"bandwidth measured in the same round ({tool}; median {bw_med / GiB:.2f} GiB/s).", "",
             "A row is clean when we read every byte once (/proc/self/io read_bytes <= 1.05 x size): another "
             "benchmark's drop_caches in the middle of a warm makes pages be read again; spoilt rows are in the "
             "jsonl, not in the medians. Residency after the warm is recorded per row (other benchmarks on this "
             "host drop the page cache every few seconds, so it is often below 100 % by the time it is checked). "
             "`read by us` = /proc/self/io read_bytes (our threads and reaped vmtouch children); "
             "`device` = the whole disk's diskstats delta, other processes included.", "",
             "| mode | clean runs | median s | GiB/s | read by us GiB | device GiB | x physics (median of per-round ratios) |",
             "|---|---|---|---|---|---|---|"]
    for m in ["fio-odirect", *modes]:
        rs = [r for r in rows if r["mode"] == m and r.get("clean", True)]
        s = _median([r["seconds"] for r in rs])
        pr = _median([r.get("proc_read_bytes", total) / GiB for r in rs])
        dr = _median([r.get("device_read_bytes", total) / GiB for r in rs])
        ratio = _median([r["seconds"] / phys[r["round"]] for r in rs])
        lines.append(f"| {m} | {len(rs)}/{n} | {s:.3f} | {total / GiB / s:.2f} | {pr:.2f} | {dr:.2f} | {ratio:.2f} |")
    return "\n".join(lines) + "\n"


def _write(out: Path, name: str, rows: list[dict], meta: dict, table: str) -> None:
    """{name}.jsonl, {name}.md and this benchmark's COMMAND line, each file replaced atomically (the
    other benchmark's files in ``out`` are left alone)."""
    from coldstart.fsutil import write_atomic

    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / f"{name}.jsonl", "".join(json.dumps(x) + "\n" for x in [{"meta": meta}, *rows]))
    write_atomic(out / f"{name}.md", table)
    # one line per benchmark: the exact command that produced {name}.*
    cmd_file = out / "COMMAND"
    keep = [l for l in (cmd_file.read_text().splitlines() if cmd_file.exists() else []) if not l.endswith(f"# -> {name}.*")]
    argv = ["coldstart" if a.endswith("/coldstart") else a for a in sys.argv]
    write_atomic(cmd_file, "\n".join([*keep, " ".join(shlex.quote(a) for a in argv) + f"   # -> {name}.*"]) + "\n")


# -- the restore -> first token benchmark (issue 5); the pipeline supplies `restore_once`
RestoreFn = Callable[[dict], dict]


def run_restore_bench(restore_once: RestoreFn, snapshot_dir: Path, *, runs: int = 5, out: Path = Path("results/warm"),
                      variants: list[dict] | None = None, drop: str = "global",
                      echo: Callable[[str], None] = print) -> list[dict]:
    global _NEEDED
    try:  # the recorded profile's needed set: the strict "bytes that had to be read"
        from coldstart.warm.profile import PROFILE_NAME, load_profile

        _NEEDED = load_profile(Path(snapshot_dir) / PROFILE_NAME).bytes
    except Exception:  # noqa: BLE001 - no profile: the no-warming restore's bytes only
        _NEEDED = None
    """For each round: every warming variant cold (page cache dropped first), then one warm restore.

    ``restore_once(variant)`` restores the snapshot with that variant (``variant["mode"]``,
    ``variant["profile"]`` (bool: use DIR/profile.json), ``variant.get("loader_odirect")``), waits for
    the first token and returns a dict with at least ``first_token_s`` (seconds from start to first
    token). ``drop``: "global" (drop_caches: libraries too, the honest cold node) or "snapshot"."""
    from coldstart.warm import warm_modes

    variants = variants or warm_modes()
    snapshot_dir = Path(snapshot_dir)
    files = [p for p in expand_paths([snapshot_dir]) if p.is_file()]
    total = sum(p.stat().st_size for p in files)
    dev = block_device(files[0])
    biggest = probe_file(files)
    rows: list[dict] = []
    bws: list[dict] = []
    for rnd in range(runs):
        drop_caches(None if drop == "global" else files)
        bw = best_bandwidth(biggest)  # every round: the shared disk's speed drifts
        bws.append(bw)
        echo(f"round {rnd} device {dev}: sequential read O_DIRECT {bw['odirect_gib_s']} GiB/s, buffered "
             f"{bw['buffered_gib_s']} GiB/s; snapshot {total / GiB:.2f} GiB")
        for v in [*variants, {"name": "warm", "mode": "none", "profile": False, "warm": True}]:
            if not v.get("warm"):
                drop_caches(None if drop == "global" else files)
            else:  # warm = the snapshot is in the page cache: read it just now (others drop caches here),
                # with the profile's ranges of the libraries the restored server maps
                from coldstart.warm import start_warming

                start_warming(files, mode="native", profile="auto", record=False).wait()
            d0, p0 = device_read_bytes(dev), self_read_bytes()
            try:
                res = restore_once(v)
            except Exception as e:  # noqa: BLE001 - one failed restore is a row, not the end of the run
                res = {"error": str(e).splitlines()[0][:300]}
                echo(f"round {rnd} {v['name']}: restore failed: {res['error']}")
            d1, p1 = device_read_bytes(dev), self_read_bytes()
            # read by us: /proc/self/io of this process, its warmer threads and its reaped children
            # (criu and the restored server, reaped by res.stop()): what this restore made the
            # device read; the diskstats delta also counts every other process on the host
            row = {"round": rnd, "variant": v["name"], **res, "device_read_bytes": d1 - d0,
                   "read_by_us_bytes": p1 - p0, "bw_bytes_s": bw["bw_bytes_s"],
                   "bw_odirect_bytes_s": bw["odirect_bytes_s"], "bw_buffered_bytes_s": bw["buffered_bytes_s"]}
            rows.append(row)
            echo(f"round {rnd} {v['name']:24s} first token {res.get('first_token_s', float('nan')):.3f} s  "
                 f"read by us {(p1 - p0) / GiB:.2f} GiB (device total {(d1 - d0) / GiB:.2f} GiB)")
        # after every round: a later failure or interruption keeps what was measured
        _write(out, "restore_bench", rows, _meta(dev, bws, total, drop),
               restore_table(rows, [v["name"] for v in variants], rnd + 1, drop, bws))
    _write(out, "restore_bench", rows, _meta(dev, bws, total, drop),
           restore_table(rows, [v["name"] for v in variants], runs, drop, bws))
    return rows


_NEEDED: int | None = None


def _meta(dev: str, bws: list[dict], total: int, drop: str) -> dict:
    return {"device": dev, "bandwidth": bws, "snapshot_bytes": total, "drop": drop, "profile_needed_bytes": _NEEDED,
            "tools": ["fio --direct=1 --bs=8M --iodepth=16 --ioengine=libaio",
                      "fio --direct=0 --numjobs=2 --bs=1M --ioengine=psync (disjoint halves)"]}


def restore_table(rows: list[dict], names: list[str], runs: int, drop: str, bws: list,
                  needed: int | None = None) -> str:
    """The issue-5 table. Floor = max(warm restore median, demand / best sequential bandwidth), where
    demand = the median bytes the cold restore *without warming* made the device read (what the
    restore needs; warming unneeded data must not raise the floor) and the bandwidth is the higher
    of the O_DIRECT and buffered fio figures (medians over the rounds)."""
    names = [*names, "warm"]
    ok = [r for r in rows if "first_token_s" in r]
    med = {n: _median([r["first_token_s"] for r in ok if r["variant"] == n]) for n in names}
    mine = {n: _median([r.get("read_by_us_bytes", 0) for r in ok if r["variant"] == n]) for n in names}
    dev = {n: _median([r["device_read_bytes"] for r in ok if r["variant"] == n]) for n in names}
    nok = {n: len([r for r in ok if r["variant"] == n]) for n in names}
    if bws and isinstance(bws[0], dict):
        od = statistics.median(b["odirect_bytes_s"] for b in bws)
        bu = statistics.median(b["buffered_bytes_s"] for b in bws)
    else:  # old runs: one O_DIRECT figure
        od, bu = statistics.median(bws), 0.0
    bw = max(od, bu)
    needed = needed if needed is not None else _NEEDED
    demand_none = mine.get("none")
    if demand_none is None or demand_none != demand_none:
        demand_none = statistics.median([mine[n] for n in names if n != "warm" and mine[n] == mine[n]] or [0])
    demand = min(demand_none, needed) if needed else demand_none
    floor = max(med["warm"], demand / bw) if bw else float("nan")
    lines = [f"Restore -> first token, median of {runs} rounds, every variant once per round; cold = page cache "
             f"dropped ({drop}) before the case; warm = the snapshot read just before.", "",
             f"- Device sequential bandwidth, measured every round on the snapshot's biggest file (evicted "
             f"first): O_DIRECT (fio QD16, 8 MiB) median {od / GiB:.2f} GiB/s; buffered (fio, 2 jobs, 1 MiB, "
             f"kernel readahead) median {bu / GiB:.2f} GiB/s. The floor uses the higher: {bw / GiB:.2f} GiB/s.",
             f"- Demand = the smaller of the bytes the cold restore *without warming* made the device read "
             f"(median of `none`: {demand_none / GiB:.2f} GiB) and the recorded profile's needed set "
             f"({(needed or 0) / GiB:.2f} GiB: CRIU's reads, the pages the restored tree touched, the weights, the "
             f"touched ranges of the mapped libraries; the kernel's unused read-around excluded) = "
             f"{demand / GiB:.2f} GiB; demand / bandwidth = {demand / bw:.3f} s." if bw else "- no bandwidth",
             f"- Floor = max(warm restore median {med['warm']:.3f} s, demand / bandwidth) = {floor:.3f} s, "
             "the same for every row: warming unneeded data does not raise it.",
             "- `read by us` = /proc/self/io read_bytes of the benchmark process and its reaped children (criu, "
             "the restored server) until the server is stopped (after first token: with a profile the warmer "
             "reads the rest of the snapshot then); `device` = the disk's diskstats delta, other processes on this shared host "
             "included.", "",
             "- `host CPU s` = CPU-seconds the whole host (2 cores) was busy from the start of the restore "
             "to first token, kernel work included.", "",
             "- `x floor (round bw)` = median over rounds of first token / max(warm median, demand / that round's "
             "higher bandwidth): the device's speed drifts between rounds on this shared virtual disk.", "",
             "| variant | runs ok | first token s (median) | read by us GiB | device GiB | host CPU s | x floor "
             "| x floor (round bw) |",
             "|---|---|---|---|---|---|---|---|"]
    cpu = {n: _median([r["host_cpu_s"] for r in ok if r["variant"] == n and "host_cpu_s" in r]) for n in names}
    best = None
    for n in names:
        ratio = med[n] / floor if floor else float("nan")
        if n not in ("warm", "none", "odirect") and ratio == ratio and (best is None or ratio < best[1]):
            best = (n, ratio)
        per_round = _median([r["first_token_s"] / max(med["warm"], demand / r["bw_bytes_s"])
                             for r in ok if r["variant"] == n and r.get("bw_bytes_s")])
        lines.append(f"| {n} | {nok[n]} | {med[n]:.3f} | {mine[n] / GiB:.2f} | {dev[n] / GiB:.2f} | {cpu[n]:.2f} "
                     f"| {ratio:.2f} | {per_round:.2f} |")
    if best:
        verdict = "met" if best[1] <= 1.2 else "MISSED"
        lines += ["", f"Target (best overlapped warming <= 1.2 x floor): {verdict}: {best[0]} at {best[1]:.2f} x "
                      f"(floor {floor:.3f} s)."]
    return "\n".join(lines) + "\n"


def _stale_snapshot(snapshot: Path) -> str:
    """Why a cached benchmark snapshot must be made again ("" = reuse it): its worker runs the
    coldstart code of its checkpoint, so a snapshot from other code would measure that code."""
    from coldstart.pipeline.manifest import code_digest

    try:
        recorded = json.loads((snapshot / "manifest.json").read_text()).get("coldstart_code", "")
    except (OSError, ValueError):
        return ""  # none yet (or unreadable: the caller checkpoints when manifest.json is missing)
    if recorded != code_digest():
        return f"{snapshot} was checkpointed by other coldstart code ({recorded[:12] or 'unrecorded'})"
    return ""


# -- issue 5: restore -> first token per warming variant, on a real snapshot
def pipeline_restore_once(snap: Path, *, echo: Callable[[str], None] = print) -> RestoreFn:
    """``restore_once`` over the pipeline's in-process ``restore()``; the variant reaches the warm
    stage through the entrypoint's environment knobs (COLDSTART_WARM_*), the loader's O_DIRECT
    through the reload call's ``direct`` argument."""
    from coldstart.engine.client import EngineClient
    from coldstart.pipeline.events import EventName
    from coldstart.pipeline.restore import RestoreOptions, restore

    def once(v: dict) -> dict:
        orig_rpc = EngineClient.collective_rpc
        if v.get("loader_odirect"):
            # the pipeline's reload has a copy mode (RestoreOptions.reload_mode) but no O_DIRECT
            # switch: add direct=True to its reload call (bench only)
            def rpc(self, method, *a, kwargs=None, **kw):
                if method == "coldstart_reload":
                    kwargs = {**(kwargs or {}), "direct": True, "mode": "copy"}
                return orig_rpc(self, method, *a, kwargs=kwargs, **kw)
            EngineClient.collective_rpc = rpc  # type: ignore[method-assign]
        try:
            opts = RestoreOptions(snapshot=snap, fallback=False, net="host", timeout=900, warm_mode=v["mode"],
                                  warm_method=v.get("method"),
                                  warm_profile="auto" if v.get("profile") else "off",
                                  warm_record=v.get("record", "off"), warm_rest=v.get("rest", "after"))
            if v.get("loader_odirect") and hasattr(opts, "reload_mode"):
                opts.reload_mode = "copy"
            elif v.get("reload"):  # force the weight reload's mode (default: auto)
                opts.reload_mode = v["reload"]
            c0 = host_cpu_busy_s()
            res = restore(opts, say=lambda s: None)
            cpu = host_cpu_busy_s() - c0
            try:
                tl = res.timeline
                ft = tl.get(EventName.FIRST_TOKEN)
                wd = tl.get(EventName.WARM_DONE)
                wl = tl.get(EventName.WEIGHTS_LOADED)
                return {"first_token_s": ft.t if ft else float("nan"), "canary_ok": res.canary_ok,
                        "reload": {k: wl.attrs[k] for k in ("mode", "auto_choice", "o_direct") if wl and k in wl.attrs},
                        "restored": res.restored, "phases": tl.phases(),
                        "warm_done_s": wd.t if wd else None, "host_cpu_s": round(cpu, 3)}
            finally:
                res.stop()
        finally:
            EngineClient.collective_rpc = orig_rpc  # type: ignore[method-assign]

    return once


def run_issue5_bench(*, size: str, runs: int, out: Path, work: Path, snapshot: Path | None,
                     drop: str = "global", echo: Callable[[str], None] = print) -> list[dict]:
    """Checkpoint the model once (unless ``snapshot``), record its access profile on one cold
    restore without warming (pure demand order), then the side-by-side rounds."""
    import socket

    from coldstart.warm.profile import PROFILE_NAME

    if snapshot is None:
        from coldstart.models.tiny import cached_model
        from coldstart.pipeline.checkpoint import CheckpointOptions, checkpoint

        model = cached_model(size)
        snapshot = work / f"snap-{size}"
        stale = _stale_snapshot(snapshot)
        if stale:
            echo(f"re-checkpointing: {stale}")
        if stale or not (snapshot / "manifest.json").exists():
            shutil.rmtree(snapshot, ignore_errors=True)
            work.mkdir(parents=True, exist_ok=True)
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            echo(f"checkpointing {model} -> {snapshot}")
            checkpoint(CheckpointOptions(model=model, out=snapshot, port=port), say=lambda s: None)
    once = pipeline_restore_once(snapshot, echo=echo)
    (snapshot / PROFILE_NAME).unlink(missing_ok=True)
    drop_caches(None if drop == "global" else expand_paths([snapshot]))
    rec = once({"name": "record", "mode": "none", "record": "force"})
    echo(f"profile recorded on a cold restore without warming: first token {rec['first_token_s']:.3f} s, "
         f"{(snapshot / PROFILE_NAME).exists() and 'saved' or 'NOT saved'}")
    return run_restore_bench(once, snapshot, runs=runs, out=out, drop=drop, echo=echo)
