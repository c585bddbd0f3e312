"""Matrix cells: small commands that run one real start-up and write its timeline, then stop the
server they started (the matrix runs each as a subprocess; see experiments/*.toml).

  python -m coldstart.matrix.cells cold MODEL_DIR --timeline-out F [--port P]
      a naive cold start of vLLM (the pipeline's cold_start) to the first token, then stop.
  python -m coldstart.matrix.cells restore SNAPSHOT --timeline-out F [--criu stock|patched] [--no-warm]
      `coldstart restore` (the pipeline's restore(), with its fallback) to the first token, then stop.
  python -m coldstart.matrix.cells probe FLAT_DIR --timeline-out F [--warm native|vmtouch|none] [--fail-first]
      no vLLM: validate a flat weights index, warm it into the page cache and load it with our loader
      (real work, seconds), optionally after a real failed load of a truncated copy (FALLBACK event).
      Used to test the matrix and the metrics cheaply; its kind is "probe", never reported as a restore.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import typer

from coldstart.errors import ColdstartError
from coldstart.pipeline.events import EventName, Timeline

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False)


@app.command()
def cold(model_dir: Path, timeline_out: Path = typer.Option(..., "--timeline-out"),
         port: int = typer.Option(18240), timeout: float = typer.Option(900.0),
         variant: Optional[str] = typer.Option(None)) -> None:
    """Naive cold start to the first token, then stop the server."""
    from coldstart.pipeline.cold import cold_start

    tl = Timeline.from_container_start("cold", model=model_dir.name, **({"variant": variant} if variant else {}))
    eng, _ = cold_start(model_dir, port=port, timeline=tl, timeout=timeout)
    tl.labels.setdefault("outcome", "ok")
    try:
        eng.stop(timeout=20)
    finally:
        tl.write_jsonl(timeline_out)


@app.command()
def restore(snapshot: Path, timeline_out: Path = typer.Option(..., "--timeline-out"),
            criu: str = typer.Option("", help="stock | patched: which criu binary restores (default: the "
                                              "snapshot's)."),
            warm: bool = typer.Option(True, "--warm/--no-warm"), timeout: float = typer.Option(300.0)) -> None:
    """`coldstart restore` to the first token (falls back to a cold boot on failure), then stop."""
    if criu:
        from coldstart.criu.locate import find_criu

        os.environ["COLDSTART_CRIU"] = str(find_criu(criu))
    from coldstart.pipeline.restore import RestoreOptions
    from coldstart.pipeline.restore import restore as do_restore

    res = do_restore(RestoreOptions(snapshot=snapshot, warm=warm, timeout=timeout), say=lambda s: print(s, flush=True))
    tl = res.timeline
    try:
        stop = getattr(res, "stop", None)  # also closes a private-netns forwarder
        stop() if stop else res.engine.stop(timeout=20)
    finally:
        tl.write_jsonl(timeline_out)


@app.command()
def probe(flat_dir: Path, timeline_out: Path = typer.Option(..., "--timeline-out"),
          warm: str = typer.Option("native"), fail_first: bool = typer.Option(False, "--fail-first"),
          threads: int = typer.Option(4)) -> None:
    """Validate, warm and load a flat weights dump with our loader; real timings, kind "probe"."""
    from coldstart.warm import start_warming
    from coldstart.weights.format import read_index
    from coldstart.weights.loader import alloc_like_index, load_into

    tl = Timeline.from_container_start("probe", model=flat_dir.name)
    index = read_index(flat_dir)
    tl.mark(EventName.MANIFEST_OK, tensors=len(index.tensors))
    flat_file = flat_dir / index.data_file if not Path(index.data_file).is_absolute() else Path(index.data_file)
    warmer = None
    if warm != "none":
        warmer = start_warming([flat_file], mode=warm)
        warm_t0 = tl.mark(EventName.WARM_START, mode=warm).t + tl.t0
    dest = alloc_like_index(index)
    if fail_first:  # a real failure: our loader refuses a truncated copy of the dump
        tmp = Path(tempfile.mkdtemp(prefix="coldstart-probe-"))
        try:
            for f in flat_dir.iterdir():
                if f.is_file():
                    shutil.copyfile(f, tmp / f.name)
            with open(tmp / flat_file.name, "r+b") as fh:
                fh.truncate(max(flat_file.stat().st_size // 2, 1))
            try:
                load_into(tmp, dest, threads=threads)
                raise ColdstartError("the truncated copy loaded: the probe's failure did not happen")
            except ColdstartError as e:
                tl.mark(EventName.FALLBACK, reason=f"weights load failed: {str(e).splitlines()[0]}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    tl.mark(EventName.WAKE_WEIGHTS)
    st = load_into(flat_dir, dest, threads=threads)
    tl.mark(EventName.WEIGHTS_LOADED, bytes=int(st.bytes), gib_per_s=round(float(st.gib_per_s), 3))
    if warmer is not None:
        ws = warmer.wait(120)
        # the warmer's own clock: it ends when its readers finish, not when we get round to asking
        tl.mark(EventName.WARM_DONE, at=warm_t0 + float(ws.seconds), bytes=int(ws.bytes),
                seconds=round(float(ws.seconds), 6))
    tl.mark(EventName.READY)
    tl.labels["outcome"] = "fallback" if fail_first else "ok"
    tl.write_jsonl(timeline_out)


def main() -> None:
    import sys

    try:
        app()
    except ColdstartError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
