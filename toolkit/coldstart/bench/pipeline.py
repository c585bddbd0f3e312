"""``coldstart bench reload`` and ``coldstart bench restore``: the two benchmarks of issue 4.

Both run their variants side by side, interleaved, in one run (the machine is shared and noisy), and
write raw jsonl + table.md + COMMAND under results/<name>/. Numbers are CPU-measured on this host;
nothing here claims anything about a GPU.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import typer

from coldstart.bench import host as hostwatch
from coldstart.bench.warm import host_cpu_busy_s
from coldstart.engine.launcher import free_port
from coldstart.pipeline.events import PHASES, EventName
from coldstart.warm.residency import evict_all
from coldstart.weights import queue, readshape


def _model(size: str) -> Path:
    from coldstart.models.tiny import cached_model

    return cached_model(size)


def _read(paths) -> None:
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            buf = bytearray(16 << 20)
            while f.readinto(buf):
                pass


def _write(out_dir: Path, rows: list[dict], table: str, argv: list[str]) -> None:
    from coldstart.fsutil import write_results

    write_results(out_dir, rows, table, " ".join(shlex.quote(a) for a in argv))


def _host_line() -> str:
    from coldstart.bench import host
    from coldstart.pipeline import hostfacts

    h = hostfacts.collect()
    return host.line(f"vLLM {h.vllm}", f"torch {h.torch}")


METHODS = ("stock", "copy", "map", "auto")  # auto: what `coldstart restore` uses (map if cached, else copy)
DEFAULT_RELOAD = "auto"
# ours: the worker's coldstart_reload arguments of each method (copy: the loader chooses O_DIRECT or not)
RELOAD_KW = {"copy": {"mode": "copy"}, "map": {"mode": "map"}, "auto": {"mode": "auto"},
             "copy-odirect": {"mode": "copy", "direct": True}, "copy-buffered": {"mode": "copy", "direct": False},
             "map-serial": {"mode": "map", "overlap": False}, "auto-repack": {"mode": "auto", "packed": False},
             "auto-4k": {"mode": "auto", "huge": False}}
ALL_RELOAD_METHODS = ("stock", *RELOAD_KW)


def _read_part(row: dict) -> float:
    """Seconds of a reload row before its prepack (the whole step for stock, for rows from before
    the prepack and for a prepack overlapped with the populate)."""
    d = row.get("detail", {})
    if row["method"] == "stock" or "prepack_s" not in d or d.get("prepack_overlapped"):
        return row["seconds"]
    return max(row["seconds"] - d["prepack_s"], 1e-9)


def reload_table(rows: list[dict], size: str, methods: tuple[str, ...] = METHODS) -> list[str]:
    """table.md of the reload benchmark: per cache state and method, the reload step alone and the
    reload plus the first forward passes (the canary), each against vLLM's stock reload."""
    lines = [f"# Weight reload step alone: vLLM `reload_weights` vs coldstart ({size} model)", "",
             _host_line(), "",
             "Each run: sleep level 2 → wake weights → (evict or pre-read the source file) → reload "
             "(timed inside the worker) → wake KV → 8-token canary check (timed too). Variants interleaved in "
             "one run. **copy** = our parallel loader reads the flat file into the weights (O_DIRECT or the page "
             "cache as the loader chooses; **copy-odirect** / **copy-buffered** force one); **map** = the flat file is mmap'ed (MAP_PRIVATE|MAP_FIXED) over the weight arena "
             "and populated with MADV_POPULATE_READ in 4 threads: \"done\" means every page is mapped and "
             "resident (no copy; a later write would copy-on-write one page); **map-serial** = a map whose "
             "prepack waits for the whole populate, so that its read is timed alone; **auto** = the default "
             "(`coldstart restore` uses it): map, cold or cached (a copy where the arena's layout does not match the "
             "file).", "",
             "Serving goes through vLLM's prepacked GEMM handles. Where the sleep could keep them and release "
             "their buffers (oneDNN's handles: coldstart.engine.packed), a map or auto reload maps the buffers "
             "back from the packed dump the run wrote beside the flat file (**map+packed** in the last column: "
             "nothing packed; map-serial then populates the two files one after the other, not side by side); "
             "**auto-repack** = auto told not to (`packed=False`); **auto-4k** = auto without 2 MiB "
             "page-cache folios under its mapping (`huge=False`). Otherwise our reload ends by packing them "
             "again (**prepack**; vLLM's stock reload packs its own inside its time): **reload** is the whole "
             "step, **read** the part before the prepack (the loader's copy, or map + populate), **GiB/s** the "
             "bytes read over that part (a packed refill reads the packed dump and the flat file's other "
             "tensors). Where the prepack ran beside the populate (a cold map), the two cannot be told apart "
             "and read is the whole step. Between a stock reload and the next method an untimed reload from the "
             "flat file packs the handles from it again, as a restored server's are.", "",
             "| cache | method | reload (s) | speed-up | read (s) | GiB/s | prepack (s) | canary after (s) | "
             "reload + canary (s) | speed-up incl. canary | runs | canary ok | mode |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for cache in ("warm", "cold"):
        sel = {m: [r for r in rows if r["cache"] == cache and r["method"] == m] for m in methods}
        if not sel["stock"]:
            continue
        st = statistics.median([r["seconds"] for r in sel["stock"]])
        st2 = statistics.median([r["seconds"] + r["canary_s"] for r in sel["stock"]])
        for m in methods:
            if not sel[m]:
                continue
            sec = statistics.median([r["seconds"] for r in sel[m]])
            both = statistics.median([r["seconds"] + r["canary_s"] for r in sel[m]])
            can = statistics.median([r["canary_s"] for r in sel[m]])
            read = statistics.median([_read_part(r) for r in sel[m]])
            packs = [r["detail"]["prepack_s"] for r in sel[m] if "prepack_s" in r.get("detail", {})]
            pack = f"{statistics.median(packs):.3f}" if packs and m != "stock" else "-"
            gib = sel[m][0]["bytes"] / 2**30 / read
            modes = Counter(str(r["detail"].get("mode")) for r in sel[m])
            chose = ", ".join(f"{k} ×{v}" for k, v in sorted(modes.items())) if m != "stock" else ""
            name = "stock reload_weights" if m == "stock" else f"ours {m}"
            lines.append(f"| {cache} | {name} | {sec:.3f} | {st / sec:.2f}× | {read:.3f} | {gib:.2f} | {pack} | "
                         f"{can:.3f} | {both:.3f} | "
                         f"{st2 / both:.2f}× | {len(sel[m])} | {all(r['canary_ok'] for r in sel[m])} | {chose} |")
    shapes = [r["detail"] for r in rows if r["method"] == "read-shape"]
    if shapes:
        sh = shapes[0]
        lines += ["", f"Cold reads of a copy: device {sh['device']} probed before the first round (weights.readshape: "
                      f"the loader's own cold loads of the flat file's first {sh['span_bytes'] / 2**20:.0f} MiB, "
                      f"alternately): O_DIRECT {', '.join(f'{v:.2f}' for v in sh['direct_gib_s'])} GiB/s, buffered "
                      f"{', '.join(f'{v:.2f}' for v in sh['buffered_gib_s'])} GiB/s -> "
                      f"{'O_DIRECT' if sh['direct'] else 'buffered'} for the cold copies below."]
    qs = [r["detail"] for r in rows if r["method"] == "queue"]
    if qs:
        q = qs[0]
        lines += ["", f"Block queue of the flat file's device ({q['device']}), as the node had it for the whole run: "
                      f"max_sectors_kb {q['max_sectors_kb']}, read_ahead_kb {q['read_ahead_kb']} "
                      "(`coldstart weights tune-queue` measures and sets the first; fio's probes ran under it too)."]
    per_round = device_probes(rows)
    dev = list(per_round.values())
    around = any(r.get("when") == "after" for r in rows if r["method"] == "device")
    cold_stock = [r for r in rows if r["cache"] == "cold" and r["method"] == "stock"]
    cold_ours = [r["bytes"] / 2**30 / _read_part(r) for r in rows if r["cache"] == "cold" and r["method"] == "auto"] \
        or [r["bytes"] / 2**30 / _read_part(r) for r in rows if r["cache"] == "cold" and r["method"] == "map"]
    if dev and cold_stock and cold_ours:
        need = 3 * cold_stock[0]["bytes"] / 2**30 / statistics.median([r["seconds"] for r in cold_stock])
        when = ("before each round on the flat file and right after the default's cold reload on the model's "
                "safetensors, the mean of the two" if around else "once per round")
        fios = sorted({r["detail"]["fio"] for r in rows if r["method"] == "device" and "fio" in r.get("detail", {})})
        shapes = "; ".join(fios) if fios else "4 jobs x 16 MiB buffered; 4 jobs x 1 MiB O_DIRECT"
        lines += ["", f"Device limit, same run (fio, page cache dropped, {when}: the fastest "
                      f"of {shapes}): median "
                      f"{statistics.median(dev):.2f} GiB/s (min {min(dev):.2f}, max {max(dev):.2f}). A 3× cold reload "
                      f"would have to read at {need:.2f} GiB/s; the default reload's read part read at "
                      f"{statistics.median(cold_ours):.2f} GiB/s = {statistics.median(cold_ours) / statistics.median(dev):.2f}× "
                      f"that median."]
        lines += _reload_bound(rows, per_round)
    res_cold = [r["resident_before"] for r in rows if r["cache"] == "cold" and "resident_before" in r]
    res_warm = [r["resident_before"] for r in rows if r["cache"] == "warm" and "resident_before" in r]
    if res_cold and res_warm:
        lines += ["", f"Page cache (mincore, just before each timed step): cold cases at most {max(res_cold):.1%} "
                      f"of their source file resident, warm cases at least {min(res_warm):.1%}."]
    lines += ["", "Target: ≥ 3× (fast-vllm reported 2.4× on GPU). Medians of the runs above; raw rows in raw.jsonl."]
    return lines


def device_probes(rows: list[dict], kind: str = "", method: str = "device") -> dict[int, float]:
    """Each round's device, GiB/s: the fastest fio shape whose name starts with ``kind`` ("buffered",
    "O_DIRECT"; "": any, the device limit) at each of the round's probes, averaged over them (before
    the round, and right after its default's cold reload where the run took one). ``method``
    "device-memory": the read into memory taken at the same moments instead of fio's."""
    at: dict[int, dict[str, float]] = {}
    for r in rows:
        if r["method"] == method and r["seconds"] > 0 and r.get("detail", {}).get("fio", "").startswith(kind):
            w = at.setdefault(r["rep"], {})
            when = r.get("when", "before")
            w[when] = max(w.get(when, 0.0), r["bytes"] / 2**30 / r["seconds"])
    return {rep: statistics.mean(w.values()) for rep, w in at.items()}


def best_shape(rows: list[dict]) -> tuple[str, dict[int, float]] | None:
    """The fio shape with the fastest median over the run and its per-round GiB/s (device_probes of that
    shape alone): `bench load`'s limit is one configuration, the best by its median, not each round's
    fastest."""
    shapes = sorted({r["detail"]["fio"] for r in rows if r["method"] == "device" and r.get("detail", {}).get("fio")})
    per = {s: device_probes(rows, s) for s in shapes}
    per = {s: v for s, v in per.items() if v}
    if not per:
        return None
    name = max(per, key=lambda s: statistics.median(per[s].values()))
    return name, per[name]


def _reload_bound(rows: list[dict], per_round: dict[int, float]) -> list[str]:
    """The default cold reload against the device probed in its own round and against the step's
    physical bound there: its bytes at that device speed, or the CPU-seconds the host spent during
    the step (the packing, the page-cache fills) spread over every core, whichever is longer. With
    the prepack beside the populate, a 2-core host can be bound by the second."""
    cores = os.cpu_count() or 1
    dev, bnd, cpu, cpu_bound = [], [], [], 0
    disk, cold = [], []  # per paired round: the file at the device's speed, the default's cold step
    for r in rows:
        if r["cache"] != "cold" or r["method"] != "auto" or r["rep"] not in per_round:
            continue
        disk_s = r["bytes"] / 2**30 / per_round[r["rep"]]
        disk.append(disk_s)
        cold.append(r["seconds"])
        dev.append(disk_s / r["seconds"])
        if r.get("host_cpu_busy_s") is not None:
            cpu_s = r["host_cpu_busy_s"] / cores
            cpu.append(r["host_cpu_busy_s"])
            cpu_bound += cpu_s > disk_s
            bnd.append(max(disk_s, cpu_s) / r.get("wall_seconds", r["seconds"]))  # (CPU over the RPC's wall)
    if not dev:
        return []
    out = [f"Paired per round, the default (auto) cold reload against the device probed in its round: median "
           f"{statistics.median(dev):.2f}× (each: {', '.join(f'{x:.2f}' for x in dev)})."]
    if bnd:
        out[0] += (f" Against the step's bound in its round, max(the file at the device's speed, the host's busy "
                   f"CPU-seconds over the step / {cores} cores): median {statistics.median(bnd):.2f}× (each: "
                   f"{', '.join(f'{x:.2f}' for x in bnd)}); the CPU was the larger in {cpu_bound} of {len(bnd)} "
                   f"rounds (busy CPU-seconds: median {statistics.median(cpu):.2f}).")
    warm = [r["seconds"] for r in rows if r["cache"] == "warm" and r["method"] == "auto"]
    if warm:
        disk_s = statistics.median(disk)
        floor = max(disk_s, statistics.median(warm))
        out.append(f"A cold reload can be no shorter than the warm one, the same step from a cached file, its "
                   f"packing included (median {statistics.median(warm):.3f} s), nor than the file at the device's "
                   f"speed ({disk_s:.3f} s at the median round): at best {floor:.3f} s, {disk_s / floor:.2f}× the "
                   f"device; the default's cold median is {statistics.median(cold) / floor:.2f}× that floor.")
    kinds = {k: device_probes(rows, k) for k in ("buffered", "O_DIRECT")}
    paired = [(r["bytes"] / 2**30 / r["seconds"], kinds["buffered"][r["rep"]], kinds["O_DIRECT"][r["rep"]])
              for r in rows if r["cache"] == "cold" and r["method"] == "auto"
              and r["rep"] in kinds["buffered"] and r["rep"] in kinds["O_DIRECT"]]
    if paired:
        out.append(f"Through the page cache, where a map reads: fio's fastest buffered shape in the same rounds, median "
                   f"{statistics.median(b for _, b, _ in paired):.2f} GiB/s, its fastest O_DIRECT shape "
                   f"{statistics.median(d for _, _, d in paired):.2f} GiB/s (O_DIRECT / buffered per round: median "
                   f"{statistics.median(d / b for _, b, d in paired):.2f}). The default cold reload against the "
                   f"page cache's rate in its round: median {statistics.median(o / b for o, b, _ in paired):.2f}× "
                   f"(each: {', '.join(f'{o / b:.2f}' for o, b, _ in paired)}).")
    one = best_shape(rows)
    if one is not None:
        name, per = one
        vs = [r["bytes"] / 2**30 / r["seconds"] / per[r["rep"]] for r in rows
              if r["cache"] == "cold" and r["method"] == "auto" and r["rep"] in per]
        own = [per[rep] / per_round[rep] for rep in per if rep in per_round]
        if vs and own:
            out.append(f"Against one read shape, as `bench load` takes its limit (fio's shape with the fastest median "
                       f"over the run: {name}, {statistics.median(per.values()):.2f} GiB/s): the default cold reload "
                       f"paired per round, median {statistics.median(vs):.2f}× (each: "
                       f"{', '.join(f'{x:.2f}' for x in vs)}). The device limit above, the fastest of the shapes in "
                       f"each round, is a maximum of noisy probes: that shape itself read at "
                       f"{statistics.median(own):.2f}× of it (median).")
    mem = device_probes(rows, method="device-memory")
    mem_paired = [(r["bytes"] / 2**30 / r["seconds"] / mem[r["rep"]], mem[r["rep"]] / per_round[r["rep"]]) for r in rows
                  if r["cache"] == "cold" and r["method"] == "auto" and r["rep"] in mem and r["rep"] in per_round]
    if mem_paired:
        out.append(f"Into memory, as a reload must land its bytes (the same probes' moments: O_DIRECT, 4 threads, "
                   f"1 MiB reads of the flat file, each into its own place in a touched buffer the file's size, in "
                   f"4 KiB pages, where fio reuses one small buffer per job; a low reference, not a bound: on the "
                   f"Intel VM reads into 4 KiB pages ran below fio's and fell further in its slow minutes, results/"
                   f"spot-checks/slow-minutes): the default cold reload paired per round, median "
                   f"{statistics.median(a for a, _ in mem_paired):.2f}× (each: "
                   f"{', '.join(f'{a:.2f}' for a, _ in mem_paired)}); that read itself at "
                   f"{statistics.median(b for _, b in mem_paired):.2f}× the device limit (each: "
                   f"{', '.join(f'{b:.2f}' for _, b in mem_paired)}).")
    serial = [r["bytes"] / 2**30 / per_round[r["rep"]] / _read_part(r) for r in rows
              if r["cache"] == "cold" and r["method"] == "map-serial" and r["rep"] in per_round]
    if serial:
        out.append(f"The read alone (map-serial's populate, before its prepack) against the device probed in its "
                   f"round: median {statistics.median(serial):.2f}× (each: {', '.join(f'{x:.2f}' for x in serial)}).")
    return [line for para in out for line in ("", para)]


def served_with_flat(model: Path, work: Path):
    """A sleep-mode server of ``model`` (run dir under ``work``), ready, with its greedy 8-token
    canary taken and its weights dumped to ``work``/flat: (engine, client, canary token ids, flat dir).
    The caller stops the engine; a failure on the way stops it here."""
    from coldstart.engine.launcher import EngineSpec, start_engine

    spec = EngineSpec(model=model, run_dir=work / "run", port=free_port(), sleep_mode=True)
    eng = start_engine(spec)
    try:
        eng.wait_ready(1800)
        c = spec.client(timeout=900)
        canary = c.complete("The capital of France is", max_tokens=8).token_ids
        flat_dir = work / "flat"
        c.collective_rpc("coldstart_dump_weights", kwargs={"out_dir": str(flat_dir)})
    except BaseException:
        eng.stop()
        raise
    return eng, c, canary, flat_dir


def bench_reload(
    size: str = typer.Option("bench", help="Model size (models.tiny): bench ≈ 1.3 GiB."),
    reps: int = typer.Option(5, help="Runs per (method, cache state); medians reported."),
    out: Path = typer.Option(Path("results/reload"), help="Results directory."),
    work: Path = typer.Option(Path("/var/tmp/coldstart-bench-reload"), help="Scratch dir (the flat dump)."),
    methods: str = typer.Option(",".join(METHODS), help="comma list of: " + ",".join(ALL_RELOAD_METHODS)
                                + " (copy-odirect / copy-buffered: a copy reload forced to O_DIRECT / the page cache; "
                                "map-serial: a map that packs after its populate, the read timed alone; "
                                "auto-repack: auto without the packed refill; "
                                "auto-4k: auto without 2 MiB page-cache folios)"),
    keep_memory: bool = typer.Option(False, "--keep-memory", help=hostwatch.KEEP_MEMORY_HELP),
) -> None:
    """Weight reload step alone: vLLM's stock reload_weights vs ours (copy through the loader, and the
    flat file mapped over the weight arena), warm and cold page cache."""
    import shutil

    from coldstart.bench.weights import DirectIntoMemory, fio_run, resident_fraction

    chosen = tuple(m.strip() for m in methods.split(",") if m.strip())
    if not chosen or set(chosen) - set(ALL_RELOAD_METHODS) or "stock" not in chosen:
        raise typer.BadParameter(f"--methods: stock and any of {', '.join(RELOAD_KW)}")
    model = _model(size)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    with hostwatch.kept_if(keep_memory, say=lambda m: print(m, file=sys.stderr, flush=True)):
        eng, c, canary, flat_dir = served_with_flat(model, work)
        rows: list[dict] = []
        try:
            # the packed handles' buffers beside it: what auto reads back instead of packing again
            dumped = c.collective_rpc("coldstart_dump_packed", kwargs={"path": str(flat_dir)})
            print(json.dumps({"dump_packed": dumped}), file=sys.stderr, flush=True)
            # how this device reads cold files faster, measured now (nothing maps the flat file yet): the
            # record every cold copy below reads by (weights.readshape)
            shape = readshape.probe_and_save(flat_dir)
            rows.append({"bench": "reload", "model": size, "method": "read-shape", "cache": "cold", "rep": -1,
                         "seconds": 0.0, "bytes": 0, "detail": dataclasses.asdict(shape)})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            rows.append({"bench": "reload", "model": size, "method": "queue", "cache": "cold", "rep": -1,
                         "seconds": 0.0, "bytes": 0, "detail": queue.settings(queue.queue_dir(flat_dir / "weights.flat"))})
            # the flat file and the packed dump beside it: evicted and pre-read together
            flat_files = [flat_dir / "weights.flat", *sorted(flat_dir.glob("packed-*/weights.flat"))]
            st_files = sorted(model.glob("*.safetensors"))
            nbytes = {m: flat_files[0].stat().st_size for m in chosen}
            nbytes["stock"] = sum(p.stat().st_size for p in st_files)

            into_memory = DirectIntoMemory(flat_files[0])

            def probe(when: str, rep: int, path: Path) -> None:
                """The device's own limit, in the same run, on a file no process maps (a mapped page
                cannot be evicted): the fio shapes that won `coldstart bench load`'s grid on our hosts
                (buffered 4 x 1 MiB on the AMD Zen 3 host, results/bench-load-avx2), and O_DIRECT with 8
                reads in flight (that host's disk: 1.54 GiB/s median against 0.78 with 4,
                results/spot-checks/read-shapes-avx2)."""
                for direct, jobs, bs, what in ((0, 4, 16 << 20, "buffered, 4 jobs, 16 MiB reads"),
                                               (0, 4, 1 << 20, "buffered, 4 jobs, 1 MiB reads"),
                                               (1, 4, 1 << 20, "O_DIRECT, 4 jobs, 1 MiB reads"),
                                               (1, 8, 1 << 20, "O_DIRECT, 8 jobs, 1 MiB reads")):
                    evict_all([path])
                    resident = resident_fraction([path])
                    nb, secs = fio_run(path, direct, jobs, bs)
                    row = {"bench": "reload", "model": size, "method": "device", "cache": "cold", "rep": rep,
                           "when": when, "resident_before": round(resident, 4), "seconds": round(secs, 6),
                           "bytes": nb, "detail": {"fio": what, "file": path.name}}
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
                evict_all([path])
                nb, secs = into_memory.run()
                row = {"bench": "reload", "model": size, "method": "device-memory", "cache": "cold", "rep": rep,
                       "when": when, "seconds": round(secs, 6), "bytes": nb,
                       "detail": {"read": f"O_DIRECT, {into_memory.threads} threads, "
                                          f"{into_memory.block >> 20} MiB reads, each into its own place in a "
                                          "touched buffer the file's size", "file": path.name}}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
            for rep in range(reps):
                for cache in ("warm", "cold"):
                    for method in chosen:
                        files = st_files if method == "stock" else flat_files
                        c.sleep(level=2)
                        c.wake_up(["weights"])
                        if cache == "cold" and method == chosen[0]:
                            probe("before", rep, flat_files[0])
                        if cache == "cold":
                            evict_all(files)
                        else:
                            _read(files)
                        resident = resident_fraction(files)
                        busy0 = host_cpu_busy_s()
                        t = time.perf_counter()
                        if method == "stock":
                            res = c.collective_rpc("reload_weights")
                        else:
                            res = c.collective_rpc("coldstart_reload",
                                                   kwargs={"path": str(flat_dir), **RELOAD_KW[method]})
                        wall = time.perf_counter() - t
                        busy = host_cpu_busy_s() - busy0
                        c.wake_up(["kv_cache"])
                        r0 = res[0] if res and isinstance(res[0], dict) else {}
                        worker_s = r0.get("seconds_rpc")
                        t = time.perf_counter()
                        ok = c.complete("The capital of France is", max_tokens=8).token_ids == canary
                        canary_s = time.perf_counter() - t
                        row = {"bench": "reload", "model": size, "method": method, "cache": cache, "rep": rep,
                               "resident_before": round(resident, 4),
                               "seconds": worker_s if worker_s is not None else wall, "wall_seconds": round(wall, 6),
                               "bytes": r0.get("bytes_read", nbytes[method]), "canary_ok": ok,
                               "canary_s": round(canary_s, 6),
                               "host_cpu_busy_s": round(busy, 3),  # every process and the kernel, over the step
                               "detail": {k: v for k, v in r0.items() if k in (
                                   "mode", "map_s", "populate_s", "copied_tensors", "threads", "read_s", "o_direct",
                                   "direct_choice", "auto_choice", "reader_cpus", "prepack_s", "prepacked_linears",
                                   "prepack_overlapped", "prepack_waited_s", "packed_refilled", "packed_bytes",
                                   "packed_read_s", "packed_refused", "huge_folios")}}
                        rows.append(row)
                        print(json.dumps(row), file=sys.stderr, flush=True)
                        if method == "stock" and len(chosen) > 1:
                            # untimed: back to handles packed from the flat dump, the state a restored
                            # server reloads from (vLLM's reload packed them from the safetensors)
                            c.sleep(level=2)
                            c.wake_up(["weights"])
                            c.collective_rpc("coldstart_reload", kwargs={"path": str(flat_dir), "packed": False})
                            c.wake_up(["kv_cache"])
                        if cache == "cold" and method == DEFAULT_RELOAD:
                            # and right after the default's cold reload (the disk's speed moves from one
                            # minute to the next): the model's safetensors, since the worker now maps the flat file
                            probe("after", rep, st_files[0])
        finally:
            eng.stop()
    lines = reload_table(rows, size, chosen)
    _write(out, rows, "\n".join(lines) + "\n", ["coldstart", "bench", "reload", *sys.argv[3:]])
    print("\n".join(lines))


def bench_restore(
    sizes: str = typer.Option("tiny,bench", help="Comma-separated model sizes."),
    reps: int = typer.Option(3, help="Runs per (model, method); medians reported."),
    out: Path = typer.Option(Path("results/restore-vs-cold"), help="Results directory."),
    work: Path = typer.Option(Path("/var/tmp/coldstart-bench-restore"), help="Scratch dir (snapshots)."),
    criu_variant: str = typer.Option("patched", help="criu build used for the snapshot/restore."),
) -> None:
    """Naive cold start → first token vs `coldstart restore` → first token, with the phase breakdown."""
    import shutil

    from coldstart.pipeline.checkpoint import CheckpointOptions, checkpoint
    from coldstart.pipeline.cold import cold_start

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rows: list[dict] = []
    for size in [s.strip() for s in sizes.split(",") if s.strip()]:
        model = _model(size)
        snap = work / f"snap-{size}"
        m, ctl = checkpoint(CheckpointOptions(model=model, out=snap, port=free_port(), criu_variant=criu_variant),
                            say=lambda s: print(s, file=sys.stderr, flush=True))
        rows.append({"bench": "restore-vs-cold", "model": size, "method": "checkpoint", "rep": 0,
                     "first_token_s": None, "events": [e.__dict__ for e in ctl.events],
                     "snapshot_bytes": sum(f.size for f in m.files.values()),
                     "pages_bytes": sum(f.size for k, f in m.files.items() if k.startswith("criu/pages-"))})
        for rep in range(reps):
            for method in ("cold", "restore"):
                if method == "cold":
                    from coldstart.pipeline.events import Timeline

                    tl = Timeline.from_container_start("cold", model=size)
                    eng, _ = cold_start(model, port=free_port(), timeline=tl, timeout=1800)
                    eng.stop()
                    ft = tl.get(EventName.FIRST_TOKEN)
                    row = {"first_token_s": ft.t if ft else None, "canary_ok": True, "fallback": None,
                           "phases": tl.phases(), "events": [e.__dict__ for e in tl.events]}
                else:  # the entrypoint as a process of its own, timed from its exec
                    r = restore_from_exec(snap, ["--no-fallback", "--timeout", "900"])
                    row = {"first_token_s": r["first_token_from_exec_s"], "canary_ok": r["restored"],
                           "fallback": r["fallback"] or r["stderr_tail"] or None,
                           "first_token_in_process_s": r["first_token_in_process_s"],
                           "phases": r["phases"], "events": r["events"]}
                row = {"bench": "restore-vs-cold", "model": size, "method": method, "rep": rep, **row}
                rows.append(row)
                print(json.dumps({k: row[k] for k in ("model", "method", "rep", "first_token_s", "phases")}),
                      file=sys.stderr, flush=True)
        shutil.rmtree(snap, ignore_errors=True)
    text = restore_table(rows)
    _write(out, rows, text, ["coldstart", "bench", "restore", *sys.argv[3:]])
    print(text)


def restore_table(rows: list[dict], note: str = "") -> str:
    """table.md of the restore-vs-cold benchmark from its rows (medians per model and method)."""
    lines = ["# Naive cold start → first token vs `coldstart restore` → first token", "", _host_line(), "",
             "Both in one run, interleaved, page cache as left by the previous run (warm). Cold start = "
             "vLLM OpenAI server (eager) from process start to the first completion; restore = manifest "
             "check → CRIU restore (patched criu; `--mmap-pages` passed when the binary offers it) → /health → wake → reload from the flat file "
             "(default mode: mapped over the weight arena) → wake KV → canary (default: one forward pass, a 1-token completion with "
             "prompt logprobs compared to the checkpoint's) → first token. Both counted from the spawn of their first process: "
             "the cold start from the spawn of vLLM's server (its Python start-up included), the restore from the spawn of "
             "`coldstart restore SNAP --no-serve` (entrypoint = its exec → its interpreter up and the restore imported). The "
             "restore's first token comes only after the canary passed; the cold start's is a 1-token completion.", "",
             "| model | cold start (s) | restore from exec (s) | speed-up | runs | target ≥ 20× | restore in-process (s) "
             "| exec overhead (s) |", "|---|---|---|---|---|---|---|---|"]
    pages_lines = ["", "The snapshot's CRIU pages the restored processes had mapped in at the first token "
                   "(FIRST_TOKEN's pages_mapped_bytes, from their pagemap), against all of them (medians):", "",
                   "| model | snapshot (MiB) | CRIU pages (MiB) | pages mapped before first token (MiB) | share |",
                   "|---|---|---|---|---|"]
    phase_lines = ["", "Restore phases (medians, s):", "",
                   "| model | entrypoint | manifest | criu_restore | server_up | wake_weights | weights_load | wake_kv | canary |",
                   "|---|---|---|---|---|---|---|---|---|"]
    for size in dict.fromkeys(r["model"] for r in rows):
        med = {}
        for method in ("cold", "restore"):
            xs = [r["first_token_s"] for r in rows if r["model"] == size and r["method"] == method
                  and r["first_token_s"] is not None]
            med[method] = statistics.median(xs) if xs else float("nan")
        n = len([r for r in rows if r["model"] == size and r["method"] == "restore"])
        sp = med["cold"] / med["restore"] if med["restore"] else float("nan")
        ip = [(r["first_token_in_process_s"], r["first_token_s"] - r["first_token_in_process_s"]) for r in rows
              if r["model"] == size and r["method"] == "restore" and r.get("first_token_in_process_s") is not None]
        lines.append(f"| {size} | {med['cold']:.2f} | {med['restore']:.2f} | {sp:.1f}× | {n} | "
                     f"{'met' if sp >= 20 else 'MISSED'} | "
                     + (f"{statistics.median(a for a, _ in ip):.2f} | {statistics.median(b for _, b in ip):.3f} |"
                        if ip else "- | - |"))
        ph = {}
        for k in ("entrypoint", "manifest", "criu_restore", "server_up", "wake_weights", "weights_load", "wake_kv",
                  "canary"):
            xs = [r["phases"].get(k) for r in rows if r["model"] == size and r["method"] == "restore"
                  and r["phases"].get(k) is not None]
            ph[k] = f"{statistics.median(xs):.3f}" if xs else "-"
        phase_lines.append(f"| {size} | " + " | ".join(ph.values()) + " |")
        ck = next((r for r in rows if r["model"] == size and r["method"] == "checkpoint"), {})
        mapped = [e["attrs"]["pages_mapped_bytes"] for r in rows if r["model"] == size and r["method"] == "restore"
                  for e in r.get("events") or [] if e.get("name") == "FIRST_TOKEN"
                  and (e.get("attrs") or {}).get("pages_mapped_bytes")]
        if mapped and ck.get("pages_bytes"):
            mm = statistics.median(mapped)
            pages_lines.append(f"| {size} | {ck['snapshot_bytes'] / 2**20:.0f} | {ck['pages_bytes'] / 2**20:.0f} | "
                               f"{mm / 2**20:.0f} | {mm / ck['pages_bytes']:.0%} |")
    extra = pages_lines if len(pages_lines) > 5 else []
    return "\n".join(lines + phase_lines + extra + ([""] + [note] if note else [])) + "\n"


def kill_restored(pid: int, timeout: float = 30.0) -> None:
    """End a restored server's whole PID namespace: SIGKILL its init (CRIU, the root's parent); the
    kernel kills everything in it (killing the root alone leaves EngineCore and the worker behind).
    Waits until the root is gone."""
    import psutil

    try:
        init = psutil.Process(pid).parent()
        procs = [init, psutil.Process(pid)] if init is not None and "criu" in init.name() else [psutil.Process(pid)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=timeout)
    time.sleep(0.3)


def restore_from_exec(snap: Path, extra: list[str] | None = None, port: int | None = None) -> dict:
    """One `coldstart restore SNAP --no-serve` as a new process; first token counted from its exec
    (the wall clock just before the spawn) and, for comparison, from the entrypoint's ENTRY_READY
    (its interpreter up and the restore imported)."""
    import subprocess
    import tempfile

    tlf = Path(tempfile.mkstemp(suffix=".jsonl")[1])
    argv = [str(Path(sys.executable).with_name("coldstart")), "restore", str(snap), "--no-serve",
            "--port", str(port or free_port()), "--timeline-out", str(tlf), *(extra or [])]
    busy0 = host_cpu_busy_s()
    t0 = time.time()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    t_exit = time.time()
    busy = host_cpu_busy_s() - busy0
    events = [json.loads(ln) for ln in tlf.read_text().splitlines() if ln.strip()]
    tlf.unlink()
    ev = {e["name"]: e for e in events}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    info = json.loads(lines[-1]) if lines else {}
    if info.get("pid"):
        kill_restored(int(info["pid"]))
    ft = ev.get("FIRST_TOKEN")
    phases = {k: round(ev[b.value]["t"] - ev[a.value]["t"], 6) for k, (a, b) in PHASES.items()
              if a.value in ev and b.value in ev}
    return {"restored": bool(info.get("restored")), "fallback": info.get("fallback_reason"),
            "phases": phases, "events": events,
            "first_token_from_exec_s": round(ft["wall"] - t0, 4) if ft else None,
            # the restore's own work: from when the entrypoint's Python was ready (its clock starts at exec)
            "first_token_in_process_s": round(ft["t"] - ev["ENTRY_READY"]["t"], 4) if ft and "ENTRY_READY" in ev
            else (ft["t"] if ft else None),
            "process_exit_s": round(t_exit - t0, 4), "verified": (ev.get("VERIFIED") or {}).get("attrs"),
            "machine_cpu_busy_s": round(busy, 3),  # every process on the host, exec to exit
            "rc": p.returncode, "stderr_tail": p.stderr[-400:] if p.returncode else ""}


def bench_artifact(
    sizes: str = typer.Option("tiny,bench", help="Comma-separated model sizes."),
    reps: int = typer.Option(3, help="Runs per cell; medians reported."),
    concurrency: str = typer.Option("1,2,4", help="Numbers of restores of one snapshot started together."),
    out: Path = typer.Option(Path("results/artifact"), help="Results directory."),
    work: Path = typer.Option(Path("/var/tmp/coldstart-bench-artifact"), help="Scratch dir (snapshots)."),
) -> None:
    """Integrity cost (digests on: recorded on this node / first restore on this node; off) with the
    page cache warm and dropped, and N concurrent restores of one snapshot; first token from exec."""
    import shutil
    import subprocess

    # (imported here: this module is loaded by the entrypoint's CLI; criu.bench costs it 3.5 ms)
    from coldstart.warm.residency import drop_caches
    from coldstart.pipeline import integrity
    from coldstart.pipeline.checkpoint import CheckpointOptions, checkpoint

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rows: list[dict] = []
    say = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    verify_modes = {"off": ["--no-verify"], "recorded": [], "first-on-node": []}
    for size in [s.strip() for s in sizes.split(",") if s.strip()]:
        snap = work / f"snap-{size}"
        m, _ = checkpoint(CheckpointOptions(model=_model(size), out=snap, port=free_port()), say=say)
        total = sum(f.size for f in m.files.values())
        # the checkpoint recorded its files as verified; a first-on-node run re-records them after its
        # full check, so every `recorded` run finds the record without a verify pass right before it
        for rep in range(reps):
            # the variants' order rotates with the repetition: in a fixed order `recorded` always ran
            # right after `off`, and a restore is slower while the previous one's teardown goes on
            order = list(verify_modes)[rep % 3:] + list(verify_modes)[:rep % 3]
            for cache in ("warm", "dropped"):
                for pos, vm in enumerate(order):
                    extra = verify_modes[vm]
                    if vm == "first-on-node":
                        integrity.NodeRecord().forget(snap, m.files)
                    if cache == "dropped":
                        drop_caches()
                    else:
                        _read(p for p in snap.rglob("*") if p.is_file())
                    r = restore_from_exec(snap, extra)
                    rows.append({"bench": "integrity", "model": size, "cache": cache, "verify": vm, "rep": rep,
                                 "position": pos, "snapshot_bytes": total, **r})
                    say(json.dumps(rows[-1]))
        subprocess.run([str(Path(sys.executable).with_name("coldstart")), "snapshot", "verify", str(snap)],
                       capture_output=True, check=True)
        for rep in range(reps):
            for n in [int(x) for x in concurrency.split(",") if x.strip()]:
                _read(p for p in snap.rglob("*") if p.is_file())
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(n) as pool:
                    got = list(pool.map(lambda i: restore_from_exec(snap), range(n)))
                for i, r in enumerate(got):
                    rows.append({"bench": "concurrent", "model": size, "n": n, "replica": i, "rep": rep, **r})
                    say(json.dumps(rows[-1]))
        shutil.rmtree(snap, ignore_errors=True)
    text = artifact_table(rows)
    _write(out, rows, text, ["coldstart", "bench", "artifact", *sys.argv[3:]])
    print(text)


def artifact_table(rows: list[dict]) -> str:
    def med(xs):
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else float("nan")

    lines = ["# Snapshot integrity cost and concurrent restores", "", _host_line(), "",
             "First token counted from the exec of "
             "`coldstart restore SNAP --no-serve` (wall clock before the spawn → the FIRST_TOKEN event's wall "
             "clock; the canary is the first token); in-process = from the entrypoint's ENTRY_READY (interpreter up, restore imported). Digests: `off` = "
             "--no-verify; `recorded` = this node verified the files before (`coldstart snapshot verify`), the "
             "restore checks identities only; `first-on-node` = no record: every chunk of every file the "
             "restore uses is hashed before serving, beside the restore. Warm = every snapshot file read just "
             "before; dropped = `echo 3 > drop_caches` just before (venv libraries dropped too). The three "
             "variants run in an order that rotates with the repetition; `paired` = the median over repetitions "
             "of each one's ratio to `off` in the same repetition.", "",
             "| model | cache | digests | first token from exec (s) | in-process (s) | vs off | paired | runs | restored |",
             "|---|---|---|---|---|---|---|---|---|"]
    integ = [r for r in rows if r["bench"] == "integrity"]
    for size in dict.fromkeys(r["model"] for r in integ):
        for cache in ("warm", "dropped"):
            base = med(r["first_token_from_exec_s"] for r in integ if (r["model"], r["cache"], r["verify"]) == (size, cache, "off"))
            for vm in ("off", "recorded", "first-on-node"):
                sel = [r for r in integ if (r["model"], r["cache"], r["verify"]) == (size, cache, vm)]
                if not sel:
                    continue
                fe = med(r["first_token_from_exec_s"] for r in sel)
                ip = med(r["first_token_in_process_s"] for r in sel)
                off = {r["rep"]: r["first_token_from_exec_s"] for r in integ
                       if (r["model"], r["cache"], r["verify"]) == (size, cache, "off")}
                paired = med(r["first_token_from_exec_s"] / off[r["rep"]] for r in sel
                             if r["first_token_from_exec_s"] and off.get(r["rep"]))
                lines.append(f"| {size} | {cache} | {vm} | {fe:.3f} | {ip:.3f} | {fe / base:.3f}× | {paired:.3f}× | {len(sel)} | "
                             f"{sum(r['restored'] for r in sel)}/{len(sel)} |")
    conc = [r for r in rows if r["bench"] == "concurrent"]
    if conc:
        lines += ["", "Concurrent restores of one snapshot (page cache warm, digests recorded): each replica's first "
                  "token from its own exec, all started together.", "",
                  "| model | N at once | median (s) | slowest (s) | slowest / median of N=1 | CPU bound (s) | "
                  "slowest / bound | batch CPU / cores (s) | restored | fallbacks |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for size in dict.fromkeys(r["model"] for r in conc):
            one = med(r["first_token_from_exec_s"] for r in conc if r["model"] == size and r["n"] == 1)
            cpu1 = med(r.get("machine_cpu_busy_s") for r in conc if r["model"] == size and r["n"] == 1)
            for n in sorted({r["n"] for r in conc if r["model"] == size}):
                sel = [r for r in conc if r["model"] == size and r["n"] == n]
                xs = [r["first_token_from_exec_s"] for r in sel if r["first_token_from_exec_s"] is not None]
                worst = max(xs) if xs else float("nan")
                bound = max(one, n * cpu1 / (os.cpu_count() or 1))
                # what each batch really used: every replica's reading spans the batch's CPU up to its exit
                batch = med(max((r.get("machine_cpu_busy_s") or 0) for r in sel if r["rep"] == rep)
                            for rep in {r["rep"] for r in sel}) / (os.cpu_count() or 1)
                lines.append(f"| {size} | {n} | {med(xs):.3f} | {worst:.3f} | {worst / one:.2f}× | {bound:.3f} | "
                             f"{worst / bound:.2f}× | {batch:.3f} | {sum(r['restored'] for r in sel)}/{len(sel)} | "
                             f"{sum(bool(r['fallback']) for r in sel)} |")
        lines += ["", f"CPU bound: N × the CPU time the whole machine spent on one restore (N=1, exec to the "
                  f"entrypoint's exit, median) / {os.cpu_count()} cores, or the N=1 time if larger: the earliest "
                  "the slowest of N can finish when every restore needs that CPU and they share the cores. "
                  "Batch CPU / cores: the CPU the whole machine spent during a batch of N (median over "
                  "repetitions) over the cores; a slowest near it was waiting for CPU, not on a lock."]
    return "\n".join(lines) + "\n"


def register(bench: typer.Typer) -> None:
    bench.command("artifact")(bench_artifact)
    bench.command("reload")(bench_reload)
    bench.command("restore")(bench_restore)
