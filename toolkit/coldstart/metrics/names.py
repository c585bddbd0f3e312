"""Every Prometheus metric name and label coldstart emits, in ONE place.

The exporter (export.py) creates its metrics from these constants and the Grafana dashboards
(dashboards.py) build their PromQL from the same constants, so a dashboard cannot query a metric the
code does not emit (tests/metrics checks every panel against a real Prometheus as well).

Model: one pushed group (or one scraped entrypoint) per run; every run carries its own series and the
dashboards aggregate across runs with sum/avg by label. Histograms of a single run have count 1; summed
over runs they are the distribution of all runs.
"""
from __future__ import annotations

# label names
PHASE = "phase"
EVENT = "event"
MODEL = "model"
VARIANT = "variant"
OUTCOME = "outcome"  # ok | fallback | failed | incomplete
KIND = "kind"  # restore | cold | checkpoint | command
REASON = "reason"
GPU = "gpu"
GPU_NAME = "gpu_name"
RUN_LABELS = (MODEL, VARIANT, OUTCOME, KIND)

# metric names as exposed (histograms add _bucket/_sum/_count; counters are declared without _total
# in prometheus_client and exposed with it)
PHASE_SECONDS = "coldstart_phase_seconds"  # histogram {phase, model, variant, outcome, kind}
EVENT_SECONDS = "coldstart_event_seconds"  # histogram {event, ...}: time from start to each event
TTFT_SECONDS = "coldstart_time_to_first_token_seconds"  # histogram {model, variant, outcome, kind}
RUNS = "coldstart_runs"  # counter -> coldstart_runs_total
RUNS_TOTAL = RUNS + "_total"
FALLBACKS = "coldstart_fallbacks"  # counter {reason, model, variant, kind} -> coldstart_fallbacks_total
FALLBACKS_TOTAL = FALLBACKS + "_total"
RUN_TIMESTAMP = "coldstart_run_start_timestamp_seconds"  # gauge: wall clock of the run's start
WARM_BYTES = "coldstart_warm_bytes"  # gauge: bytes brought into the page cache by warming
WARM_THROUGHPUT = "coldstart_warm_throughput_bytes_per_second"  # gauge
WEIGHTS_BYTES = "coldstart_weights_loaded_bytes"  # gauge: bytes reloaded into the engine
WEIGHTS_THROUGHPUT = "coldstart_weights_load_throughput_bytes_per_second"  # gauge
GPU_MEMORY_USED = "coldstart_gpu_memory_used_bytes"  # gauge {gpu, gpu_name}: NVML, only with a device
GPU_MEMORY_TOTAL = "coldstart_gpu_memory_total_bytes"  # gauge {gpu, gpu_name}

#: metrics present only on a host where nvidia-ml-py finds a device (never faked on CPU)
GPU_ONLY = (GPU_MEMORY_USED, GPU_MEMORY_TOTAL)

#: every series name the exporter can emit (histogram names expanded), for the dashboard lint
HISTOGRAMS = (PHASE_SECONDS, EVENT_SECONDS, TTFT_SECONDS)
EXPOSED = tuple(
    [f"{h}{s}" for h in HISTOGRAMS for s in ("_bucket", "_sum", "_count")]
    + [RUNS_TOTAL, FALLBACKS_TOTAL, RUN_TIMESTAMP, WARM_BYTES, WARM_THROUGHPUT, WEIGHTS_BYTES,
       WEIGHTS_THROUGHPUT, GPU_MEMORY_USED, GPU_MEMORY_TOTAL]
)

# Histogram buckets (seconds): from sub-millisecond RPCs to multi-minute cold starts.
SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60,
                   90, 120, 180, 300, 600, float("inf"))
