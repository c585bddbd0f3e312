"""Smoke test of the `coldstart bench load` harness on the tiny model: one repetition, real loaders,
real fio, real page-cache eviction (posix_fadvise on the test's own files, so the suite's other tests
keep their cache). Asserts the structure and honesty of the outputs, never a speed."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from coldstart.errors import ColdstartError
from coldstart.bench import weights as bench

REQUIRED = {"schema", "run_id", "rep", "order", "method", "config", "params", "cache", "evict", "resident_before",
            "bytes", "seconds", "gib_s", "dest", "bit_exact", "loadavg1", "files", "host"}


@pytest.fixture(scope="module")
def bench_run(tiny_model_dir: Path, tmp_path_factory) -> Path:
    """One run through the CLI entry point (the function the weights CLI registers as `bench load`)."""
    base = tmp_path_factory.mktemp("bench-load")
    # our own copy: other tests may map the shared model, and mapped pages cannot be evicted
    model = base / "model"
    shutil.copytree(tiny_model_dir, model)
    app = typer.Typer()
    app.command()(bench.bench_load_command)
    app.command("noop")(lambda: None)  # two commands: typer keeps the sub-command name
    out = base / "results" / "bench-load"
    r = CliRunner().invoke(app, ["bench-load-command", "--reps", "1", "--quick", "--evict", "fadvise",
                                 "--model-dir", str(model), "--out", str(out),
                                 "--work-dir", str(base / "work")])
    assert r.exit_code == 0, (r.output, r.exception)
    return out


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "raw.jsonl").read_text().splitlines()]


def test_outputs_exist_and_no_staging_left(bench_run: Path) -> None:
    for name in ("raw.jsonl", "table.md", "COMMAND", "host.json"):
        assert (bench_run / name).is_file() and (bench_run / name).stat().st_size > 0, name
    assert (bench_run / "COMMAND").read_text().startswith("coldstart bench load")
    assert not [p for p in bench_run.parent.iterdir() if p.name.startswith(".")], "staging dir left behind"


def test_raw_lines_have_the_schema_and_cover_every_method(bench_run: Path) -> None:
    recs = _records(bench_run)
    assert recs
    for r in recs:
        assert REQUIRED <= set(r), REQUIRED - set(r)
        assert r["cache"] in ("cold", "warm")
        assert r["bytes"] > 0 and r["seconds"] > 0 and r["gib_s"] > 0
    methods = {(r["method"], r["cache"]) for r in recs}
    for need in [("limit-fio", "cold"), ("limit-mem", "warm"), ("coldstart", "cold"), ("coldstart", "warm"),
                 ("safetensors", "cold"), ("safetensors", "warm")]:
        assert need in methods, need
    # one repetition: every cell exactly once
    keys = [(r["method"], r["config"], r["cache"]) for r in recs]
    assert len(keys) == len(set(keys))


def test_every_loader_was_bit_exact_and_cache_states_are_real(bench_run: Path) -> None:
    recs = _records(bench_run)
    for r in recs:
        if r["method"].startswith("limit"):
            assert r["bit_exact"] is None
        else:
            assert r["bit_exact"] is True, r
        if r["cache"] == "cold":
            assert r["resident_before"] < 0.05, r
        else:
            assert r["resident_before"] > 0.95, r
    loaders = {r["method"] for r in recs if not r["method"].startswith("limit")}
    # loaders move the same tensor bytes
    assert len({r["bytes"] for r in recs if r["method"] in loaders}) == 1


def test_table_has_ratios_and_acceptance(bench_run: Path) -> None:
    md = (bench_run / "table.md").read_text()
    assert "| method | config | cold GiB/s |" in md
    assert "## Acceptance" in md and "vs limit" in md and "vs safetensors" in md
    assert "unverified on GPU" in md
    for line in md.splitlines():
        if line.startswith("| coldstart | default |"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            float(cells[4])  # cold x limit
            float(cells[5])  # cold x safetensors
            break
    else:
        pytest.fail("no coldstart default row")


def test_bad_method_is_one_clear_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = bench.BenchConfig(model_dir=tiny_model_dir, reps=1, out=tmp_path / "o", methods=("coldstart", "nope"))
    with pytest.raises(ColdstartError, match="unknown method"):
        bench.run_bench(cfg)
    assert not (tmp_path / "o").exists()


def test_mincore_sees_eviction_and_warming(tmp_path: Path) -> None:
    f = tmp_path / "blob"
    f.write_bytes(b"x" * (8 << 20))
    bench.warm([f])
    assert bench.resident_fraction([f]) > 0.95
    bench.evict([f], "fadvise")
    assert bench.resident_fraction([f]) < 0.05
