"""CLI of the pipeline stage: ``coldstart checkpoint``, ``coldstart restore``, ``coldstart inspect``,
``coldstart bench restore`` and ``coldstart bench reload``. Thin: the logic lives in the modules."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def checkpoint_cmd(
    ctx: typer.Context,
    model: Path = typer.Argument(..., help="Local Hugging Face model directory."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Snapshot directory (default: ./snapshots/<model>)."),
    port: int = typer.Option(8000, help="Port the server listens on (the restored server keeps it)."),
    criu_variant: str = typer.Option("patched", help="patched (mmap restore) or stock criu."),
    kv_cache_bytes: int = typer.Option(256 << 20, help="vLLM --kv-cache-memory-bytes."),
    canary: str = typer.Option("The capital of France is", help="Canary prompt (greedy, seed 0)."),
    no_sleep: bool = typer.Option(False, "--no-sleep", help="Dump the server awake (weights inside the image)."),
    canary_kind: str = typer.Option("logprobs", help="logprobs: one forward pass, prompt logprobs compared | "
                                    "tokens: 16 greedy tokens compared (slower)."),
    reload_mode: str = typer.Option("auto", help="The rehearsal's weight reload: map | copy | auto."),
    server_caps: str = typer.Option("keep", help="keep: the server gets this process's capabilities | none: "
                                    "it runs with none (the snapshot then restores in a least-privilege container: "
                                    "CRIU gives the server back its dumped set)."),
    timeline_out: Optional[Path] = typer.Option(None, help="Append the timing events (jsonl) here."),
) -> None:
    """Snapshot a warmed-up vLLM server of MODEL; extra args after `--` go to vLLM."""
    from rich.console import Console

    from coldstart.pipeline.checkpoint import CheckpointOptions, checkpoint

    out = out or Path("snapshots") / Path(model).name
    opts = CheckpointOptions(model=model, out=out, port=port, engine_args=list(ctx.args), canary_prompt=canary,
                             kv_cache_bytes=kv_cache_bytes, criu_variant=criu_variant,
                             sleep=False if no_sleep else None, canary_kind=canary_kind, reload_mode=reload_mode,
                             server_caps=server_caps)
    m, tl = checkpoint(opts, say=_say)
    Console(stderr=True).print(tl.table())
    if timeline_out:
        tl.write_jsonl(timeline_out)
    print(str(Path(out).absolute()))


def _snapshot_or_ref(arg: str) -> tuple[str | None, Path]:
    """A directory, or a registry reference and the mount point it will be mounted on (one per
    restore: replicas do not share a mount, they share the node's chunk cache)."""
    import os

    from coldstart.registry.mount import as_reference, mount_point_for

    if as_reference(arg) is None:
        return None, Path(arg)
    from coldstart.pipeline.events import exec_wall_time

    os.environ.setdefault("COLDSTART_T0", repr(exec_wall_time()))  # the mount is part of the start
    return arg, mount_point_for(arg)


def restore_cmd(
    snapshot: str = typer.Argument("/snapshot", help="Snapshot directory (made by `coldstart checkpoint`), or a "
                                   "registry reference (host[:port]/repo[:tag], pushed by `coldstart push`): mounted "
                                   "lazily, then restored from the mount."),
    serve: bool = typer.Option(True, "--serve/--no-serve", help="--no-serve: return once READY, leave the server running."),
    verify: str = typer.Option("auto", "--verify", envvar="COLDSTART_VERIFY", help="Digests of the snapshot's files, checked before serving: "
                               "auto (what this node has not verified unchanged before) | full (everything, "
                               "every time) | off."),
    no_verify: bool = typer.Option(False, "--no-verify", help="Same as --verify off."),
    no_warm: bool = typer.Option(False, "--no-warm", help="Do not warm the page cache in the background."),
    no_fallback: bool = typer.Option(False, "--no-fallback", help="Fail instead of cold-booting."),
    model: Optional[str] = typer.Option(None, help="Model to cold-boot if the manifest is unreadable."),
    timeout: float = typer.Option(300.0, help="Seconds to wait for the restored server."),
    net: str = typer.Option("auto", envvar="COLDSTART_RESTORE_NET",
                            help="host | private (own netns + forwarder: any number of replicas) | auto (host "
                            "when the snapshot's port is free here)."),
    reload_mode: str = typer.Option("auto", help="Weights: map (the snapshot's file mapped over the weight "
                                    "arena; it must stay in place) | copy | auto (map when the layout matches)."),
    port: Optional[int] = typer.Option(None, envvar="COLDSTART_PORT",
                                       help="Host port (private net: the forwarder's; cold boot: vLLM's)."),
    listen: str = typer.Option("127.0.0.1", envvar="COLDSTART_LISTEN", help="Address the forwarder (private net) or the cold boot listens "
                               "on: 0.0.0.0 in a container with its own network, so a published port reaches it."),
    timeline_out: Optional[Path] = typer.Option(None, help="Append the timing events (jsonl) here."),
    ready_file: Optional[Path] = typer.Option(None, envvar="COLDSTART_READY_FILE",
                                              help="Write the summary line here once serving (a health check's signal)."),
    metrics_gateway: Optional[str] = typer.Option(None, help="Push this restore's timing metrics to this Pushgateway URL."),
    metrics_port: Optional[int] = typer.Option(None, help="Serve /metrics on 127.0.0.1:PORT while the entrypoint serves."),
    variant: str = typer.Option("default", help="The `variant` label of the metrics."),
    warm_mode: Optional[str] = typer.Option(None, help="Page-cache warming: native | vmtouch | none "
                                            "(default: $COLDSTART_WARM_MODE or native)."),
    warm_method: Optional[str] = typer.Option(None, help="Native warming: pread | populate | willneed."),
    warm_profile: str = typer.Option("auto", help="Access profile to follow: auto (DIR/profile.json) | off | PATH."),
    warm_record: str = typer.Option("auto", help="Record an access profile at first token: auto (when none) | off | force."),
    warm_rest: str = typer.Option("after", help="With a profile, warm what it does not name: after (first token) | now | never."),
) -> None:
    """Restore a snapshot and serve (the container entrypoint); any failure → cold boot, reason printed."""
    from rich.console import Console

    from coldstart.pipeline.restore import RestoreOptions, restore, serve as serve_fn

    ref, snap = _snapshot_or_ref(snapshot)
    res = restore(RestoreOptions(snapshot=snap, ref=ref, verify="off" if no_verify else verify, warm=not no_warm, fallback=not no_fallback,
                                 model=model, timeout=timeout, net=net, port=port, listen=listen, reload_mode=reload_mode,
                                 warm_mode=warm_mode,
                                 warm_method=warm_method, warm_profile=warm_profile, warm_record=warm_record, warm_rest=warm_rest),
                  say=_say)
    Console(stderr=True).print(res.timeline.table())
    if timeline_out:
        res.timeline.write_jsonl(timeline_out)
    if metrics_gateway:
        from coldstart.metrics.export import push_timeline

        push_timeline(res.timeline, metrics_gateway, variant=variant)
    if metrics_port and serve:
        from coldstart.metrics.export import serve_metrics

        serve_metrics(metrics_port, res.timeline, variant=variant)
    status = "restored" if res.restored else f"cold boot (fallback: {res.fallback_reason})"
    summary = json.dumps({"url": res.base_url, "pid": res.engine.root_pid, "restored": res.restored,
                          "fallback_reason": res.fallback_reason, "canary_ok": res.canary_ok,
                          "events": {e.name: e.t for e in res.timeline.events}})
    print(summary, flush=True)
    _say(f"ready: {res.base_url} ({status})")
    if ready_file:
        from coldstart.fsutil import write_atomic

        write_atomic(ready_file, summary + "\n")
    if not serve and getattr(res, "forwarder", None) is not None:
        _say("warning: --net private forwards through this process; with --no-serve the port closes "
             "when it exits (the server itself keeps running)")
    if serve:
        raise typer.Exit(serve_fn(res))


def inspect_cmd(snapshot: Path = typer.Argument(...), verify: bool = typer.Option(False, "--verify")) -> None:
    """Print a snapshot's manifest summary and whether it fits this host."""
    from coldstart.pipeline.manifest import read_manifest, validate_against_host

    m = read_manifest(snapshot)
    problems = validate_against_host(m, snapshot, verify=verify)
    print(json.dumps({"model": m.model, "created_at": m.created_at, "vllm": m.host.get("vllm"),
                      "bytes": sum(f.size for f in m.files.values()), "canary": m.canary.text,
                      "fits_this_host": not problems, "problems": problems}, indent=1))
    if problems:
        raise typer.Exit(1)


snapshot_app = typer.Typer(help="Snapshots on this host: list, verify, remove.", no_args_is_help=True)


@snapshot_app.command("ls")
def snapshot_ls(roots: List[Path] = typer.Argument(None, help="Snapshot dirs, or dirs holding snapshots "
                                                   "(default: ./snapshots)."),
                as_json: bool = typer.Option(False, "--json", help="One JSON object per snapshot.")) -> None:
    """List snapshots with size and state (ready, in use by a live restore, partial)."""
    from coldstart.pipeline.snapshots import find

    for s in find(list(roots or [Path("snapshots")])):
        if as_json:
            print(json.dumps({"path": str(s.path), "state": s.state, "bytes": s.bytes, "model": s.model,
                              "created_at": s.created_at, "users": s.users}))
        else:
            users = f" (PIDs {', '.join(map(str, s.users))})" if s.users else ""
            print(f"{str(s.path):50} {s.bytes / 2**30:7.2f} GiB  {s.model:16} {s.created_at:25} {s.state}{users}")


@snapshot_app.command("rm")
def snapshot_rm(snapshot: Path = typer.Argument(...),
                force: bool = typer.Option(False, "--force", help="Remove even while a restore uses it.")) -> None:
    """Remove a snapshot; refused while a live restore maps its files."""
    from coldstart.pipeline.snapshots import remove

    remove(snapshot, force=force)
    _say(f"removed {snapshot}")


@snapshot_app.command("verify")
def snapshot_verify(snapshot: Path = typer.Argument(...)) -> None:
    """Check every file's digests now and remember the result on this node (restores then skip it)."""
    from coldstart.pipeline.snapshots import verify

    st = verify(snapshot)
    _say(f"{snapshot}: {st['checked']} files ({st['bytes'] / 2**30:.2f} GiB) match their digests")


def register(app: typer.Typer, bench: typer.Typer) -> None:
    extra = {"allow_extra_args": True, "ignore_unknown_options": True}
    app.command("checkpoint", context_settings=extra)(checkpoint_cmd)
    app.command("restore")(restore_cmd)
    app.command("inspect")(inspect_cmd)
    app.add_typer(snapshot_app, name="snapshot")
    try:
        from coldstart.pipeline import bench as _bench  # noqa: F401
    except ImportError:
        return
    _bench.register(bench)
