"""`coldstart warm ...` and `coldstart bench warm`: thin typer wrappers over coldstart.warm."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from typer.core import TyperGroup


class _DefaultRunGroup(TyperGroup):
    """`coldstart warm DIR|FILES` means `coldstart warm run DIR|FILES` (status/evict are explicit)."""

    def parse_args(self, ctx, args):  # type: ignore[override]
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


warm_app = typer.Typer(cls=_DefaultRunGroup, no_args_is_help=True,
                       help="Pull a snapshot into the page cache (DIR|FILES...), or show/drop its residency.")


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


@warm_app.command("run")
def run(
    paths: list[Path] = typer.Argument(..., help="snapshot directory or files"),
    mode: str = typer.Option("native", help="native | vmtouch"),
    profile: Optional[Path] = typer.Option(None, help="access profile to follow (default: DIR/profile.json if present)"),
    threads: Optional[int] = typer.Option(None, help="reader threads (native) or vmtouch processes (default 8)"),
    method: str = typer.Option("sendfile", help="native only: sendfile | pread | populate | willneed"),
    chunk_mib: int = typer.Option(8, help="native: bytes per read; vmtouch: split size is 32x this"),
    evict_first: bool = typer.Option(False, "--evict", help="drop the files from the page cache first (benchmarks)"),
    as_json: bool = typer.Option(False, "--json", help="print the stats as JSON"),
) -> None:
    """Warm DIR|FILES into the page cache, with a progress bar of bytes resident."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn, TransferSpeedColumn

    from coldstart.errors import ColdstartError
    from coldstart.warm import default_profile, make_warmer
    from coldstart.warm.residency import evict, expand_paths, resident_bytes

    from coldstart.warm.native import METHODS

    for opt, value in (("--chunk-mib", chunk_mib), ("--threads", threads)):
        if value is not None and value < 1:
            raise ColdstartError(f"{opt} {value}: must be at least 1")
    if mode not in ("native", "vmtouch"):
        raise ColdstartError(f"--mode {mode!r}: choose native or vmtouch")
    if mode == "native" and method not in METHODS:
        raise ColdstartError(f"--method {method!r}: choose one of {', '.join(METHODS)}")
    files = expand_paths(paths)
    if not files:
        raise ColdstartError("nothing to warm: no files under " + " ".join(map(str, paths)))
    if profile is None and len(paths) == 1 and paths[0].is_dir():
        profile = default_profile(paths[0])
    if evict_first:
        for f in files:
            try:
                evict(f)
            except OSError:
                pass  # the warmer reports unreadable files
    kw: dict = {}
    if mode == "native":
        kw = {"method": method, "chunk": chunk_mib << 20}
    elif mode == "vmtouch":
        kw = {"split": 32 * (chunk_mib << 20)}
    import logging

    logging.getLogger("coldstart.warm").setLevel(logging.ERROR)  # the CLI prints the errors itself
    w = make_warmer(files, mode=mode, profile=profile, threads=threads, **kw)
    if not w.plan.files:
        raise ColdstartError("; ".join(w.stats.errors) or "nothing to warm")

    def resident() -> int:
        total = 0
        for f in w.plan.files:
            try:
                total += resident_bytes(f)[0]
            except OSError:
                pass
        return total

    size = sum(w.plan.files.values())
    with Progress(TextColumn(f"[bold]warm ({mode})"), BarColumn(), DownloadColumn(binary_units=True),
                  TransferSpeedColumn(), TimeElapsedColumn(), transient=as_json) as prog:
        task = prog.add_task("resident", total=size or 1, completed=resident())
        w.start()
        try:
            while not w.done:
                w.wait(0.1)
                prog.update(task, completed=resident())
        except KeyboardInterrupt:
            w.cancel()
            w.wait()
            raise
        prog.update(task, completed=resident())
    stats = w.wait()
    if as_json:
        print(json.dumps(stats.to_dict(), indent=1))
    else:
        print(f"warmed {_human(stats.bytes)} of {len(w.plan.files)} files in {stats.seconds:.2f} s "
              f"({stats.gib_s:.2f} GiB/s){', following ' + str(profile) if stats.profile_used else ''}")
    for e in stats.errors:
        print(f"warning: {e}")


@warm_app.command("status")
def status(paths: list[Path] = typer.Argument(..., help="snapshot directory or files")) -> None:
    """Page-cache residency per file (mincore)."""
    from rich.console import Console
    from rich.table import Table

    from coldstart.errors import ColdstartError
    from coldstart.warm.residency import expand_paths, resident_bytes

    files = expand_paths(paths)
    t = Table("resident", "size", "%")
    t.add_column("file", overflow="fold")  # full paths, wrapped rather than cut
    tot_r = tot_s = 0
    bad = []
    for f in files:
        try:
            r, s = resident_bytes(f)
        except OSError as e:
            bad.append(f"{f}: {e.strerror or e}")
            continue
        tot_r += r
        tot_s += s
        t.add_row(_human(r), _human(s), f"{100 * r / s:.1f}" if s else "-", str(f))
    t.add_row(_human(tot_r), _human(tot_s), f"{100 * tot_r / tot_s:.1f}" if tot_s else "-", "[bold]total")
    if len(bad) < len(files):  # (nothing readable: the error line alone, no empty table)
        Console().print(t)
    if bad:
        raise ColdstartError("; ".join(bad))


@warm_app.command("evict")
def evict_cmd(paths: list[Path] = typer.Argument(..., help="snapshot directory or files")) -> None:
    """Drop the files from the page cache (posix_fadvise DONTNEED after fsync)."""
    from coldstart.errors import ColdstartError
    from coldstart.warm.residency import evict, expand_paths

    bad = []
    for f in expand_paths(paths):
        try:
            evict(f)
        except OSError as e:
            bad.append(f"{f}: {e.strerror or e}")
    if bad:
        raise ColdstartError("; ".join(bad))


def bench_warm(
    files: Optional[list[Path]] = typer.Argument(None, help="files to warm (default: a generated weights-sized file)"),
    size_gib: float = typer.Option(1.5, help="size of the generated file when FILES is not given"),
    runs: int = typer.Option(5, help="rounds; every mode runs once per round, side by side"),
    out: Path = typer.Option(Path("results/warm"), help="results directory"),
    modes: str = typer.Option("vmtouch,native,native-willneed,native-1thread", help="comma-separated"),
) -> None:
    """Cold -> fully resident time per warming mode, device bytes read, device sequential bandwidth."""
    from coldstart.bench.warm import run_warm_bench

    run_warm_bench(files=files or None, size_gib=size_gib, runs=runs, out=out,
                   modes=[m.strip() for m in modes.split(",") if m.strip()], echo=print)


def bench_warm_restore(
    size: str = typer.Option("bench", help="model size (coldstart.models.tiny): bench ~1.3 GiB"),
    runs: int = typer.Option(5, help="rounds; every variant once per round, side by side"),
    out: Path = typer.Option(Path("results/warm"), help="results directory"),
    work: Path = typer.Option(Path("/var/tmp/coldstart-bench-warm"), help="scratch dir for the snapshot"),
    snapshot: Optional[Path] = typer.Option(None, help="use this snapshot instead of checkpointing one"),
    drop: str = typer.Option("global", help="cold = drop the whole page cache (global) or the snapshot's files"),
) -> None:
    """Restore -> first token per warming mode (none, vmtouch, native, native+profile,
    loader O_DIRECT), cold (page cache dropped) and warm, with device bytes read and bandwidth."""
    from coldstart.bench.warm import run_issue5_bench

    run_issue5_bench(size=size, runs=runs, out=out, work=work, snapshot=snapshot, drop=drop, echo=print)


def register(app: typer.Typer, bench: typer.Typer) -> None:
    app.add_typer(warm_app, name="warm")
    bench.command("warm")(bench_warm)
    bench.command("warm-restore")(bench_warm_restore)
