"""`make demo`'s container part: what a user deploys. The runtime image (built once, then cached), the
tiny model checkpointed inside a container, restored in a new least-privilege container from a
read-only mount while the host warms the snapshot (the node's first restore of it, which verifies every
file, then a second replica), beside the naive container start of the same model.
Both are timed from the docker-py create call to the first completion through the published port."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def main() -> int:
    from rich.console import Console
    from rich.table import Table

    from coldstart.bench import containers as bench
    from coldstart.containers import docker_api, image, run
    from coldstart.errors import ColdstartError
    from coldstart.models.tiny import cached_model

    con = Console()
    say = lambda s: con.print("   " + s)  # noqa: E731
    try:
        c = docker_api.client(None)
    except ColdstartError as e:
        con.print(f"[yellow]container part skipped: {e}[/]")
        return 0
    con.print("[bold]c1/5[/] the runtime image (the first build imports several GB; later runs reuse it)")
    img = image.app_image(c, Path(__file__).resolve().parents[3], say=say)
    say(f"{img.tag} ({'cached' if img.cached else f'built in {img.seconds:.0f} s'})")

    model = cached_model("tiny")
    snap = Path(os.environ.get("COLDSTART_DEMO_DIR", "/var/tmp/coldstart-demo")) / "container-snapshot"
    shutil.rmtree(snap, ignore_errors=True)
    con.print("[bold]c2/5[/] coldstart checkpoint inside a container (the server runs without capabilities)")
    ck = run.checkpoint(c, img.tag, model, snap)
    if ck.exit_code != 0:
        con.print(ck.logs.rstrip()[-2000:])
        raise ColdstartError(f"the checkpoint container exited with {ck.exit_code}")
    say(f"snapshot: {snap} ({ck.seconds:.0f} s from the create call)")

    layers = docker_api.image_layers(c, img.tag)
    con.print("[bold]c3/5[/] a new container restores it: read-only mount, least privilege, host warming. "
              "The node's first restore of a snapshot verifies the files the node has no record of and "
              "records the access profile")
    first = restore(c, img.tag, model, snap, layers)
    con.print("[bold]c4/5[/] a second replica restores the same snapshot (the node's verification record and "
              "profile reused: what every later replica on this node pays)")
    rest = restore(c, img.tag, model, snap, layers)
    con.print("[bold]c5/5[/] the naive container start of the same model (vLLM's own server), for comparison")
    naive = bench.one_start(c, img.tag, "naive", model, snap)
    if naive.get("error"):
        raise ColdstartError(f"the naive container failed: {naive['error']}")

    t = Table(title="container restore vs naive container start (tiny model, CPU, this machine; "
                    "seconds from the create call)")
    t.add_column("event")
    t.add_column("first restore on the node", justify="right")
    t.add_column("next replica", justify="right")
    t.add_column("naive container", justify="right")
    t.add_row("container created", f"{first['created_s']:.3f}", f"{rest['created_s']:.3f}", f"{naive['created_s']:.3f}")
    t.add_row("container started", f"{first['started_s']:.3f}", f"{rest['started_s']:.3f}", f"{naive['started_s']:.3f}")
    ev1 = first.get("events") or {}
    for name, at in sorted((rest.get("events") or {}).items(), key=lambda kv: kv[1]):
        t.add_row(f"  {name}", f"{ev1[name]:.3f}" if name in ev1 else "", f"{at:.3f}", "")
    t.add_row("first completion via the port", f"{first['first_token_s']:.3f}", f"{rest['first_token_s']:.3f}",
              f"{naive['first_token_s']:.3f}")
    con.print(t)
    con.print(f"[bold]first completion: container restore {rest['first_token_s']:.2f} s (the node's first restore of "
              f"this snapshot {first['first_token_s']:.2f} s) vs naive container {naive['first_token_s']:.2f} s "
              f"({naive['first_token_s'] / rest['first_token_s']:.1f}× faster)[/]")
    shutil.rmtree(snap, ignore_errors=True)
    return 0


def restore(c, image: str, model: Path, snap: Path, layers: list[Path]) -> dict:
    """One restore container with host warming (bench.one_start), said in a line; an error raises."""
    from coldstart.bench import containers as bench
    from coldstart.errors import ColdstartError

    rest = bench.one_start(c, image, "restore+hostwarm", model, snap, layers)
    if rest.get("error"):
        raise ColdstartError(f"the restore container failed: {rest['error']}")
    ver = (rest.get("event_attrs") or {}).get("VERIFIED") or {}
    print(f"   restored={rest.get('restored')}, first completion {rest['first_token_s']:.2f} s"
          + (f", files verified: {ver['checked']} ({ver.get('skipped', 0)} on the node's record)" if "checked" in ver else "")
          + (f", fallback: {rest.get('fallback_reason')}" if not rest.get("restored") else ""))
    return rest


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 - one line, non-zero exit
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
