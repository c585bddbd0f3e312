"""`coldstart container ...`: thin typer wrappers over coldstart.containers."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

container_app = typer.Typer(no_args_is_help=True, help="The runtime image and coldstart in containers (our dockerd: "
                            "scripts/start-docker).")


@container_app.command("build")
def build_command(
    repo: Path = typer.Option(Path(__file__).resolve().parents[3], "--repo", help="checkout whose toolkit/ goes in"),
    host: Optional[str] = typer.Option(None, "--host", help="dockerd address [default: $COLDSTART_DOCKER_HOST, "
                                       "$DOCKER_HOST, else scripts/start-docker's socket]"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Build (or find cached) the runtime image: Debian base + venv + patched criu + coldstart,
    ENTRYPOINT `coldstart restore`. The first build imports several GB; later ones reuse it."""
    from coldstart.containers import docker_api, image

    c = docker_api.client(host)
    info = image.app_image(c, repo, say=lambda m: typer.echo(m, err=True))
    if as_json:
        typer.echo(json.dumps(info.__dict__))
    else:
        typer.echo(f"{info.tag} {info.id[:19]} ({'cached' if info.cached else f'built in {info.seconds:.0f} s'})")


@container_app.command("info")
def info_command(host: Optional[str] = typer.Option(None, "--host")) -> None:
    """What the daemon is and what it allows (the capability names it knows)."""
    from coldstart.containers import docker_api

    f = docker_api.daemon_facts(docker_api.client(host))
    typer.echo(json.dumps({**f.__dict__, "knows_CHECKPOINT_RESTORE": f.knows_checkpoint_restore_cap}))


@container_app.command("checkpoint")
def checkpoint_command(
    model: Path = typer.Argument(..., help="model directory (mounted read-only at its own path)"),
    out: Path = typer.Option(..., "--out", help="snapshot directory to create on the host"),
    port: int = typer.Option(18765, "--port", help="the server's port (host network)"),
    host: Optional[str] = typer.Option(None, "--host"),
) -> None:
    """Checkpoint MODEL inside a container of the runtime image; the snapshot lands in OUT on the host."""
    from coldstart.containers import docker_api, image, run
    from coldstart.errors import ColdstartError

    c = docker_api.client(host)
    img = image.app_image(c, Path(__file__).resolve().parents[3], say=lambda m: typer.echo(m, err=True))
    res = run.checkpoint(c, img.tag, model, out, port=port)
    typer.echo(res.logs.rstrip())
    if res.exit_code != 0:
        raise ColdstartError(f"checkpoint container exited with {res.exit_code}")
    typer.echo(f"snapshot: {res.snapshot} ({res.seconds:.0f} s, from the container's create call)")


@container_app.command("restore")
def restore_command(
    snapshot: Path = typer.Argument(..., help="snapshot directory on the host (mounted read-only)"),
    model: Path = typer.Option(..., "--model", help="the model directory the snapshot was taken from"),
    host: Optional[str] = typer.Option(None, "--host"),
) -> None:
    """Start a container that restores SNAPSHOT (entrypoint `coldstart restore`); prints its id."""
    from coldstart.containers import docker_api, image, run

    c = docker_api.client(host)
    img = image.app_image(c, Path(__file__).resolve().parents[3], say=lambda m: typer.echo(m, err=True))
    ctr = run.start_restore(c, img.tag, snapshot, model)
    typer.echo(ctr.id)


def register(app: typer.Typer, bench: typer.Typer) -> None:
    app.add_typer(container_app, name="container")
