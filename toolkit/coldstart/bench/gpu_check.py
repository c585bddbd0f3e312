"""``scripts/gpu-check OUTDIR``: the GPU half of coldstart proven on a bare CUDA machine in one run.

Order (most valuable first, each stage on its own so that one failure does not end the run, and a
time budget so that the whole run ends well inside a 10-minute lease): device facts (nvidia-ml-py),
the tests marked ``gpu``, the loader into CUDA vs its limits and vs safetensors, the driver's
checkpoint API at 1/4/16 GiB, CRIU dump/restore of a GPU process. OUTDIR gets results.jsonl (raw
records), table.md, facts.json, pytest.xml, COMMAND and log: ready to commit as results/gpu/<gpu>-<date>/.

Needs only what the bare machines have (docs/gpu.md): coldstart is imported from the checkout
(``toolkit/`` on PYTHONPATH), its optional dependencies may be missing (each one is reported).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[3]
OPTIONAL = ("torch", "numpy", "xxhash", "safetensors", "pynvml", "pytest", "blake3", "typer", "rich", "psutil")
WHY_OPTIONAL = {"blake3": "the blake3 digest algorithm (xxh3_64 is the default and is used)",
                "pynvml": "device facts and memory readings (nvidia-ml-py)",
                "typer": "the coldstart CLI (the kit does not need it)", "rich": "the CLI's output"}


class Refused(Exception):
    """The kit cannot run here; the message is the one line the user sees."""


def gpu_absent_reason() -> str:
    """'' when an NVIDIA GPU and a working CUDA driver are here, else why not (cheap checks first)."""
    if not (Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi")):
        return "no NVIDIA GPU on this machine (no /dev/nvidiactl, no nvidia-smi)"
    try:
        from coldstart.engine.cuda_checkpoint import CudaError, _fn, check
        import ctypes

        n = ctypes.c_int(0)
        check(_fn("cuDeviceGetCount")(ctypes.byref(n)), "cuDeviceGetCount")
        if n.value < 1:
            return "the CUDA driver sees no device"
    except CudaError as e:
        return f"the CUDA driver does not work here: {e}"
    return ""


def check_outdir(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise Refused(f"{out} exists and is not an empty directory: give a new OUTDIR")


def dependencies() -> dict[str, str]:
    """Each optional module: its version, or 'missing'."""
    import importlib

    out = {}
    for m in OPTIONAL:
        try:
            mod = importlib.import_module(m)
            out[m] = str(getattr(mod, "__version__", "present"))
        except Exception:  # noqa: BLE001
            out[m] = "missing"
    return out


def device_facts() -> dict[str, Any]:
    """The GPU through nvidia-ml-py, plus the host and the software versions."""
    f: dict[str, Any] = {"host": platform.node(), "kernel": platform.release(), "python": platform.python_version(),
                         "cpus": os.cpu_count()}
    try:
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.startswith("model name"):
                f["cpu"] = ln.split(":", 1)[1].strip()
                break
        f["mem_gib"] = round(int(Path("/proc/meminfo").read_text().split()[1]) / 2**20, 1)
    except OSError:
        pass
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            name = pynvml.nvmlDeviceGetName(h)
            f["gpu"] = name.decode() if isinstance(name, bytes) else name
            f["gpu_count"] = pynvml.nvmlDeviceGetCount()
            drv = pynvml.nvmlSystemGetDriverVersion()
            f["driver"] = drv.decode() if isinstance(drv, bytes) else drv
            v = pynvml.nvmlSystemGetCudaDriverVersion()
            f["cuda_driver"] = f"{v // 1000}.{v % 1000 // 10}"
            f["gpu_mem_gib"] = round(pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**30, 1)
            for key, fn in (("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration"),
                            ("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"),
                            ("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth"),
                            ("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth")):
                try:
                    f[key] = getattr(pynvml, fn)(h)
                except Exception:  # noqa: BLE001
                    pass
            try:
                f["sm_clock_max_mhz"] = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)
            except Exception:  # noqa: BLE001
                pass
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:  # noqa: BLE001
        f["nvml_error"] = str(e)
    try:
        import torch

        f["torch"] = torch.__version__
        f["torch_cuda"] = torch.version.cuda
        f.setdefault("gpu", torch.cuda.get_device_name(0))
    except Exception as e:  # noqa: BLE001
        f["torch_error"] = str(e)
    return f


def gpu_slug(facts: dict[str, Any]) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3' (the results folder's name)."""
    name = str(facts.get("gpu", "gpu")).lower().replace("nvidia", "").strip()
    return "-".join("".join(c if c.isalnum() else " " for c in name).split()) or "gpu"


# ------------------------------------------------------------------------------------------------
# the table


def _med(xs: list[float]) -> float | None:
    xs = [x for x in xs if isinstance(x, (int, float))]
    return round(statistics.median(xs), 3) if xs else None


def paired(ld: list[dict], cache: str, h2d: float | None, case: str = "coldstart") -> str:
    """Median over repetitions of case / min(H2D, best file read of the same repetition): robust to a
    machine whose speed drifts between repetitions (each cell is compared with reads done minutes,
    not the whole run, apart)."""
    ratios = []
    for rep in sorted({r.get("rep") for r in ld if r.get("cache") == cache}):
        ours = [r["gib_s"] for r in ld if r.get("case") == case and r.get("cache") == cache and r.get("rep") == rep
                and r.get("gib_s")]
        reads = [r["gib_s"] for r in ld if str(r.get("case", "")).startswith("read_") and r.get("cache") == cache
                 and r.get("rep") == rep and r.get("gib_s")]
        if ours and reads:
            lim = min(h2d, max(reads)) if h2d else max(reads)
            ratios.append(ours[0] / lim)
    if not ratios:
        return "-"
    return f"{statistics.median(ratios):.2f}x ({', '.join(f'{x:.2f}' for x in ratios)})"


def _loader_lines(ld: list[dict], cpu: bool) -> list[str]:
    """The loader section's lines: medians per case and cache, and the ratios to the limits (into
    CUDA: min(pinned H2D, best file read); into host memory: the best file read)."""
    L: list[str] = []
    h2d = None if cpu else _med([r.get("h2d_gib_s") for r in ld if r.get("case") == "h2d_pinned"])
    nbytes = next((r.get("bytes") for r in ld if r.get("bytes")), 0)
    dflt = next((r.get("loader_default_threads") for r in ld if r.get("loader_default_threads")), None)
    L.append(f"{nbytes / 2**30:.2f} GiB in {next((r.get('tensors') for r in ld if r.get('tensors')), '?')} tensors"
             + (f"; `coldstart` = the loader's defaults ({dflt} readers here)" if dflt else "")
             + (f"; pinned host-to-device copy: **{h2d} GiB/s**" if not cpu else ""))
    L.append("")
    L.append("| case | cold | warm |")
    L.append("|---|---|---|")
    # a cold cell that found its file in the page cache (resident_before) did not measure a cold read
    not_cold = [r for r in ld if r.get("cache") == "cold" and (r.get("resident_before") or 0) > 0.5]
    ld = [r for r in ld if r not in not_cold]
    med: dict[tuple[str, str], float | None] = {}
    cases = list(dict.fromkeys(r.get("case") for r in ld if r.get("case") not in (None, "h2d_pinned")))
    for case in cases:
        cells = []
        for cache in ("cold", "warm"):
            rs = [r for r in ld if r.get("case") == case and r.get("cache") == cache]
            errs = [r["error"] for r in rs if r.get("error")]
            bad = [r["mismatch"] for r in rs if r.get("mismatch")]
            m = med[(case, cache)] = _med([r.get("gib_s") for r in rs if not r.get("error")])
            cell = "-" if not rs else (f"{m}" if m is not None else "error")
            if bad:
                cell += f" (WRONG DATA: {bad[0]})"
            if errs:
                cell += f" ({len(errs)} errors: {errs[0][:80]})"
            cells.append(cell)
        L.append(f"| {case} | {cells[0]} | {cells[1]} |")
    L.append("")
    L.append("| ratio | cold | warm | target |")
    L.append("|---|---|---|---|")
    lim: dict[str, float | None] = {}
    best: dict[str, tuple[str, float] | None] = {}
    for cache in ("cold", "warm"):
        reads = [v for (c, k), v in med.items() if k == cache and c.startswith("read_") and v]
        lim[cache] = (max(reads) if cpu else min(h2d, max(reads)) if h2d else None) if reads else None
        ours = [(c, v) for (c, k), v in med.items() if k == cache and c.startswith("coldstart") and v
                and c != "coldstart_verify"]
        best[cache] = max(ours, key=lambda x: x[1]) if ours else None

    def ratio(a, b):
        return f"{a / b:.2f}x" if a and b else "-"

    def best_ratio(cache, b):
        return f"{ratio(best[cache][1], b)} ({best[cache][0]})" if best[cache] else "-"

    what = "best read (cold: of the file; warm: into a touched buffer of its size)" if cpu else "min(H2D, best file read)"
    L.append(f"| limit = {what} | {lim['cold']} | {lim['warm']} | |")
    L.append(f"| coldstart / limit | {ratio(med.get(('coldstart', 'cold')), lim['cold'])} | "
             f"{ratio(med.get(('coldstart', 'warm')), lim['warm'])} | >= 0.9x |")
    if len([c for c in cases if c.startswith("coldstart")]) > 2:
        L.append(f"| best coldstart config / limit | {best_ratio('cold', lim['cold'])} | "
                 f"{best_ratio('warm', lim['warm'])} | >= 0.9x |")
    L.append(f"| coldstart / limit, paired per repetition (median) | {paired(ld, 'cold', h2d)} | "
             f"{paired(ld, 'warm', h2d)} | >= 0.9x |")
    if any(c == "coldstart_coord" for c in cases):
        L.append(f"| coldstart, one coordinator issuing the copies / limit, paired | "
                 f"{paired(ld, 'cold', h2d, 'coldstart_coord')} | {paired(ld, 'warm', h2d, 'coldstart_coord')} | |")
    L.append(f"| coldstart+verify / limit | {ratio(med.get(('coldstart_verify', 'cold')), lim['cold'])} | "
             f"{ratio(med.get(('coldstart_verify', 'warm')), lim['warm'])} | |")
    L.append(f"| coldstart / safetensors | {ratio(med.get(('coldstart', 'cold')), med.get(('safetensors', 'cold')))} | "
             f"{ratio(med.get(('coldstart', 'warm')), med.get(('safetensors', 'warm')))} | >= 2x cold |")
    st_cold = med.get(("safetensors", "cold"))
    if st_cold and lim["cold"]:
        L.append(f"| bound: limit / safetensors (the most any loader can gain) | {ratio(lim['cold'], st_cold)} | "
                 f"{ratio(lim['warm'], med.get(('safetensors', 'warm')))} | |")
    if not_cold:
        L.append("")
        L.append("Left out, cold cells that found their file in the page cache (not a cold read): "
                 + ", ".join(f"{r.get('case')} rep {r.get('rep')} ({r.get('resident_before')})" for r in not_cold) + ".")
    return L


def render_table(records: list[dict], facts: dict[str, Any], command: str) -> str:
    """table.md from the records (also from a partial run: missing stages say so)."""
    L = [f"# GPU check: {facts.get('gpu', '?')}", "",
         f"`{command}`", "",
         f"GPU {facts.get('gpu', '?')} ({facts.get('gpu_mem_gib', '?')} GiB), driver {facts.get('driver', '?')}, "
         f"CUDA driver {facts.get('cuda_driver', '?')}, PCIe gen {facts.get('pcie_gen', '?')} x{facts.get('pcie_width', '?')}; "
         f"host {facts.get('cpu', '?')}, {facts.get('cpus', '?')} CPUs, {facts.get('mem_gib', '?')} GiB, kernel "
         f"{facts.get('kernel', '?')}; torch {facts.get('torch', '?')}. Medians over the repetitions.", ""]
    tests = [r for r in records if r.get("bench") == "tests"]
    L.append("## GPU tests")
    if tests:
        t = tests[-1]
        L.append(f"{t.get('passed', 0)} passed, {t.get('failed', 0)} failed, {t.get('errors', 0)} errors, "
                 f"{t.get('skipped', 0)} skipped (pytest -m gpu tests/gpu; rc {t.get('rc')})")
        for name in t.get("failures", []):
            L.append(f"- FAILED {name}")
    else:
        L.append("not run")
    L.append("")

    for bench_name, title in (("loader", "## Loader into CUDA memory vs its limits (GiB/s)"),
                              ("loader_cpu", "## Loader into host memory (this machine's CPUs) vs the file-read limit (GiB/s)")):
        ld = [r for r in records if r.get("bench") == bench_name]
        if bench_name == "loader_cpu" and not ld:
            continue  # an optional stage: no section when it was not asked for
        L.append(title)
        L += _loader_lines(ld, bench_name == "loader_cpu") if ld else ["not run"]
        L.append("")

    ck = [r for r in records if r.get("bench") == "cuda_checkpoint"]
    L.append("## CUDA driver checkpoint of a process holding device memory (seconds)")
    if ck:
        L.append("| GiB | lock | checkpoint | restore | unlock | checkpoint GiB/s | restore GiB/s | released GiB | verified |")
        L.append("|---|---|---|---|---|---|---|---|---|")
        for gib in sorted({r.get("gib") for r in ck if r.get("gib") is not None}):
            rs = [r for r in ck if r.get("gib") == gib]
            errs = [r["error"] for r in rs if r.get("error")]
            ok = [r for r in rs if not r.get("error")]
            if not ok:
                L.append(f"| {gib:g} | error: {errs[0][:120]} | | | | | | | |")
                continue
            ver = all(r.get("verified") for r in ok)
            L.append(f"| {gib:g} | {_med([r['lock_s'] for r in ok])} | {_med([r['checkpoint_s'] for r in ok])} | "
                     f"{_med([r['restore_s'] for r in ok])} | {_med([r['unlock_s'] for r in ok])} | "
                     f"{_med([r['checkpoint_gib_s'] for r in ok])} | {_med([r['restore_gib_s'] for r in ok])} | "
                     f"{_med([r.get('released_gib') for r in ok])} | {'yes' if ver else 'NO'} ({len(ok)}/{len(rs)}) |")
    else:
        L.append("not run")
    L.append("")

    cr = [r for r in records if r.get("bench") == "criu_cuda"]
    L.append("## CRIU dump + restore of a GPU process (our patched CRIU, mmap restore)")
    if cr:
        L.append("| mode | GiB (device / host) | CUDA lock+checkpoint | criu dump | criu restore | CUDA restore+unlock | "
                 "restore to device checked | pages read, cold | same pid | verified (device / full) |")
        L.append("|---|---|---|---|---|---|---|---|---|---|")
        for r in cr:
            size = f"{r['gib']} / {r.get('host_gib', 0)}" if "gib" in r else ""
            if r.get("error"):
                L.append(f"| {r['mode']} | {size} | error: {r['error'][:200]} | | | | | | | |")
                continue
            ck_s = round(r.get("lock_s", 0) + r.get("checkpoint_s", 0), 3) if "lock_s" in r else "(in dump)"
            rs_s = round(r.get("cuda_restore_s", 0) + r.get("unlock_s", 0), 3) if "cuda_restore_s" in r else "(in restore)"
            read = f"{r['pages_read_bytes'] / 2**30:.2f} of {r['pages_bytes'] / 2**30:.2f} GiB" if "pages_read_bytes" in r else ""
            full = {True: "yes", False: "NO", None: "-"}[r.get("verified_full")]
            L.append(f"| {r['mode']} | {size} | {ck_s} | {r.get('dump_s')} | {r.get('restore_s')} | {rs_s} | "
                     f"{r.get('to_verified_s', '')} | {read} | {r.get('same_pid')} | "
                     f"{r.get('verified')}{' ' + r['verify_error'] if r.get('verify_error') else ''} / {full} |")
        hot = [r for r in cr if r.get("mode") == "hot" and "child_bytes" in r]
        if hot:
            L.append("")
            L.append("Hot layout (docs/criu.md): " + "; ".join(
                f"{r['gib']} GiB: {r['child_bytes'] / 2**30:.2f} GiB of {r['parent_bytes'] / 2**30:.2f} GiB of pages touched "
                f"by the recording restore ({r['record_s']} s), split in {r['split_s']} s" for r in hot) + ".")
    else:
        L.append("not run")
    L.append("")
    errs = [r for r in records if r.get("bench") == "stage" and r.get("error")]
    if errs:
        L.append("## Stages that failed")
        L += [f"- {r['stage']}: {r['error']}" for r in errs]
        L.append("")
    return "\n".join(L) + "\n"


# ------------------------------------------------------------------------------------------------
# the run


class Run:
    def __init__(self, out: Path, command: str):
        self.out = out
        self.command = command
        self.records: list[dict] = []
        self.facts: dict[str, Any] = {}
        self.t0 = time.monotonic()
        self._log = open(out / "log", "a", buffering=1)

    def say(self, msg: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.1f}s] {msg}"
        print(line, flush=True)
        self._log.write(line + "\n")

    def add(self, rows: list[dict]) -> None:
        with open(self.out / "results.jsonl", "a") as f:
            for r in rows:
                r = dict(r)
                r.pop("ref", None)
                f.write(json.dumps(r, default=str) + "\n")
                self.records.append(r)
        self.write_table()

    def write_table(self) -> None:
        (self.out / "table.md").write_text(render_table(self.records, self.facts, self.command))

    def stage(self, name: str, fn: Callable[[], list[dict]], budget_end: float) -> None:
        left = budget_end - time.monotonic()
        if left <= 0:
            self.say(f"== {name}: skipped (time budget spent)")
            self.add([{"bench": "stage", "stage": name, "error": "skipped: time budget spent"}])
            return
        self.say(f"== {name}")
        t = time.monotonic()
        try:
            rows = fn()
        except Exception as e:  # noqa: BLE001 - the next stage still runs
            import traceback

            self._log.write(traceback.format_exc())
            self.say(f"   {name} failed: {type(e).__name__}: {e}")
            rows = [{"bench": "stage", "stage": name, "error": f"{type(e).__name__}: {e}"}]
        self.add(rows)
        self.say(f"   {name}: {time.monotonic() - t:.1f} s")


def run_tests(run: Run, timeout: float) -> list[dict]:
    xml = run.out / "pytest.xml"
    argv = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/gpu", "-q", "-rA", "-p", "no:cacheprovider",
            f"--junitxml={xml}"]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / "toolkit") + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        p = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        out, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), 124
    for ln in out.splitlines():
        run._log.write("   | " + ln + "\n")
    print(out[-4000:], flush=True)
    row: dict[str, Any] = {"bench": "tests", "rc": rc, "passed": 0, "failed": 0, "errors": 0, "skipped": 0,
                           "failures": []}
    if xml.exists():
        root = ET.parse(xml).getroot()
        for tc in root.iter("testcase"):
            name = f"{tc.get('classname', '')}::{tc.get('name', '')}"
            if tc.find("failure") is not None:
                row["failed"] += 1
                row["failures"].append(name)
            elif tc.find("error") is not None:
                row["errors"] += 1
                row["failures"].append(name)
            elif tc.find("skipped") is not None:
                row["skipped"] += 1
            else:
                row["passed"] += 1
    return [row]


def default_criu() -> Path | None:
    p = REPO / "build" / "gpu-pack" / "criu" / "bin" / "criu"
    return p if p.exists() else None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/gpu-check",
        description="Verify coldstart's GPU path on a CUDA machine: device facts, the GPU tests, the loader "
                    "into CUDA vs its limits and safetensors, CUDA driver checkpoints, CRIU dump/restore of a "
                    "GPU process. Writes OUTDIR/{results.jsonl,table.md,facts.json,pytest.xml,COMMAND,log}.")
    p.add_argument("outdir", type=Path, help="new or empty directory for the results (commit it as results/gpu/<gpu>-<date>/)")
    p.add_argument("--work", type=Path, default=Path("/var/tmp/coldstart-gpu-check"),
                   help="scratch space for the test data and CRIU images (several GiB; removed at the end)")
    p.add_argument("--loader-gib", type=float, default=4.0, help="size of the loader benchmark's model (GiB)")
    p.add_argument("--reps", type=int, default=3, help="repetitions per loader cell")
    p.add_argument("--threads", type=int, default=8, help="the file-read limit's base thread count (16 and 24 are also measured)")
    p.add_argument("--loader-threads", type=int, default=None,
                   help="force the loader's reader count (default: the loader's own default for CUDA)")
    p.add_argument("--ckpt-gib", default="1,4,16", help="device memory held by the checkpointed process (GiB list)")
    p.add_argument("--ckpt-reps", type=int, default=2)
    p.add_argument("--criu", type=Path, default=None,
                   help="criu to use (default: the pack from scripts/gpu-pack, build/gpu-pack/criu/bin/criu)")
    p.add_argument("--criu-gib", default="1,4", help="device memory of the process CRIU dumps (GiB list)")
    p.add_argument("--criu-host-gib", type=float, default=0.0,
                   help="host memory that process also holds and its restore need not read (GiB)")
    p.add_argument("--criu-modes", default="driver,driver_cold,plugin,hot",
                   help="CRIU modes, comma-separated (driver, driver_cold, plugin, hot)")
    p.add_argument("--only", default="tests,loader,checkpoint,criu",
                   help="stages to run, comma-separated (tests, loader, checkpoint, criu; and loader-cpu, not by "
                        "default: the loader into host memory, this machine's CPUs as one more host)")
    p.add_argument("--retable", action="store_true",
                   help="only re-render OUTDIR/table.md from its results.jsonl, facts.json and COMMAND (no GPU needed)")
    p.add_argument("--budget-s", type=float, default=540.0,
                   help="stop starting new stages after this many seconds (a lease command runs at most 600 s)")
    return p.parse_args(argv)


def retable(out: Path) -> int:
    """Re-render table.md of an earlier run from its raw records (after the table learned something)."""
    try:
        records = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines() if x.strip()]
        facts = json.loads((out / "facts.json").read_text())
        command = (out / "COMMAND").read_text().strip()
    except (OSError, ValueError) as e:
        print(f"gpu-check: {out} is not a kit output directory ({e})", file=sys.stderr)
        return 2
    (out / "table.md").write_text(render_table(records, facts, command))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    command = "scripts/gpu-check " + " ".join(shlex.quote(x) for x in argv)
    if a.retable:
        return retable(a.outdir)
    try:
        check_outdir(a.outdir)
        why = gpu_absent_reason()
        if why:
            raise Refused(f"{why}; nothing was run")
    except Refused as e:
        print(f"gpu-check: {e}", file=sys.stderr)
        return 2
    a.outdir.mkdir(parents=True, exist_ok=True)
    (a.outdir / "COMMAND").write_text(command + "\n")
    run = Run(a.outdir, command)
    end = run.t0 + a.budget_s
    stages = {s.strip() for s in a.only.split(",") if s.strip()}
    deps = dependencies()
    for m, v in deps.items():
        if v == "missing":
            run.say(f"optional module {m} missing: {WHY_OPTIONAL.get(m, 'needed by some stages')}")
    run.facts = device_facts()
    run.facts["deps"] = deps
    run.facts["date"] = _dt.date.today().isoformat()
    run.facts["results_dir"] = f"results/gpu/{gpu_slug(run.facts)}-{run.facts['date']}"
    (a.outdir / "facts.json").write_text(json.dumps(run.facts, indent=1, default=str) + "\n")
    run.say("device: " + json.dumps({k: v for k, v in run.facts.items() if k != "deps"}, default=str))
    run.write_table()
    work = a.work
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    from coldstart.bench import gpu as bench

    try:
        if "tests" in stages:
            run.stage("tests", lambda: run_tests(run, max(60.0, min(240.0, end - time.monotonic()))), end)
        if "loader" in stages:
            run.stage("loader", lambda: bench.loader_bench(work / "loader", gib=a.loader_gib, reps=a.reps,
                                                           threads=a.threads, loader_threads=a.loader_threads,
                                                           say=run.say), end)
            shutil.rmtree(work / "loader", ignore_errors=True)
        if "loader-cpu" in stages:
            run.stage("loader-cpu", lambda: bench.loader_bench(work / "loader-cpu", gib=a.loader_gib, reps=a.reps,
                                                               threads=a.threads, device="cpu", say=run.say), end)
            shutil.rmtree(work / "loader-cpu", ignore_errors=True)
        if "checkpoint" in stages:
            sizes = tuple(float(x) for x in a.ckpt_gib.split(",") if x.strip())
            run.stage("checkpoint", lambda: bench.cuda_checkpoint_bench(work / "ckpt", sizes_gib=sizes,
                                                                        reps=a.ckpt_reps, say=run.say), end)
        if "criu" in stages:
            criu = a.criu or default_criu()
            if criu is None:
                run.add([{"bench": "criu_cuda", "mode": "driver", "error": "no criu: run scripts/gpu-pack here and "
                          "carry build/gpu-pack, or pass --criu"}])
            else:
                plugins = criu.resolve().parent.parent / "plugins" if criu.name == "criu" else None
                modes = tuple(m.strip() for m in a.criu_modes.split(",") if m.strip())
                for gib in (float(x) for x in a.criu_gib.split(",") if x.strip()):
                    run.stage(f"criu {gib:g} GiB", lambda gib=gib: bench.criu_cuda_bench(
                        work / "criu", criu, gib=gib, host_gib=a.criu_host_gib, plugin_dir=plugins, modes=modes,
                        say=run.say), end)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        run.write_table()
    run.say(f"done in {time.monotonic() - run.t0:.0f} s; results in {a.outdir} (commit as {run.facts['results_dir']}/)")
    print((a.outdir / "table.md").read_text())
    failed = any(r.get("bench") == "tests" and (r.get("failed") or r.get("errors")) for r in run.records)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
