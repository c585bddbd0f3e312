"""`bench lazy --container`: its table says that every start went through a container, and what the
containers cannot take is refused in one line before anything is checkpointed."""
from __future__ import annotations

import subprocess
import sys

from coldstart.bench.lazy import CONTAINER_NOTE, render


def _rows() -> list[dict]:
    art = {"size": "tiny-hot", "rate_gbit": 1.0, "method": "artifact", "bytes": 2 << 30, "file_bytes": 2 << 30,
           "chunks": 10, "packs": 1, "profiled_bytes": 1 << 30, "profiled_file_bytes": 1 << 30}
    starts = [{"size": "tiny-hot", "rate_gbit": 1.0, "rep": 0, "method": m, "first_token_s": t, "link_bytes": b}
              for m, t, b in (("pull", 30.0, 2 << 30), ("lazy+prefetch", 15.0, 1 << 30), ("local", 1.0, None))]
    return [art, *starts]


def test_the_container_table_says_its_starts_were_container_restores() -> None:
    text = render(_rows(), "Host: x", "coldstart bench lazy --container", container=True)
    assert text.splitlines()[0].endswith(", in containers")
    assert CONTAINER_NOTE in text
    assert "| tiny-hot | 1 Gbit/s | 2048 | 30.00 | - | 15.00 |" in text
    assert CONTAINER_NOTE not in render(_rows(), "Host: x", "coldstart bench lazy")


def test_nydus_through_containers_is_one_line_before_any_work(tmp_path) -> None:
    p = subprocess.run([sys.executable, "-m", "coldstart", "bench", "lazy", "--container", "--methods", "lazy,nydus",
                        "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert p.stderr.strip().splitlines()[-1] == (
        "error: --container: not with nydus, --runtime or --packed (the image carries the runtime)"), p.stderr
    assert not (tmp_path / "work").exists() and not (tmp_path / "out").exists()
