"""criu.server.ensure_kerndat: CRIU's kernel facts probed once per node and security setting, then
copied into each new mount namespace's empty /dev/shm (as a new container has), where criu loads them."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import xxhash

# one process in a new mount namespace with its own empty /dev/shm, like a new container
_CHILD = """
import json, subprocess, sys
from coldstart.criu import server
criu, log = sys.argv[1], sys.argv[2]
came = server.ensure_kerndat(criu)
check = subprocess.run([criu, "check", "-v4", "-o", log], capture_output=True, text=True)
print(json.dumps({"came": came, "check": check.stdout.strip(), "key": server.kdat_key(criu)}))
"""


def _fresh_shm(criu: Path, node: Path, log: Path, *, drop_cap: str | None = None) -> dict:
    run = [sys.executable, "-c", _CHILD, str(criu), str(log)]
    if drop_cap:  # the same process lacking one capability: other facts may hold (e.g. loginuid)
        run = ["setpriv", f"--bounding-set=-{drop_cap}", *run]
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
           'mount -t tmpfs none /dev/shm && exec "$@"', "sh", *run]
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "COLDSTART_NODE_DIR": str(node),
           "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "toolkit")}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_kernel_facts_are_probed_once_per_node_and_loaded_from_there(criu_paths, tmp_path):
    criu, node = criu_paths["patched"], tmp_path / "node"
    first = _fresh_shm(criu, node, tmp_path / "1.log")
    assert first["came"] == "probed" and first["check"] == "Looks good.", first
    kept = list((node / "criu-kdat").glob("*/*"))
    assert [p.parent.name for p in kept] == [first["key"]], kept
    second = _fresh_shm(criu, node, tmp_path / "2.log")
    assert second["came"] == "node" and second["check"] == "Looks good.", second
    assert "Loaded kdat cache from" in (tmp_path / "2.log").read_text()  # criu took the copy as valid


def test_a_process_with_other_capabilities_probes_its_own(criu_paths, tmp_path):
    criu, node = criu_paths["patched"], tmp_path / "node"
    full = _fresh_shm(criu, node, tmp_path / "1.log")
    less = _fresh_shm(criu, node, tmp_path / "2.log", drop_cap="audit_control")
    assert less["came"] == "probed" and less["key"] != full["key"], (full, less)
    assert len(list((node / "criu-kdat").iterdir())) == 2


def test_a_damaged_copy_on_the_node_is_not_used_and_is_written_again(criu_paths, tmp_path):
    criu, node = criu_paths["patched"], tmp_path / "node"
    first = _fresh_shm(criu, node, tmp_path / "1.log")
    (kept,) = (node / "criu-kdat" / first["key"]).iterdir()
    good = kept.read_bytes()
    kept.write_bytes(good[: len(good) // 2])  # truncated (a full disk, a killed copy)
    again = _fresh_shm(criu, node, tmp_path / "2.log")
    assert again["came"] == "probed" and again["check"] == "Looks good.", again
    (rewritten,) = (node / "criu-kdat" / first["key"]).iterdir()  # (a probe's bytes may differ: padding)
    assert len(rewritten.read_bytes()) == len(good)
    assert rewritten.suffix[1:] == xxhash.xxh3_64(rewritten.read_bytes()).hexdigest()


def test_after_a_failed_restore_the_copy_it_used_is_forgotten(tmp_path, monkeypatch):
    """A CRIU failure with the node's facts removes that copy (pipeline.restore calls
    forget_node_kerndat), so the next restore probes; the facts found there are never probed here."""
    from coldstart.criu import server

    shm, node = tmp_path / "shm", tmp_path / "node"
    shm.mkdir()
    monkeypatch.setattr(server, "KDAT_FILES", (str(shm / "criu.kdat"),))
    monkeypatch.setenv("COLDSTART_NODE_DIR", str(node))
    facts = b"kernel facts as criu wrote them"
    key_dir = node / "criu-kdat" / server.kdat_key(sys.executable)  # any binary: the key only stats it
    key_dir.mkdir(parents=True)
    copy = key_dir / f"{server._kdat_name(str(shm / 'criu.kdat'))}.{xxhash.xxh3_64(facts).hexdigest()}"
    copy.write_bytes(facts)
    assert server.ensure_kerndat(sys.executable) == "node" and (shm / "criu.kdat").read_bytes() == facts
    assert server.forget_node_kerndat() and not copy.exists()
    assert not server.forget_node_kerndat()  # once
