"""Re-checkpointing an mmap-restored process (patches/criu 0005), owned by the patch author (h3).

After an mmap restore, runs of the process's memory are private mappings of pages-N.img. The
patched dump must save all of that memory as anonymous memory, so the new images restore after
the old ones are gone, with the same contents, including pages the process never touched.
"""
from __future__ import annotations

import pytest

from coldstart.criu.dump import DumpOptions, dump
from coldstart.errors import ColdstartError

from .conftest import DUMP, Held, ropts, start_and_dump


def _restore_or_skip(held: Held, mode: str, pidns: bool = False):
    try:
        return held.restore(ropts(mode, pidns=pidns))
    except ColdstartError as e:
        if "in use" in str(e) or "File exists" in str(e):
            pytest.skip(f"dumped pid reused on this busy host: {e}")
        raise


def test_redump_of_mmap_restored_process_is_self_contained(bins, tmp_path):
    held = start_and_dump(bins["memhold"], ["64", "33"], tmp_path / "a", before=["digest"])
    r = _restore_or_skip(held, "mmap")
    try:
        assert "pages-" in open(f"/proc/{r.pid}/maps").read()  # the restore really mapped the image
        # dump it untouched: its memory is only in the old pages image (a stock dump skips it)
        d2 = dump(r.pid, tmp_path / "b" / "images", DumpOptions(**{**DUMP, "variant": "patched"}))
    finally:
        r.kill()
    assert d2.pages_bytes >= 64 << 20
    # the new images must not refer to the old ones: take the old ones away
    (tmp_path / "a" / "images").rename(tmp_path / "a" / "images.gone")
    held2 = Held(tmp_path / "b" / "images", held.ctl, {"dump": d2})
    for mode in ("stock", "mmap"):
        r2 = _restore_or_skip(held2, mode, pidns=True)
        try:
            assert held.ctl.request(r2.pid, "digest") == held.facts["digest"], mode
            assert held.ctl.request(r2.pid, "verify") == "ok", mode
            assert "images.gone" not in open(f"/proc/{r2.pid}/maps").read()
            # recorded as anonymous memory: a stock restore gives zeros after MADV_DONTNEED
            got = held.ctl.request(r2.pid, f"madv {1 << 20} {1 << 20}")
            assert got == ("zeros" if mode == "stock" else "image"), (mode, got)
        finally:
            r2.kill()
