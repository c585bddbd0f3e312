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
    host.unwind_on_sigterm()


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


def _first_sentence(doc: str) -> str:
    """A docstring's first sentence on one line (its first paragraph if it has no full stop)."""
    para = " ".join(doc.strip().split("\n\n")[0].split())
    cut = para.find(". ")
    return para if cut < 0 else para[:cut + 1]


def _short_helps(t: typer.Typer) -> None:
    """Command lists show each command's first sentence: typer would list its whole first
    paragraph, hard line breaks included."""
    for ci in t.registered_commands:
        doc = ci.help or (ci.callback.__doc__ if ci.callback else None)
        if doc and not ci.short_help:
            ci.short_help = _first_sentence(doc)
    for gi in t.registered_groups:
        if gi.typer_instance is not None:
            _short_helps(gi.typer_instance)


_register()
_short_helps(app)


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
