"""The benchmarks sit on top: no stage imports them, and results/ holds data, not the scripts."""
from __future__ import annotations

import ast
from pathlib import Path

import coldstart

PKG = Path(coldstart.__file__).parent
REPO = PKG.parents[1]
STAGES = ("models", "weights", "criu", "warm", "engine", "pipeline", "registry", "containers", "matrix", "metrics")
TOP = {"cli.py", "demo.py"}  # a stage's typer commands and demo sit with the CLI, on top


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_no_stage_module_imports_a_benchmark() -> None:
    offenders = [f"{p.relative_to(PKG)}: {m}" for stage in STAGES for p in sorted((PKG / stage).rglob("*.py"))
                 if p.name not in TOP for m in sorted(_imports(p))
                 if m == "coldstart.bench" or m.startswith("coldstart.bench.")]
    assert not offenders, offenders


def test_results_hold_no_scripts() -> None:
    scripts = [str(p.relative_to(REPO)) for p in (REPO / "results").rglob("*") if p.suffix in (".py", ".sh")]
    assert not scripts, f"scripts belong in experiments/ or scripts/: {scripts}"
