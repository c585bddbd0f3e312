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


STAGES = ("models", "weights", "criu", "warm", "engine", "pipeline", "registry", "containers", "matrix",
          "metrics", "bench")  # bench: the benchmarks that span stages (coldstart.bench)


def _stages(argv: list[str]) -> tuple[str, ...]:
    """`coldstart restore` is the container entrypoint: it registers the pipeline stage alone (the
    other stages' CLI imports, numpy among them, cost ~0.1 s of every start; -X importtime)."""
    return ("pipeline",) if len(argv) > 1 and argv[1] == "restore" else STAGES


def _register() -> None:
    # Imported lazily per stage so that a stage with heavy imports (torch, vLLM) costs nothing to
    # the others' start-up; each stage module exposes `app` and optionally `register(app, bench)`.
    import importlib

    for stage in _stages(sys.argv):
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
