"""`coldstart bench lazy`, `mount` and `serve`: thin typer wrappers over coldstart.bench.lazy, .mount and .serve."""
from __future__ import annotations

import os
from pathlib import Path

import typer

from coldstart.bench.host import KEEP_MEMORY_HELP


def _snapshots(sizes: str, work: Path, say, layouts: str = "hot", packed: str = "auto") -> list[tuple[str, Path, Path]]:
    """(case label, model dir, snapshot dir) per model size, layout (`coldstart checkpoint --layout`)
    and packed-handle choice (auto, kept: --keep-packed, repack: --no-keep-packed), checkpointed under
    ``work`` on first use; the label is the size, with the layout unless dumped and the choice unless
    auto (e.g. bench-hot-repack)."""
    from coldstart.bench.containers import case_label, require_layout
    from coldstart.engine.launcher import free_port
    from coldstart.errors import ColdstartError
    from coldstart.models.tiny import cached_model
    from coldstart.pipeline.checkpoint import CheckpointOptions, checkpoint

    keeps = {"auto": None, "kept": True, "repack": False}
    choices = [x.strip() for x in packed.split(",") if x.strip()]
    bad = [c for c in choices if c not in keeps]
    if bad:  # before any checkpoint is made
        raise ColdstartError(f"--packed: {', '.join(map(repr, bad))} not one of {', '.join(keeps)}")
    cases = []
    for size in [s.strip() for s in sizes.split(",") if s.strip()]:
        for layout in [x.strip() for x in layouts.split(",") if x.strip()]:
            for choice in choices:
                label = case_label(size, layout) + ("" if choice == "auto" else f"-{choice}")
                model = cached_model(size)
                snap = work / "snapshots" / label
                if not (snap / "manifest.json").exists():
                    say(f"checkpointing {size} ({layout} layout, packed handles {choice}) -> {snap}")
                    checkpoint(CheckpointOptions(model=model, out=snap, port=free_port(), layout=layout,
                                                 keep_packed=keeps[choice]), say=say)
                require_layout(snap, layout)
                cases.append((label, model, snap))
    return cases


def bench_lazy(
    sizes: str = typer.Option("tiny,bench", help="models (made by `coldstart model make-tiny` sizes)"),
    rates: str = typer.Option("1,10", help="link rates in Gbit/s (tc tbf on a veth pair)"),
    reps: int = typer.Option(2, help="repetitions per cell"),
    methods: str = typer.Option("pull,lazy,lazy+prefetch,nydus,local",
                                help="pull | lazy | lazy+prefetch | nydus (skipped when scripts/setup-nydus has not "
                                     "built it) | local | lazy+prefetch-all (every chunk prefetched from the mount on) | "
                                     "lazy+prefetch-raw (the trees pushed with --compress none)"),
    work: Path = typer.Option(Path("/var/tmp/coldstart-bench-lazy"), help="snapshots, registry storage, node state"),
    out: Path = typer.Option(Path("results/lazy"), help="results directory (raw.jsonl, table.md, COMMAND)"),
    runtime: bool = typer.Option(False, "--runtime", help="the node lacks the runtime too: this venv is pushed "
                                 "(`push --runtime-of`), pulled by `pull` and mounted lazily by the lazy methods"),
    layouts: str = typer.Option("hot", help="snapshot layouts (`coldstart checkpoint --layout`: dumped, hot), "
                                "each a case per model (named e.g. bench-hot)"),
    packed: str = typer.Option("auto", help="the CPU checkpoint's packed GEMM handles (`coldstart checkpoint "
                               "--keep-packed`): auto (its default), kept, repack (--no-keep-packed), each a case "
                               "per model and layout (named e.g. bench-hot-repack)"),
    keep_memory: bool = typer.Option(False, "--keep-memory", help=KEEP_MEMORY_HELP),
    container: bool = typer.Option(False, "--container", help="every start is `coldstart container restore` "
                                   "(REF, the pulled dir or the local one) of a snapshot made in a container of "
                                   "the app image (our dockerd: scripts/start-docker); not with nydus or --runtime "
                                   "(the image carries the runtime)"),
) -> None:
    """Restore → first token on an emulated fresh node: full pull then restore, lazy mount without and
    with prefetch, beside a warm local restore; the registry in its own network namespace behind a
    shaped link, the node emptied before each start. With --container, the same through containers."""
    import shlex
    import sys

    from coldstart.bench import lazy
    from coldstart.fsutil import write_results
    from coldstart.bench import host as hostwatch
    from coldstart.warm.snapshot import node_profile

    say = lambda m: typer.echo(m, err=True)  # noqa: E731
    chosen = tuple(m for m in methods.split(",") if m)
    models = None
    if container:
        from coldstart.errors import ColdstartError

        if runtime or "nydus" in chosen or packed != "auto":
            raise ColdstartError("--container: not with nydus, --runtime or --packed (the image carries the runtime)")
        cases, models = lazy.container_cases(sizes, layouts, work / "containers", say)
    else:
        cases = [(size, snap) for size, _, snap in _snapshots(sizes, work, say, layouts, packed)]
        for size, snap in cases:
            if node_profile(snap) is None or not node_profile(snap).exists():
                say(f"restoring {size} once, to record its access profile (the push packs in that order)")
                lazy.record_profile(snap)
    if "nydus" in chosen:
        from coldstart.errors import ColdstartError
        from coldstart.registry import nydus

        try:
            nydus.binary("nydusd")
        except ColdstartError as e:
            say(f"skipping nydus: {e}")
            chosen = tuple(m for m in chosen if m != "nydus")
    with hostwatch.kept_if(keep_memory, say=say):
        rows = lazy.run_bench(cases, [float(r) for r in rates.split(",") if r], reps, work, say, methods=chosen,
                              runtime=Path(os.path.realpath(sys.prefix)) if runtime else None, models=models)
    host = hostwatch.line() + " Link: veth + tc tbf, no added latency (no netem in this kernel)."
    command = "coldstart bench lazy " + " ".join(shlex.quote(a) for a in sys.argv[3:])
    table = lazy.render(rows, host, command, container=container)
    write_results(out, rows, table, command)
    typer.echo(table)


def bench_mount(
    size_gib: float = typer.Option(2.0, help="size of the file read (GiB)"),
    reps: int = typer.Option(3, help="repetitions per state"),
    random_reads: int = typer.Option(4096, help="4 KiB random reads per random case"),
    work: Path = typer.Option(Path("/var/tmp/coldstart-bench-mount"), help="file, registry storage, chunk cache"),
    out: Path = typer.Option(Path("results/lazy-mount"), help="results directory (raw.jsonl, table.md, COMMAND)"),
    keep_memory: bool = typer.Option(False, "--keep-memory", help=KEEP_MEMORY_HELP),
) -> None:
    """Sequential and random read throughput of one large file through the lazy mount (uncached:
    fetched from a loopback registry; cached: from the node's chunk cache) against the local disk."""
    import shlex
    import sys

    from coldstart.bench import mount
    from coldstart.fsutil import write_results
    from coldstart.bench import host as hostwatch

    say = lambda m: typer.echo(m, err=True)  # noqa: E731
    with hostwatch.kept_if(keep_memory, say=say):
        rows = mount.run_bench(work, int(size_gib * 2**30), reps, random_reads, say)
    host = hostwatch.line()
    command = "coldstart bench mount " + " ".join(shlex.quote(a) for a in sys.argv[3:])
    table = mount.render(rows, host, command)
    write_results(out, rows, table, command)
    typer.echo(table)


def bench_serve(
    sizes: str = typer.Option("tiny,bench", help="models (made by `coldstart model make-tiny` sizes)"),
    concurrency: str = typer.Option("1,8", help="client concurrencies"),
    prompts: str = typer.Option("8,32", help="prompts per concurrency (same order)"),
    rounds: int = typer.Option(3, help="back-to-back (stock, restored) rounds per phase"),
    phases: str = typer.Option("restored,restored+cycle,restored+copy",
                               help="restored server phases to measure: restored (as restored), restored+cycle "
                                    "(after one more sleep/wake/reload), restored+copy (after a cycle that copies the "
                                    "weights into anonymous memory)"),
    input_len: int = typer.Option(64, help="random prompt length (tokens)"),
    output_len: int = typer.Option(128, help="output tokens per request (ignore-eos)"),
    work: Path = typer.Option(Path("/var/tmp/coldstart-bench-serve"), help="snapshots and raw benchmark output"),
    out: Path = typer.Option(Path("results/serve"), help="results directory (raw.jsonl, table.md, COMMAND)"),
) -> None:
    """Output tokens/s and time per output token of a restored server (and of the same server after
    one more sleep/wake cycle) against a stock cold-booted vLLM server, with vLLM's own serving
    benchmark."""
    import shlex
    import sys

    from coldstart.bench import serve
    from coldstart.fsutil import write_results
    from coldstart.bench import host as hostwatch
    from coldstart.pipeline import hostfacts

    say = lambda m: typer.echo(m, err=True)  # noqa: E731
    concs = [int(c) for c in concurrency.split(",") if c]
    counts = [int(n) for n in prompts.split(",") if n]
    if len(counts) != len(concs):
        raise typer.BadParameter("--prompts needs one count per --concurrency")
    chosen = tuple(p.strip() for p in phases.split(",") if p.strip())
    bad = set(chosen) - set(serve.SERVERS[1:])
    if bad or not chosen:
        raise typer.BadParameter(f"--phases: choose from {', '.join(serve.SERVERS[1:])}")
    cases = _snapshots(sizes, work, say)
    rows = serve.run_bench(cases, concs, dict(zip(concs, counts)), rounds, input_len, output_len, work / "raw", say,
                           phases=chosen)
    host = hostwatch.line(f"vLLM {hostfacts.collect().vllm}")
    command = "coldstart bench serve " + " ".join(shlex.quote(a) for a in sys.argv[3:])
    table = serve.render(rows, host, command, input_len, output_len)
    write_results(out, rows, table, command)
    typer.echo(table)


def register(app: typer.Typer, bench: typer.Typer) -> None:
    bench.command("lazy")(bench_lazy)
    bench.command("mount")(bench_mount)
    bench.command("serve")(bench_serve)
