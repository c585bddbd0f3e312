"""Acceptance: every PromQL expression of every dashboard panel returns data from a real Prometheus that
scraped real runs' metrics, and no panel queries a metric the code does not emit.

Where the data come from (all real, nothing invented):
- a real `coldstart checkpoint` of the tiny model (its checkpoint timeline is pushed too);
- a real `coldstart restore` of that snapshot (matrix cell `restore`, pushed by the matrix runner);
- a real fallback: the same restore with COLDSTART_CRIU pointing at a missing binary, so the pipeline
  refuses the restore, says why and cold-boots vLLM (FALLBACK event with the reason);
- a real probe cell (validate + warm + load the tiny model's flat dump with our loader), which gives the
  warming bytes even when the restore's own warmer has not finished before the first token;
- the same restore timeline served on /metrics (the entrypoint's mode) and scraped by Prometheus.
The only mock: the GPU panel. There is no GPU here, so one extra group is pushed with a mocked NVML
reading (variant "nvml-mock-test") to prove the GPU panel's PromQL works on the series the exporter
emits when NVML finds a device; that group never leaves this test's private Prometheus.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import requests

from coldstart.metrics import names as N
from coldstart.metrics.dashboards import iter_panel_queries, substitute_variables
from coldstart.metrics.export import GpuMemory, push_timeline, serve_metrics
from coldstart.metrics.timelines import read_timelines

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _query(prom: str, expr: str) -> list:
    r = requests.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=30)
    body = r.json()
    assert body.get("status") == "success", f"{expr}: {body}"
    return body["data"]["result"]


def _wait(pred, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.5)


@pytest.fixture(scope="session")
def real_runs(observability, tiny_model_dir, tiny_snapshot, tmp_path_factory):
    """Checkpoint, restore, fallback and probe for real; every run pushed to the Pushgateway."""
    from coldstart.matrix.runner import run_experiment
    from coldstart.matrix.spec import parse_experiment
    from coldstart.weights.dump import dump_safetensors

    d = tmp_path_factory.mktemp("metrics-live")
    gw = observability["pushgateway"]
    snap, ckpt = tiny_snapshot.out, tiny_snapshot.timeline  # the session's one checkpoint
    ckpt.labels.update(variant="metrics-test")
    push_timeline(ckpt, gw, instance="checkpoint-metrics-test")
    flat = d / "flat"
    dump_safetensors(tiny_model_dir, flat)
    cell = ["{python}", "-m", "coldstart.matrix.cells"]
    spec = parse_experiment({
        "experiment": {"name": "metrics-live", "seed": 1, "repetitions": 1, "caches": ["asis"], "models": ["tiny"],
                       "timeout_s": 1200},
        "models": {"tiny": {"path": str(tiny_model_dir)}},
        "variants": [
            {"name": "restore", "command": cell + ["restore", str(snap), "--timeline-out", "{timeline}"]},
            {"name": "restore-no-criu", "env": {"COLDSTART_CRIU": str(d / "no-such-criu")},
             "command": cell + ["restore", str(snap), "--timeline-out", "{timeline}"]},
            {"name": "probe", "kind": "probe",
             "command": cell + ["probe", str(flat), "--timeline-out", "{timeline}", "--warm", "native"]},
        ],
    })
    raw = run_experiment(spec, d / "results", gateway=gw, say=print)
    runs = {r["variant"]: r for r in map(json.loads, raw.read_text().splitlines()) if r["record"] == "run"}
    for v, r in runs.items():
        assert r["ok"], f"{v}: {r['error']} (log {r['log']})"
    return {"raw": raw, "runs": runs, "checkpoint": ckpt}


def test_the_runs_are_what_the_dashboards_need(real_runs):
    runs = real_runs["runs"]
    assert runs["restore"]["kind"] == "restore"
    assert runs["restore-no-criu"]["outcome"] == "fallback"
    assert {"criu_restore", "weights_load"} <= set(runs["restore"]["phases"]) or \
        runs["restore"]["outcome"] == "fallback"


def test_every_panel_query_returns_data(real_runs, observability):
    prom, gw = observability["prometheus"], observability["pushgateway"]
    # The GPU panel: one group with a mocked NVML reading (see the module docstring).
    restore_tl = [t for t in read_timelines(real_runs["raw"]) if t.labels.get("variant") == "restore"][-1]
    restore_tl.labels.update(variant="nvml-mock-test")
    push_timeline(restore_tl, gw, instance="nvml-mock-test",
                  gpu=lambda: [GpuMemory(0, "mocked NVML device", 3 << 30, 80 << 30)])
    expected_groups = 5  # checkpoint, restore, fallback, probe, nvml mock
    _wait(lambda: (r := _query(prom, f"count({N.RUNS_TOTAL})")) and float(r[0]["value"][1]) >= expected_groups,
          "Prometheus to scrape every pushed run")
    _wait(lambda: _query(prom, N.GPU_MEMORY_USED), "the GPU group")

    assert DASHBOARDS, "no dashboards/*.json"
    checked, empty = 0, []
    for dash_file in DASHBOARDS:
        dash = json.loads(dash_file.read_text())
        for title, expr in iter_panel_queries(dash):
            result = _query(prom, substitute_variables(expr))
            checked += 1
            if not result:
                empty.append(f"{dash_file.name}: {title}: {expr}")
        for var in dash.get("templating", {}).get("list", []):
            q = var.get("query")
            if isinstance(q, str) and q.startswith("label_values("):
                metric, label = re.match(r"label_values\((\w+),\s*(\w+)\)", q).groups()
                r = requests.get(f"{prom}/api/v1/label/{label}/values", params={"match[]": metric}, timeout=30)
                assert r.json()["data"], f"template variable {var['name']}: no values"
    assert checked >= 10
    assert not empty, "panels without data:\n" + "\n".join(empty)


def test_no_panel_queries_a_metric_the_code_does_not_emit(real_runs, observability):
    """Every metric named by any panel exists in Prometheus, fed by the exporter (GPU: via the mocked
    NVML group of the previous test, which a GPU host's NVML would feed for real)."""
    prom = observability["prometheus"]
    used = set()
    for dash_file in DASHBOARDS:
        for _, expr in iter_panel_queries(json.loads(dash_file.read_text())):
            used |= set(re.findall(r"\b(coldstart_[a-z_]+)", expr))
    assert used <= set(N.EXPOSED)
    missing = [m for m in sorted(used) if not _query(prom, f'count({{__name__="{m}"}})')]
    assert not missing, f"queried by a panel but never emitted: {missing}"


def test_entrypoint_metrics_endpoint_is_scraped(real_runs, observability):
    """The entrypoint's mode: /metrics served while it runs, discovered through DIR/targets/*.json."""
    prom = observability["prometheus"]
    tl = [t for t in read_timelines(real_runs["raw"]) if t.labels.get("variant") == "restore"][-1]
    tl.labels.update(variant="served-live")
    port = free_port()
    server = serve_metrics(port, tl, gpu=None)
    try:
        (Path(observability["dir"]) / "targets" / "live.json").write_text(
            json.dumps([{"targets": [f"127.0.0.1:{port}"]}]))
        _wait(lambda: _query(prom, f'{N.RUNS_TOTAL}{{job="coldstart", variant="served-live"}}'),
              "Prometheus to scrape the served /metrics", timeout=90)
    finally:
        server.shutdown()
