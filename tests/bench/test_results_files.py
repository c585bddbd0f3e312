"""Benchmark outputs are replaced file by file, atomically, and keep the files beside them."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from coldstart import fsutil
from coldstart.fsutil import write_atomic, write_results


def test_write_results_replaces_its_files_and_keeps_the_others(tmp_path: Path) -> None:
    out = tmp_path / "reload"
    out.mkdir()
    (out / "earlier-runs.jsonl").write_text("kept\n")
    (out / "raw.jsonl").write_text("old\n")
    write_results(out, [{"a": 1}, {"b": 2}], "# table\n", "coldstart bench reload --reps 5")
    assert (out / "raw.jsonl").read_text() == '{"a": 1}\n{"b": 2}\n'
    assert (out / "table.md").read_text() == "# table\n"
    assert (out / "COMMAND").read_text() == "coldstart bench reload --reps 5\n"
    assert (out / "earlier-runs.jsonl").read_text() == "kept\n"
    assert sorted(p.name for p in out.iterdir()) == ["COMMAND", "earlier-runs.jsonl", "raw.jsonl", "table.md"]


def test_unserializable_rows_change_nothing(tmp_path: Path) -> None:
    (tmp_path / "raw.jsonl").write_text("old\n")
    with pytest.raises(TypeError):
        write_results(tmp_path, [{"x": object()}], "t", "c")
    assert (tmp_path / "raw.jsonl").read_text() == "old\n"
    assert not (tmp_path / "table.md").exists()


def test_a_failed_rename_leaves_the_old_file_and_no_temp(tmp_path: Path, monkeypatch) -> None:
    f = tmp_path / "table.md"
    f.write_text("old")

    def boom(src, dst):
        raise OSError(28, os.strerror(28))  # ENOSPC-like failure at the last step

    monkeypatch.setattr(fsutil.os, "replace", boom)
    with pytest.raises(OSError):
        write_atomic(f, "new")
    assert f.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["table.md"]
