"""raw.jsonl -> summary.md + summary.csv (median, p10, p90 per phase per variant, ratio to the
baseline) and PNG plots (stacked phase bars, per-variant distributions). Re-runnable at any time from
the raw file alone: `coldstart matrix report results/X`."""
from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coldstart.errors import ColdstartError
from coldstart.fsutil import write_atomic
from coldstart.pipeline.events import PHASES

TOTAL = "total"  # start -> first token (FIRST_TOKEN, else READY, else last event)
#: sequential phases that stack into the total; "warm" overlaps them, total_first_token is the sum
STACKED = [p for p in PHASES if p not in ("warm", "total_first_token")]
METRICS = [TOTAL, *PHASES]


@dataclass
class Raw:
    experiment: dict[str, Any]
    runs: list[dict[str, Any]]  # run records (timed cells only)
    prepare: list[dict[str, Any]]
    fallbacks: dict[str, str] | None = None  # run id -> FALLBACK reason


def load_raw(results: Path) -> Raw:
    """Read results/X/raw.jsonl (or raw.jsonl.partial of an interrupted run)."""
    results = Path(results)
    path = results / "raw.jsonl" if results.is_dir() else results
    if results.is_dir() and not path.exists() and (results / "raw.jsonl.partial").exists():
        path = results / "raw.jsonl.partial"
    if not path.is_file():
        raise ColdstartError(f"no raw.jsonl in {results}")
    exp: dict[str, Any] = {}
    runs, prep = [], []
    reasons: dict[str, str] = {}
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                raise ColdstartError(f"{path}:{i}: corrupt line (not JSON)") from None
            kind = rec.get("record")
            if kind == "experiment":
                exp = rec
            elif kind == "run":
                (prep if rec.get("prepare") else runs).append(rec)
            elif kind == "event" and rec.get("name") == "FALLBACK":
                reasons[str(rec.get("run"))] = str((rec.get("attrs") or {}).get("reason", ""))
    if not runs:
        raise ColdstartError(f"{path}: no runs recorded")
    return Raw(exp, runs, prep, reasons)


def _pct(vals: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(np.asarray(vals, dtype=float), q))


def _metric(run: dict[str, Any], m: str) -> float | None:
    if m == TOTAL:
        return run.get("total_seconds")
    return (run.get("phases") or {}).get(m)


@dataclass
class Row:
    model: str
    variant: str
    cache: str
    metric: str
    n: int
    median: float
    p10: float
    p90: float
    ratio: float | None  # median / baseline median (same model, cache, metric)


def summarise(raw: Raw) -> tuple[list[Row], dict[tuple[str, str, str], dict[str, int]]]:
    """Stats rows for successful runs, and outcome counts per (model, variant, cache)."""
    groups: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    outcomes: dict[tuple[str, str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    order: list[tuple[str, str, str]] = []
    vorder = [v["name"] for v in raw.experiment.get("variants", [])]
    for r in raw.runs:
        key = (r["model"], r["variant"], r["cache"])
        if key not in order:
            order.append(key)
        outcomes[key]["failed" if not r.get("ok") else r.get("outcome", "ok")] += 1
        if r.get("ok"):
            groups[key].append(r)
    caches = ["cold", "warm", "asis"]
    order.sort(key=lambda k: (k[0], vorder.index(k[1]) if k[1] in vorder else 999,
                              caches.index(k[2]) if k[2] in caches else 9))
    base = raw.experiment.get("baseline")
    med: dict[tuple[str, str, str, str], float] = {}
    rows: list[Row] = []
    for key in order:
        for m in METRICS:
            vals = [v for v in (_metric(r, m) for r in groups.get(key, [])) if v is not None]
            if not vals:
                continue
            med[(*key, m)] = _pct(vals, 50)
            rows.append(Row(*key, m, len(vals), _pct(vals, 50), _pct(vals, 10), _pct(vals, 90), None))
    for row in rows:
        b = med.get((row.model, base, row.cache, row.metric)) if base else None
        row.ratio = row.median / b if b else None
    return rows, {k: dict(v) for k, v in outcomes.items()}


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None:
        return ""
    return f"{x:.{digits}f}"


def write_csv(rows: list[Row]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["model", "variant", "cache", "metric", "n", "median_s", "p10_s", "p90_s", "ratio_to_baseline"])
    for r in rows:
        w.writerow([r.model, r.variant, r.cache, r.metric, r.n, _fmt(r.median, 6), _fmt(r.p10, 6), _fmt(r.p90, 6),
                    _fmt(r.ratio, 4)])
    return buf.getvalue()


def _reporting_note(host: dict) -> str:
    """The VM's free page reporting (recorded since --keep-memory; older runs say nothing): while on,
    the memory a dropped page cache frees goes back to the hypervisor, and cold cells pay for it."""
    rep = host.get("page_reporting")
    if "page_reporting" not in host:
        return ""
    if rep is None:
        return " No free page reporting on this kernel."
    if host.get("memory_kept"):
        return (f" The VM's free page reporting (order {rep['order']}) was off for the run and its free memory "
                "touched first (--keep-memory).")
    return (f" The VM's free page reporting was on (order {rep['order']}): a dropped page cache is also memory "
            "the hypervisor backs again when it is next touched (--keep-memory turns it off).")


def write_markdown(raw: Raw, rows: list[Row], outcomes, command: str | None) -> str:
    exp = raw.experiment
    host = exp.get("host", {})
    base = exp.get("baseline")
    lines = [f"# Experiment matrix: {exp.get('name', '?')}", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    gpus = host.get("gpus") or []
    lines += [
        f"Host: {host.get('cpu', '?')}, {host.get('cores', '?')} cores, "
        f"{(host.get('memory_bytes') or 0) / 2**30:.0f} GiB, kernel {host.get('kernel', '?')}, "
        f"vLLM {host.get('vllm', '?')}, torch {host.get('torch', '?')}, commit {host.get('coldstart_commit', '?')}; "
        + ("GPU: " + ", ".join(g['name'] for g in gpus) if gpus else "no GPU: **every number here is CPU-measured**")
        + "." + _reporting_note(host),
        f"Seed {exp.get('seed')}, {exp.get('repetitions')} repetitions per cell, cells in a shuffled interleaved "
        "order; cold = page cache dropped just before the run, warm = the cell's files read just before. "
        "Times are seconds from process start (like a container start) to the first token; median [p10–p90] "
        "over successful runs (with few runs the percentiles are interpolated).",
        "",
        "## Time to first token",
        "",
        f"| model | variant | cache | n | outcomes | median s | p10–p90 s | vs {base or 'baseline'} |",
        "|---|---|---|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        if r.metric != TOTAL:
            continue
        oc = ", ".join(f"{k} {v}" for k, v in sorted(outcomes.get((r.model, r.variant, r.cache), {}).items()))
        speed = f"{1 / r.ratio:.1f}× faster" if r.ratio and r.variant != base and r.ratio < 1 else (
            f"{r.ratio:.2f}× the time" if r.ratio and r.variant != base else "baseline" if r.variant == base else "")
        lines.append(f"| {r.model} | {r.variant} | {r.cache} | {r.n} | {oc} | {r.median:.2f} | "
                     f"{r.p10:.2f}–{r.p90:.2f} | {speed} |")
    failed = [(k, v) for k, v in outcomes.items() if v.get("failed")]
    for (m, v, c), oc in failed:
        if not any(r.model == m and r.variant == v and r.cache == c for r in rows):
            lines.append(f"| {m} | {v} | {c} | 0 | failed {oc['failed']} | | | |")
    phase_cols = [p for p in PHASES if any(r.metric == p for r in rows)]
    if phase_cols:
        lines += ["", "## Phases (median seconds)", "",
                  "| model | variant | cache | " + " | ".join(phase_cols) + " |",
                  "|---|---|---|" + "---:|" * len(phase_cols)]
        by = {(r.model, r.variant, r.cache, r.metric): r for r in rows}
        keys = []
        for r in rows:
            if (r.model, r.variant, r.cache) not in keys:
                keys.append((r.model, r.variant, r.cache))
        for k in keys:
            cells = [f"{by[(*k, p)].median:.3f}" if (*k, p) in by else "" for p in phase_cols]
            lines.append(f"| {k[0]} | {k[1]} | {k[2]} | " + " | ".join(cells) + " |")
    errors = [r for r in raw.runs if not r.get("ok")]
    if errors:
        lines += ["", "## Failed runs", ""]
        for r in errors[:20]:
            lines.append(f"- {r['run']}: {r.get('error', '')}")
    fb = [r for r in raw.runs if r.get("outcome") == "fallback"]
    if fb:
        lines += ["", "## Fallbacks", "",
                  f"{len(fb)} run(s) fell back to a cold start (their time includes the cold boot):", ""]
        for r in fb:
            lines.append(f"- {r['run']}: {(raw.fallbacks or {}).get(r['run'], '?')[:300]}")
    lines += ["", "Files: raw.jsonl (every event of every run + host facts), summary.csv (all phases, p10/p90, "
              "ratios), phases.png, distributions.png.", ""]
    return "\n".join(lines)


def _label(model: str, variant: str, cache: str, models: int) -> str:
    return (f"{model} " if models > 1 else "") + f"{variant} [{cache}]"


def plot(raw: Raw, rows: list[Row], out: Path) -> list[Path]:
    """phases.png: stacked median phases per cell (+ 'other' up to the median total);
    distributions.png: every run's total per cell."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {(r.model, r.variant, r.cache, r.metric): r for r in rows}
    keys = []
    for r in rows:
        if (r.model, r.variant, r.cache) not in keys:
            keys.append((r.model, r.variant, r.cache))
    nmodels = len({k[0] for k in keys})
    labels = [_label(*k, nmodels) for k in keys]
    paths = []

    kinds = {(r["model"], r["variant"], r["cache"]): r.get("kind", "") for r in raw.runs}
    zoom = [k for k in keys if kinds.get(k) != "cold"]
    panels = [(keys, "all variants")] + ([(zoom, "without the naive cold start (zoom)")]
                                         if zoom and len(zoom) < len(keys) else [])
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, sum(0.5 * len(ks) + 1.4 for ks, _ in panels) + 0.6),
                             squeeze=False)
    cmap = plt.get_cmap("tab10")
    for ax, (ks, sub) in zip(axes[:, 0], panels):
        labs = [_label(*k, nmodels) for k in ks]
        left = [0.0] * len(ks)
        for i, ph in enumerate([*STACKED, "other"]):
            vals = []
            for j, k in enumerate(ks):
                if ph == "other":
                    tot = by.get((*k, TOTAL))
                    v = max(tot.median - left[j], 0.0) if tot else 0.0
                else:
                    v = by[(*k, ph)].median if (*k, ph) in by else 0.0
                vals.append(v)
            if not any(vals):
                continue
            name = "other (imports, gaps; naive: the whole cold boot)" if ph == "other" else ph
            ax.barh(labs, vals, left=left, color=cmap(i % 10) if ph != "other" else "#bbbbbb", label=name)
            left = [a + b for a, b in zip(left, vals)]
        ax.invert_yaxis()
        ax.set_xlabel("seconds (median), start → first token")
        ax.set_title(f"{raw.experiment.get('name', '')}: where the time goes, {sub} (CPU-measured)", fontsize=10)
        ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    p = out / "phases.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)

    fig, ax = plt.subplots(figsize=(10, 0.55 * len(keys) + 1.8))
    data = []
    for k in keys:
        data.append([r["total_seconds"] for r in raw.runs if r.get("ok") and r.get("total_seconds") is not None
                     and (r["model"], r["variant"], r["cache"]) == k])
    ax.boxplot(data, vert=False, tick_labels=labels, widths=0.5)
    for j, vals in enumerate(data, 1):
        ax.scatter(vals, [j] * len(vals), s=14, color="black", zorder=3)
    ax.invert_yaxis()
    if data and max((max(d) for d in data if d), default=1) / max(min((min(d) for d in data if d), default=1), 1e-3) > 20:
        ax.set_xscale("log")
    ax.set_xlabel("seconds, start → first token (every run)")
    ax.set_title(f"{raw.experiment.get('name', '')}: distribution per variant (CPU-measured)")
    fig.tight_layout()
    p = out / "distributions.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    return paths


def render(results: Path, command: str | None = None) -> list[Path]:
    """Write summary.md, summary.csv, phases.png, distributions.png next to raw.jsonl."""
    results = Path(results)
    raw = load_raw(results)
    out = results if results.is_dir() else results.parent
    if command is None and (out / "COMMAND").exists():
        command = (out / "COMMAND").read_text().strip()
    rows, outcomes = summarise(raw)
    write_atomic(out / "summary.csv", write_csv(rows))
    write_atomic(out / "summary.md", write_markdown(raw, rows, outcomes, command))
    pngs = plot(raw, rows, out) if rows else []
    return [out / "summary.md", out / "summary.csv", *pngs]
