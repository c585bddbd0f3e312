"""`coldstart matrix run|report|plan`: the experiment matrix (experiments/*.toml -> results/<name>/)."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import List, Optional

import typer

from coldstart.bench.host import KEEP_MEMORY_HELP

sub = typer.Typer(help="Experiment matrix: run variants x caches x models, tables and plots under results/.",
                  no_args_is_help=True)


def _default_out(spec_path: Path, exp) -> Path:
    return Path(exp.out) if exp.out else Path("results") / f"matrix-{exp.name}"


@sub.command("run")
def run_cmd(
    spec: Path = typer.Argument(..., help="experiments/X.toml"),
    out: Optional[Path] = typer.Option(None, "--out", help="Results folder (default: the spec's out, else "
                                       "results/matrix-<name>)."),
    reps: Optional[int] = typer.Option(None, "--reps", help="Override the repetitions."),
    only: Optional[List[str]] = typer.Option(None, "--only", help="Run only these variants (repeatable)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing raw.jsonl."),
    gateway: Optional[str] = typer.Option(None, "--gateway", help="Also push each run to this Pushgateway."),
    fresh_snapshots: bool = typer.Option(False, "--fresh-snapshots", help="Re-make the snapshots."),
    keep_memory: bool = typer.Option(False, "--keep-memory", help=KEEP_MEMORY_HELP),
) -> None:
    """Run every cell (shuffled, interleaved), record raw.jsonl, then write the summary and plots."""
    from coldstart.bench import host
    from coldstart.matrix.report import render
    from coldstart.matrix.runner import run_experiment
    from coldstart.matrix.spec import load_experiment

    exp = load_experiment(spec)
    out = out or _default_out(spec, exp)
    say = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    reporting = host.page_reporting()  # before --keep-memory turns it off
    with host.kept_if(keep_memory, say=say) as kept:
        raw = run_experiment(exp, out, repetitions=reps, only=only, force=force, gateway=gateway,
                             fresh_snapshots=fresh_snapshots, say=say,
                             host_extra={"page_reporting": reporting, "memory_kept": kept is not None})
    cmd = "coldstart matrix run " + " ".join(shlex.quote(a) for a in sys.argv[3:]) if len(sys.argv) > 3 else \
        f"coldstart matrix run {spec}"
    (out / "COMMAND").write_text(cmd + "\n")
    for p in render(out, command=cmd):
        print(p)
    print(raw)


@sub.command("report")
def report_cmd(results: Path = typer.Argument(..., help="results/<name> (holding raw.jsonl).")) -> None:
    """Re-render summary.md, summary.csv and the plots from raw.jsonl."""
    from coldstart.matrix.report import render

    for p in render(results):
        print(p)


@sub.command("plan")
def plan_cmd(spec: Path = typer.Argument(..., help="experiments/X.toml"),
             reps: Optional[int] = typer.Option(None, "--reps", help="Override the repetitions.")) -> None:
    """Print the cells and the shuffled run order without running anything."""
    from coldstart.matrix.runner import plan
    from coldstart.matrix.spec import load_experiment

    exp = load_experiment(spec)
    p = plan(exp, reps)
    print(f"{exp.name}: {len(exp.variants)} variants, {len(exp.cells())} cells, {len(p.runs)} runs")
    for v in exp.variants:
        print(f"  {v.name}: {' '.join(v.command)}")
    for rnd, order, m, v, c in p.runs:
        print(f"  round {rnd + 1} #{order + 1}: {v.name} {m.name} {c}")


def register(app: typer.Typer, bench: typer.Typer) -> None:
    app.add_typer(sub, name="matrix")
