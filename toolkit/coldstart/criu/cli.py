"""`coldstart criu ...` and `coldstart bench criu`: thin typer wrappers over dump/restore/bench."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

sub = typer.Typer(help="CRIU: which binary, dump, restore (stock copy or mmap restore).", no_args_is_help=True)


@sub.command("check")
def check_command(
    variant: str = typer.Option("patched", help="patched (mmap restore) or stock"),
) -> None:
    """Which criu is used, its version, whether it has --mmap-pages, and `criu check`."""
    import subprocess

    from coldstart.criu.locate import build_info, criu_supports_mmap, criu_version, find_criu
    from coldstart.errors import ColdstartError

    criu = find_criu(variant)
    info = build_info(criu)
    typer.echo(f"criu:        {criu}")
    typer.echo(f"variant:     {info.get('variant', variant)}")
    typer.echo(f"version:     {criu_version(criu)}")
    typer.echo(f"mmap-pages:  {'yes' if criu_supports_mmap(criu) else 'no'}")
    if info.get("patch"):
        typer.echo(f"patches:     {info['patch']}")
    r = subprocess.run([str(criu), "check"], capture_output=True, text=True)
    # the verdict ("Looks good.") is on stdout; warnings (e.g. a stale kerndat cache) on stderr
    out = r.stdout.strip() or r.stderr.strip()
    typer.echo(f"criu check:  {out.splitlines()[-1] if out else '(no output)'}")
    if r.returncode != 0:
        err = [x for x in (r.stdout + r.stderr).splitlines() if "Error" in x] or (r.stdout + r.stderr).splitlines()
        raise ColdstartError(f"`{criu} check` failed: {err[-1] if err else r.returncode}")


@sub.command("dump")
def dump_command(
    pid: int = typer.Argument(..., help="root of the process tree"),
    images_dir: Path = typer.Argument(..., help="new directory for the images (must not exist)"),
    leave_running: bool = typer.Option(False, help="keep the tree running after the dump"),
    variant: str = typer.Option("patched", help="criu build to use"),
) -> None:
    """Checkpoint a process tree with the flag set vLLM needs (atomic: staging dir + rename)."""
    from coldstart.criu.dump import DumpOptions, dump

    r = dump(pid, images_dir, DumpOptions(variant=variant, leave_running=leave_running))
    typer.echo(f"dumped pid {r.pid} ({r.n_processes} processes) in {r.seconds:.2f} s: "
               f"{r.pages_bytes / 2**30:.2f} GiB of pages -> {r.images_dir}")


@sub.command("restore")
def restore_command(
    images_dir: Path = typer.Argument(..., help="CRIU image directory"),
    mmap_pages: Optional[bool] = typer.Option(None, "--mmap-pages/--no-mmap-pages",
                                              help="map pages-*.img instead of copying (default: if criu supports it)"),
    mmap_min_kb: int = typer.Option(0, help="with --mmap-pages: copy runs smaller than this (0 = criu's default)"),
    pidns: bool = typer.Option(False, "--pidns/--no-pidns", help="restore into a fresh PID namespace"),
    variant: str = typer.Option("patched", help="criu build to use"),
    work_dir: Optional[Path] = typer.Option(None, help="where restore.log and the pidfile go"),
) -> None:
    """Restore a tree; prints the restored root pid (as the host sees it) and the time taken."""
    from coldstart.criu.locate import criu_supports_mmap, find_criu
    from coldstart.criu.restore import RestoreOptions, restore

    if mmap_pages is None:
        mmap_pages = criu_supports_mmap(find_criu(variant))
    r = restore(images_dir, RestoreOptions(variant=variant, mmap_pages=mmap_min_kb if mmap_pages else None,
                                           pidns=pidns, work_dir=work_dir))
    how = (f"mmap, runs >= {mmap_min_kb} KiB" if mmap_min_kb else "mmap, criu's default minimum run") if mmap_pages else "copy"
    ns = f", pid {r.ns_pid} in its namespace" if r.pidns else ""
    typer.echo(f"restored pid {r.pid}{ns} in {r.seconds:.3f} s ({how}); log: {r.log_path}")


def bench_criu_command(
    sizes: str = typer.Option("1,4", help="image sizes in GiB, comma separated"),
    runs: int = typer.Option(5, help="runs per cell (medians are reported; the issue asks >= 5)"),
    modes: str = typer.Option("cold,warm,warm-vmtouch", help="page-cache states"),
    out: Path = typer.Option(Path("results/bench-criu"), help="raw.jsonl, table.md and COMMAND go here"),
    work: Path = typer.Option(Path("/var/tmp/coldstart-bench-criu"), help="scratch dir for the images"),
    min_kb: int = typer.Option(0, help="--mmap-pages minimum run in KiB (0 = criu's default)"),
) -> None:
    """Stock vs mmap restore: time to running, and restore + read every page (interleaved runs)."""
    import sys

    from coldstart.bench.criu import BenchConfig, run_bench

    cfg = BenchConfig(sizes_gib=[float(x) for x in sizes.split(",") if x], runs=runs,
                      modes=[m for m in modes.split(",") if m], out_dir=out, work_dir=work, mmap_min_kb=min_kb,
                      command=" ".join(["coldstart", "bench", "criu", *sys.argv[3:]]))
    run_bench(cfg, say=typer.echo)


def register(app: typer.Typer, bench: typer.Typer) -> None:
    app.add_typer(sub, name="criu")
    bench.command("criu")(bench_criu_command)
