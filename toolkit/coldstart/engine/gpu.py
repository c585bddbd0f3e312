"""GPU-side facts and tools for checkpointing a CUDA vLLM server. UNVERIFIED ON GPU (no device here).

On a GPU host the dump needs, besides CRIU: NVIDIA's ``cuda-checkpoint`` (moves the CUDA state of a
process to host memory and back; CRIU's CUDA plugin calls it) and CRIU's ``cuda_plugin.so``, loaded
with ``-L DIR``. vLLM's sleep level 2 first releases the weights and KV cache (CuMemAllocator), so
what cuda-checkpoint saves is the small remainder (CUDA context, graphs, allocator pools).
This module finds those tools, names what is missing, and reads the GPU/driver facts that a
snapshot's manifest must match at restore.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

PLUGIN_DIRS = ("/usr/lib/criu", "/usr/local/lib/criu", "/usr/lib64/criu")


@dataclass
class GpuCheckpointTools:
    cuda_checkpoint: Path | None
    plugin_dir: Path | None
    problems: list[str] = field(default_factory=list)

    @classmethod
    def find(cls, plugin_dir: str | os.PathLike | None = None,
             state_dir: str | os.PathLike | None = None) -> "GpuCheckpointTools":
        """Locate cuda-checkpoint (NVIDIA's on PATH, else ours over the driver API, written under
        ``state_dir``/bin, default $COLDSTART_STATE_DIR) and the CRIU CUDA plugin
        ($CRIU_CUDA_PLUGIN_DIR, then the usual CRIU plugin directories); every missing piece becomes
        one line in ``problems``."""
        problems: list[str] = []
        cc = shutil.which("cuda-checkpoint")
        if not cc:
            from coldstart.engine import cuda_checkpoint

            why = cuda_checkpoint.api_available()
            if why:
                problems.append(f"cuda-checkpoint not found on PATH and the driver's checkpoint API is unusable: {why}")
            else:
                if state_dir is None:
                    from coldstart.state import state_dir as default_state_dir

                    state_dir = default_state_dir()
                cc = str(cuda_checkpoint.command_dir(Path(state_dir)) / "cuda-checkpoint")
        cands = [plugin_dir] if plugin_dir else []
        if os.environ.get("CRIU_CUDA_PLUGIN_DIR"):
            cands.append(os.environ["CRIU_CUDA_PLUGIN_DIR"])
        cands += list(PLUGIN_DIRS)
        pdir = next((Path(c) for c in cands if c and (Path(c) / "cuda_plugin.so").is_file()), None)
        if pdir is None:
            problems.append("CRIU CUDA plugin (cuda_plugin.so) not found in "
                            + ", ".join(str(c) for c in cands if c))
        return cls(Path(cc) if cc else None, pdir, problems)

    @property
    def ok(self) -> bool:
        return not self.problems

    def criu_args(self) -> list[str]:
        """Extra CRIU arguments for dump and restore of a CUDA process tree."""
        return ["-L", str(self.plugin_dir)] if self.plugin_dir else []

    def criu_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """CRIU's environment: the plugin runs cuda-checkpoint from PATH."""
        env = dict(os.environ if base is None else base)
        if self.cuda_checkpoint:
            env["PATH"] = f"{self.cuda_checkpoint.parent}:{env.get('PATH', '')}"
        return env


def gpu_facts() -> dict[str, str]:
    """GPU model(s), driver and CUDA versions for the manifest; {} on a host without a GPU.
    Uses nvidia-ml-py when installed, else ``nvidia-smi``; never raises."""
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        try:
            n = pynvml.nvmlDeviceGetCount()
            names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(n)]
            names = [x.decode() if isinstance(x, bytes) else str(x) for x in names]
            drv = pynvml.nvmlSystemGetDriverVersion()
            return {"gpus": ",".join(names), "gpu_count": str(n),
                    "driver": drv.decode() if isinstance(drv, bytes) else str(drv)}
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    smi = shutil.which("nvidia-smi")
    if not smi:
        return {}
    try:
        out = subprocess.run([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return {}
    rows = [[c.strip() for c in ln.split(",")] for ln in out.strip().splitlines() if ln.strip()]
    if not rows:
        return {}
    return {"gpus": ",".join(r[0] for r in rows), "gpu_count": str(len(rows)),
            "driver": rows[0][1] if len(rows[0]) > 1 else ""}
