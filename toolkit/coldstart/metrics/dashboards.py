"""Grafana dashboards as code (grafana-foundation-sdk, Grafana's own SDK, so the JSON follows Grafana's
schema), plus provisioning files. Every PromQL expression is built from the names in names.py; the
metrics test runs each one against a real Prometheus holding real runs' series.

`coldstart metrics dashboards --out dashboards/` writes:
  dashboards/coldstart-restores.json
  dashboards/provisioning/datasources/coldstart.yaml   (a Prometheus datasource, uid coldstart-prometheus)
  dashboards/provisioning/dashboards/coldstart.yaml    (file provider pointing at the JSON folder)
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from coldstart.fsutil import write_atomic
from coldstart.metrics import names as N

DATASOURCE_UID = "coldstart-prometheus"
DASHBOARD_UID = "coldstart-restores"
SEL = f'{N.MODEL}=~"$model", {N.VARIANT}=~"$variant"'  # the dashboard's template variables


@dataclass
class PanelSpec:
    """One panel: title, viz type, unit, a description saying what it answers, and its queries
    as (expr, legend)."""
    title: str
    viz: str  # timeseries | barchart-like bargauge | stat | piechart
    unit: str
    description: str
    queries: list[tuple[str, str]]
    row: str
    stacked: bool = False
    width: int = 12
    instant: bool = False


def _mean(metric: str, by: str, extra: str = "") -> str:
    sel = "{" + SEL + (", " + extra if extra else "") + "}"
    return f"sum by ({by}) ({metric}_sum{sel}) / sum by ({by}) ({metric}_count{sel})"


def _quantile(q: float, metric: str, by: str, extra: str = "") -> str:
    sel = "{" + SEL + (", " + extra if extra else "") + "}"
    return f"histogram_quantile({q}, sum by (le, {by}) ({metric}_bucket{sel}))"


def panel_specs() -> list[PanelSpec]:
    """The panels of the restores dashboard, in layout order."""
    restore = f'{N.KIND}="restore"'
    stacked_phases = f'{N.PHASE}!~"warm|total_first_token"'  # warm overlaps; total is the sum
    latest = (f"{N.RUN_TIMESTAMP}{{{SEL}, {restore}}} == scalar(max({N.RUN_TIMESTAMP}{{{SEL}, {restore}}}))")
    return [
        # --- time to first token
        PanelSpec("Time to first token by variant (p50, p90)", "timeseries", "s",
                  "Container start to first token, quantiles over the runs present, per variant.",
                  [(_quantile(0.5, N.TTFT_SECONDS, N.VARIANT), "p50 {{variant}}"),
                   (_quantile(0.9, N.TTFT_SECONDS, N.VARIANT), "p90 {{variant}}")], "Time to first token"),
        PanelSpec("Mean time to first token by variant and kind", "bargauge", "s",
                  "Restore vs cold start: the product's number, per variant.",
                  [(_mean(N.TTFT_SECONDS, f"{N.VARIANT}, {N.KIND}"), "{{variant}} ({{kind}})")],
                  "Time to first token", instant=True),
        # --- phases
        PanelSpec("Restore phases over time (mean per run)", "timeseries", "s",
                  "Where a restore's seconds go, stacked by phase (warming overlaps and is shown apart).",
                  [(_mean(N.PHASE_SECONDS, N.PHASE, f"{restore}, {stacked_phases}"), "{{phase}}")],
                  "Phases", stacked=True),
        PanelSpec("Latest restore: phase breakdown", "bargauge", "s",
                  "Phases of the most recent restore (by its start timestamp).",
                  [(f"sum by ({N.PHASE}) ({N.PHASE_SECONDS}_sum{{{SEL}, {restore}}} "
                    f"and on (instance) ({latest}))", "{{phase}}")], "Phases", instant=True),
        PanelSpec("Phase p50 by variant", "bargauge", "s",
                  "Median of each phase per variant over the runs present.",
                  [(_quantile(0.5, N.PHASE_SECONDS, f"{N.PHASE}, {N.VARIANT}"), "{{variant}} {{phase}}")],
                  "Phases", instant=True),
        PanelSpec("Time to each event by kind (mean)", "bargauge", "s",
                  "Seconds from start to each timing event, for restores, cold starts and checkpoints.",
                  [(_mean(N.EVENT_SECONDS, f"{N.KIND}, {N.EVENT}"), "{{kind}} {{event}}")],
                  "Phases", instant=True),
        # --- fallbacks
        PanelSpec("Fallback rate", "stat", "percentunit",
                  "Fallbacks to a cold start per restore attempted.",
                  [(f"sum({N.FALLBACKS_TOTAL}{{{SEL}, {restore}}}) / sum({N.RUNS_TOTAL}{{{SEL}, {restore}}})",
                    "fallback rate")], "Fallbacks", width=6, instant=True),
        PanelSpec("Fallbacks by reason", "bargauge", "short",
                  "Why restores fell back (the leading category of the reason).",
                  [(f"sum by ({N.REASON}) ({N.FALLBACKS_TOTAL}{{{SEL}, {restore}}})", "{{reason}}")],
                  "Fallbacks", width=9, instant=True),
        PanelSpec("Runs by kind and outcome", "timeseries", "short",
                  "Runs present, by kind (restore, cold, checkpoint) and outcome (ok, fallback, ...).",
                  [(f"sum by ({N.KIND}, {N.OUTCOME}) ({N.RUNS_TOTAL}{{{SEL}}})", "{{kind}} {{outcome}}")],
                  "Fallbacks", width=9),
        # --- bytes and throughput
        PanelSpec("Weight loading throughput by variant", "timeseries", "Bps",
                  "Bytes/s of the weight reload (WEIGHTS_LOADED), mean over runs per variant.",
                  [(f"avg by ({N.VARIANT}) ({N.WEIGHTS_THROUGHPUT}{{{SEL}}})", "{{variant}}")],
                  "Warming and weight loading"),
        PanelSpec("Page-cache warming throughput by variant", "timeseries", "Bps",
                  "Bytes/s brought into the page cache by the warmer (WARM_DONE).",
                  [(f"avg by ({N.VARIANT}) ({N.WARM_THROUGHPUT}{{{SEL}}})", "{{variant}}")],
                  "Warming and weight loading"),
        PanelSpec("Bytes warmed and loaded", "bargauge", "bytes",
                  "Bytes per run: page-cache warming and weight loading.",
                  [(f"avg by ({N.VARIANT}) ({N.WARM_BYTES}{{{SEL}}})", "warm {{variant}}"),
                   (f"avg by ({N.VARIANT}) ({N.WEIGHTS_BYTES}{{{SEL}}})", "weights {{variant}}")],
                  "Warming and weight loading", width=24, instant=True),
        # --- GPU (NVML; absent on hosts without a device)
        PanelSpec("GPU memory during restore", "timeseries", "bytes",
                  "NVML memory used per device, sampled at each scrape of the entrypoint (or at push). "
                  "Empty on hosts without a GPU: never faked. Unverified on GPU.",
                  [(f"max by ({N.GPU}, {N.GPU_NAME}) ({N.GPU_MEMORY_USED}{{{SEL}}})", "used gpu{{gpu}} {{gpu_name}}"),
                   (f"max by ({N.GPU}, {N.GPU_NAME}) ({N.GPU_MEMORY_TOTAL}{{{SEL}}})", "total gpu{{gpu}}")],
                  "GPU", width=24),
    ]


def build_dashboard():
    """The restores dashboard as a grafana-foundation-sdk Dashboard model."""
    from grafana_foundation_sdk.builders import bargauge, common, dashboard, prometheus, stat, timeseries
    from grafana_foundation_sdk.models import common as cm
    from grafana_foundation_sdk.models import dashboard as dm

    ds = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
    label_q = f"label_values({N.RUNS_TOTAL}, %s)"
    b = (
        dashboard.Dashboard("coldstart: restores")
        .uid(DASHBOARD_UID)
        .description("Where every second of a coldstart restore goes, per variant; fallbacks; warming and "
                     "weight-loading throughput; GPU memory (NVML, when present). Metrics: coldstart.metrics.")
        .tags(["coldstart", "vllm"])
        .refresh("5s")
        .time("now-6h", "now")
        .timezone("browser")
        .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
    )
    for var in (N.MODEL, N.VARIANT):
        b = b.with_variable(
            dashboard.QueryVariable(var).label(var).datasource(ds).query(label_q % var)
            .multi(True).include_all(True).all_value(".*")
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED))

    current_row = None
    next_id = 1  # Grafana wants unique panel ids (rows included)
    for p in panel_specs():
        if p.row != current_row:
            b = b.with_row(dashboard.Row(p.row).id(next_id))
            next_id += 1
            current_row = p.row
        targets = []
        for j, (expr, legend) in enumerate(p.queries):
            q = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + j)).datasource(ds)
            q = q.instant() if p.instant else q.range()
            targets.append(q)
        if p.viz == "timeseries":
            pb = timeseries.Panel().fill_opacity(30 if p.stacked else 10)
            if p.stacked:
                pb = pb.stacking(common.StackingConfig().mode(cm.StackingMode.NORMAL))
        elif p.viz == "stat":
            pb = stat.Panel().reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]))
        else:
            pb = (bargauge.Panel().orientation(cm.VizOrientation.HORIZONTAL)
                  .display_mode(cm.BarGaugeDisplayMode.GRADIENT)
                  .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"])))
        pb = (pb.id(next_id).title(p.title).description(p.description).unit(p.unit).datasource(ds)
              .targets(targets).height(8).span(p.width))
        next_id += 1
        b = b.with_panel(pb)
    return b.build()


def dashboard_json() -> dict:
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    return json.loads(json.dumps(build_dashboard(), cls=JSONEncoder))


DATASOURCE_YAML = f"""# Grafana datasource provisioning (generated by `coldstart metrics dashboards`).
# PROMETHEUS_URL defaults to the one scripts/start-observability prints.
apiVersion: 1
datasources:
  - name: coldstart Prometheus
    uid: {DATASOURCE_UID}
    type: prometheus
    access: proxy
    url: ${{PROMETHEUS_URL:-http://127.0.0.1:19090}}
    isDefault: true
    jsonData:
      timeInterval: 1s
"""

DASHBOARDS_YAML = """# Grafana dashboard provisioning (generated by `coldstart metrics dashboards`).
apiVersion: 1
providers:
  - name: coldstart
    folder: coldstart
    type: file
    disableDeletion: false
    allowUiUpdates: true
    options:
      # where the dashboards/*.json files are mounted in the Grafana container
      path: ${COLDSTART_DASHBOARDS_DIR:-/var/lib/grafana/dashboards/coldstart}
      foldersFromFilesStructure: false
"""


def write_dashboards(out: Path) -> list[Path]:
    """Write the dashboard JSON and the provisioning files under ``out``; returns the paths."""
    out = Path(out)
    d = dashboard_json()
    files = {
        out / f"{DASHBOARD_UID}.json": json.dumps(d, indent=2, sort_keys=True) + "\n",
        out / "provisioning" / "datasources" / "coldstart.yaml": DATASOURCE_YAML,
        out / "provisioning" / "dashboards" / "coldstart.yaml": DASHBOARDS_YAML,
    }
    for p, text in files.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(p, text)
    return list(files)


def iter_panel_queries(dash: dict):
    """(panel title, expr) of every Prometheus query of every panel, rows' nested panels included."""
    def walk(panels):
        for p in panels or []:
            yield from walk(p.get("panels"))
            for t in p.get("targets") or []:
                if t.get("expr"):
                    yield p.get("title", ""), t["expr"]
    yield from walk(dash.get("panels"))


def substitute_variables(expr: str, values: dict[str, str] | None = None) -> str:
    """Replace Grafana template variables by the values a user selecting "All" would send."""
    values = {"model": ".*", "variant": ".*", **(values or {})}
    for k, v in values.items():
        expr = expr.replace(f"${{{k}}}", v).replace(f"${k}", v)
    return expr.replace("$__rate_interval", "1m").replace("$__interval", "15s").replace("$__range", "1h")
