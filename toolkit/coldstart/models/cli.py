"""`coldstart model ...`: make the self-generated test and benchmark models."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from coldstart.models.tiny import model_dir


def make_tiny_command(
    size: str = typer.Option("tiny", "--size", help="tiny (~7 MB, tests) or bench (~1.3 GiB, benchmarks)"),
    seed: int = typer.Option(0, "--seed", help="everything (tokenizer, weights) is deterministic from it"),
    out: Optional[Path] = typer.Option(None, "--out", help="output dir (default: $COLDSTART_CACHE/models/SIZE-seedSEED)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing model at OUT"),
) -> None:
    """Make a Llama model with random weights and a locally trained tokenizer (loads offline)."""
    from rich.console import Console

    from coldstart.models.tiny import make_tiny

    out = out or model_dir(size, seed)
    console = Console(stderr=True)
    with console.status(f"making {size} model (seed {seed}) at {out}"):
        path = make_tiny(out, size=size, seed=seed, overwrite=overwrite)
    total = sum(p.stat().st_size for p in path.iterdir())
    console.print(f"[green]made[/] {path} ({total / 2**20:.1f} MiB)")
    print(path)


def register(app: typer.Typer, bench: typer.Typer) -> None:
    sub = typer.Typer(help="Self-made models (random weights, local tokenizer) for tests and benchmarks.",
                      no_args_is_help=True)
    sub.command("make-tiny")(make_tiny_command)
    app.add_typer(sub, name="model")
