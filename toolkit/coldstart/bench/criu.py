"""`coldstart bench criu`: stock (copy) vs mmap restore of 1 and 4 GiB images.

For each image size and page-cache state (cold: caches dropped; warm: images read just now;
warm-vmtouch: caches dropped and `vmtouch -t` of the images started right before the restore)
we measure, on the same restore:
- to_running: restore() called -> criu returned -> the process answers a ping;
- restore_read_all: restore() called -> the process has read every byte of its 1/4 GiB and
  answered its digest (which must equal the digest taken before the dump).
Runs are interleaved (run i: every size x state x variant, variant order alternating) so noise
on this shared machine hits both variants alike; medians are reported with their ratio.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from coldstart.errors import ColdstartError
from coldstart.warm.residency import drop_caches

SEED = 1234


@dataclass
class BenchConfig:
    sizes_gib: list[float] = field(default_factory=lambda: [1.0, 4.0])
    runs: int = 5
    modes: list[str] = field(default_factory=lambda: ["cold", "warm", "warm-vmtouch"])
    out_dir: Path = Path("results/bench-criu")
    work_dir: Path = Path("/var/tmp/coldstart-bench-criu")
    mmap_min_kb: int = 0
    command: str = "coldstart bench criu"


def _conditions() -> dict:
    """Load and free memory when a row was measured: this machine is shared and often saturated."""
    load1 = float(Path("/proc/loadavg").read_text().split()[0])
    avail = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            avail = int(line.split()[1]) * 1024
    return {"loadavg1": load1, "mem_available_gib": round(avail / 2**30, 2)}


def _pages(images: Path) -> list[str]:
    return [str(p) for p in sorted(images.glob("pages-*.img"))]


def warm_now(images: Path) -> None:
    subprocess.run(["vmtouch", "-qt", *_pages(images)], check=True)


def _vmtouch() -> str:
    v = shutil.which("vmtouch")
    if not v:
        raise ColdstartError("vmtouch not found (apt install vmtouch; scripts/setup.d/25-criu-tests.sh)")
    return v


def _make_image(memhold: Path, size_gib: float, work: Path, say) -> tuple[Path, str, int]:
    """Start memhold with `size_gib` of data, take its digest, dump it (cached across runs)."""
    from coldstart.criu.dump import DumpOptions, dump
    from coldstart.criu.testprog import Ctl

    mb = int(size_gib * 1024)
    images = work / f"img-{mb}M"
    meta = work / f"img-{mb}M.json"
    if images.exists() and meta.exists():
        m = json.loads(meta.read_text())
        if m.get("memhold") == memhold.name:
            return images, m["digest"], m["pid"]
        shutil.rmtree(images)
    elif images.exists():
        shutil.rmtree(images)
    ctl = Ctl(work / f"ctl-{mb}M")
    say(f"dumping a {size_gib:g} GiB memhold image -> {images}")
    p, _ = ctl.start([str(memhold), str(mb), str(SEED), str(ctl.dir)], timeout=600)
    digest = ctl.request(p.pid, "digest", timeout=600)
    r = dump(p.pid, images, DumpOptions(variant="stock", network_lock=None, tcp_established=False))
    p.wait(60)
    meta.write_text(json.dumps({"digest": digest, "pid": p.pid, "memhold": memhold.name,
                                "pages_bytes": r.pages_bytes, "dump_s": r.seconds}))
    return images, digest, p.pid


def _one(images: Path, digest: str, ctl_dir: Path, variant: str, mode: str, min_kb: int, work: Path) -> dict:
    from coldstart.criu.restore import RestoreOptions, alive, restore, wait_gone
    from coldstart.criu.testprog import Ctl
    from coldstart.errors import ColdstartError as _E

    ctl = Ctl(ctl_dir)
    vm = None
    before = _conditions()
    if mode == "cold":
        drop_caches()
    elif mode == "warm":
        warm_now(images)
    elif mode == "warm-vmtouch":
        drop_caches()
    else:
        raise ColdstartError(f"unknown page-cache mode {mode!r} (cold, warm, warm-vmtouch)")
    opts = RestoreOptions(variant="patched" if variant == "mmap" else "stock",
                          mmap_pages=min_kb if variant == "mmap" else None,
                          network_lock=None, tcp_established=False, work_dir=work / "restore")
    t0 = time.monotonic()
    if mode == "warm-vmtouch":
        vm = subprocess.Popen([_vmtouch(), "-qt", *_pages(images)])
    pidns = False
    try:
        try:
            r = restore(images, opts)
        except _E as e:
            # the dumped PID was taken meanwhile by another process on this shared host: this
            # run restores into a fresh PID namespace instead (recorded in the row)
            if "in use" not in str(e) and "File exists" not in str(e):
                raise
            pidns = True
            opts.pidns = True
            if mode != "warm-vmtouch":
                t0 = time.monotonic()
            r = restore(images, opts)
        t_restored = time.monotonic()
        try:
            ctl.request(r.pid, "ping", timeout=600)
            t_running = time.monotonic()
            got = ctl.request(r.pid, "digest", timeout=1200)
            t_read = time.monotonic()
        finally:
            r.kill()
    finally:
        if vm is not None:
            vm.wait()
    wait_gone([r.pid])
    if alive(r.pid):
        raise ColdstartError(f"restored pid {r.pid} did not go away")
    return {
        "variant": variant, "mode": mode, "criu_s": round(r.seconds, 6),
        "restore_call_s": round(t_restored - t0, 6), "to_running_s": round(t_running - t0, 6),
        "read_all_s": round(t_read - t_running, 6), "restore_read_all_s": round(t_read - t0, 6),
        "digest_ok": got == digest, "pidns": pidns, **before,
    }


def run_bench(cfg: BenchConfig, say: Callable[[str], None] = print) -> list[dict]:
    from coldstart.criu.locate import criu_supports_mmap, criu_version, find_criu
    from coldstart.criu.restore import set_child_subreaper
    from coldstart.criu.testprog import build

    if os.geteuid() != 0:
        raise ColdstartError("coldstart bench criu needs root (criu restore, drop_caches)")
    if cfg.runs < 1:
        raise ColdstartError("--runs must be >= 1")
    patched, stock = find_criu("patched"), find_criu("stock")
    if not criu_supports_mmap(patched):
        raise ColdstartError(f"{patched} has no --mmap-pages: build the patched criu (scripts/build-criu)")
    if "warm-vmtouch" in cfg.modes or "warm" in cfg.modes:
        _vmtouch()
    set_child_subreaper()
    work = cfg.work_dir.absolute()
    work.mkdir(parents=True, exist_ok=True)
    memhold = build("memhold.c", work / "bin")
    images = {s: _make_image(memhold, s, work, say) for s in cfg.sizes_gib}

    out = cfg.out_dir
    out.mkdir(parents=True, exist_ok=True)
    raw_tmp = out / "raw.jsonl.tmp"
    host = {"kernel": platform.release(), "cpus": os.cpu_count(), "criu": criu_version(stock),
            "stock": str(stock), "patched": str(patched)}
    rows: list[dict] = []
    with open(raw_tmp, "w") as raw:
        for run in range(cfg.runs):
            for size in cfg.sizes_gib:
                img, digest, _ = images[size]
                for mode in cfg.modes:
                    order = ["stock", "mmap"] if run % 2 == 0 else ["mmap", "stock"]
                    for variant in order:
                        row = _one(img, digest, work / f"ctl-{int(size * 1024)}M", variant, mode,
                                   cfg.mmap_min_kb, work)
                        row.update(run=run, size_gib=size, mmap_min_kb=cfg.mmap_min_kb,
                                   pages_bytes=sum(Path(p).stat().st_size for p in _pages(img)), **host)
                        rows.append(row)
                        raw.write(json.dumps(row) + "\n")
                        raw.flush()
                        say(f"run {run + 1}/{cfg.runs} {size:g} GiB {mode:<12} {variant:<5} "
                            f"running {row['to_running_s']:.3f} s  restore+read-all {row['restore_read_all_s']:.3f} s"
                            + ("" if row["digest_ok"] else "  DIGEST MISMATCH"))
    os.replace(raw_tmp, out / "raw.jsonl")
    table = render_table(rows, cfg)
    (out / "table.md").write_text(table)
    (out / "COMMAND").write_text(cfg.command + "\n")
    say(table)
    bad = [r for r in rows if not r["digest_ok"]]
    if bad:
        raise ColdstartError(f"{len(bad)} restores gave a wrong memory digest (see {out / 'raw.jsonl'})")
    return rows


def _med(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def render_table(rows: list[dict], cfg: BenchConfig) -> str:
    lines = [
        "# coldstart bench criu: stock (copy) vs mmap restore",
        "",
        f"Medians of {cfg.runs} interleaved runs per cell (CPU-measured on this 2-core VM; no GPU involved). "
        "`to running`: restore called until the restored process answers a ping. `restore+read-all`: "
        "until it has read every byte of its memory and answered the digest (checked against the "
        "pre-dump digest on every run). cold = caches dropped; warm = image read just before; "
        "warm-vmtouch = caches dropped and `vmtouch -t` of the image started just before the restore.",
        "",
        "| size | page cache | stock to running | mmap to running | speed-up | stock restore+read-all | mmap restore+read-all | speed-up |",
        "|---|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for size in cfg.sizes_gib:
        for mode in cfg.modes:
            cell = [r for r in rows if r["size_gib"] == size and r["mode"] == mode]
            s = [r for r in cell if r["variant"] == "stock"]
            m = [r for r in cell if r["variant"] == "mmap"]
            if not s or not m:
                continue
            sr, mr = _med(s, "to_running_s"), _med(m, "to_running_s")
            sa, ma = _med(s, "restore_read_all_s"), _med(m, "restore_read_all_s")
            lines.append(f"| {size:g} GiB | {mode} | {sr:.3f} s | {mr:.3f} s | {sr / mr:.1f}x | "
                         f"{sa:.3f} s | {ma:.3f} s | {sa / ma:.2f}x |")
            if size == max(cfg.sizes_gib) and mode == "warm":
                ok = sr / mr >= 20
                verdicts.append(f"- Target mmap >= 20x faster to running on {size:g} GiB warm: "
                                f"{sr / mr:.1f}x -> {'met' if ok else 'MISSED'}")
            verdicts.append(f"- restore+read-all no slower than stock, {size:g} GiB {mode}: "
                            f"mmap {ma:.3f} s vs stock {sa:.3f} s -> {'met' if ma <= sa else 'MISSED'}")
    loads = [r["loadavg1"] for r in rows if "loadavg1" in r]
    mems = [r["mem_available_gib"] for r in rows if "mem_available_gib" in r]
    cond = []
    if loads:
        cond = ["", "## Conditions", "",
                f"- load average (1 min) before each restore: median {statistics.median(loads):.1f}, "
                f"max {max(loads):.1f} on {os.cpu_count()} CPUs",
                f"- MemAvailable before each restore: median {statistics.median(mems):.1f} GiB, min {min(mems):.1f} GiB",
                f"- restores that fell back to a fresh PID namespace (dumped PID taken): "
                f"{sum(1 for r in rows if r.get('pidns'))} of {len(rows)}"]
    lines += ["", "## Targets", "", *verdicts, *cond, "", f"Command: `{cfg.command}` (raw rows: raw.jsonl)", ""]
    return "\n".join(lines)
