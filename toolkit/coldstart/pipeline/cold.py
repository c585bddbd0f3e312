"""A normal ("naive") cold start of vLLM: the fallback of every failed restore, and the baseline the
restore benchmark compares against. Plain vLLM as a user would run it (our launcher's dumpable
settings are harmless here), no sleep mode, no snapshot."""
from __future__ import annotations

import tempfile
from pathlib import Path

from coldstart.pipeline.events import EventName, Timeline


def cold_start(model: Path | str, *, port: int, host: str = "127.0.0.1", engine_args: list[str] | None = None,
               run_dir: Path | None = None, timeline: Timeline | None = None, timeout: float = 900.0,
               served_model_name: str | None = None, kv_cache_bytes: int = 256 << 20,
               canary_prompt: str | None = None, canary_tokens: int = 16, python: str | None = None,
               binds: dict[Path, str] | None = None):
    """Start vLLM for ``model`` and wait until it answers a first completion. ``python`` and
    ``binds``: run it from a runtime mounted elsewhere (EngineSpec.binds), not this process's own.

    Returns (EngineProcess, Completion or None). Marks SERVER_UP, FIRST_TOKEN and READY on the
    timeline. The run dir defaults to a fresh temp dir (never the snapshot's: that stays
    immutable), removed when the server stops.
    """
    from coldstart.engine.client import EngineClient
    from coldstart.engine.launcher import EngineSpec, start_engine

    tl = timeline or Timeline.from_container_start("cold", model=Path(str(model)).name)
    scratch = None if run_dir else Path(tempfile.mkdtemp(prefix="coldstart-cold-"))
    run_dir = Path(run_dir) if run_dir else scratch
    spec = EngineSpec(model=Path(model), run_dir=run_dir, port=port, host=host, kv_cache_bytes=kv_cache_bytes,
                      sleep_mode=False, dev_mode=False, extra_args=list(engine_args or []), served_model_name=served_model_name,
                      binds=dict(binds or {}), **({"python": python} if python else {}))
    eng = start_engine(spec, new_pidns=True)
    try:
        eng.wait_ready(timeout)
        tl.mark(EventName.SERVER_UP)
        comp = None
        client = EngineClient(spec.base_url, timeout=300)
        comp = client.complete(canary_prompt or "Hello", max_tokens=canary_tokens if canary_prompt else 1, seed=0)
        tl.mark(EventName.FIRST_TOKEN)
        tl.mark(EventName.READY, url=spec.base_url)
        eng.scratch = scratch  # gone with the server; a failed start keeps it for the log it names
        return eng, comp
    except BaseException:
        eng.stop(timeout=10)
        raise
