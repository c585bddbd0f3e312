"""Every command's --help says what its options do."""
from __future__ import annotations

import typer

from coldstart.cli import app


def _commands(cmd, path: tuple[str, ...] = ("coldstart",)):
    yield path, cmd
    for name, sub in (getattr(cmd, "commands", None) or {}).items():  # (typer's own click: no isinstance)
        yield from _commands(sub, (*path, name))


def test_no_help_text_is_dropped_by_the_rich_help() -> None:
    """Typer's rich help drops a "[default: ...]" written into an option's help (it prints its own),
    and with it what the default is when the option has none of its own to show."""
    said = [f"{' '.join(path)} {p.name}: {p.help}" for path, cmd in _commands(typer.main.get_command(app))
            for p in cmd.params if "[default:" in (getattr(p, "help", None) or "")]
    assert not said, said
    assert sum(1 for _ in _commands(typer.main.get_command(app))) > 50  # the walk reached the subcommands


def test_every_argument_and_option_says_what_it_is() -> None:
    bare = [f"{' '.join(path)} {p.name}" for path, cmd in _commands(typer.main.get_command(app))
            for p in cmd.params if p.name != "help" and not (getattr(p, "help", None) or "").strip()]
    assert not bare, bare
