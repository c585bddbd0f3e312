"""``coldstart restore``, the container entrypoint, with its own argument parser.

Every millisecond between the entrypoint's exec and the restore is part of the user's start, so
this path imports the standard library and the restore itself, nothing else: the typer CLI
(typer brings pydantic and rich) cost ~0.15 s before the restore's clock started, and rich is
imported only to print the timeline after the first token. `coldstart.main` sends `coldstart
restore ...` here without importing the CLI; `coldstart.cli`'s `restore` command forwards here too.

The restore's clock starts at the entrypoint's exec (COLDSTART_T0 when the caller knows an earlier
start, e.g. a container's create call): ENTRY_READY marks when Python is up and the arguments are
parsed, so what happens before the restore's own work shows in its timeline.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

VERIFY_MODES = ("auto", "full", "off")  # --verify
NETS = ("auto", "host", "private")  # --net
ENV = {  # option -> environment variable that sets its default (a container's settings)
    "verify": "COLDSTART_VERIFY", "net": "COLDSTART_RESTORE_NET", "port": "COLDSTART_PORT",
    "listen": "COLDSTART_LISTEN", "ready_file": "COLDSTART_READY_FILE", "runtime": "COLDSTART_RUNTIME",
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="coldstart restore",
        description="Restore a snapshot and serve (the container entrypoint); any failure → cold boot, "
                    "reason printed. Options marked [env X] take their default from X.")
    env = lambda dest: f" [env {ENV[dest]}]" if dest in ENV else ""  # noqa: E731
    a = p.add_argument
    a("snapshot", nargs="?", default="/snapshot",
      help="Snapshot directory (made by `coldstart checkpoint`), a registry reference (host[:port]/repo[:tag], "
           "pushed by `coldstart push`: mounted lazily, then restored from the mount), or an image written by "
           "`coldstart snapshot pack` (mounted read-only under the node dir unless it is already, and left "
           "mounted). Default: /snapshot.")
    a("--serve", action=argparse.BooleanOptionalAction, default=True,
      help="--no-serve: return once READY, leave the server running.")
    a("--verify", default=os.environ.get(ENV["verify"], "auto"), choices=VERIFY_MODES,
      help="Digests of the snapshot's files, checked before serving: auto (what this node has not verified "
           "unchanged before) | full (everything, every time) | off." + env("verify"))
    a("--no-verify", action="store_true", help="Same as --verify off.")
    a("--runtime", default=os.environ.get(ENV["runtime"]) or None,
      help="Where the server's runtime (the venv with torch and vLLM it was checkpointed with) comes from: a "
           "registry reference pushed by `coldstart push VENV REF --runtime-of SNAPSHOT` (mounted lazily, only "
           "what the server maps fetched first) or a directory; the restored server sees it at its checkpoint "
           "path. Default: the runtime installed at that path." + env("runtime"))
    a("--no-warm", action="store_true", help="Do not warm the page cache in the background.")
    a("--no-fallback", action="store_true", help="Fail instead of cold-booting.")
    a("--model", help="Model to cold-boot if the manifest is unreadable.")
    a("--timeout", type=float, default=300.0, help="Seconds to wait for the restored server (default 300).")
    a("--net", default=os.environ.get(ENV["net"], "auto"), choices=NETS,
      help="host | private (own netns + forwarder: any number of replicas) | auto (host when the snapshot's "
           "port is free here)." + env("net"))
    a("--reload-mode", default="auto", choices=("auto", "map", "copy"),
      help="Weights: map (the snapshot's file mapped over the weight arena; it must stay in place) | copy | "
           "auto (map when the layout matches).")
    a("--settle", action=argparse.BooleanOptionalAction, default=True,
      help="After the first token, copy weights served from the mapped snapshot file into anonymous memory in "
           "the background (the server then serves as fast as a stock one and no longer reads that file); "
           "--no-settle keeps the mapping.")
    a("--port", type=int, default=os.environ.get(ENV["port"]) or None,  # (a string default is parsed by type=)
      help="Host port (private net: the forwarder's; cold boot: vLLM's)." + env("port"))
    a("--listen", default=os.environ.get(ENV["listen"], "127.0.0.1"),
      help="Address the forwarder (private net) or the cold boot listens on: 0.0.0.0 in a container with its "
           "own network, so a published port reaches it (default 127.0.0.1)." + env("listen"))
    a("--timeline-out", type=Path, help="Append the timing events (jsonl) here.")
    a("--ready-file", type=Path, default=os.environ.get(ENV["ready_file"]) or None,
      help="Write the summary line here once serving (a health check's signal)." + env("ready_file"))
    a("--metrics-gateway", help="Push this restore's timing metrics to this Pushgateway URL.")
    a("--metrics-port", type=int, help="Serve /metrics on 127.0.0.1:PORT while the entrypoint serves.")
    a("--variant", default="default", help="The `variant` label of the metrics.")
    a("--warm-mode", choices=("native", "vmtouch", "none"),
      help="Page-cache warming: native | vmtouch | none (default: $COLDSTART_WARM_MODE or native).")
    a("--warm-method", choices=("sendfile", "pread", "populate", "willneed"),
      help="Native warming: sendfile (default: no copy) | pread | populate | willneed.")
    a("--warm-profile", default="auto",
      help="Access profile to follow: auto (this node's own, else DIR/profile.json) | off | PATH.")
    a("--warm-record", default="auto", choices=("auto", "off", "force"),
      help="Record this node's access profile until the first token: auto (while it has none; in a "
           "container also when nothing is warmed) | off | force.")
    a("--warm-rest", default="after", choices=("after", "now", "never"),
      help="With a profile, warm what it does not name: after (first token) | now | never.")
    return p


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def prepare(argv: list[str]) -> argparse.Namespace:
    """The entrypoint's work before ENTRY_READY: the arguments parsed, the clock's start fixed, the
    restore imported. `coldstart bench container`'s entry probe runs only this, so that what it
    measures is what the entrypoint does."""
    p = parser()
    args = p.parse_args(argv)
    for dest, choices in (("verify", VERIFY_MODES), ("net", NETS)):  # argparse checks choices only on
        if getattr(args, dest) not in choices:  # the command line, not on defaults (the environment's)
            p.error(f"{ENV[dest]}={getattr(args, dest)!r}: not one of {', '.join(choices)}")
    from coldstart.pipeline.events import PYTHON_T_ENV, exec_wall_time

    os.environ.setdefault("COLDSTART_T0", repr(exec_wall_time()))
    started = getattr(sys.modules.get("coldstart.main"), "STARTED", None)  # None: not run as `coldstart`
    if started is not None:
        os.environ[PYTHON_T_ENV] = repr(started)
    import coldstart.pipeline.restore  # noqa: F401  (its imports belong before ENTRY_READY)
    import coldstart.registry.mount  # noqa: F401
    return args


def run(args: argparse.Namespace) -> int:
    """Restore, print the summary line, then serve; ``args`` from ``prepare``."""
    from coldstart.pipeline.restore import RestoreOptions, restore, serve_and_release
    from coldstart.registry.mount import as_reference, mount_point_for

    ref = as_reference(args.snapshot)
    snap = mount_point_for(ref) if ref else Path(args.snapshot)
    if not ref and snap.is_file():  # an image from `coldstart snapshot pack`: restored from its mount
        from coldstart.pipeline.nodeimage import mounted

        snap = mounted(snap)
    opts = RestoreOptions(snapshot=snap, ref=ref, verify="off" if args.no_verify else args.verify,
                          warm=not args.no_warm, fallback=not args.no_fallback, model=args.model,
                          timeout=args.timeout, net=args.net, port=args.port, listen=args.listen,
                          reload_mode=args.reload_mode, warm_mode=args.warm_mode, warm_method=args.warm_method,
                          warm_profile=args.warm_profile, warm_record=args.warm_record,
                          warm_rest=args.warm_rest, runtime=args.runtime, settle=args.settle)
    res = restore(opts, say=_say)
    status = "restored" if res.restored else f"cold boot (fallback: {res.fallback_reason})"
    summary = json.dumps({"url": res.base_url, "pid": res.engine.root_pid, "restored": res.restored,
                          "fallback_reason": res.fallback_reason, "canary_ok": res.canary_ok,
                          "events": {e.name: e.t for e in res.timeline.events},
                          "attrs": {e.name: e.attrs for e in res.timeline.events if e.attrs}}, default=str)
    print(summary, flush=True)
    if args.ready_file:
        from coldstart.fsutil import write_atomic

        write_atomic(args.ready_file, summary + "\n")
    from rich.console import Console  # after the first token: the table costs the start nothing

    Console(stderr=True).print(res.timeline.table())
    _say(f"ready: {res.base_url} ({status})")
    if args.timeline_out:
        res.timeline.write_jsonl(args.timeline_out)
    if args.metrics_gateway:
        from coldstart.metrics.export import push_timeline

        push_timeline(res.timeline, args.metrics_gateway, variant=args.variant)
    if args.metrics_port and args.serve:
        from coldstart.metrics.export import serve_metrics

        serve_metrics(args.metrics_port, res.timeline, variant=args.variant)
    if not args.serve and getattr(res, "forwarder", None) is not None:
        _say("warning: --net private forwards through this process; with --no-serve the port closes "
             "when it exits (the server itself keeps running)")
    return serve_and_release(res, opts, say=_say) if args.serve else 0


def main(argv: list[str]) -> int:
    from coldstart.errors import ColdstartError

    args = prepare(argv)
    try:
        return run(args)
    except ColdstartError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
