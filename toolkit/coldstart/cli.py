"""The thin `coldstart` CLI: each pipeline stage owns its sub-commands in ``<stage>/cli.py``."""
from __future__ import annotations

import sys

import typer

from coldstart.errors import ColdstartError

app = typer.Typer(
    help="coldstart: snapshot a warmed-up vLLM server once, restore it in seconds at every start.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
bench = typer.Typer(help="Benchmarks; raw results (jsonl) and tables go under results/.", no_args_is_help=True)
app.add_typer(bench, name="bench")


@bench.callback()
def _bench_watch() -> None:
    """Benchmarks; raw results (jsonl) and tables go under results/."""
    from coldstart.bench import host

    host.watch()  # what else ran during the benchmark, for its table's host line


STAGES = ("models", "weights", "criu", "warm", "engine", "pipeline", "registry", "containers", "matrix",
          "metrics", "bench")  # bench: the benchmarks that span stages (coldstart.bench)


def _register() -> None:
    # Imported lazily per stage so that a stage with heavy imports (torch, vLLM) costs nothing to
    # the others' start-up; each stage module exposes `app` and optionally `register(app, bench)`.
    import importlib

    for stage in STAGES:
        try:
            mod = importlib.import_module(f"coldstart.{stage}.cli")
        except ModuleNotFoundError as e:
            if e.name == f"coldstart.{stage}.cli":
                continue
            raise
        mod.register(app, bench)


_register()


def main() -> None:
    try:
        app()
    except ColdstartError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
