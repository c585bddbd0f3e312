"""scripts/gpu-pack: the patched CRIU packed for a bare, offline GPU machine (CPU-side checks).

The pack (build/gpu-pack/criu/ and criu.tar.gz) must run from wherever it is copied, with only the
target's glibc, and say in PACK.json exactly what it holds. These tests run the real script (cached:
seconds after the first run) and the packed criu on this host; none needs a GPU.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-pack"
OUT = ROOT / "build" / "gpu-pack"
PACK = OUT / "criu"
TARBALL = OUT / "criu.tar.gz"
MAX_BYTES = 48 * 1024 * 1024
CRIU_BUILD = Path(os.environ.get("COLDSTART_CACHE", "/var/cache/coldstart")) / "criu" / "current-patched"
GLIBC_OWN = ("libc.so", "ld-linux", "libm.so", "libpthread.so", "libdl.so", "librt.so", "linux-vdso")


def run_pack() -> subprocess.CompletedProcess[str]:
    r = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, f"scripts/gpu-pack failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def files_of(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file() and p.name != "PACK.json"}


@pytest.fixture(scope="module")
def pack() -> dict:
    """Runs scripts/gpu-pack once for the module; returns PACK.json."""
    if not (CRIU_BUILD / "sbin" / "criu").is_file():
        pytest.skip("no CRIU build here (make setup runs scripts/build-criu): the pack is made on the build host")
    run_pack()
    return json.loads((PACK / "PACK.json").read_text())


def test_pack_has_the_wrapper_binary_libraries_and_plugin(pack):
    wrapper = PACK / "bin" / "criu"
    assert wrapper.read_text().startswith("#!/bin/sh") and os.access(wrapper, os.X_OK)
    assert (PACK / "libexec" / "criu").read_bytes()[:4] == b"\x7fELF"
    libs = sorted(p.name for p in (PACK / "lib").iterdir())
    assert libs and libs == sorted(lib["soname"] for lib in pack["libs"])
    assert not [p for p in PACK.rglob("*") if p.is_symlink()], "the pack must hold real files only"
    plugin = PACK / "plugins" / "cuda_plugin.so"
    if pack["cuda_plugin"]["built"]:
        assert plugin.read_bytes()[:4] == b"\x7fELF"
    else:
        assert not plugin.exists() and pack["cuda_plugin"]["reason"]
    assert pack["criu_version"] == "4.2.1" and "Version: 4.2.1" in pack["criu_version_output"]
    assert TARBALL.is_file()


def test_pack_leaves_glibc_to_the_target(pack):
    shipped = [p.name for p in (PACK / "lib").iterdir()]
    assert not [n for n in shipped if n.startswith(GLIBC_OWN)], shipped
    assert "libc.so.6" in pack["from_target"]
    # the target has glibc >= 2.39; every packed ELF must be satisfied by it
    major, minor = map(int, pack["glibc_min"].split(".")[:2])
    assert (major, minor) <= (2, 39)


def test_pack_json_sha256s_match_the_files(pack):
    assert files_of(PACK) == set(pack["files"])
    for rel, f in pack["files"].items():
        assert sha256(PACK / rel) == f["sha256"], rel
        assert (PACK / rel).stat().st_size == f["bytes"], rel
    assert pack["total_bytes"] == sum(f["bytes"] for f in pack["files"].values())
    for lib in pack["libs"]:
        assert lib["path"] in pack["files"] and lib["real_path"] and lib["ldd_path"]


def test_pack_fits_the_size_limit(pack):
    assert pack["total_bytes"] <= MAX_BYTES
    assert sum(p.stat().st_size for p in PACK.rglob("*") if p.is_file()) <= MAX_BYTES


def test_tarball_holds_the_same_pack(pack, tmp_path):
    with tarfile.open(TARBALL) as t:
        t.extractall(tmp_path, filter="tar")
    assert files_of(tmp_path / "criu") == set(pack["files"])
    assert (tmp_path / "criu" / "PACK.json").read_bytes() == (PACK / "PACK.json").read_bytes()
    for rel, f in pack["files"].items():
        assert sha256(tmp_path / "criu" / rel) == f["sha256"], rel


def test_wrapper_runs_from_a_moved_copy_with_an_empty_environment(pack, tmp_path):
    shutil.copytree(PACK, tmp_path / "a" / "criu", symlinks=True)
    moved = tmp_path / "b" / "criu"
    moved.parent.mkdir()
    (tmp_path / "a" / "criu").rename(moved)
    r = subprocess.run([str(moved / "bin" / "criu"), "--version"], env={}, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == pack["criu_version_output"] + "\n", r.stderr
    # a symlink to the wrapper finds its pack too; every library but glibc's comes from the copy
    link = tmp_path / "criu-link"
    link.symlink_to(moved / "bin" / "criu")
    r = subprocess.run([str(link), "--version"], env={"LD_DEBUG": "libs"}, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    loaded = {line.split("calling init: ")[1].strip() for line in r.stderr.splitlines() if "calling init: " in line}
    for lib in pack["libs"]:
        assert any(p.endswith("/lib/" + lib["soname"]) and p.startswith(str(moved)) for p in loaded), lib["soname"]


def test_cuda_plugin_loads_from_the_pack(pack, tmp_path):
    """A dump of a sleeping process with `-L <pack>/plugins` loads the plugin (which, with no GPU
    here, disables itself)."""
    if not pack["cuda_plugin"]["built"]:
        pytest.skip(f"no cuda plugin in the pack: {pack['cuda_plugin']['reason']}")
    if os.geteuid() != 0:
        pytest.skip("criu dump needs root")
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        r = subprocess.run([str(PACK / "bin" / "criu"), "dump", "-t", str(proc.pid), "-D", str(tmp_path),
                            "-L", str(PACK / "plugins"), "-v4", "-o", "dump.log"],
                           capture_output=True, text=True, timeout=120)
        log = (tmp_path / "dump.log").read_text()
        assert r.returncode == 0, log[-2000:]
        assert 'Plugin "cuda_plugin"' in log
        assert "cuda_plugin: " in log  # its init ran: "No GPU device found; ..." on this host
    finally:
        proc.kill()
        proc.wait()


def test_second_run_is_a_noop(pack):
    def state() -> dict[str, tuple[int, int]]:
        paths = [OUT / "criu", TARBALL, *PACK.rglob("*")]
        return {str(p): (p.stat().st_ino, p.stat().st_mtime_ns) for p in paths}

    before = state()
    r = run_pack()
    ours = [line for line in r.stdout.splitlines() if "[gpu-pack]" in line]
    assert len(ours) == 1 and "cached:" in ours[0] and "nothing to do" in ours[0], r.stdout
    assert state() == before
