"""`coldstart weights dump|load|verify` (and `coldstart bench load`, from bench/weights.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from coldstart.errors import ColdstartError


def _progress_bar(description: str):
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    # on stderr: stdout stays clean for --json and scripts
    return Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(binary_units=True),
                    TransferSpeedColumn(), TimeRemainingColumn(), transient=True, console=Console(stderr=True))


def dump_command(
    src: Path = typer.Argument(..., help="a directory of *.safetensors files (a Hugging Face model dir)"),
    out: Path = typer.Argument(..., help="output directory (weights.flat + weights.index.json)"),
    alignment: int = typer.Option(4096, "--alignment", help="tensor offset alignment in bytes (power of two)"),
    chunk_mb: int = typer.Option(16, "--chunk-mb", help="digest chunk size in MiB"),
    digest: str = typer.Option("xxh3_64", "--digest", help="xxh3_64 or blake3"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing dump at OUT"),
) -> None:
    """Dump a safetensors model to the flat format (atomic: OUT appears only when complete)."""
    from coldstart.weights.dump import dump_safetensors

    with _progress_bar("dump") as prog:
        task = prog.add_task(f"dumping {src.name}", total=None)

        def cb(done: int, total: int) -> None:
            prog.update(task, completed=done, total=total or None)

        index = dump_safetensors(src, out, alignment=alignment, chunk_bytes=chunk_mb << 20, digest_algo=digest,
                                 overwrite=overwrite, progress=cb)
    typer.echo(f"dumped {len(index.tensors)} tensors, {index.total_bytes / 2**30:.3f} GiB -> {out}")


def load_command(
    flat: Path = typer.Argument(..., help="a dump directory or its weights.flat"),
    threads: Optional[int] = typer.Option(None, "--threads", help="reader threads (0: one per CPU, at most 16); "
                                          "default: one per CPU through the page cache, 8 with O_DIRECT"),
    chunk_mb: int = typer.Option(16, "--chunk-mb", help="largest piece in MiB"),
    read_kb: Optional[int] = typer.Option(None, "--read-kb", help="largest blocking read of uncached data in KiB "
                                          "(0: whole pieces); default: whole pieces through the page cache, 1024 with O_DIRECT"),
    layout: str = typer.Option("ranges", "--layout", help="ranges (one contiguous run per reader) | shared (one queue)"),
    fadvise: str = typer.Option("sequential", "--fadvise", help="hint on each reader's fd: sequential | none"),
    buffers: int = typer.Option(0, "--buffers", help="host buffers (staged mode; 0: one per reader thread + 2)"),
    verify: bool = typer.Option(False, "--verify", help="check every chunk digest while loading"),
    direct: Optional[bool] = typer.Option(
        None, "--direct/--buffered",
        help="O_DIRECT reads (bypass the page cache) or page-cache reads; default: O_DIRECT when under 10% of the file is cached"),
    mode: str = typer.Option("auto", "--mode", help="auto | direct (preadv into the tensors) | staged (via host buffers)"),
    device: str = typer.Option("cpu", "--device", help="where to allocate the destination tensors (cpu, cuda)"),
    json_out: bool = typer.Option(False, "--json", help="print the stats as JSON instead of a table"),
) -> None:
    """Allocate tensors like the dump's, load it into them, print the throughput."""
    import json

    from rich.console import Console
    from rich.table import Table

    from coldstart.weights.format import read_index
    from coldstart.weights.loader import alloc_like_index, load_into

    index = read_index(flat)
    dest = alloc_like_index(index, device=device)
    with _progress_bar("load") as prog:
        task = prog.add_task(f"loading {Path(index.data_file).name}", total=index.total_bytes)
        stats = load_into(index, dest, threads=threads, chunk_bytes=chunk_mb << 20, buffers=buffers, verify=verify,
                          direct=direct, mode=mode, layout=layout,
                          read_bytes=None if read_kb is None else read_kb << 10,
                          fadvise=None if fadvise == "none" else fadvise,
                          progress=lambda done, total: prog.update(task, completed=done))
    if json_out:
        typer.echo(json.dumps(stats.as_dict()))
        return
    tab = Table(title=f"coldstart weights load: {flat}")
    tab.add_column("")
    tab.add_column("value", justify="right")
    rows = [
        ("tensors", str(stats.tensors)), ("bytes", f"{stats.bytes / 2**30:.3f} GiB"),
        ("seconds", f"{stats.seconds:.3f}"), ("throughput", f"{stats.gib_per_s:.2f} GiB/s"),
        ("mode", stats.mode + (" + O_DIRECT" if stats.o_direct else "") + (" + verify" if stats.verify else "")),
        ("O_DIRECT choice", stats.direct_choice or "set by --direct/--buffered"),
        ("threads / chunk / buffers", f"{stats.threads} / {stats.chunk_bytes >> 20} MiB / {stats.buffers or '-'}"),
        ("layout / cold reads / hint", f"{stats.layout} / {stats.read_bytes >> 10 or '-'} KiB / {stats.fadvise or '-'}"),
        *((f"phase {k}", f"{v:.3f} s") for k, v in stats.phases.items()),
        ("read (thread-s)", f"{stats.read_s:.3f}"),
    ]
    if stats.mode == "staged":
        rows += [("copy (s)", f"{stats.copy_s:.3f}"), ("wait for reads (s)", f"{stats.wait_s:.3f}")]
    if stats.verify:
        rows.append(("verify (thread-s)", f"{stats.verify_s:.3f}"))
    for k, v in rows:
        tab.add_row(k, v)
    Console().print(tab)
    for n in stats.notes:
        typer.echo(f"note: {n}")


def verify_command(
    flat: Path = typer.Argument(..., help="a dump directory or its weights.flat"),
    threads: int = typer.Option(4, "--threads", help="hashing threads"),
) -> None:
    """Check every chunk digest of a dump; exit 1 naming the first bad tensors."""
    from coldstart.weights.format import read_index
    from coldstart.weights.loader import verify_flat

    read_index(flat)  # a missing or bad dump is one line, before the progress bar draws
    with _progress_bar("verify") as prog:
        task = prog.add_task("verifying", total=None)
        index, bad = verify_flat(flat, threads=threads,
                                 progress=lambda done, total: prog.update(task, completed=done, total=total))
    if bad:
        more = f" (and {len(bad) - 1} more corrupt tensors)" if len(bad) > 1 else ""
        raise ColdstartError(f"{bad[0]}{more}")
    left = f"; {len(index.absent)} left out ({index.absent_why})" if index.absent else ""
    typer.echo(f"ok: {len(index.tensors) - len(index.absent)} tensors, "
               f"{sum(e.nbytes for e in index.tensors if e.name not in index.absent) / 2**30:.3f} GiB, "
               f"{index.digest_algo} digests match{left}")


def probe_command(
    flat: Path = typer.Argument(..., help="a dump directory or its weights.flat, on the device to probe"),
    span_mb: int = typer.Option(128, "--span-mb", help="MiB of the file's head each probe read loads"),
    rounds: int = typer.Option(2, "--rounds", help="alternating (O_DIRECT, buffered) pairs"),
) -> None:
    """Measure whether the device holding FLAT reads cold files faster with O_DIRECT or through the
    page cache, and record it in the node dir: later cold loads into page-aligned memory (the
    engine's weight arena, CUDA staging buffers) read that way. A cold load of a file of 1 GiB or
    more probes an unprobed device by itself; this runs it ahead of time."""
    from coldstart.weights.format import read_index
    from coldstart.weights.readshape import probe_and_save, record_path

    index = read_index(flat)  # a missing or bad dump is one line, before the probe says anything
    typer.echo(f"probing cold reads of {flat}: {rounds} x 2 loads of {span_mb} MiB", err=True)
    rec = probe_and_save(index, span=span_mb << 20, rounds=rounds)
    typer.echo(f"{rec.why()} (each: {', '.join(map(str, rec.direct_gib_s))} / "
               f"{', '.join(map(str, rec.buffered_gib_s))}) -> {rec.way}; "
               f"recorded in {record_path(rec.probed_file)}")


def tune_queue_command(
    path: Path = typer.Argument(..., help="a large file (256 MiB or more) on the device to tune, e.g. a snapshot's weights.flat"),
    apply: bool = typer.Option(False, "--apply", help="set the chosen max_sectors_kb (until reboot); without it, only measure"),
    rounds: int = typer.Option(3, "--rounds", help="rounds; each tries every value once, in a rotated order"),
    span_mb: int = typer.Option(512, "--span-mb", help="MiB of the file's head each read populates"),
) -> None:
    """Measure how fast the device holding PATH fills the page cache under each largest request size
    (its queue's max_sectors_kb: the current value, 1024, 512, 256) and choose; with --apply, set it.
    Some virtual disks serve the kernel's large readahead requests slower (docs/weights.md). A node
    setting: run as root on the node; the probe puts the queue back as it found it."""
    from coldstart.weights import queue

    q = queue.queue_dir(path)
    typer.echo(f"probing {q.parent.name}: cold populates of {span_mb} MiB of {path}, {rounds} rounds", err=True)
    rec = queue.probe(path, span=span_mb << 20, rounds=rounds, say=lambda s: typer.echo(s, err=True))
    typer.echo(rec.why())
    if rec.choice_kb == rec.current_kb:
        typer.echo(f"keep max_sectors_kb {rec.current_kb}: no other value read {queue.MARGIN:.2f}x faster")
        return
    gain = rec.median(rec.choice_kb) / rec.median(rec.current_kb)
    if apply:
        queue.apply(q, rec.choice_kb)
        typer.echo(f"set max_sectors_kb {rec.current_kb} -> {rec.choice_kb} ({gain:.2f}x); until reboot, or with "
                   f"this udev rule: {queue.udev_rule(q, rec.choice_kb)}")
    else:
        typer.echo(f"max_sectors_kb {rec.choice_kb} reads {gain:.2f}x faster than {rec.current_kb}; "
                   "--apply sets it")


def register(app: typer.Typer, bench: typer.Typer) -> None:
    sub = typer.Typer(help="Flat weight format: dump, parallel load, verify; probe how a device reads cold files.",
                      no_args_is_help=True)
    sub.command("dump")(dump_command)
    sub.command("load")(load_command)
    sub.command("verify")(verify_command)
    sub.command("probe")(probe_command)
    sub.command("tune-queue")(tune_queue_command)
    app.add_typer(sub, name="weights")
    from coldstart.bench.weights import bench_load_command

    bench.command("load")(bench_load_command)
