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
    listen: str = typer.Option("127.0.0.1", help="Address the server listens on (the restored server keeps it). "
                               "0.0.0.0 in a container: clients then reach the restored server through the "
                               "container's port with no relay, and it holds requests without its control token "
                               "until its restore has checked the canary (docs/containers.md)."),
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
    layout: Optional[str] = typer.Option(None, show_default="hot with the patched criu on a CPU host, else dumped",
                                         help="hot: restore the snapshot once, recording the CRIU pages it touches "
                                         "before its first token, and store those together (a restore reads them in "
                                         "one pass and maps the rest lazily: a third of the bytes, what a lazily "
                                         "mounted snapshot fetches; ~12 s more at checkpoint; docs/criu.md) | dumped: "
                                         "the images as CRIU wrote them."),
    keep_packed: Optional[bool] = typer.Option(None, "--keep-packed/--no-keep-packed",
                                     show_default="on where the rehearsal took >= 0.25 s to pack them",
                                     help="CPU: keep the linear layers' packed GEMM handles in the image, so a "
                                     "restore neither reads the linear weights nor packs them again (bench model, "
                                     "AVX-512 host: first token 1.6 -> 0.8 s warm, host restore; on an AVX2 host "
                                     "packing takes 0.03 s); the image grows by the packed copy (about the "
                                     "weights' size; docs/engine.md). No effect on GPU."),
    slim_weights: bool = typer.Option(True, "--slim-weights/--full-weights",
                                      help="With the packed handles kept: leave the weights only they read out of "
                                      "the weights file (holes; the index keeps their digests), so the snapshot "
                                      "holds them once (bench model: ~1 GiB less on disk and in a registry). The "
                                      "restored server then keeps its handles through every sleep(2), and a dump "
                                      "of its weights rebuilds them exactly from the handles."),
    profile: bool = typer.Option(True, "--profile/--no-profile",
                                 help="CPU: restore the snapshot once more, its files evicted from the page cache, "
                                 "and ship the access profile it records (profile.json): a node's first restore "
                                 "then warms in first-access order instead of reading the files whole (bench model: "
                                 "0.46 s sooner; a few seconds more at checkpoint)."),
    timeline_out: Optional[Path] = typer.Option(None, help="Append the timing events (jsonl) here."),
) -> None:
    """Snapshot a warmed-up vLLM server of MODEL; extra args after `--` go to vLLM."""
    from rich.console import Console

    from coldstart.pipeline.checkpoint import CheckpointOptions, checkpoint

    out = out or Path("snapshots") / Path(model).name
    opts = CheckpointOptions(model=model, out=out, port=port, listen=listen, engine_args=list(ctx.args), canary_prompt=canary,
                             kv_cache_bytes=kv_cache_bytes, criu_variant=criu_variant,
                             sleep=False if no_sleep else None, canary_kind=canary_kind, reload_mode=reload_mode,
                             server_caps=server_caps, layout=layout, keep_packed=keep_packed,
                             slim_weights=slim_weights, profile=profile)
    m, tl = checkpoint(opts, say=_say)
    Console(stderr=True).print(tl.table())
    if timeline_out:
        tl.write_jsonl(timeline_out)
    print(str(Path(out).absolute()))


def restore_cmd(ctx: typer.Context) -> None:
    """Restore a snapshot and serve (the container entrypoint); any failure → cold boot, reason
    printed. `coldstart restore --help` lists its options."""
    from coldstart.pipeline.entry import main

    raise typer.Exit(main(list(ctx.args)))


def inspect_cmd(snapshot: str = typer.Argument(..., help="snapshot directory, or a registry reference "
                                                "(host[:port]/repo:tag, as `coldstart restore` takes)"),
                verify: bool = typer.Option(False, "--verify", help="also hash every file against the manifest")) -> None:
    """Print a snapshot's manifest summary and whether it fits this host. A registry reference is
    mounted lazily for the look (only the files read cross the link; all of them with --verify)."""
    import contextlib

    from coldstart.pipeline.manifest import read_manifest, validate_against_host
    from coldstart.registry.mount import as_reference

    with contextlib.ExitStack() as stack:
        ref = as_reference(snapshot)
        if ref:
            from coldstart.registry.mount import mount, mount_point_for

            mnt = mount(ref, mount_point_for(ref, "inspect-"), prefetch="none")
            stack.callback(mnt.unmount)
            snap = mnt.mountpoint
        else:
            snap = Path(snapshot)
        m = read_manifest(snap, ref)
        problems = validate_against_host(m, snap, verify=verify)
    print(json.dumps({"model": m.model, "created_at": m.created_at, "vllm": m.host.get("vllm"),
                      "bytes": sum(f.size for f in m.files.values()), "canary": m.canary.text,
                      "layout": {"hot": {k: v for k, v in m.layout.items() if k != "early"}} if m.layout else "dumped",
                      "listens": f"{m.host_addr}:{m.port}" + (" (gated until the canary)" if m.gated else ""),
                      "profile": "shipped" if "profile.json" in m.files else "none (each node records its own)",
                      "fits_this_host": not problems, "problems": problems}, indent=1))
    if problems:
        raise typer.Exit(1)


snapshot_app = typer.Typer(help="Snapshots on this host: list, verify, remove, pack into a compressed image "
                            "and mount it.", no_args_is_help=True)


@snapshot_app.command("ls")
def snapshot_ls(roots: List[Path] = typer.Argument(None, help="Snapshot dirs, or dirs holding snapshots "
                                                   "(default: ./snapshots)."),
                as_json: bool = typer.Option(False, "--json", help="One JSON object per snapshot.")) -> None:
    """List snapshots with size and state (ready, in use by a live restore, partial)."""
    from coldstart.errors import ColdstartError
    from coldstart.pipeline.snapshots import find

    if not roots and not Path("snapshots").is_dir():
        raise ColdstartError("no ./snapshots here (where `coldstart checkpoint` writes by default); "
                             "name the snapshot dirs, or the dirs that hold them")
    roots = list(roots or [Path("snapshots")])
    found = find(roots)
    if not found and not as_json:
        print(f"no snapshots in {', '.join(map(str, roots))}", file=sys.stderr)
    for s in found:
        if as_json:
            print(json.dumps({"path": str(s.path), "state": s.state, "bytes": s.bytes, "model": s.model,
                              "created_at": s.created_at, "users": s.users}))
        else:
            users = f" (PIDs {', '.join(map(str, s.users))})" if s.users else ""
            print(f"{str(s.path):50} {s.bytes / 2**30:7.2f} GiB  {s.model:16} {s.created_at:25} {s.state}{users}")


@snapshot_app.command("rm")
def snapshot_rm(snapshot: Path = typer.Argument(..., help="snapshot directory"),
                force: bool = typer.Option(False, "--force", help="Remove even while a restore uses it.")) -> None:
    """Remove a snapshot; refused while a live restore maps its files."""
    from coldstart.pipeline.snapshots import remove

    remove(snapshot, force=force)
    _say(f"removed {snapshot}")


@snapshot_app.command("verify")
def snapshot_verify(snapshot: Path = typer.Argument(..., help="snapshot directory")) -> None:
    """Check every file's digests now and remember the result on this node (restores then skip it)."""
    from coldstart.pipeline.snapshots import verify

    st = verify(snapshot)
    _say(f"{snapshot}: {st['checked']} files ({st['bytes'] / 2**30:.2f} GiB) match their digests")


@snapshot_app.command("pack")
def snapshot_pack(snapshot: Path = typer.Argument(..., help="The snapshot directory."),
                  image: Path = typer.Argument(..., help="The image file to write (must not exist)."),
                  compressor: str = typer.Option("lz4hc", help="lz4hc (fastest to restore from), zstd (smallest: also compresses random bf16 weights, about 0.78x; needs make setup's mkfs.erofs) or lz4.")) -> None:
    """Pack a snapshot into one compressed read-only image (EROFS) for the node's disk, to mount and restore from."""
    from coldstart.pipeline.nodeimage import pack

    _say(f"packing {snapshot} into {image} ({compressor})")
    st = pack(snapshot, image, compressor=compressor)
    _say(f"{image}: {st['bytes'] / 2**20:.0f} MiB, against {st['snapshot_bytes'] / 2**20:.0f} MiB for the "
         f"snapshot on the disk ({st['seconds']} s)")


@snapshot_app.command("mount")
def snapshot_mount(image: Path = typer.Argument(..., help="An image written by `snapshot pack`."),
                   at: Path = typer.Argument(..., help="The directory to mount it at (read-only).")) -> None:
    """Mount a packed snapshot read-only; `coldstart restore AT` then restores from it."""
    from coldstart.pipeline.nodeimage import mount

    _say(f"mounted {image} at {mount(image, at)} (read-only): coldstart restore {at}")


@snapshot_app.command("unmount")
def snapshot_unmount(at: Path = typer.Argument(..., help="Where `snapshot mount` mounted an image, or the image "
                                                      "itself where `coldstart restore IMAGE` mounted it.")) -> None:
    """Unmount a packed snapshot; refused while a restore maps its files."""
    from coldstart.pipeline.nodeimage import unmount

    _say(f"unmounted {unmount(at)}")


def register(app: typer.Typer, bench: typer.Typer) -> None:
    extra = {"allow_extra_args": True, "ignore_unknown_options": True}
    app.command("checkpoint", context_settings=extra)(checkpoint_cmd)
    # parsed by pipeline.entry (the entrypoint's light parser), which also answers --help
    app.command("restore", context_settings=extra, add_help_option=False)(restore_cmd)
    app.command("inspect")(inspect_cmd)
    app.add_typer(snapshot_app, name="snapshot")
    try:
        from coldstart.bench import pipeline as _bench  # noqa: F401
    except ImportError:
        return
    _bench.register(bench)
