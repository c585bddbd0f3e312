"""Timing events: one schema for logs, results/, Prometheus and Grafana (see DESIGN.md).

Every stage reports into a ``Timeline``; the restore prints it as a table, writes it as jsonl, and the
metrics stage turns it into Prometheus series. Times are monotonic seconds since CONTAINER_START.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any


class EventName(str, Enum):
    CONTAINER_START = "CONTAINER_START"  # the clock's origin: the user's command (COLDSTART_T0) or now
    # container runs (coldstart.containers), all on the clock of the host's create call
    CONTAINER_CREATE = "CONTAINER_CREATE"
    CONTAINER_STARTED = "CONTAINER_STARTED"
    # the entrypoint process's start as /proc records it (not from Python): its fork, which for a
    # container is runc's init, created by docker's start call before it execs the entrypoint
    ENTRYPOINT_START = "ENTRYPOINT_START"
    ENTRY_PYTHON = "ENTRY_PYTHON"  # the entrypoint's first line of ours (coldstart.main), the interpreter up
    ENTRY_READY = "ENTRY_READY"  # its interpreter up, arguments parsed, the restore imported: its own work starts
    LAZY_MOUNTED = "LAZY_MOUNTED"  # a registry reference mounted lazily (index verified, prefetch started)
    RUNTIME_MOUNTED = "RUNTIME_MOUNTED"  # the server's runtime (venv) mounted lazily, or a directory given for it
    MANIFEST_OK = "MANIFEST_OK"
    WARM_START = "WARM_START"
    WARM_DONE = "WARM_DONE"
    RESTORE_ISSUED = "RESTORE_ISSUED"
    RESTORE_DONE = "RESTORE_DONE"
    SERVER_UP = "SERVER_UP"
    WAKE_WEIGHTS = "WAKE_WEIGHTS"
    WEIGHTS_LOADED = "WEIGHTS_LOADED"
    WAKE_KV = "WAKE_KV"
    CANARY_OK = "CANARY_OK"
    FIRST_TOKEN = "FIRST_TOKEN"
    FALLBACK = "FALLBACK"
    READY = "READY"
    SETTLE_ASKED = "SETTLE_ASKED"  # after READY: the worker copies mapped weights into anonymous memory, in the background
    # checkpoint side
    CHECKPOINT_START = "CHECKPOINT_START"
    ENGINE_UP = "ENGINE_UP"
    CANARY_RECORDED = "CANARY_RECORDED"
    WEIGHTS_DUMPED = "WEIGHTS_DUMPED"
    ASLEEP = "ASLEEP"
    CRIU_DUMPED = "CRIU_DUMPED"
    HOT_LAYOUT = "HOT_LAYOUT"  # recording restore done, images split (pipeline/layout.py)
    PUBLISHED = "PUBLISHED"


# Phases (the intervals plotted and exported as histograms): name -> (start event, end event).
PHASES: dict[str, tuple[EventName, EventName]] = {
    "entrypoint": (EventName.ENTRYPOINT_START, EventName.ENTRY_READY),
    "manifest": (EventName.CONTAINER_START, EventName.MANIFEST_OK),
    "criu_restore": (EventName.RESTORE_ISSUED, EventName.RESTORE_DONE),
    "server_up": (EventName.RESTORE_DONE, EventName.SERVER_UP),
    "wake_weights": (EventName.SERVER_UP, EventName.WAKE_WEIGHTS),
    "weights_load": (EventName.WAKE_WEIGHTS, EventName.WEIGHTS_LOADED),
    "wake_kv": (EventName.WEIGHTS_LOADED, EventName.WAKE_KV),
    "canary": (EventName.WAKE_KV, EventName.CANARY_OK),
    "warm": (EventName.WARM_START, EventName.WARM_DONE),
    "total_first_token": (EventName.CONTAINER_START, EventName.FIRST_TOKEN),
}


@dataclass
class Event:
    name: str
    t: float  # monotonic seconds since CONTAINER_START
    wall: float  # time.time()
    attrs: dict[str, Any] = field(default_factory=dict)


PYTHON_T_ENV = "COLDSTART_ENTRY_PYTHON"  # wall time of the entrypoint's first line of ours (pipeline.entry)


def exec_wall_time(pid: int | str = "self") -> float:
    """Wall-clock time of the process's exec, to the kernel's tick (10 ms). Its start in ticks since
    boot (/proc/PID/stat) is set against CLOCK_BOOTTIME now; psutil's create_time adds the boot time
    from /proc/stat, which is whole seconds, and was up to 1 s off."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
    return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - started)


@dataclass
class Timeline:
    """Collects events of one run (a restore, a checkpoint or a cold start)."""

    kind: str = "restore"  # restore | checkpoint | cold
    labels: dict[str, str] = field(default_factory=dict)  # model, variant, outcome...
    t0: float = field(default_factory=time.monotonic)
    wall0: float = field(default_factory=time.time)
    events: list[Event] = field(default_factory=list)

    @classmethod
    def from_container_start(cls, kind: str = "restore", **labels: str) -> "Timeline":
        """Start the clock at the container's start when known (COLDSTART_T0 = wall clock set by the
        entrypoint wrapper), else now."""
        tl = cls(kind=kind, labels=dict(labels))
        t0_wall = os.environ.get("COLDSTART_T0")
        if t0_wall:
            delta = time.time() - float(t0_wall)
            tl.t0 -= max(delta, 0.0)
            tl.wall0 = float(t0_wall)
        tl.mark(EventName.CONTAINER_START if kind != "checkpoint" else EventName.CHECKPOINT_START, at=tl.t0)
        if t0_wall and kind != "checkpoint":
            # the exec time has the kernel tick's resolution (10 ms): rounded to the millisecond, so
            # that two readings of it (COLDSTART_T0 set by the entrypoint itself) give exactly 0
            since = round(exec_wall_time() - float(t0_wall), 3)
            tl.mark(EventName.ENTRYPOINT_START, at=tl.t0 + max(since, 0.0))
            py = float(os.environ.get(PYTHON_T_ENV) or "nan") - float(t0_wall)
            if py >= since - 0.005:  # this process's (not inherited from a parent that was the entrypoint)
                tl.mark(EventName.ENTRY_PYTHON, at=tl.t0 + max(py, since, 0.0))
            tl.mark(EventName.ENTRY_READY)
        return tl

    def mark(self, name: EventName | str, at: float | None = None, **attrs: Any) -> Event:
        now = time.monotonic() if at is None else at
        ev = Event(name=str(getattr(name, "value", name)), t=round(now - self.t0, 6),
                   wall=round(self.wall0 + (now - self.t0), 6), attrs=attrs)
        self.events.append(ev)
        return ev

    def get(self, name: EventName | str) -> Event | None:
        key = str(getattr(name, "value", name))
        for ev in reversed(self.events):
            if ev.name == key:
                return ev
        return None

    def phases(self) -> dict[str, float]:
        """Durations of every phase whose two ends were recorded."""
        out: dict[str, float] = {}
        for phase, (a, b) in PHASES.items():
            ea, eb = self.get(a), self.get(b)
            if ea and eb:
                out[phase] = round(eb.t - ea.t, 6)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "labels": self.labels, "wall0": self.wall0,
                "events": [asdict(e) for e in self.events], "phases": self.phases()}

    def write_jsonl(self, path: Path) -> None:
        """Append one line per event (plus the labels) to ``path``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            for e in self.events:
                f.write(json.dumps({"kind": self.kind, **self.labels, **asdict(e)}) + "\n")

    def table(self):
        """A rich Table of the events (t, delta, attributes)."""
        from rich.table import Table

        tab = Table(title=f"coldstart {self.kind} timeline")
        for col in ("event", "t (s)", "Δ (s)", "details"):
            tab.add_column(col)
        prev = 0.0
        for e in self.events:
            tab.add_row(e.name, f"{e.t:.3f}", f"{e.t - prev:.3f}",
                        " ".join(f"{k}={_brief(v)}" for k, v in e.attrs.items()))
            prev = e.t
        return tab


def _brief(v: Any, width: int = 80) -> str:
    """An attribute as the table shows it: a long list or mapping (the hot layout's early ranges,
    per file) by its size only; ``write_jsonl`` (``--timeline-out``) keeps it whole."""
    text = str(v)
    if len(text) <= width or not isinstance(v, (dict, list, tuple)):
        return text
    return f"({len(v)} {'entries' if isinstance(v, dict) else 'items'})"
