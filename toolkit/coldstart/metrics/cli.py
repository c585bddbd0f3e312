"""`coldstart metrics ...`: regenerate the Grafana dashboards, push saved timelines, serve /metrics."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

sub = typer.Typer(help="Prometheus metrics and Grafana dashboards for coldstart's timing events.",
                  no_args_is_help=True)


@sub.command("dashboards")
def dashboards_cmd(out: Path = typer.Option(Path("dashboards"), "--out", help="Output folder.")) -> None:
    """Write the Grafana dashboard JSON and provisioning files (built with grafana-foundation-sdk)."""
    from coldstart.metrics.dashboards import write_dashboards

    for p in write_dashboards(out):
        typer.echo(str(p))


@sub.command("push")
def push_cmd(
    timeline: Path = typer.Argument(..., help="A timeline jsonl (restore --timeline-out, or a matrix raw.jsonl)."),
    gateway: str = typer.Option(..., "--gateway", help="Pushgateway URL, e.g. http://127.0.0.1:19091"),
    job: str = typer.Option("coldstart", help="Pushgateway job name."),
    model: Optional[str] = typer.Option(None, help="Override the model label."),
    variant: Optional[str] = typer.Option(None, help="Override the variant label."),
) -> None:
    """Push every run in a saved timeline file (one Pushgateway group per run)."""
    from coldstart.metrics.export import push_timeline
    from coldstart.metrics.timelines import read_timelines

    tls = read_timelines(timeline)
    for tl in tls:
        key = push_timeline(tl, gateway, job=job, model=model, variant=variant)
        typer.echo(f"pushed {tl.kind} run ({len(tl.events)} events) as {key}")


@sub.command("serve")
def serve_cmd(
    timeline: Path = typer.Argument(..., help="A timeline jsonl to expose (the last run in it)."),
    port: int = typer.Option(9464, help="Port for /metrics."),
    addr: str = typer.Option("127.0.0.1", help="Bind address."),
    seconds: float = typer.Option(0.0, help="Stop after this many seconds (0 = until interrupted)."),
) -> None:
    """Serve a saved run on /metrics (re-read at every scrape, so a growing file shows live phases).
    The restore entrypoint uses coldstart.metrics.export.serve_metrics on its live Timeline."""
    from coldstart.metrics.export import serve_metrics
    from coldstart.metrics.timelines import read_timelines

    read_timelines(timeline)  # fail early on a bad file
    server = serve_metrics(port, lambda: read_timelines(timeline)[-1], addr=addr)
    typer.echo(f"serving http://{addr}:{port}/metrics")
    t_end = time.monotonic() + seconds if seconds > 0 else None
    try:
        while t_end is None or time.monotonic() < t_end:
            time.sleep(0.2)
    finally:
        server.shutdown()


def register(app: typer.Typer, bench: typer.Typer) -> None:
    app.add_typer(sub, name="metrics")
