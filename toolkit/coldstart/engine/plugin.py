"""vLLM general plugin (entry point ``vllm.general_plugins: coldstart``), run by vLLM in every process.

It does three things (the first two through vLLM's public extension points):
1. registers the ``coldstart`` load format (``register_model_loader``): ``--load-format coldstart``
   loads the model's weights from our flat file (weights.flat + weights.index.json) with the
   parallel loader, for the first load and for ``reload_weights``;
2. only when ``COLDSTART_CPU_SLEEP=1`` (set by ``EngineSpec`` together with
   ``--worker-cls coldstart.engine.sleep_worker.SleepCPUWorker``): tells vLLM that sleep mode is
   available on the CPU platform, because our worker implements it. vLLM's check
   (``Platform.is_sleep_mode_available``) is a platform capability with no public switch, so the
   plugin overrides that one method on ``CpuPlatform`` in that process; nothing else changes, and
   without the variable vLLM behaves exactly as stock;
3. only inside a PID namespace whose /proc is the host's (how ``start_engine`` runs the server):
   makes vLLM's two ``/proc/<getpid()>`` lookups correct (see ``coldstart.engine.pidns``).

Where the flat weights are found (first match): ``--model-loader-extra-config '{"flat_dir": DIR}'``,
``$COLDSTART_FLAT_DIR``, ``<model>/coldstart-flat/``, ``<model>/`` itself if it holds weights.flat.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Mapping

# a child of vLLM's logger, so the lines land in the server log with vLLM's format and level
log = logging.getLogger("vllm.coldstart.plugin")

FLAT_FILE = "weights.flat"
FLAT_INDEX = "weights.index.json"
_registered = False


def cpu_sleep_enabled() -> bool:
    return os.environ.get("COLDSTART_CPU_SLEEP", "") not in ("", "0", "false", "no")


def find_flat_dir(model: str | os.PathLike, extra: Mapping[str, Any] | None = None) -> Path:
    """Resolve where the flat weights are (see the module docstring)."""
    from coldstart.errors import ColdstartError

    cands: list[Path] = []
    if extra and extra.get("flat_dir"):
        cands.append(Path(extra["flat_dir"]))
    if os.environ.get("COLDSTART_FLAT_DIR"):
        cands.append(Path(os.environ["COLDSTART_FLAT_DIR"]))
    m = Path(model)
    cands += [m / "coldstart-flat", m]
    for c in cands:
        if (c / FLAT_FILE).is_file() and (c / FLAT_INDEX).is_file():
            return c
    raise ColdstartError("no flat weights (weights.flat + weights.index.json) in any of: "
                         + ", ".join(str(c) for c in cands))


def model_tensor_objects(model) -> dict[str, Any]:
    """The module's own Parameter/buffer objects behind ``model_tensors``, in the same order (the
    weight arena re-points them: ``.data`` must be set on these objects, not on ``p.data`` aliases)."""
    out: dict[str, Any] = {}
    seen: set[int] = set()
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t is None or t.numel() == 0:
            continue
        key = id(t)
        if key in seen:
            continue
        seen.add(key)
        out[name] = t
    return out


def model_tensors(model) -> dict[str, Any]:
    """The tensors a flat dump holds and a reload fills: named parameters and buffers (kernel format,
    i.e. after vLLM's post-load processing), shared tensors once. The order is the dump's order,
    which the weight arena (coldstart.engine.arena) reproduces."""
    return {n: (t.data if hasattr(t, "data") else t) for n, t in model_tensor_objects(model).items()}


def load_flat_into_model(model, flat_dir: Path, **kw) -> Any:
    """Fill the model's tensors in place from a flat dump (names must match exactly)."""
    from coldstart.weights.loader import load_into

    return load_into(Path(flat_dir), model_tensors(model), **kw)


def _loader_kwargs(extra: Mapping[str, Any] | None) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    for key in ("threads", "chunk_bytes", "buffers"):
        if extra and key in extra:
            kw[key] = int(extra[key])
    for key in ("verify", "direct"):
        if extra and key in extra:
            kw[key] = bool(extra[key])
    return kw


def _register_loader() -> None:
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    @register_model_loader("coldstart")
    class ColdstartModelLoader(BaseModelLoader):
        """Loads the flat dump written from a running engine (post-processed tensors, exact names)."""

        def download_model(self, model_config) -> None:
            find_flat_dir(model_config.model, self.load_config.model_loader_extra_config)

        def load_weights(self, model, model_config) -> None:
            extra = self.load_config.model_loader_extra_config or {}
            flat = find_flat_dir(model_config.model, extra)
            stats = load_flat_into_model(model, flat, **_loader_kwargs(extra))
            log.info("coldstart: loaded weights from %s: %s", flat, stats)

    globals()["ColdstartModelLoader"] = ColdstartModelLoader


def _allow_cpu_sleep() -> None:
    from vllm.platforms.cpu import CpuPlatform

    if getattr(CpuPlatform, "_coldstart_sleep", False):
        return

    def is_sleep_mode_available(self) -> bool:  # our SleepCPUWorker implements sleep on CPU
        return True

    CpuPlatform.is_sleep_mode_available = is_sleep_mode_available  # type: ignore[method-assign]
    CpuPlatform._coldstart_sleep = True  # type: ignore[attr-defined]


def register() -> None:
    """Called by vLLM (possibly several times per process): idempotent."""
    global _registered
    if _registered:
        return
    _registered = True
    try:
        _register_loader()
    except Exception as e:  # never take vLLM down because of us; say why in its log
        log.warning("coldstart: could not register the 'coldstart' load format: %s", e)
    if cpu_sleep_enabled():
        try:
            _allow_cpu_sleep()
        except Exception as e:
            log.warning("coldstart: could not enable sleep mode on CPU: %s", e)
    try:
        from coldstart.engine import pidns

        if pidns.install():
            log.info("coldstart: PID namespace with the host's /proc: vLLM's PID lookups patched")
    except Exception as e:
        log.warning("coldstart: could not patch vLLM's PID lookups for the PID namespace: %s", e)


def decode_arg(v: Any) -> Any:
    """collective_rpc passes only strings: decode JSON-looking ones (numbers, booleans, objects)."""
    if isinstance(v, str):
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v
