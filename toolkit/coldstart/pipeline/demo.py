"""`make demo`: make the default tiny model, checkpoint it, restore it, send a completion, and print
the restore's timing table beside a naive cold start of the same model (CPU-measured)."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def main() -> int:
    from rich.console import Console
    from rich.table import Table

    from coldstart.engine.client import EngineClient
    from coldstart.engine.launcher import free_port
    from coldstart.models.tiny import make_tiny, model_dir
    from coldstart.pipeline.checkpoint import CheckpointOptions, checkpoint
    from coldstart.pipeline.cold import cold_start
    from coldstart.pipeline.events import EventName, Timeline
    from coldstart.pipeline.restore import RestoreOptions, restore

    con = Console()
    model = model_dir("tiny", 0)
    if not (model / "config.json").exists():
        con.print(f"[bold]1/5[/] making the tiny model in {model}")
        make_tiny(model, size="tiny", seed=0)
    else:
        con.print(f"[bold]1/5[/] tiny model: {model}")
    demo = Path(os.environ.get("COLDSTART_DEMO_DIR", "/var/tmp/coldstart-demo"))
    snap = demo / "snapshot"
    shutil.rmtree(snap, ignore_errors=True)
    demo.mkdir(parents=True, exist_ok=True)

    con.print("[bold]2/5[/] coldstart checkpoint (start vLLM, canary, dump weights, sleep 2, CRIU dump)")
    m, ctl = checkpoint(CheckpointOptions(model=model, out=snap, port=free_port()), say=lambda s: con.print("   " + s))
    con.print(ctl.table())

    con.print("[bold]3/5[/] coldstart restore")
    res = restore(RestoreOptions(snapshot=snap), say=lambda s: con.print("   " + s))
    try:
        con.print("[bold]4/5[/] a completion from the restored server")
        comp = EngineClient(res.base_url).complete("Hello, coldstart", max_tokens=12)
        con.print(f"   {res.base_url}: {comp.text!r}  (restored={res.restored}"
                  f"{'' if res.restored else ', fallback: ' + str(res.fallback_reason)})")
    finally:
        res.stop()

    con.print("[bold]5/5[/] naive cold start of the same model, for comparison")
    ctl_cold = Timeline.from_container_start("cold", model="tiny")
    eng, _ = cold_start(model, port=free_port(), timeline=ctl_cold)
    eng.stop()

    t = Table(title="coldstart restore vs naive cold start (tiny model, CPU, this machine)")
    t.add_column("event")
    t.add_column("restore t (s)", justify="right")
    t.add_column("cold start t (s)", justify="right")
    names = list(dict.fromkeys([e.name for e in res.timeline.events] + [e.name for e in ctl_cold.events]))
    for n in names:
        a, b = res.timeline.get(n), ctl_cold.get(n)
        t.add_row(n, f"{a.t:.3f}" if a else "", f"{b.t:.3f}" if b else "")
    con.print(t)
    fa, fb = res.timeline.get(EventName.FIRST_TOKEN), ctl_cold.get(EventName.FIRST_TOKEN)
    if fa and fb:
        con.print(f"[bold]first token: restore {fa.t:.2f} s vs cold start {fb.t:.2f} s "
                  f"({fb.t / fa.t:.1f}× faster)[/]")
    shutil.rmtree(snap, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
