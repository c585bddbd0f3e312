"""Timeline -> Prometheus series: pushed to a Pushgateway at the end of a run, or served on /metrics
by the entrypoint while it runs (the same series either way, built from the names in names.py).

One run = one group: ``push_timeline`` pushes into a fresh registry with a grouping key unique to the
run, so runs never overwrite each other and the dashboards aggregate across runs. GPU memory comes from
nvidia-ml-py only when it finds a device; on a host without one the GPU series are simply absent
(unit-tested with a mocked NVML; verified on an H100 by tests/gpu/test_nvml_metrics.py).
"""
from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from coldstart.errors import ColdstartError
from coldstart.metrics import names as N
from coldstart.metrics.timelines import fallback_reasons, first_token_seconds, outcome_of
from coldstart.pipeline.events import EventName, Timeline

GIB = 1 << 30


@dataclass
class GpuMemory:
    index: int
    name: str
    used_bytes: int
    total_bytes: int


def gpu_memory() -> list[GpuMemory]:
    """Per-device memory from NVML; [] when nvidia-ml-py or a device is absent (never raises)."""
    try:
        import pynvml  # nvidia-ml-py
    except Exception:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:
        return []
    out: list[GpuMemory] = []
    try:
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            name = pynvml.nvmlDeviceGetName(h)
            if isinstance(name, bytes):
                name = name.decode(errors="replace")
            out.append(GpuMemory(i, str(name), int(mem.used), int(mem.total)))
    except Exception:
        pass
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return out


def _attr_float(attrs: dict[str, Any], *keys: str) -> float | None:
    for k in keys:
        v = attrs.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
        try:
            if v is not None:
                return float(v)
        except (TypeError, ValueError):
            continue
    return None


def _bytes_and_rate(tl: Timeline, end: EventName, phase: str) -> tuple[float | None, float | None]:
    """(bytes, bytes/s) of a transfer from the end event's attrs (bytes, gib_per_s | bytes_per_s),
    the throughput derived from the phase duration when not given."""
    e = tl.get(end)
    if e is None:
        return None, None
    nbytes = _attr_float(e.attrs, "bytes", "nbytes", "total_bytes")
    rate = _attr_float(e.attrs, "bytes_per_s")
    if rate is None:
        gib = _attr_float(e.attrs, "gib_per_s", "gib_s", "GiB/s")
        rate = gib * GIB if gib is not None else None
    if rate is None and nbytes is not None:
        secs = _attr_float(e.attrs, "seconds") or tl.phases().get(phase)
        if secs and secs > 0:
            rate = nbytes / secs
    return nbytes, rate


def run_labels(tl: Timeline, model: str | None = None, variant: str | None = None) -> dict[str, str]:
    return {
        N.MODEL: str(model or tl.labels.get("model") or "unknown"),
        N.VARIANT: str(variant or tl.labels.get("variant") or "default"),
        N.OUTCOME: outcome_of(tl),
        N.KIND: str(tl.kind or "restore"),
    }


def build_registry(tl: Timeline, *, model: str | None = None, variant: str | None = None,
                   gpu: Callable[[], list[GpuMemory]] | None = gpu_memory):
    """A fresh CollectorRegistry holding this run's series (see names.py for the catalogue)."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

    disable_created_metrics()  # no *_created series: one run per group, they would only add noise
    reg = CollectorRegistry()
    lab = run_labels(tl, model, variant)
    base = list(N.RUN_LABELS)

    h_phase = Histogram(N.PHASE_SECONDS, "Duration of each coldstart phase (events.PHASES).",
                        [N.PHASE, *base], buckets=N.SECONDS_BUCKETS, registry=reg)
    for phase, secs in tl.phases().items():
        h_phase.labels(phase=phase, **lab).observe(max(float(secs), 0.0))

    h_event = Histogram(N.EVENT_SECONDS, "Seconds from the run's start to each timing event.",
                        [N.EVENT, *base], buckets=N.SECONDS_BUCKETS, registry=reg)
    seen: set[str] = set()
    for e in tl.events:
        if e.name in seen:
            continue
        seen.add(e.name)
        h_event.labels(event=e.name, **lab).observe(max(float(e.t), 0.0))

    h_ttft = Histogram(N.TTFT_SECONDS, "Time from container start to the first token (READY if no "
                       "FIRST_TOKEN event).", base, buckets=N.SECONDS_BUCKETS, registry=reg)
    ttft = first_token_seconds(tl)
    if ttft is not None:
        h_ttft.labels(**lab).observe(max(ttft, 0.0))

    Counter(N.RUNS, "Runs (restores, cold starts, checkpoints) by outcome.", base,
            registry=reg).labels(**lab).inc()
    c_fb = Counter(N.FALLBACKS, "Restores that fell back to a cold start, by reason.",
                   [N.REASON, N.MODEL, N.VARIANT, N.KIND], registry=reg)
    for reason in fallback_reasons(tl):
        c_fb.labels(reason=reason, model=lab[N.MODEL], variant=lab[N.VARIANT], kind=lab[N.KIND]).inc()

    Gauge(N.RUN_TIMESTAMP, "Wall clock (unix seconds) of the run's start.", base,
          registry=reg).labels(**lab).set(float(tl.wall0))

    for end, phase, bname, rname, what in (
        (EventName.WARM_DONE, "warm", N.WARM_BYTES, N.WARM_THROUGHPUT, "page-cache warming"),
        (EventName.WEIGHTS_LOADED, "weights_load", N.WEIGHTS_BYTES, N.WEIGHTS_THROUGHPUT, "weight loading"),
    ):
        nbytes, rate = _bytes_and_rate(tl, end, phase)
        g_b = Gauge(bname, f"Bytes of {what} in this run.", base, registry=reg)
        g_r = Gauge(rname, f"Throughput of {what} in this run (bytes/s).", base, registry=reg)
        if nbytes is not None:
            g_b.labels(**lab).set(nbytes)
        if rate is not None:
            g_r.labels(**lab).set(rate)

    if gpu is not None:
        devs = gpu()
        if devs:
            g_used = Gauge(N.GPU_MEMORY_USED, "GPU memory in use (NVML), per device.",
                           [N.GPU, N.GPU_NAME, *base], registry=reg)
            g_tot = Gauge(N.GPU_MEMORY_TOTAL, "GPU memory size (NVML), per device.",
                          [N.GPU, N.GPU_NAME, *base], registry=reg)
            for d in devs:
                g_used.labels(gpu=str(d.index), gpu_name=d.name, **lab).set(d.used_bytes)
                g_tot.labels(gpu=str(d.index), gpu_name=d.name, **lab).set(d.total_bytes)
    return reg


def run_id(tl: Timeline) -> str:
    """A grouping key unique to the run: the labels' run id if any, else host + start time + pid."""
    rid = tl.labels.get("run") or tl.labels.get("run_id")
    if rid:
        return str(rid)
    return f"{socket.gethostname()}-{int(tl.wall0 * 1000)}-{os.getpid()}"


def push_timeline(tl: Timeline, gateway_url: str, *, job: str = "coldstart", model: str | None = None,
                  variant: str | None = None, instance: str | None = None, timeout: float = 10.0,
                  gpu: Callable[[], list[GpuMemory]] | None = gpu_memory) -> dict[str, str]:
    """Push one run's series to a Pushgateway (PUT: the group is this run's alone). Returns the
    grouping key. An unreachable gateway is a ColdstartError naming the URL."""
    from prometheus_client import push_to_gateway

    reg = build_registry(tl, model=model, variant=variant, gpu=gpu)
    key = {"instance": instance or run_id(tl)}
    try:
        push_to_gateway(gateway_url, job=job, registry=reg, grouping_key=key, timeout=timeout)
    except Exception as e:  # urllib errors, HTTP errors
        raise ColdstartError(f"could not push metrics to {gateway_url}: {e}") from None
    return {"job": job, **key}


def push_timelines(tls: Iterable[Timeline], gateway_url: str, **kw: Any) -> list[dict[str, str]]:
    return [push_timeline(tl, gateway_url, **kw) for tl in tls]


class TimelineCollector:
    """A prometheus_client collector that renders a live Timeline at every scrape, so the entrypoint
    shows its phases on /metrics as they complete (and GPU memory over the restore when present)."""

    def __init__(self, timeline: Timeline | Callable[[], Timeline], **kw: Any) -> None:
        self._tl = timeline
        self._kw = kw
        self._lock = threading.Lock()

    def collect(self):
        tl = self._tl() if callable(self._tl) else self._tl
        with self._lock:
            reg = build_registry(tl, **self._kw)
        yield from reg.collect()


def serve_metrics(port: int, timeline: Timeline | Callable[[], Timeline], *, addr: str = "127.0.0.1",
                  **kw: Any):
    """Serve the live timeline on http://addr:port/metrics in a daemon thread; returns the server
    (call ``.shutdown()`` to stop). A port in use is a ColdstartError."""
    from prometheus_client import CollectorRegistry, start_http_server

    reg = CollectorRegistry()
    reg.register(TimelineCollector(timeline, **kw))
    try:
        res = start_http_server(port, addr=addr, registry=reg)
    except OSError as e:
        raise ColdstartError(f"cannot serve metrics on {addr}:{port}: {e.strerror or e}") from None
    server = res[0] if isinstance(res, tuple) else res
    return server
