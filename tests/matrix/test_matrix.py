"""The experiment matrix: spec parsing, the seeded interleaved plan, a real small run, the report.

The run uses cheap REAL cells (no vLLM): `cells probe` validates, warms and loads the tiny model's
flat dump with our loader (real timings), `--fail-first` first tries a truncated copy, which our loader
really refuses (a real FALLBACK), and a plain command with no timeline is timed from outside. The
page cache is really dropped before the cold cells (root). No timing thresholds: behaviour only.
"""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from coldstart.errors import ColdstartError
from coldstart.matrix.runner import plan, run_experiment
from coldstart.matrix.spec import load_experiment, parse_experiment
from coldstart.pipeline.events import PHASES

ROOT = Path(__file__).resolve().parents[2]
COLDSTART = Path(sys.executable).with_name("coldstart")


def _spec(flat: Path, model: Path) -> str:
    return f"""
[experiment]
name = "probe-test"
seed = 7
repetitions = 2
baseline = "plain"
caches = ["cold", "warm"]
models = ["m"]
[models.m]
path = "{model}"
[axes.warm]
native = ["--warm", "native"]
none = ["--warm", "none"]
[[variants]]
name = "plain"
kind = "command"
command = ["{{python}}", "-c", "open('{{model_dir}}/config.json').read()"]
caches = ["warm"]
[[variants]]
name = "probe-{{warm}}"
kind = "probe"
command = ["{{python}}", "-m", "coldstart.matrix.cells", "probe", "{flat}", "--timeline-out", "{{timeline}}"]
axes = {{ warm = "none" }}
warm_paths = ["{flat}"]
[[variants]]
name = "probe-fallback"
kind = "probe"
command = ["{{python}}", "-m", "coldstart.matrix.cells", "probe", "{flat}", "--timeline-out", "{{timeline}}",
           "--fail-first", "--warm", "native"]
caches = ["warm"]
warm_paths = ["{flat}"]
"""


def test_shipped_experiments_parse():
    d = load_experiment(ROOT / "experiments" / "default.toml")
    f = load_experiment(ROOT / "experiments" / "full.toml")
    assert d.baseline == "naive" and f.baseline == "naive"
    for exp in (d, f):
        names = [v.name for v in exp.variants]
        assert "naive" in names and len(names) == len(set(names))
        for v in exp.variants:
            assert any("{timeline}" in a for a in v.command), v.name
            assert not v.snapshot or v.snapshot in exp.snapshots
    # axes expand into named variants whose options come from the axis table
    v = {x.name: x for x in d.variants}["restore-l2-stock-warm-native"]
    assert v.axes == {"criu": "stock", "warming": "native"} and v.command[-3:] == ["--criu", "stock", "--warm"]
    assert len(f.models) == 2 and f.repetitions >= 5


@pytest.mark.parametrize("bad, message", [
    ({"experiment": {"name": "x"}}, "no [[variants]]"),
    ({"variants": [{"name": "a", "command": ["true"]}]}, "missing [experiment]"),
    ({"experiment": {"name": "x", "baseline": "zzz"}, "variants": [{"name": "a", "command": ["true"]}]},
     "baseline 'zzz'"),
    ({"experiment": {"name": "x"}, "variants": [{"name": "a", "command": ["true"]}] * 2}, "duplicate variant"),
    ({"experiment": {"name": "x"}, "axes": {"c": {"a": []}},
      "variants": [{"name": "v-{c}", "command": ["true"], "axes": {"c": "b"}}]}, "has no value 'b'"),
    ({"experiment": {"name": "x"}, "variants": [{"name": "v", "command": ["true"], "axes": {"q": "b"}}]},
     "unknown axis 'q'"),
    ({"experiment": {"name": "x", "caches": ["tepid"]}, "variants": [{"name": "a", "command": ["true"]}]},
     "cache state 'tepid'"),
    ({"experiment": {"name": "x"}, "variants": [{"name": "a", "command": ["true"], "snapshot": "s"}]},
     "unknown snapshot 's'"),
])
def test_bad_specs_name_the_problem(bad, message):
    with pytest.raises(ColdstartError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_experiment(bad)


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(ColdstartError, match="not found"):
        load_experiment(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[experiment\nname=")
    with pytest.raises(ColdstartError, match="not valid TOML"):
        load_experiment(bad)


def test_plan_is_seeded_and_interleaved():
    exp = load_experiment(ROOT / "experiments" / "default.toml")
    a, b = plan(exp), plan(exp)
    key = lambda p: [(r, v.name, c) for r, _, _, v, c in p.runs]  # noqa: E731
    assert key(a) == key(b)  # same seed, same order
    cells = {(v.name, c) for _, v, c in exp.cells()}
    for rnd in range(exp.repetitions):  # every round runs every cell exactly once
        assert sorted((v.name, c) for r, _, _, v, c in a.runs if r == rnd) == sorted(cells)
    rounds = [[(v.name, c) for r, _, _, v, c in a.runs if r == rnd] for rnd in range(exp.repetitions)]
    assert len({tuple(x) for x in rounds}) > 1  # shuffled per round, not one fixed order
    exp.seed += 1
    assert key(plan(exp)) != key(a)


@pytest.fixture(scope="module")
def probe_results(tmp_path_factory, tiny_flat, tiny_model_dir):
    d = tmp_path_factory.mktemp("matrix-run")
    spec = d / "probe.toml"
    spec.write_text(_spec(tiny_flat, tiny_model_dir))
    out = d / "results"
    r = subprocess.run([str(COLDSTART), "matrix", "run", str(spec), "--out", str(out)], capture_output=True,
                       text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    return spec, out


def _records(out: Path):
    return [json.loads(line) for line in (out / "raw.jsonl").read_text().splitlines() if line.strip()]


def test_run_records_every_event_with_host_facts(probe_results):
    _, out = probe_results
    recs = _records(out)
    exp = [r for r in recs if r["record"] == "experiment"]
    runs = [r for r in recs if r["record"] == "run"]
    events = [r for r in recs if r["record"] == "event"]
    assert len(exp) == 1 and exp[0]["seed"] == 7
    # 2 reps x (plain warm + probe-none cold/warm + probe-fallback warm)
    assert Counter((r["variant"], r["cache"]) for r in runs) == {
        ("plain", "warm"): 2, ("probe-none", "cold"): 2, ("probe-none", "warm"): 2, ("probe-fallback", "warm"): 2}
    for r in runs:
        assert r["ok"], r
        host = r["host"]
        assert host["cpu"] and host["kernel"] and host["memory_bytes"] > 0 and host["cores"] >= 1
        assert "gpus" in host and host["disks"]
        assert "page_reporting" in host and host["memory_kept"] is False  # no --keep-memory given
        evs = [e for e in events if e["run"] == r["run"]]
        assert evs and evs[0]["name"] == "CONTAINER_START"
        assert [e["t"] for e in evs if e["name"] == "READY"] == [r["total_seconds"]]
    # the probe's real phases are recorded
    probe = [r for r in runs if r["variant"] == "probe-none"]
    assert all({"manifest", "weights_load"} <= set(r["phases"]) for r in probe)
    loaded = [e for e in events if e["name"] == "WEIGHTS_LOADED"]
    assert loaded and all(e["attrs"]["bytes"] > 0 for e in loaded)
    # the real failure before the good load is a FALLBACK with the loader's reason
    fb = [r for r in runs if r["variant"] == "probe-fallback"]
    assert all(r["outcome"] == "fallback" for r in fb)
    reasons = [e["attrs"]["reason"] for e in events if e["name"] == "FALLBACK"]
    assert len(reasons) == 2 and all(x.startswith("weights load failed") for x in reasons)
    # the plain command wrote no timeline: it was timed from outside
    plain = [e for e in events if e["variant"] == "plain" and e["name"] == "READY"]
    assert plain and all(e["attrs"].get("measured") == "externally" for e in plain)
    # interleaved: round 1 finishes every cell before round 2 starts
    rounds = [r["round"] for r in runs]
    assert rounds == sorted(rounds)


def test_summary_table_and_plots(probe_results):
    _, out = probe_results
    rows = list(csv.DictReader(open(out / "summary.csv")))
    tot = {(r["variant"], r["cache"]): r for r in rows if r["metric"] == "total"}
    assert set(tot) == {("plain", "warm"), ("probe-none", "cold"), ("probe-none", "warm"), ("probe-fallback", "warm")}
    for r in tot.values():
        assert r["n"] == "2"
        assert float(r["p10_s"]) <= float(r["median_s"]) <= float(r["p90_s"])
    assert float(tot[("plain", "warm")]["ratio_to_baseline"]) == 1.0
    assert tot[("probe-none", "warm")]["ratio_to_baseline"]  # has a baseline in the same cache state
    assert tot[("probe-none", "cold")]["ratio_to_baseline"] == ""  # the baseline ran warm only
    assert {r["metric"] for r in rows} <= {"total", *PHASES}
    md = (out / "summary.md").read_text()
    assert "| plain | warm |" in md and "CPU-measured" in md and "Command: `coldstart matrix run" in md
    assert "page reporting" in md  # on, off, or none on this kernel: the line says which
    assert (out / "COMMAND").read_text().startswith("coldstart matrix run")
    for png in ("phases.png", "distributions.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_rerenders_from_raw_alone(probe_results):
    _, out = probe_results
    before = (out / "summary.csv").read_text()
    for f in ("summary.csv", "summary.md", "phases.png", "distributions.png"):
        (out / f).unlink()
    r = subprocess.run([str(COLDSTART), "matrix", "report", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert (out / "summary.csv").read_text() == before
    assert (out / "phases.png").exists() and (out / "distributions.png").exists()


def test_existing_results_are_not_overwritten(probe_results):
    spec, out = probe_results
    r = subprocess.run([str(COLDSTART), "matrix", "run", str(spec), "--out", str(out)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and "exists" in r.stderr and "--force" in r.stderr
    assert r.stderr.count("\n") <= 2  # one line, no traceback


def test_report_errors_are_one_line(tmp_path):
    (tmp_path / "raw.jsonl").write_text('{"record": "experiment"}\nnot json\n')
    r = subprocess.run([str(COLDSTART), "matrix", "report", str(tmp_path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and "corrupt line" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([str(COLDSTART), "matrix", "report", str(tmp_path / "none")], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and "no raw.jsonl" in r.stderr


def test_failing_cell_is_recorded_not_fatal(tmp_path, tiny_model_dir):
    spec = parse_experiment({
        "experiment": {"name": "f", "repetitions": 1, "caches": ["asis"], "models": ["m"]},
        "models": {"m": {"path": str(tiny_model_dir)}},
        "variants": [{"name": "boom", "command": ["{python}", "-c", "import sys; sys.exit('broken cell')"]},
                     {"name": "fine", "command": ["{python}", "-c", "pass"]}],
    })
    raw = run_experiment(spec, tmp_path / "r", say=lambda s: None)
    runs = {r["variant"]: r for r in map(json.loads, raw.read_text().splitlines()) if r["record"] == "run"}
    assert not runs["boom"]["ok"] and "broken cell" in runs["boom"]["error"]
    assert runs["fine"]["ok"]
    assert not (tmp_path / "r" / "raw.jsonl.partial").exists()
