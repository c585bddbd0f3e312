"""`coldstart container ...`: thin typer wrappers over coldstart.containers."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Optional

import typer

from coldstart.bench.host import KEEP_MEMORY_HELP

container_app = typer.Typer(no_args_is_help=True, help="The runtime image and coldstart in containers (our dockerd: "
                            "scripts/start-docker).")

HOST_HELP = "dockerd address (default: $COLDSTART_DOCKER_HOST, $DOCKER_HOST, else scripts/start-docker's socket)"
DEFAULT_PORT = 8000
PORT_HELP = "host port (127.0.0.1) published to the container's 8000"
PORT_DEFAULT = f"{DEFAULT_PORT}; with --pod the pod's"
POD_HELP = ("a running `coldstart container pod` (name or id) whose network namespace the container joins, as a "
            "pod's containers do on a Kubernetes node: no network is set up at its start, and the server is "
            "reached through the pod's published port (--port, if given, must be that one)")


def _pod_and_port(c, pod: str | None, port: int | None):
    """The pod to join (None for none) and the host port that reaches the server: the pod's own."""
    from coldstart.containers import run
    from coldstart.errors import ColdstartError

    if pod is None:
        return None, port
    joined = run.find_pod(c, pod)
    published = run.pod_port(joined)
    if port not in (None, published):
        raise ColdstartError(f"--port {port}: pod {pod} publishes the server's port on {published} (leave --port "
                             "out with --pod)")
    return joined, published


@container_app.command("build")
def build_command(
    repo: Path = typer.Option(Path(__file__).resolve().parents[3], "--repo", help="checkout whose toolkit/ goes in"),
    host: Optional[str] = typer.Option(None, "--host", help=HOST_HELP),
    as_json: bool = typer.Option(False, "--json", help="print the image's tag, id and whether it was cached as JSON"),
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
def info_command(host: Optional[str] = typer.Option(None, "--host", help=HOST_HELP)) -> None:
    """What the daemon is and what it allows (the capability names it knows), and the OCI runtime our
    containers run under there (the daemon's default, or $COLDSTART_OCI_RUNTIME)."""
    from coldstart.containers import docker_api

    c = docker_api.client(host)
    f = docker_api.daemon_facts(c)
    typer.echo(json.dumps({**f.__dict__, "knows_CHECKPOINT_RESTORE": f.knows_checkpoint_restore_cap,
                           "oci_runtime": docker_api.oci_runtime(c) or f.runtime}))


@container_app.command("checkpoint")
def checkpoint_command(
    model: Path = typer.Argument(..., help="model directory (mounted read-only at its own path)"),
    out: str = typer.Option(..., "--out", help="snapshot directory to create on the host, or volume:NAME: a docker "
                            "named volume (created if missing) that will hold it"),
    layout: Optional[str] = typer.Option(None, show_default="hot", help="the images' layout, as `coldstart checkpoint "
                                         "--layout`: hot (the pages a restore touches before its first token stored "
                                         "together) | dumped"),
    keep_packed: Optional[bool] = typer.Option(None, "--keep-packed/--no-keep-packed",
                                               show_default="on where the rehearsal took >= 0.25 s to pack them",
                                               help="as `coldstart checkpoint --keep-packed`: the linear layers' "
                                               "packed GEMM handles kept in the image"),
    host: Optional[str] = typer.Option(None, "--host", help=HOST_HELP),
) -> None:
    """Checkpoint MODEL inside a container of the image; the snapshot lands in OUT on the host (or in the
    docker named volume of OUT=volume:NAME). The
    server runs without capabilities, so the snapshot restores in a least-privilege container. The
    checkpoint's container gets SYS_ADMIN, SYS_CHROOT and SETPCAP (seccomp unconfined, for CRIU's
    dump), and for the hot layout the restore's NET_ADMIN, SYS_TIME and DAC_OVERRIDE too (it
    restores the snapshot once to record what a restore touches); docs/containers.md."""
    from coldstart.containers import docker_api, image, run
    from coldstart.errors import ColdstartError
    from coldstart.pipeline.checkpoint import hf_model_dir

    hf_model_dir(model)  # before the image build
    c = docker_api.client(host)
    img = image.app_image(c, Path(__file__).resolve().parents[3], say=lambda m: typer.echo(m, err=True))
    extra = (["--layout", layout] if layout else []) + (
        [] if keep_packed is None else ["--keep-packed" if keep_packed else "--no-keep-packed"])
    res = run.checkpoint(c, img.tag, model, out, extra=extra)
    typer.echo(res.logs.rstrip())
    if res.exit_code != 0:
        raise ColdstartError(f"checkpoint container exited with {res.exit_code}")
    where = str(res.snapshot) if not res.volume else (
        f"{run.VOLUME_PREFIX}{res.volume}" + (f" (on this host: {res.snapshot})" if res.snapshot else ""))
    typer.echo(f"snapshot: {where} ({res.seconds:.0f} s, from the container's create call; "
               f"the container's capabilities: {', '.join(res.caps)})")


def _serve_container(ctr, port: int, t0: float, warmer=None, created_s: float | None = None,
                     started_s: float | None = None, lazy=None) -> None:
    """Follow a started container until its entrypoint's summary line, print it with the host's timings
    (CONTAINER_CREATE and CONTAINER_STARTED among its events). ``lazy``: the snapshot's lazy mount,
    asked for the chunks it has not fetched once the restored server serves (run.fetch_rest)."""
    from coldstart.containers.run import fetch_rest, summary, with_host_events

    summ = with_host_events(summary(ctr, time.monotonic() + 900), created_s, started_s)
    fetched = fetch_rest(lazy, summ)
    if fetched is not None:
        summ["snapshot_fetch_all"] = fetched
    if warmer is not None:
        warmer.wait()
    ctr.reload()
    # "url": where the host reaches the server (the published port); the entrypoint's own is the container's
    typer.echo(json.dumps({"container": ctr.id[:12], "status": ctr.status,
                            "seconds_from_create": round(time.monotonic() - t0, 2), **summ,
                            "url": f"http://127.0.0.1:{port}", "container_url": summ.get("url")}))


@container_app.command("restore")
def restore_command(
    snapshot: str = typer.Argument(..., help="snapshot directory on the host (mounted read-only), an image of one "
                                   "(`coldstart snapshot pack`: mounted on the host as `coldstart restore IMAGE` "
                                   "does), a registry reference: mounted lazily on the host (`coldstart "
                                   "mount`), a mount bound into the container read-only; or volume:NAME, the "
                                   "docker named volume `container checkpoint --out volume:NAME` wrote"),
    model: Path = typer.Option(..., "--model", help="the model directory the snapshot was taken from"),
    port: Optional[int] = typer.Option(None, "--port", show_default=PORT_DEFAULT, help=PORT_HELP),
    pod: Optional[str] = typer.Option(None, "--pod", help=POD_HELP),
    name: Optional[str] = typer.Option(None, "--name", help="container name"),
    host_warm: bool = typer.Option(True, "--host-warm/--no-host-warm",
                                   help="warm the snapshot's page cache from the host, from the create call on"),
    verify: Optional[str] = typer.Option(None, "--verify", show_default="auto; off for a registry reference",
                                         help="the entrypoint's check of the snapshot's digests before it serves "
                                         "(`coldstart restore --verify`): auto (what this node has not verified "
                                         "before) | full | off. A lazy mount checks every chunk it fetches"),
    host: Optional[str] = typer.Option(None, "--host", help=HOST_HELP),
) -> None:
    """Start a container that restores SNAPSHOT (entrypoint `coldstart restore`, least privilege, its own
    network with the port published, or a pod's: --pod) and wait for its summary line (restored or
    fallback, and why)."""
    from coldstart.containers import docker_api, image, run
    from coldstart.errors import ColdstartError
    from coldstart.pipeline.checkpoint import check_listen, hf_model_dir
    from coldstart.pipeline.entry import VERIFY_MODES
    from coldstart.registry.mount import as_reference

    if verify not in (None, *VERIFY_MODES):
        raise ColdstartError(f"--verify {verify!r}: not one of {', '.join(VERIFY_MODES)}")
    hf_model_dir(model)  # before the image build: one line, not minutes then a traceback
    if pod is None:
        port = DEFAULT_PORT if port is None else port
        check_listen("127.0.0.1", port)  # docker would refuse only at the start call, the container made
    vol = run.volume_name(snapshot)
    ref = None if vol else as_reference(snapshot)
    if not (ref or vol):
        run.host_snapshot(Path(snapshot))
    c = docker_api.client(host)
    joined, port = _pod_and_port(c, pod, port)
    img = image.app_image(c, Path(__file__).resolve().parents[3], say=lambda m: typer.echo(m, err=True))
    layers = docker_api.image_layers(c, img.tag)
    if ref:
        run.gc_container_mounts(c)  # (before the clock: not part of this start)
    if vol:
        run.require_volume(c, vol)
    t0, wall0 = time.monotonic(), time.time()
    if os.environ.get("COLDSTART_T0"):  # a caller's earlier clock (a benchmark that spawned this command)
        given = float(os.environ["COLDSTART_T0"])
        t0, wall0 = t0 - (wall0 - given), given
    env = {"COLDSTART_T0": repr(wall0)}
    snap, m = Path(snapshot), None
    if vol:  # the host warms it where it sees the volume's data (a local volume), else not at all
        snap = run.volume_snapshot(c, vol) or snapshot
        if not isinstance(snap, Path) and host_warm:
            typer.echo(f"volume {vol}: its data is not on this host's file system (another driver, or mount "
                       "options): no host warming", err=True)
            host_warm = False
    elif not ref and snap.is_file():  # (inside the clock: `coldstart restore IMAGE` mounts inside its own)
        snap = run.image_mount(snap)
    if ref:
        m = run.mount_for_container(ref)
        snap = m.mountpoint
        # every byte read through the mount is checked against its chunk's BLAKE3 digest
        env["COLDSTART_VERIFY"] = "off"
        typer.echo(f"mounted {snapshot} at {snap} (lazy; unmounted by the next `container restore REF` once "
                   f"the container is removed, or by `coldstart umount {snap}`)", err=True)
    if verify:
        env["COLDSTART_VERIFY"] = verify
    warmer = run.host_warm(snap, layers) if host_warm else None
    try:
        ctr = run.create_restore(c, img.tag, snapshot if vol else snap, model, port, name=name, env=env,
                                 host_warms=host_warm, lazy=m, pod=joined)
        created_s = time.monotonic() - t0
        if m is not None:
            run.own_mount(m, ctr)
        run.start(ctr)
    except BaseException:
        if warmer is not None:
            warmer.cancel()
        if m is not None:  # no container will use it
            m.unmount()
        raise
    started_s = time.monotonic() - t0
    if warmer is not None:
        warmer.container_started()
    _serve_container(ctr, port, t0, warmer, created_s, started_s, lazy=m)


@container_app.command("pod")
def pod_command(
    port: int = typer.Option(DEFAULT_PORT, "--port", help="host port (127.0.0.1) published to the pod's 8000"),
    name: Optional[str] = typer.Option(None, "--name", help="the pod's container name (default: docker's)"),
    host: Optional[str] = typer.Option(None, "--host", help=HOST_HELP),
) -> None:
    """Start a pod's sandbox: a container of the image that only holds a network namespace, the port
    published, as kubelet makes a pod's sandbox before the pod's containers. `container restore --pod`
    and `run-cold --pod` join it, so docker sets up no network at their start. Prints the pod's name
    and url; `docker rm -f NAME` removes it."""
    from coldstart.containers import docker_api, image, run
    from coldstart.pipeline.checkpoint import check_listen

    check_listen("127.0.0.1", port)
    c = docker_api.client(host)
    img = image.app_image(c, Path(__file__).resolve().parents[3], say=lambda m: typer.echo(m, err=True))
    pod = run.create_pod(c, img.tag, port, name=name)
    typer.echo(json.dumps({"pod": pod.name, "id": pod.id[:12], "url": f"http://127.0.0.1:{port}"}))


@container_app.command("run-cold")
def run_cold_command(
    model: Path = typer.Argument(..., help="model directory (mounted read-only)"),
    port: Optional[int] = typer.Option(None, "--port", show_default=PORT_DEFAULT, help=PORT_HELP),
    pod: Optional[str] = typer.Option(None, "--pod", help=POD_HELP),
    host: Optional[str] = typer.Option(None, "--host", help=HOST_HELP),
) -> None:
    """The naive container start, to compare with: vLLM's own server in the same image, docker's default
    security, the same network as `container restore`; prints the seconds from the create call to the
    first completion."""
    from coldstart.containers import docker_api, image, run
    from coldstart.pipeline.checkpoint import check_listen, hf_model_dir

    hf_model_dir(model)
    if pod is None:
        port = DEFAULT_PORT if port is None else port
        check_listen("127.0.0.1", port)
    c = docker_api.client(host)
    joined, port = _pod_and_port(c, pod, port)
    img = image.app_image(c, Path(__file__).resolve().parents[3], say=lambda m: typer.echo(m, err=True))
    t0 = time.monotonic()
    ctr = run.create_naive(c, img.tag, model, port, pod=joined)
    run.start(ctr)
    t1 = run.first_completion(port, str(Path(model).resolve()), t0 + 900, ctr)
    typer.echo(json.dumps({"container": ctr.id[:12], "url": f"http://127.0.0.1:{port}",
                           "first_token_s_from_create": round(t1 - t0, 2)}))


def bench_container(
    sizes: str = typer.Option("tiny,bench", help="models (made by `coldstart model make-tiny` sizes)"),
    reps: int = typer.Option(3, help="repetitions per cell"),
    naive_reps: Optional[int] = typer.Option(None, help="repetitions of the naive start (the first ones; "
                                             "default --reps): minutes each for the bench model"),
    caches: str = typer.Option("warm,cold", help="page-cache states: warm; cold (the whole page cache dropped "
                               "before each start); cold-snapshot (a node that runs containers: after one "
                               "unmeasured restore, only the snapshot's files evicted; restores only)"),
    layouts: str = typer.Option("hot", help="snapshot layouts (`coldstart checkpoint --layout`), each a case "
                                "per model (named e.g. bench-hot); a model's naive starts run once, with its first"),
    methods: str = typer.Option("naive,restore,restore+hostwarm,entry,entry+hostwarm",
                                help="naive | restore | restore+hostwarm | restore+load (a warm restore while "
                                "the host warmer reads a cold copy of the snapshot: the warming's own cost) | "
                                "entry, entry+hostwarm (the restore's container running only the entrypoint's "
                                "start, to ENTRY_READY: what a cold cache costs before the restore's code)"),
    work: Path = typer.Option(Path("/var/tmp/coldstart-bench-container"), help="where the snapshots are kept"),
    out: Path = typer.Option(Path("results/container"), help="results directory (raw.jsonl, table.md, COMMAND)"),
    keep_memory: bool = typer.Option(False, "--keep-memory", help=KEEP_MEMORY_HELP),
    network: str = typer.Option("bridge", help="bridge: each container its own network namespace on our bridge, "
                                "its port published (`docker run -p`); pod: each joins a pod's network namespace "
                                "made before the clock and before the page cache is dropped, as kubelet runs a "
                                "pod's containers (no network set up at their start)"),
    host: Optional[str] = typer.Option(None, "--host", help=HOST_HELP),
) -> None:
    """Container restore (with and without host warming overlapped with create) vs the naive container
    start, first token from the docker-py create call; the disk's bandwidth measured in the same run."""
    import shlex
    import sys

    from coldstart.bench import containers as cbench
    from coldstart.bench import host as hostwatch
    from coldstart.containers import docker_api, image
    from coldstart.fsutil import write_results

    say = lambda m: typer.echo(m, err=True)  # noqa: E731
    split = lambda v: [x.strip() for x in v.split(",") if x.strip()]  # noqa: E731
    for opt, given, known in (("--caches", caches, cbench.CACHES), ("--methods", methods, cbench.METHODS),
                              ("--layouts", layouts, cbench.LAYOUTS)):
        bad = [x for x in split(given) if x not in known]
        if bad or not split(given):
            raise typer.BadParameter(f"{', '.join(map(repr, bad)) or 'none given'}: choose from {', '.join(known)}",
                                     param_hint=opt)
    if network not in ("bridge", "pod"):
        raise typer.BadParameter(f"{network!r}: choose from bridge, pod", param_hint="--network")
    c = docker_api.client(host)
    img = image.app_image(c, Path(__file__).resolve().parents[3], say=say)
    cases = [(cbench.case_label(size, layout), *cbench.snapshot_in_container(c, img.tag, size, work, say, layout))
             for size in split(sizes) for layout in split(layouts)]
    with hostwatch.kept_if(keep_memory, say=say):
        rows = cbench.run_bench(c, img.tag, cases, reps=reps, caches=tuple(split(caches)), say=say,
                                naive_reps=naive_reps, methods=tuple(split(methods)), network=network)
    host_line = hostwatch.line(f"docker {docker_api.daemon_facts(c).version}", f"image {img.tag}",
                               f"network {network}")
    command = "coldstart bench container " + " ".join(shlex.quote(a) for a in sys.argv[3:])
    table = cbench.render(rows, host_line, command)
    write_results(out, rows, table, command)
    typer.echo(table)


def register(app: typer.Typer, bench: typer.Typer) -> None:
    app.add_typer(container_app, name="container")
    bench.command("container")(bench_container)
