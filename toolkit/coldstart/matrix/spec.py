"""Experiment definitions (experiments/*.toml) parsed into dataclasses.

An experiment is a set of named variants (each a command that produces a timeline, with axis values
that map to command-line options), crossed with models and page-cache states, repeated, in an order
shuffled from a seed. Example (see experiments/default.toml for a full one):

    [experiment]
    name = "default"; seed = 1; repetitions = 3; baseline = "naive"; caches = ["cold", "warm"]
    models = ["tiny"]

    [models.tiny]                     # make = a coldstart.models.tiny size, or path = "/a/model/dir"
    make = "tiny"

    [snapshots.l2]                    # prepared once per model before the timed runs
    command = ["{coldstart}", "checkpoint", "{model_dir}", "--out", "{snapshot}"]

    [axes.criu]                       # axis value -> extra arguments
    stock = ["--criu", "stock"]
    mmap = ["--criu", "patched"]

    [[variants]]
    name = "restore-{criu}"           # a list of values expands to one variant per value
    snapshot = "l2"
    command = ["{python}", "-m", "coldstart.matrix.cells", "restore", "{snapshot}", "--timeline-out", "{timeline}"]
    axes = { criu = ["stock", "mmap"] }
    warm_paths = ["{snapshot}", "{model_dir}"]

Placeholders: {python} {coldstart} {model} {model_dir} {snapshot} {timeline} {run_dir} {variant} {cache} {rep}.
"""
from __future__ import annotations

import itertools
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coldstart.errors import ColdstartError

CACHE_STATES = ("cold", "warm", "asis")  # asis: leave the page cache alone


@dataclass
class ModelSpec:
    name: str
    make: str | None = None  # coldstart.models.tiny size ("tiny", "bench")
    seed: int = 0
    path: str | None = None  # an existing model directory


@dataclass
class SnapshotSpec:
    name: str
    command: list[str]


@dataclass
class Variant:
    name: str
    command: list[str]
    kind: str = "restore"  # restore | cold | command (label only)
    snapshot: str | None = None
    axes: dict[str, str] = field(default_factory=dict)  # axis -> value (after expansion)
    caches: list[str] = field(default_factory=list)
    warm_paths: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float | None = None


@dataclass
class Experiment:
    name: str
    seed: int
    repetitions: int
    baseline: str | None
    caches: list[str]
    models: list[ModelSpec]
    snapshots: dict[str, SnapshotSpec]
    variants: list[Variant]
    description: str = ""
    timeout_s: float = 900.0
    out: str | None = None
    source: Path | None = None

    def cells(self) -> list[tuple[ModelSpec, Variant, str]]:
        """Every (model, variant, cache state) combination, in definition order."""
        return [(m, v, c) for m in self.models for v in self.variants for c in (v.caches or self.caches)]


def _str_list(v: Any, what: str) -> list[str]:
    if isinstance(v, str):
        return [v]
    if not isinstance(v, list) or not all(isinstance(x, (str, int, float)) for x in v):
        raise ColdstartError(f"{what} must be a list of strings")
    return [str(x) for x in v]


def _expand_variant(raw: dict[str, Any], axes: dict[str, dict[str, list[str]]], where: str) -> list[Variant]:
    if "name" not in raw or "command" not in raw:
        raise ColdstartError(f"{where}: a variant needs `name` and `command`")
    command = _str_list(raw["command"], f"{where}.command")
    values = raw.get("axes", {}) or {}
    if not isinstance(values, dict):
        raise ColdstartError(f"{where}.axes must be a table of axis = value or [values]")
    keys = list(values)
    choices = []
    for k in keys:
        if k not in axes:
            raise ColdstartError(f"{where}: unknown axis {k!r} (define [axes.{k}])")
        vals = values[k] if isinstance(values[k], list) else [values[k]]
        for v in vals:
            if str(v) not in axes[k]:
                raise ColdstartError(f"{where}: axis {k!r} has no value {v!r} (known: {', '.join(axes[k])})")
        choices.append([str(v) for v in vals])
    out = []
    for combo in itertools.product(*choices) if keys else [()]:
        picked = dict(zip(keys, combo))
        extra = [a for k, v in picked.items() for a in axes[k][v]]
        try:
            name = str(raw["name"]).format(**picked)
        except KeyError as e:
            raise ColdstartError(f"{where}: variant name uses {e} which is not one of its axes") from None
        caches = _str_list(raw.get("caches", []), f"{where}.caches")
        for c in caches:
            if c not in CACHE_STATES:
                raise ColdstartError(f"{where}: cache state {c!r} is not one of {', '.join(CACHE_STATES)}")
        out.append(Variant(
            name=name, command=command + extra, kind=str(raw.get("kind", "restore")),
            snapshot=raw.get("snapshot"), axes=picked, caches=caches,
            warm_paths=_str_list(raw.get("warm_paths", []), f"{where}.warm_paths"),
            env={str(k): str(v) for k, v in (raw.get("env") or {}).items()},
            timeout_s=float(raw["timeout_s"]) if "timeout_s" in raw else None,
        ))
    return out


def parse_experiment(data: dict[str, Any], source: Path | None = None) -> Experiment:
    where = str(source or "experiment")
    exp = data.get("experiment")
    if not isinstance(exp, dict) or "name" not in exp:
        raise ColdstartError(f"{where}: missing [experiment] table with a name")
    axes_raw = data.get("axes", {}) or {}
    axes: dict[str, dict[str, list[str]]] = {}
    for ax, vals in axes_raw.items():
        if not isinstance(vals, dict):
            raise ColdstartError(f"{where}: [axes.{ax}] must map values to argument lists")
        axes[ax] = {str(k): _str_list(v, f"axes.{ax}.{k}") for k, v in vals.items()}
    models_raw = data.get("models", {}) or {}
    model_names = _str_list(exp.get("models", list(models_raw) or ["tiny"]), "experiment.models")
    models = []
    for mn in model_names:
        m = models_raw.get(mn, {"make": mn})
        if not isinstance(m, dict) or not (m.get("make") or m.get("path")):
            raise ColdstartError(f"{where}: model {mn!r} needs `make` (a tiny-model size) or `path`")
        models.append(ModelSpec(name=mn, make=m.get("make"), seed=int(m.get("seed", 0)), path=m.get("path")))
    snapshots = {}
    for sn, s in (data.get("snapshots", {}) or {}).items():
        if not isinstance(s, dict) or "command" not in s:
            raise ColdstartError(f"{where}: [snapshots.{sn}] needs a command")
        snapshots[sn] = SnapshotSpec(sn, _str_list(s["command"], f"snapshots.{sn}.command"))
    variants: list[Variant] = []
    for i, raw in enumerate(data.get("variants", []) or []):
        variants += _expand_variant(raw, axes, f"{where}: variants[{i}]")
    if not variants:
        raise ColdstartError(f"{where}: no [[variants]]")
    names = [v.name for v in variants]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ColdstartError(f"{where}: duplicate variant names: {', '.join(sorted(dup))}")
    for v in variants:
        if v.snapshot and v.snapshot not in snapshots:
            raise ColdstartError(f"{where}: variant {v.name!r} uses unknown snapshot {v.snapshot!r}")
    caches = _str_list(exp.get("caches", ["asis"]), "experiment.caches")
    for c in caches:
        if c not in CACHE_STATES:
            raise ColdstartError(f"{where}: cache state {c!r} is not one of {', '.join(CACHE_STATES)}")
    baseline = exp.get("baseline")
    if baseline is not None and baseline not in names:
        raise ColdstartError(f"{where}: baseline {baseline!r} is not a variant")
    reps = int(exp.get("repetitions", 3))
    if reps < 1:
        raise ColdstartError(f"{where}: repetitions must be >= 1")
    return Experiment(
        name=str(exp["name"]), seed=int(exp.get("seed", 0)), repetitions=reps, baseline=baseline,
        caches=caches, models=models, snapshots=snapshots, variants=variants,
        description=str(exp.get("description", "")), timeout_s=float(exp.get("timeout_s", 900)),
        out=exp.get("out"), source=source,
    )


def load_experiment(path: Path) -> Experiment:
    """Parse experiments/X.toml; a missing file or a bad definition is a ColdstartError naming it."""
    path = Path(path)
    if not path.is_file():
        raise ColdstartError(f"experiment file not found: {path}")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ColdstartError(f"{path}: not valid TOML ({e})") from None
    return parse_experiment(data, source=path)
