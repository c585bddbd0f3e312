"""The exporter and the dashboards without a server: series names, labels, NVML (mocked: the one place
a mock is allowed, there is no GPU here), the dashboards on disk match the code, live /metrics."""
from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from coldstart.errors import ColdstartError
from coldstart.metrics import names as N
from coldstart.metrics.dashboards import dashboard_json, iter_panel_queries, write_dashboards
from coldstart.metrics.export import build_registry, gpu_memory, push_timeline, serve_metrics
from coldstart.metrics.timelines import read_timelines, reason_label
from coldstart.pipeline.events import EventName, Timeline

ROOT = Path(__file__).resolve().parents[2]


def _exposition(reg) -> str:
    from prometheus_client import generate_latest

    return generate_latest(reg).decode()


def _restore_timeline(**labels) -> Timeline:
    """A timeline shaped like a restore's (the marks happen now: durations are whatever they take)."""
    tl = Timeline.from_container_start("restore", model="tiny", variant="v", **labels)
    for ev in ("MANIFEST_OK", "WARM_START", "RESTORE_ISSUED", "RESTORE_DONE", "SERVER_UP", "WAKE_WEIGHTS"):
        tl.mark(ev)
    tl.mark(EventName.WEIGHTS_LOADED, bytes=4096, gib_s=0.5)
    tl.mark(EventName.WARM_DONE, bytes=8192)
    for ev in ("WAKE_KV", "CANARY_OK", "FIRST_TOKEN", "READY"):
        tl.mark(ev)
    return tl


def test_series_from_a_restore_timeline():
    tl = _restore_timeline()
    text = _exposition(build_registry(tl, gpu=None))
    for phase in ("manifest", "criu_restore", "weights_load", "canary", "warm", "total_first_token"):
        assert f'phase="{phase}"' in text
    assert 'coldstart_runs_total{kind="restore",model="tiny",outcome="ok",variant="v"} 1.0' in text
    assert "coldstart_weights_loaded_bytes{" in text and "coldstart_warm_bytes{" in text
    # gib_s from the pipeline's WEIGHTS_LOADED becomes bytes/s
    m = re.search(r"coldstart_weights_load_throughput_bytes_per_second\{[^}]*\} (\S+)", text)
    assert m and float(m.group(1)) == pytest.approx(0.5 * 2**30)
    assert "coldstart_fallbacks_total{" not in text.replace("# HELP coldstart_fallbacks_total", "")
    assert "_created" not in text
    assert N.GPU_MEMORY_USED not in text


def test_fallback_counted_with_a_short_reason():
    tl = Timeline.from_container_start("restore", model="tiny")
    tl.mark(EventName.FALLBACK, reason="canary mismatch: the restored server answered 'x'")
    tl.mark(EventName.FIRST_TOKEN)
    text = _exposition(build_registry(tl, gpu=None))
    assert 'coldstart_fallbacks_total{kind="restore",model="tiny",reason="canary mismatch",variant="default"} 1.0' in text
    assert 'outcome="fallback"' in text
    assert reason_label("criu restore failed (log /tmp/x): Error (criu/files.c:123)") == "criu restore failed (log /tmp/x)"


class _Mem:
    used = 12 << 30
    total = 80 << 30


def test_gpu_memory_from_mocked_nvml(monkeypatch):
    """With a device, NVML's numbers become the GPU gauges the dashboard's GPU panel queries (mocked NVML:
    no GPU on this machine; the real path is unverified on GPU)."""
    import pynvml

    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 1)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: ("h", i))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", lambda h: _Mem())
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda h: b"NVIDIA H100 80GB HBM3")
    devs = gpu_memory()
    assert [(d.index, d.name, d.used_bytes) for d in devs] == [(0, "NVIDIA H100 80GB HBM3", 12 << 30)]
    text = _exposition(build_registry(_restore_timeline()))
    for name in N.GPU_ONLY:
        assert re.search(rf'^{name}\{{[^}}]*gpu="0"[^}}]*gpu_name="NVIDIA H100 80GB HBM3"', text, re.M), name


def test_no_gpu_series_without_a_device():
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("this host has an NVIDIA device")
    except Exception:
        pass
    assert gpu_memory() == []
    assert N.GPU_MEMORY_USED not in _exposition(build_registry(_restore_timeline()))


def test_dashboards_only_query_metrics_the_exporter_defines():
    used = set()
    for _, expr in iter_panel_queries(dashboard_json()):
        used |= set(re.findall(r"\b(coldstart_[a-z_]+)", expr))
    assert used and used <= set(N.EXPOSED), used - set(N.EXPOSED)


def test_committed_dashboards_are_up_to_date(tmp_path):
    for p in write_dashboards(tmp_path):
        rel = p.relative_to(tmp_path)
        committed = ROOT / "dashboards" / rel
        assert committed.exists(), f"dashboards/{rel} missing: run coldstart metrics dashboards --out dashboards"
        assert committed.read_text() == p.read_text(), f"dashboards/{rel} is stale: regenerate it"
    d = json.loads((ROOT / "dashboards" / "coldstart-restores.json").read_text())
    assert d["uid"] == "coldstart-restores" and d["schemaVersion"] >= 39
    assert sum(1 for _ in iter_panel_queries(d)) >= 10


def test_serve_metrics_shows_phases_as_they_complete():
    tl = Timeline.from_container_start("restore", model="tiny", variant="live")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = serve_metrics(port, tl, gpu=None)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        assert 'phase="criu_restore"' not in requests.get(url, timeout=10).text
        tl.mark(EventName.RESTORE_ISSUED)
        tl.mark(EventName.RESTORE_DONE)
        assert 'phase="criu_restore"' in requests.get(url, timeout=10).text
        with pytest.raises(ColdstartError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            serve_metrics(port, tl)
    finally:
        server.shutdown()


def test_push_to_unreachable_gateway_is_one_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ColdstartError, match=f"could not push metrics to http://127.0.0.1:{port}"):
        push_timeline(_restore_timeline(), f"http://127.0.0.1:{port}", timeout=3)


def test_timeline_files_round_trip_and_bad_files(tmp_path):
    a, b = _restore_timeline(), _restore_timeline()
    f = tmp_path / "t.jsonl"
    a.write_jsonl(f)
    b.write_jsonl(f)  # appended runs split at CONTAINER_START
    tls = read_timelines(f)
    assert len(tls) == 2 and [e.name for e in tls[1].events] == [e.name for e in b.events]
    assert tls[0].phases() == a.phases()
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    coldstart = Path(sys.executable).with_name("coldstart")
    r = subprocess.run([str(coldstart), "metrics", "push", str(tmp_path / "bad.jsonl"), "--gateway",
                        "http://127.0.0.1:9"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "not a JSON line" in r.stderr and "Traceback" not in r.stderr
    with pytest.raises(ColdstartError, match="not found"):
        read_timelines(tmp_path / "missing.jsonl")
