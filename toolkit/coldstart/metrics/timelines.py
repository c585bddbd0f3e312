"""Reading timelines back from jsonl, and the facts every consumer derives from one (outcome, reasons).

Accepts what ``Timeline.write_jsonl`` writes (one line per event: kind + labels + event, runs appended
one after another), whole-timeline lines (``Timeline.to_dict()``), and the matrix's raw.jsonl (event
lines tagged with a ``run`` id).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from coldstart.errors import ColdstartError
from coldstart.pipeline.events import Event, EventName, Timeline

_EVENT_KEYS = {"kind", "name", "t", "wall", "attrs"}
_META_KEYS = {"record", "run", "host"}  # matrix bookkeeping, not labels
_START = {EventName.CONTAINER_START.value, EventName.CHECKPOINT_START.value}


def _timeline_from_dict(d: dict[str, Any]) -> Timeline:
    tl = Timeline(kind=d.get("kind", "restore"), labels={k: str(v) for k, v in d.get("labels", {}).items()})
    tl.wall0 = float(d.get("wall0", 0.0))
    tl.events = [Event(name=e["name"], t=float(e["t"]), wall=float(e.get("wall", 0.0)),
                       attrs=dict(e.get("attrs") or {})) for e in d.get("events", [])]
    return tl


def timelines_from_records(records: Iterable[dict[str, Any]]) -> list[Timeline]:
    """Group event records into timelines: by ``run`` id when present, else a new timeline starts at
    each CONTAINER_START/CHECKPOINT_START or when kind/labels change."""
    out: list[Timeline] = []
    by_run: dict[str, Timeline] = {}
    cur: Timeline | None = None
    for rec in records:
        if "events" in rec:  # a whole Timeline.to_dict()
            out.append(_timeline_from_dict(rec))
            cur = None
            continue
        if rec.get("record", "event") != "event" or "name" not in rec:
            continue
        labels = {k: str(v) for k, v in rec.items() if k not in _EVENT_KEYS | _META_KEYS}
        kind = str(rec.get("kind", "restore"))
        ev = Event(name=str(rec["name"]), t=float(rec["t"]), wall=float(rec.get("wall", 0.0)),
                   attrs=dict(rec.get("attrs") or {}))
        run = rec.get("run")
        if run is not None:
            tl = by_run.get(str(run))
            if tl is None:
                tl = by_run[str(run)] = Timeline(kind=kind, labels=labels)
                tl.wall0 = ev.wall - ev.t
                out.append(tl)
        else:
            if cur is None or ev.name in _START or cur.kind != kind or cur.labels != labels:
                cur = Timeline(kind=kind, labels=labels)
                cur.wall0 = ev.wall - ev.t
                out.append(cur)
            tl = cur
        tl.events.append(ev)
    return out


def read_timelines(path: Path) -> list[Timeline]:
    """All timelines in a jsonl file; a missing, empty or corrupt file is a ColdstartError."""
    path = Path(path)
    if not path.is_file():
        raise ColdstartError(f"timeline file not found: {path}")
    records = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ColdstartError(f"{path}:{i}: not a JSON line ({e.msg})") from None
    tls = timelines_from_records(records)
    if not tls:
        raise ColdstartError(f"no timing events in {path}")
    return tls


def fallback_reasons(tl: Timeline) -> list[str]:
    """The reason of each FALLBACK event (short, label-safe)."""
    out = []
    for e in tl.events:
        if e.name == EventName.FALLBACK.value:
            out.append(reason_label(str(e.attrs.get("reason", "unknown"))))
    return out


def reason_label(reason: str) -> str:
    """Fallback reasons become label values: keep the leading category ("canary mismatch: ..." ->
    "canary mismatch"), bounded length, so the number of series stays small."""
    r = reason.strip().split(":", 1)[0].strip().lower() or "unknown"
    return r[:60]


def outcome_of(tl: Timeline) -> str:
    """ok | fallback | failed | incomplete: the labels' ``outcome`` if set, else from the events."""
    if tl.labels.get("outcome"):
        return str(tl.labels["outcome"])
    names = {e.name for e in tl.events}
    if EventName.FALLBACK.value in names:
        return "fallback"
    if names & {EventName.FIRST_TOKEN.value, EventName.READY.value, EventName.PUBLISHED.value}:
        return "ok"
    return "incomplete"


def first_token_seconds(tl: Timeline) -> float | None:
    """Seconds from the start to the first token (FIRST_TOKEN, else READY), or None."""
    for name in (EventName.FIRST_TOKEN, EventName.READY):
        e = tl.get(name)
        if e is not None:
            return float(e.t)
    return None
