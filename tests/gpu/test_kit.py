"""The GPU kit's CPU-side parts (run everywhere): refusals, argument checks, the result files."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from coldstart.bench import gpu_check as kit

REPO = Path(__file__).resolve().parents[2]


def _gpu_here() -> bool:
    return not kit.gpu_absent_reason()


def test_refuses_without_a_gpu_in_one_line(tmp_path):
    if _gpu_here():
        pytest.skip("a GPU is present: the refusal cannot be seen here")
    p = subprocess.run([str(REPO / "scripts" / "gpu-check"), str(tmp_path / "out")], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode != 0
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-check: no NVIDIA GPU"), p.stderr
    assert not (tmp_path / "out").exists(), "a refused run must leave no result directory"


def test_refuses_a_used_outdir(tmp_path):
    (tmp_path / "old.txt").write_text("x")
    p = subprocess.run([str(REPO / "scripts" / "gpu-check"), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "not an empty directory" in p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["old.txt"]


def test_needs_an_outdir_and_explains_itself():
    p = subprocess.run([str(REPO / "scripts" / "gpu-check")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "outdir" in p.stderr
    h = subprocess.run([str(REPO / "scripts" / "gpu-check"), "--help"], capture_output=True, text=True, timeout=120)
    assert h.returncode == 0 and "results.jsonl" in h.stdout and "--budget-s" in h.stdout


def test_cuda_checkpoint_command_without_a_driver():
    env = {"PYTHONPATH": str(REPO / "toolkit"), "PATH": "/usr/bin:/bin"}
    h = subprocess.run([sys.executable, "-m", "coldstart.engine.cuda_checkpoint", "-h"], capture_output=True, text=True, env=env)
    assert h.returncode == 0 and "--action" in h.stdout and "--get-restore-tid" in h.stdout
    if _gpu_here():
        return
    p = subprocess.run([sys.executable, "-m", "coldstart.engine.cuda_checkpoint", "--get-state", "--pid", "1"],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 1 and "libcuda.so.1 cannot be loaded" in p.stderr


SAMPLE = [
    {"bench": "tests", "rc": 1, "passed": 9, "failed": 1, "errors": 0, "skipped": 0, "failures": ["t::x"]},
    {"bench": "loader", "case": "h2d_pinned", "cache": "-", "rep": 0, "h2d_gib_s": 50.0, "bytes": 4 << 30,
     "tensors": 10, "threads": 8},
    *[{"bench": "loader", "case": c, "cache": k, "rep": r, "gib_s": v, "bytes": 4 << 30}
      for r in range(3) for (c, k, v) in [("read_buffered", "cold", 3.0), ("read_direct", "cold", 4.0),
                                          ("read_buffered", "warm", 20.0), ("coldstart", "cold", 3.8),
                                          ("coldstart", "warm", 19.0), ("safetensors", "cold", 1.5),
                                          ("safetensors", "warm", 5.0), ("coldstart_coord", "cold", 3.6),
                                          ("coldstart_coord", "warm", 18.0)]],
    {"bench": "loader", "case": "coldstart_verify", "cache": "cold", "rep": 0, "error": "Boom: x"},
    {"bench": "cuda_checkpoint", "gib": 1.0, "rep": 0, "lock_s": 0.01, "checkpoint_s": 0.5, "restore_s": 0.4,
     "unlock_s": 0.01, "checkpoint_gib_s": 2.0, "restore_gib_s": 2.5, "released_gib": 1.0, "verified": True},
    {"bench": "cuda_checkpoint", "gib": 16.0, "error": "CudaError: out of memory"},
    {"bench": "criu_cuda", "mode": "driver", "gib": 1.0, "lock_s": 0.1, "checkpoint_s": 0.4, "dump_s": 2.0,
     "restore_s": 1.0, "cuda_restore_s": 0.3, "unlock_s": 0.01, "same_pid": True, "verified": True},
    {"bench": "criu_cuda", "mode": "plugin", "error": "ColdstartError: criu dump failed: x"},
    {"bench": "criu_cuda", "mode": "hot", "gib": 1.0, "host_gib": 1.0, "lock_s": 0.1, "checkpoint_s": 0.4,
     "dump_s": 2.0, "pages_bytes": 3 << 30, "record_s": 1.5, "split_s": 0.5, "child_bytes": 1 << 30,
     "parent_bytes": 3 << 30, "restore_s": 0.2, "cuda_restore_s": 0.9, "unlock_s": 0.01, "to_verified_s": 1.4,
     "pages_read_bytes": 1 << 30, "same_pid": True, "verified": True, "verified_full": True},
    {"bench": "stage", "stage": "criu", "error": "skipped: time budget spent"},
]


def test_table_shows_limits_ratios_targets_and_failures():
    t = kit.render_table(SAMPLE, {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580"}, "scripts/gpu-check out")
    assert "`scripts/gpu-check out`" in t and "NVIDIA H100 80GB HBM3" in t
    assert "9 passed, 1 failed" in t and "FAILED t::x" in t
    assert "| limit = min(H2D, best file read) | 4.0 | 20.0 |" in t  # cold: best of buffered/direct
    assert "| coldstart / limit | 0.95x | 0.95x | >= 0.9x |" in t
    assert "| coldstart / safetensors | 2.53x | 3.80x | >= 2x cold |" in t
    assert "| coldstart, one coordinator issuing the copies / limit, paired | 0.90x (0.90, 0.90, 0.90) | " \
           "0.90x (0.90, 0.90, 0.90) | |" in t
    assert "1 errors: Boom: x" in t
    assert "| 1 | 0.01 | 0.5 | 0.4 | 0.01 | 2.0 | 2.5 | 1.0 | yes (1/1) |" in t
    assert "| 16 | error: CudaError: out of memory" in t
    assert "| driver | 1.0 / 0 | 0.5 | 2.0 | 1.0 | 0.31 |  |  | True | True / - |" in t
    assert "| hot | 1.0 / 1.0 | 0.5 | 2.0 | 0.2 | 0.91 | 1.4 | 1.00 of 3.00 GiB | True | True / yes |" in t
    assert "1.0 GiB: 1.00 GiB of 3.00 GiB of pages touched by the recording restore (1.5 s)" in t
    assert "| plugin |  | error: ColdstartError" in t
    assert "- criu: skipped: time budget spent" in t


def test_table_of_a_run_that_did_nothing_says_so():
    t = kit.render_table([], {}, "scripts/gpu-check o")
    assert t.count("not run") == 4


def test_results_folder_name():
    assert kit.gpu_slug({"gpu": "NVIDIA H100 80GB HBM3"}) == "h100-80gb-hbm3"
    assert kit.gpu_slug({"gpu": "NVIDIA H200"}) == "h200"
    assert kit.gpu_slug({}) == "gpu"


def test_run_writes_jsonl_and_table_as_it_goes(tmp_path):
    run = kit.Run(tmp_path, "scripts/gpu-check x")
    run.stage("loader", lambda: [SAMPLE[1]], budget_end=run.t0 + 60)
    run.stage("checkpoint", lambda: (_ for _ in ()).throw(RuntimeError("no device")), budget_end=run.t0 + 60)
    run.stage("criu", lambda: [], budget_end=run.t0 - 1)
    rows = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert rows[0]["case"] == "h2d_pinned"
    assert rows[1] == {"bench": "stage", "stage": "checkpoint", "error": "RuntimeError: no device"}
    assert rows[2]["error"] == "skipped: time budget spent"
    table = (tmp_path / "table.md").read_text()
    assert "pinned host-to-device copy: **50.0 GiB/s**" in table and "checkpoint: RuntimeError" in table
    assert "== checkpoint" in (tmp_path / "log").read_text()


def test_paired_ratio_compares_within_a_repetition():
    ld = [{"case": "read_buffered", "cache": "warm", "rep": 0, "gib_s": 30.0},
          {"case": "coldstart", "cache": "warm", "rep": 0, "gib_s": 27.0},
          {"case": "read_buffered", "cache": "warm", "rep": 1, "gib_s": 15.0},
          {"case": "coldstart", "cache": "warm", "rep": 1, "gib_s": 16.5},
          {"case": "read_buffered_t16", "cache": "warm", "rep": 2, "gib_s": 20.0},
          {"case": "coldstart", "cache": "warm", "rep": 2, "gib_s": 10.0}]
    assert kit.paired(ld, "warm", 50.0) == "0.90x (0.90, 1.10, 0.50)"
    assert kit.paired(ld, "warm", 12.0) == "1.38x (2.25, 1.38, 0.83)"  # H2D caps the limit
    assert kit.paired(ld, "cold", 50.0) == "-"


def test_retable_rerenders_from_the_raw_records(tmp_path):
    (tmp_path / "results.jsonl").write_text("\n".join(json.dumps(r) for r in SAMPLE) + "\n")
    (tmp_path / "facts.json").write_text(json.dumps({"gpu": "NVIDIA H100 80GB HBM3"}))
    (tmp_path / "COMMAND").write_text("scripts/gpu-check out\n")
    p = subprocess.run([str(REPO / "scripts" / "gpu-check"), str(tmp_path), "--retable"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "table.md").read_text() == kit.render_table(SAMPLE, {"gpu": "NVIDIA H100 80GB HBM3"},
                                                                     "scripts/gpu-check out")
    bad = subprocess.run([str(REPO / "scripts" / "gpu-check"), str(tmp_path / "nope"), "--retable"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "not a kit output directory" in bad.stderr


def test_a_cold_cell_that_found_its_file_cached_is_left_out_and_named():
    rows = [{"bench": "loader_cpu", "case": c, "cache": "cold", "rep": r, "gib_s": v, "resident_before": res,
             "bytes": 4 << 30, "tensors": 2}
            for (c, r, v, res) in [("read_buffered", 0, 2.0, 0.0), ("coldstart", 0, 2.0, 0.0), ("safetensors", 0, 1.0, 0.0),
                                   ("read_buffered", 1, 2.0, 0.0), ("coldstart", 1, 2.0, 0.0), ("safetensors", 1, 20.0, 1.0)]]
    t = kit.render_table(rows, {"gpu": "x"}, "scripts/gpu-check out")
    assert "## Loader into host memory" in t and "| safetensors | 1.0 | - |" in t
    assert "| coldstart / safetensors | 2.00x |" in t
    assert "Left out, cold cells that found their file in the page cache (not a cold read): safetensors rep 1 (1.0)." in t
