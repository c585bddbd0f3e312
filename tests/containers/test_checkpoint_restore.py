"""A snapshot taken inside a container restores in new least-privilege containers from a read-only
mount: one serves the canary's completion through its published port and turns healthy; three at
once all restore; one lacking a required capability says which and still serves (cold boot)."""
from __future__ import annotations

import json
import re
import shutil
import time
import urllib.request
from pathlib import Path

import pytest

from coldstart.containers import docker_api, run
from coldstart.engine.launcher import free_port

DOCS = Path(__file__).resolve().parents[2] / "docs" / "containers.md"


@pytest.fixture(scope="session")
def container_snapshot(docker_client, app_image, tiny_model_dir, tmp_path_factory):
    # the images as dumped: the session's host snapshot has the default (hot) layout, so the
    # dumped one is exercised end to end here; test_a_hot_layout_... covers hot in containers
    res = run.checkpoint(docker_client, app_image.tag, tiny_model_dir, tmp_path_factory.mktemp("csnap") / "tiny",
                         extra=["--layout", "dumped"])
    assert res.exit_code == 0, res.logs[-3000:]
    assert (res.snapshot / "manifest.json").exists()
    assert json.loads((res.snapshot / "manifest.json").read_text())["server_caps"] == []
    assert sorted(res.caps) == run.CHECKPOINT_CAPS_DUMPED  # no restore runs in it: the smaller set
    yield res.snapshot
    shutil.rmtree(res.snapshot.parent, ignore_errors=True)  # 2.4 GB: pytest keeps three sessions' tmp dirs


def _completion(port: int, model: str) -> dict:
    body = json.dumps({"model": model, "prompt": "hello", "max_tokens": 4, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def _remove(docker_client, name: str | None) -> None:
    """Remove container ``name`` if there is one (a command may have failed before it made it)."""
    import docker

    try:
        if name:
            docker_client.containers.get(name).remove(force=True)
    except docker.errors.NotFound:
        pass


def _summary(ctr, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    logs = ""
    while time.monotonic() < deadline:
        logs = ctr.logs().decode(errors="replace")
        line = next((ln for ln in logs.splitlines() if ln.startswith('{"url"')), None)
        if line:
            return json.loads(line)
        ctr.reload()
        assert ctr.status in ("created", "running"), logs[-3000:]
        time.sleep(0.2)
    raise AssertionError(f"no summary line in {timeout:.0f} s: {logs[-3000:]}")


def _restores_and_serves(ctr, port: int, model: Path) -> dict:
    """The container's entrypoint restored (canary passed) and a completion comes back through its port."""
    summary = _summary(ctr, 240)
    assert summary["restored"] is True and summary["canary_ok"] is True, summary
    assert _completion(port, str(model))["choices"][0]["text"]
    return summary


@pytest.mark.parametrize("runtime", ["default", "crun"])
def test_restore_in_a_new_container_from_a_read_only_mount(docker_client, app_image, container_snapshot,
                                                           tiny_model_dir, runtime, monkeypatch):
    """Under the daemon's default OCI runtime (runc) and under crun, where the daemon knows it (a node
    may run either; the snapshot was checkpointed under the default)."""
    facts = docker_api.daemon_facts(docker_client)
    if runtime not in facts.runtimes + ["default"]:
        pytest.skip(f"the daemon does not know {runtime} (scripts/start-docker registers it where it can run)")
    monkeypatch.setenv(docker_api.RUNTIME_ENV, runtime)
    monkeypatch.setattr(docker_api, "_runtimes_seen", {})  # chosen once per daemon: choose again
    port = free_port()
    ctr = run.start_restore(docker_client, app_image.tag, container_snapshot, tiny_model_dir, port)
    try:
        assert ctr.attrs["HostConfig"]["Runtime"] == (facts.runtime if runtime == "default" else runtime)
        summary = _summary(ctr, 240)
        assert summary["restored"] is True and summary["canary_ok"] is True, summary
        ev = summary["events"]  # no COLDSTART_T0 given: the clock starts at the entrypoint's exec
        assert ev["ENTRYPOINT_START"] == 0 and 0 < ev["ENTRY_READY"] < ev["FIRST_TOKEN"], ev
        assert 0 <= ev["ENTRY_PYTHON"] <= ev["ENTRY_READY"], ev  # runc's init execs python after docker's start
        # the server restored into the container's own network serves its port: no relay in between
        attrs = summary["attrs"]
        assert attrs["RESTORE_ISSUED"]["net"] == "host" and attrs["READY"]["gate"] == "opened", attrs
        out = _completion(port, str(tiny_model_dir))
        assert out["choices"][0]["text"], out
        deadline = time.monotonic() + 30
        while ctr.attrs["State"].get("Health", {}).get("Status") != "healthy" and time.monotonic() < deadline:
            time.sleep(0.5)
            ctr.reload()
        assert ctr.attrs["State"]["Health"]["Status"] == "healthy", ctr.attrs["State"].get("Health")
        caps = ctr.attrs["HostConfig"]
        assert caps["CapDrop"] == ["ALL"] and sorted(caps["CapAdd"]) == run.RESTORE_CAPS
        assert not any("seccomp=unconfined" in o for o in caps.get("SecurityOpt") or [])
    finally:
        ctr.remove(force=True)


# Run in the restore's container instead of its entrypoint: the same restore, with probes of the
# server's port before the canary: from the container's own address on the bridge and from loopback
# without the control token (as a pod's sidecar), each in a thread of its own, and one with the token
# (as the restore's own checks); after it, the network is let in and the dev-mode routes still ask
# for the token, from loopback too.
_GATE_PROBE = """
import json, socket, threading, time, urllib.error, urllib.request
from pathlib import Path
from coldstart.engine.gate import TOKEN_HEADER
from coldstart.pipeline.manifest import read_manifest
from coldstart.pipeline.restore import RestoreOptions, restore

def status(host, path="/v1/models", token=None, method="GET"):
    req = urllib.request.Request(f"http://{host}:8000{path}", method=method,
                                 headers={TOKEN_HEADER: token} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code

me = socket.gethostbyname(socket.gethostname())
token = read_manifest(Path("/snapshot")).control_token
seen, answered, threads = {}, {}, []

def before_canary(eng):
    for name, host in (("network", me), ("loopback", "127.0.0.1")):
        threads.append(threading.Thread(target=lambda n=name, h=host: answered.update({n: status(h)})))
        threads[-1].start()
    seen["token"] = status("127.0.0.1", token=token)
    time.sleep(1)
    seen["held"] = sorted(n for n in ("network", "loopback") if n not in answered)

res = restore(RestoreOptions(snapshot=Path("/snapshot"), fallback=False, before_canary=before_canary))
for t in threads:
    t.join(60)
seen.update(answered, restored=res.restored, after=status(me), sleep=status("127.0.0.1", "/sleep", method="POST"),
            state=status("127.0.0.1", "/is_sleeping", token=token))
print("GATE " + json.dumps(seen), flush=True)
"""


def test_the_restored_servers_port_answers_the_network_only_after_the_canary(docker_client, app_image,
                                                                              container_snapshot, tiny_model_dir):
    """Restored into the container's network, the server listens on the container's port from the
    start; until the canary passed it holds every request without the snapshot's control token, from
    the network or from loopback (a pod's sidecar shares it), and answers them once it passed, while
    the restore's own checks, which carry it, go through. vLLM's dev-mode routes ask for the token
    after that too."""
    ctr = run.create_restore(docker_client, app_image.tag, container_snapshot, tiny_model_dir, free_port(),
                             entrypoint=["python", "-c", _GATE_PROBE])
    try:
        ctr.start()
        assert ctr.wait(timeout=240)["StatusCode"] == 0, ctr.logs().decode(errors="replace")[-3000:]
        logs = ctr.logs().decode(errors="replace")
        line = next(ln for ln in logs.splitlines() if ln.startswith("GATE "))
        assert json.loads(line[5:]) == {"held": ["loopback", "network"], "network": 200, "loopback": 200, "token": 200,
                                        "restored": True, "after": 200, "sleep": 403, "state": 200}, logs[-2000:]
    finally:
        ctr.remove(force=True)


def test_host_warms_the_restores_helpers_and_the_snapshots_metadata_first(docker_client, app_image,
                                                                         container_snapshot):
    """The image lists the programs the restore's wrapper runs and their libraries; the host reads
    them through the image's layers, with the snapshot's small files, beside its bulk reads (which
    start at once, not at docker's start call)."""
    from coldstart.containers import docker_api

    layers = docker_api.image_layers(docker_client, app_image.tag)
    remap = docker_api.layer_remap(layers)
    listed = remap(Path("/opt/coldstart/restore-files")).read_text().split()
    names = {Path(p).name for p in listed}
    assert {"criu", "unshare", "dash", "mount", "setsid"} <= names and any(n.startswith("libc.so") for n in names), listed
    files = run.early_files(container_snapshot, remap)
    assert container_snapshot / "manifest.json" in files and container_snapshot / "criu" / "inventory.img" in files
    assert remap(Path("/usr/local/sbin/criu")) in files and all(remap(Path(p)).is_file() for p in listed)
    assert not any(f.name.startswith("pages-") for f in files)
    w = run.HostWarm(container_snapshot, layers)  # no container_started(): the bulk reads do not wait for it
    w.wait(120)
    assert w.error is None and w.early["files"] >= len(listed) and w.early["bytes"] > 10 << 20, w.early
    assert w.stats is not None and w.stats.bytes > 0


def test_the_entry_probe_times_the_entrypoints_start_in_the_restores_container(docker_client, app_image,
                                                                              container_snapshot, tiny_model_dir):
    """bench container's entry probe: the restore's container running only what the entrypoint does
    before ENTRY_READY, timed from the create call; with the host warming, the warmer is stopped when
    the probe ends and its record kept."""
    from coldstart.bench.containers import one_start
    from coldstart.containers import docker_api

    layers = docker_api.image_layers(docker_client, app_image.tag)
    row = one_start(docker_client, app_image.tag, "entry", tiny_model_dir, container_snapshot, layers)
    assert "error" not in row, row
    assert 0 < row["created_s"] <= row["exec_s"] <= row["entry_s"] < 60, row
    row = one_start(docker_client, app_image.tag, "entry+hostwarm", tiny_model_dir, container_snapshot, layers)
    assert "error" not in row and row["exec_s"] <= row["entry_s"], row
    assert row["host_warm"]["error"] is None and row["host_warm"]["early"]["files"] > 0, row


def test_the_early_files_of_a_hot_layout_include_the_parents_pagemaps(tmp_path):
    snap = tmp_path / "snap"
    (snap / "criu" / "parent").mkdir(parents=True)
    for rel in ("manifest.json", "criu/inventory.img", "criu/pagemap-1.img", "criu/pages-1.img",
                "criu/parent/pagemap-1.img", "criu/parent/pages-1.img"):
        (snap / rel).write_bytes(b"x")
    files = run.early_files(snap)
    assert snap / "criu" / "parent" / "pagemap-1.img" in files and snap / "criu" / "pagemap-1.img" in files
    assert not any(f.name.startswith("pages-") for f in files)


def test_the_host_reads_the_hot_childs_pages_at_once_only_on_a_node_that_holds_the_image(tmp_path, monkeypatch):
    """HostWarm's head reader: with the image's criu in the page cache (a node that runs containers)
    it reads the hot layout's largest page file whole from the create call; with it evicted (a cold
    node, where those reads would hold back docker's and the entrypoint's own) it reads nothing;
    "on" reads either way, "off" starts no reader; a small child page file and a dumped layout are
    left to the bulk reader."""
    import os

    from coldstart.warm.residency import evict, range_resident

    snap = tmp_path / "snap"
    (snap / "criu" / "parent").mkdir(parents=True)
    child, small = snap / "criu" / "pages-3.img", snap / "criu" / "pages-1.img"
    child.write_bytes(b"\x01" * (24 << 20))
    small.write_bytes(b"\x02" * (1 << 20))
    layer = tmp_path / "layer"
    criu = layer / run.IMAGE_CRIU.lstrip("/")
    criu.parent.mkdir(parents=True)
    criu.write_bytes(b"\x7fELF" + b"\x00" * (4 << 20))
    os.sync()  # written back, so that an eviction drops them

    def head(mode: str) -> dict | None:
        evict(child)
        w = run.HostWarm(snap, [layer], early=False, head=mode)
        w.wait(60)
        return w.head

    def child_cached() -> bool:
        fd = os.open(child, os.O_RDONLY)
        try:
            return range_resident(fd, 0, child.stat().st_size)
        finally:
            os.close(fd)

    criu.read_bytes()
    assert "under" in head("auto")["skipped"]  # 24 MiB: below HEAD_MIN
    monkeypatch.setattr(run, "HEAD_MIN", 16 << 20)
    evict(criu)
    got = head("auto")
    assert got["bytes"] == 0 and "not in the page cache" in got["skipped"], got
    criu.read_bytes()  # the image's files as a restore before left them
    got = head("auto")
    assert got["skipped"] is None and got["bytes"] == child.stat().st_size and child_cached(), got
    evict(criu)
    assert head("on")["bytes"] == child.stat().st_size
    assert head("off") is None
    (snap / "criu" / "parent").rmdir()
    criu.read_bytes()
    assert head("auto")["skipped"] == "not a hot layout"
    with pytest.raises(ValueError, match="head"):
        run.HostWarm(snap, [layer], early=False, head="maybe")


def test_the_host_reads_the_entrypoints_libraries_before_its_modules(tmp_path, monkeypatch):
    """The profile records the entrypoint's modules in import order and its mapped files after them
    (address order); the early reader takes the interpreter's libraries first, then the extension
    modules, then the modules as recorded."""
    from coldstart.warm.profile import Profile, ProfileRange

    snap = tmp_path / "snap"
    (snap / "criu").mkdir(parents=True)
    (snap / "manifest.json").write_text("{}")
    lib = "/root/.pyenv/versions/3.11.7/lib"
    own = [f"{lib}/python3.11/encodings/__init__.py", f"{lib}/python3.11/__pycache__/abc.cpython-311.pyc",
           f"{lib}/python3.11/lib-dynload/_json.cpython-311-x86_64-linux-gnu.so",
           "/opt/venv/lib/python3.11/site-packages/xxhash/_xxhash.cpython-311-x86_64-linux-gnu.so",
           "/usr/lib/x86_64-linux-gnu/libc.so.6", f"{lib}/libpython3.11.so.1.0"]
    prof = Profile(snapshot_id="x", files={f: 1 for f in own},
                   ranges=[ProfileRange(file=f, offset=0, length=1, t=0.0, source="process") for f in own])
    monkeypatch.setattr(run._snapshot, "node_profile", lambda s: prof.save(tmp_path / "profile.json"))
    layers = tmp_path / "layers"
    files = run.early_files(snap, remap=lambda p: layers / p.relative_to("/"))
    got = [str(f.relative_to(layers)) for f in files if f.is_relative_to(layers)]
    assert got[:len(own)] == [own[i].lstrip("/") for i in (4, 5, 2, 3, 0, 1)], got


def test_three_containers_restore_the_same_read_only_snapshot_at_once(docker_client, app_image, container_snapshot,
                                                                      tiny_model_dir):
    ports = [free_port() for _ in range(3)]
    ctrs = [run.create_restore(docker_client, app_image.tag, container_snapshot, tiny_model_dir, p) for p in ports]
    try:
        for ctr in ctrs:
            ctr.start()
        summaries = [_summary(ctr, 300) for ctr in ctrs]
        assert [s["restored"] for s in summaries] == [True] * 3, summaries
        assert all(s["canary_ok"] for s in summaries), summaries
        texts = [_completion(p, str(tiny_model_dir))["choices"][0]["text"] for p in ports]
        assert len(set(texts)) == 1 and texts[0], texts  # greedy, same weights: the same answer
    finally:
        for ctr in ctrs:
            ctr.remove(force=True)


def test_a_restore_in_a_pods_network_namespace_serves_through_the_pods_port(docker_host, docker_client, app_image,
                                                                            container_snapshot, tiny_model_dir):
    """As kubelet runs a pod's containers: `coldstart container pod` starts the pod's sandbox, which holds
    the network namespace and the port; `container restore --pod` joins it (no network of its own) and
    serves through the pod's port. A pod that is not there, or a --port that is not the pod's, is one
    line before any container is made."""
    import os
    import subprocess
    import sys

    def cs(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "coldstart", "container", *args, "--host", docker_host],
                              capture_output=True, text=True, timeout=timeout)

    port = free_port()
    pod_name, name = f"coldstart-test-pod-{os.getpid()}", f"coldstart-test-in-pod-{os.getpid()}"
    try:
        p = cs("pod", "--port", str(port), "--name", pod_name)
        assert p.returncode == 0, p.stderr[-3000:]
        made = json.loads(p.stdout.strip().splitlines()[-1])
        assert made["pod"] == pod_name and made["url"] == f"http://127.0.0.1:{port}", made
        for args, says in ((["--pod", f"{pod_name}-gone"], f"docker has no container {pod_name}-gone"),
                           (["--pod", pod_name, "--port", str(port + 1)],
                            f"--port {port + 1}: pod {pod_name} publishes the server's port on {port}")):
            p = cs("restore", str(container_snapshot), "--model", str(tiny_model_dir), *args, timeout=120)
            lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
            assert p.returncode != 0 and len(lines) == 1 and says in lines[0], p.stderr[-2000:]
        p = cs("restore", str(container_snapshot), "--model", str(tiny_model_dir), "--pod", pod_name,
               "--name", name)
        assert p.returncode == 0, p.stderr[-3000:]
        out = json.loads(p.stdout.strip().splitlines()[-1])
        assert out["restored"] is True and out["canary_ok"], out
        assert out["url"] == f"http://127.0.0.1:{port}", out
        ctr = docker_client.containers.get(name)
        assert ctr.attrs["HostConfig"]["NetworkMode"] == f"container:{docker_client.containers.get(pod_name).id}"
        assert _completion(port, str(tiny_model_dir))["choices"][0]["text"]
    finally:
        _remove(docker_client, name)
        _remove(docker_client, pod_name)


def test_a_missing_capability_is_named_and_the_cold_boot_serves(docker_client, app_image, container_snapshot,
                                                                tiny_model_dir):
    port = free_port()
    ctr = run.start_restore(docker_client, app_image.tag, container_snapshot, tiny_model_dir, port,
                            security=run.security_without("SYS_TIME"))
    try:
        summary = _summary(ctr, 600)
        assert summary["restored"] is False, summary
        assert "CAP_SYS_TIME" in summary["fallback_reason"], summary
        assert "fallback: this container lacks CAP_SYS_TIME" in ctr.logs().decode(errors="replace")
        out = _completion(port, str(tiny_model_dir))
        assert out["choices"][0]["text"], out
    finally:
        ctr.remove(force=True)


def _caps_in_docs(heading: str, row: str = "") -> list[str]:
    """The capabilities of the table under ``heading`` (those whose row contains ``row``)."""
    text = DOCS.read_text()
    section = text.split(heading, 1)[1].split("\n#", 1)[0]
    return sorted(re.findall(r"^\| `CAP_([A-Z_]+)`[^\n]*" + re.escape(row), section, flags=re.M))


def test_the_capability_lists_in_the_docs_are_what_the_containers_get():
    assert _caps_in_docs("### The restore container's capabilities") == run.RESTORE_CAPS
    assert _caps_in_docs("### The checkpoint container's capabilities") == run.CHECKPOINT_CAPS
    assert _caps_in_docs("### The checkpoint container's capabilities", "| both |") == run.CHECKPOINT_CAPS_DUMPED
    assert run.checkpoint_security(["--layout", "dumped"])["cap_add"] == run.CHECKPOINT_CAPS_DUMPED
    assert run.checkpoint_security(["--layout=dumped"])["cap_add"] == run.CHECKPOINT_CAPS_DUMPED
    assert run.checkpoint_security([])["cap_add"] == run.CHECKPOINT_CAPS


def test_restore_in_a_container_from_a_lazy_registry_mount(docker_client, app_image, container_snapshot,
                                                           tiny_model_dir, tmp_path, monkeypatch):
    """The fleet path: the snapshot pushed to a registry, mounted lazily on the host (empty chunk
    cache), the mount bound read-only into a least-privilege container that restores from it."""
    from coldstart.registry import artifact, mount, server

    srv = server.start(tmp_path / "registry", free_port())
    try:
        ref = f"{srv.host}/snapshots/container-tiny:v1"
        artifact.push(container_snapshot, ref)
        monkeypatch.setenv("COLDSTART_LAZY_CACHE", str(tmp_path / "lazy-cache"))
        mnt = mount.mount(ref, tmp_path / "mnt")
        port = free_port()
        ctr = run.start_restore(docker_client, app_image.tag, mnt.mountpoint, tiny_model_dir, port,
                                env={"COLDSTART_VERIFY": "off"})  # the mount checks every chunk it serves
        try:
            _restores_and_serves(ctr, port, tiny_model_dir)
        finally:
            ctr.remove(force=True)
            mnt.unmount()
    finally:
        srv.stop()


def test_a_chunk_the_registry_serves_damaged_is_named_in_a_container_before_and_after_ready(
        docker_host, docker_client, app_image, container_snapshot, tiny_model_dir, tmp_path, monkeypatch):
    """The snapshot mounted lazily on the host (prefetching nothing by itself: COLDSTART_LAZY_PREFETCH=none)
    and bound into the container with the daemon's log and index. A first restore (``--no-warm``)
    shows which chunks of the largest pages image a restore reads; one in the middle of the longest
    run it did not read is then damaged in the registry. `coldstart container restore REF` serves
    restored; the host's daemon, asked for every chunk, finds that one bad, and the entrypoint in the
    container stops the restored server and cold-boots on the same port, naming the chunk, its file
    and the reference. Then CRIU's process-tree image damaged instead (a chunk every restore reads,
    a fresh chunk cache): the fallback's reason names it before CRIU's symptom."""
    import os
    import signal
    import subprocess
    import sys

    import psutil

    from coldstart.registry import artifact, server
    from coldstart.registry.distribution import Ref, Registry

    srv = server.start(tmp_path / "registry", free_port())
    name = f"coldstart-test-damage-{os.getpid()}"
    for k, sub in (("COLDSTART_LAZY_CACHE", "lazy-cache"), ("COLDSTART_STATE_DIR", "state")):
        monkeypatch.setenv(k, str(tmp_path / sub))
    monkeypatch.setenv("COLDSTART_LAZY_PREFETCH", "none")
    mnt = ctr = None

    def damage(c) -> str:  # one byte of chunk c flipped in its pack; how a fallback names it (file: {})
        blob = srv.blob_path(index.packs[c.pack].digest)
        data = bytearray(blob.read_bytes())
        data[c.offset + c.stored // 2] ^= 0xFF
        blob.write_bytes(bytes(data))
        return f"chunk {c.digest[:19]} of {{}} of {ref} failed its digest twice: the registry serves it damaged"

    try:
        ref = f"{srv.host}/snapshots/container-damage:v1"
        artifact.push(container_snapshot, ref)
        index, _, _ = artifact.fetch_index(Registry(Ref.parse(ref)))
        e = max((e for e in index.entries if re.fullmatch(r"criu/pages-\d+\.img", e.path)), key=lambda e: e.size)
        elsewhere = {ci for o in index.entries if o is not e for ci in o.chunks}

        def unread(ci):  # not in the node's chunk cache, nor in another file
            hexd = index.chunks[ci].digest.split(":", 1)[1]
            return ci not in elsewhere and not (tmp_path / "lazy-cache" / "chunks" / hexd[:2] / hexd).exists()

        mnt = run.mount_for_container(ref)
        ctr = run.start_restore(docker_client, app_image.tag, mnt.mountpoint, tiny_model_dir, free_port(),
                                env={"COLDSTART_VERIFY": "off"}, extra=["--no-warm"], lazy=mnt)
        assert _summary(ctr, 240)["restored"] is True
        ctr.remove(force=True)
        mnt.unmount()
        runs, cur = [], []
        for ci in e.chunks + [None]:
            if ci is not None and unread(ci):
                cur.append(ci)
            elif cur:
                runs.append(cur)
                cur = []
        longest = max(runs, key=len)
        named = damage(index.chunks[longest[len(longest) // 2]])

        port = free_port()
        p = subprocess.run([sys.executable, "-m", "coldstart", "container", "restore", ref, "--model",
                            str(tiny_model_dir), "--port", str(port), "--name", name, "--host", docker_host],
                           capture_output=True, text=True, timeout=600, env=dict(os.environ))
        assert p.returncode == 0, p.stderr[-3000:]
        assert json.loads(p.stdout.strip().splitlines()[-1])["restored"] is True, p.stdout[-2000:]
        at = next(ln for ln in p.stderr.splitlines() if ln.startswith("mounted ")).split(" at ")[1].split()[0]
        daemon = next(q for q in psutil.process_iter(["cmdline"]) if at in (q.info["cmdline"] or []))
        daemon.send_signal(signal.SIGUSR1)  # Mount.fetch_all: every chunk, now
        named_ctr = docker_client.containers.get(name)
        deadline = time.monotonic() + 600
        while "(cold boot)" not in (logs := named_ctr.logs().decode(errors="replace")):
            named_ctr.reload()
            assert named_ctr.status == "running" and time.monotonic() < deadline, logs[-3000:]
            time.sleep(0.5)
        assert f"fallback: after READY: {named.format(e.path)}, and the restored server maps it" in logs, logs[-3000:]
        assert _completion(port, str(tiny_model_dir))["choices"][0]["text"]  # the cold boot, same port
        named_ctr.remove(force=True)

        pst = next(x for x in index.entries if x.path == "criu/pstree.img")
        named = damage(index.chunks[pst.chunks[0]])
        monkeypatch.setenv("COLDSTART_LAZY_CACHE", str(tmp_path / "lazy-cache-2"))  # (the first has it)
        mnt = run.mount_for_container(ref)
        port = free_port()
        ctr = run.start_restore(docker_client, app_image.tag, mnt.mountpoint, tiny_model_dir, port,
                                env={"COLDSTART_VERIFY": "off"}, lazy=mnt)
        summ = _summary(ctr, 240)
        assert summ["restored"] is False and summ["fallback_reason"].startswith(
            named.format("criu/pstree.img") + " ("), summ
        assert _completion(port, str(tiny_model_dir))["choices"][0]["text"]  # the cold boot
    finally:
        for n in (name, ctr.name if ctr is not None else None):
            _remove(docker_client, n)
        if mnt is not None:
            mnt.unmount()
        run.gc_container_mounts(docker_client)
        srv.stop()


def test_a_hot_layout_checkpointed_in_a_container_restores_in_a_new_one(docker_client, app_image, tiny_model_dir,
                                                                         tmp_path):
    """The default layout, hot, restores the snapshot once inside the checkpoint container (its
    run-dir overlay needs the same state tmpfs as a restore container); the split snapshot restores
    in another, and in a third, which finds CRIU's kernel facts that the second probed in the node dir.
    Both are warmed from the host (following the shipped profile): the first, on a node without a
    profile of its own, records one from the restored tree's page tables, entrypoint files included;
    the second follows it and records nothing."""
    from coldstart.warm.profile import load_profile
    from coldstart.warm.snapshot import node_profile

    layers = docker_api.image_layers(docker_client, app_image.tag)
    res = run.checkpoint(docker_client, app_image.tag, tiny_model_dir, tmp_path / "tiny-hot")
    assert res.exit_code == 0, res.logs[-3000:]
    assert sorted(res.caps) == run.CHECKPOINT_CAPS
    manifest = json.loads((res.snapshot / "manifest.json").read_text())
    assert manifest["layout"] and manifest["layout"]["child_bytes"] > 0, res.logs[-3000:]
    assert (res.snapshot / "criu" / "parent").is_dir()
    assert (res.snapshot / "profile.json").is_file()
    came, warm = [], []
    try:
        for _ in range(2):
            port = free_port()
            ctr = run.create_restore(docker_client, app_image.tag, res.snapshot, tiny_model_dir, port,
                                     node=tmp_path / "node", host_warms=True)
            warmer = run.host_warm(res.snapshot, layers)
            try:
                ctr.start()
                attrs = _restores_and_serves(ctr, port, tiny_model_dir)["attrs"]
                came.append(attrs["MANIFEST_OK"]["kdat"])
                warm.append((attrs["WARM_START"]["mode"].split(":")[0], attrs["WARM_START"]["recording"]))
            finally:
                warmer.cancel()
                ctr.remove(force=True)
        assert came == ["probed", "node"], came
        assert warm == [("deferred", True), ("deferred", False)], warm
        mine = node_profile(res.snapshot)
        prof = load_profile(tmp_path / "node" / mine.relative_to(mine.parents[2]))
        assert "pagecache" not in {r.source for r in prof.ranges}  # the host's reads are not the restore's
        assert any(r.file.startswith("criu/pages-") and r.source == "pagemap" for r in prof.ranges)
        assert prof.mapped_files() and any(r.source == "process" for r in prof.ranges)
    finally:
        shutil.rmtree(res.snapshot, ignore_errors=True)


def test_the_container_restore_command_prints_where_the_host_reaches_the_server(docker_host, docker_client, app_image,
                                                                                container_snapshot, tiny_model_dir):
    """`coldstart container restore` as a user runs it: its summary's url is the published port on the
    host (the entrypoint's own, inside the container, is container_url), and that port serves."""
    import os
    import subprocess
    import sys

    port = free_port()
    name = f"coldstart-test-cli-{os.getpid()}"
    try:
        p = subprocess.run([sys.executable, "-m", "coldstart", "container", "restore", str(container_snapshot),
                            "--model", str(tiny_model_dir), "--port", str(port), "--name", name,
                            "--host", docker_host], capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        out = json.loads(p.stdout.strip().splitlines()[-1])
        assert out["restored"] is True and out["status"] == "running", out
        assert out["url"] == f"http://127.0.0.1:{port}" and out["container_url"] == "http://127.0.0.1:8000", out
        assert "CONTAINER_CREATE" in out["events"] and "CONTAINER_STARTED" in out["events"], out["events"]
        assert _completion(port, str(tiny_model_dir))["choices"][0]["text"]
    finally:
        _remove(docker_client, name)


def test_the_container_restore_command_restores_a_packed_image(docker_host, docker_client, app_image,
                                                              container_snapshot, tiny_model_dir, tmp_path,
                                                              monkeypatch):
    """`coldstart container restore IMAGE`, the image from `coldstart snapshot pack` (the node's copy):
    the host mounts it where `coldstart restore IMAGE` would (one mount per image under the node dir,
    left for the next restore) and binds that mount into the container, which restores from it. A
    file that is no image is one line naming it."""
    import os
    import subprocess
    import sys

    from coldstart.pipeline import nodeimage

    monkeypatch.setenv("COLDSTART_NODE_DIR", str(tmp_path / "node"))
    image = tmp_path / "tiny.erofs"
    nodeimage.pack(container_snapshot, image, compressor="lz4")
    port = free_port()
    name = f"coldstart-test-image-{os.getpid()}"
    try:
        p = subprocess.run([sys.executable, "-m", "coldstart", "container", "restore", str(image), "--model",
                            str(tiny_model_dir), "--port", str(port), "--name", name, "--host", docker_host],
                           capture_output=True, text=True, timeout=600, env=dict(os.environ))
        assert p.returncode == 0, p.stderr[-3000:]
        assert json.loads(p.stdout.strip().splitlines()[-1])["restored"] is True, p.stdout[-2000:]
        assert os.path.ismount(nodeimage.node_mount_point(image))
        assert _completion(port, str(tiny_model_dir))["choices"][0]["text"]
    finally:
        _remove(docker_client, name)
        if os.path.ismount(nodeimage.node_mount_point(image)):
            nodeimage.unmount(image)
    (tmp_path / "not-an-image").write_bytes(b"x" * 4096)
    p = subprocess.run([sys.executable, "-m", "coldstart", "container", "restore", str(tmp_path / "not-an-image"),
                        "--model", str(tiny_model_dir), "--port", str(free_port()), "--host", docker_host],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1] == (f"error: snapshot {tmp_path / 'not-an-image'} is a file but not an "
                                                 "image written by `coldstart snapshot pack` (a snapshot is a "
                                                 "directory)"), p.stderr[-2000:]


def test_checkpoint_into_a_named_volume_and_restore_from_it(docker_host, docker_client, app_image, tiny_model_dir):
    """`container checkpoint MODEL --out volume:NAME` writes the snapshot into a docker named volume
    (docker creates it); `container restore volume:NAME` mounts that volume read-only and restores,
    the host warming it where it sees the volume's data. A volume docker does not have is one line,
    and none is created by asking."""
    import os
    import subprocess
    import sys

    vol, name = f"coldstart-test-vol-{os.getpid()}", f"coldstart-test-vol-{os.getpid()}"
    missing = f"coldstart-test-no-vol-{os.getpid()}"
    cli = [sys.executable, "-m", "coldstart", "container"]
    try:
        p = subprocess.run([*cli, "checkpoint", str(tiny_model_dir), "--out", f"volume:{vol}", "--layout", "dumped",
                            "--host", docker_host], capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
        held = run.volume_snapshot(docker_client, vol)
        assert held is not None and (held / "manifest.json").is_file()
        assert f"snapshot: volume:{vol} (on this host: {held})" in p.stdout, p.stdout[-2000:]
        p = subprocess.run([*cli, "checkpoint", str(tiny_model_dir), "--out", f"volume:{vol}", "--host", docker_host],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode != 0 and p.stderr.strip().splitlines()[-1].startswith(
            f"error: volume {vol} already holds a snapshot"), p.stderr[-2000:]
        port = free_port()
        p = subprocess.run([*cli, "restore", f"volume:{vol}", "--model", str(tiny_model_dir), "--port", str(port),
                            "--name", name, "--host", docker_host], capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        out = json.loads(p.stdout.strip().splitlines()[-1])
        assert out["restored"] is True and out["canary_ok"] is True, out
        mounts = docker_client.containers.get(name).attrs["Mounts"]
        assert any(m["Type"] == "volume" and m["Name"] == vol and m["Destination"] == "/snapshot" and not m["RW"]
                   for m in mounts), mounts
        assert _completion(port, str(tiny_model_dir))["choices"][0]["text"]
        p = subprocess.run([*cli, "restore", f"volume:{missing}", "--model", str(tiny_model_dir), "--port",
                            str(free_port()), "--host", docker_host], capture_output=True, text=True, timeout=300)
        assert p.returncode != 0 and "Traceback" not in p.stderr
        assert p.stderr.strip().splitlines()[-1].startswith(f"error: docker has no volume {missing} "), p.stderr[-2000:]
        assert not run.volume_snapshot(docker_client, missing) and missing not in [
            v.name for v in docker_client.volumes.list()]
    finally:
        _remove(docker_client, name)
        try:
            docker_client.volumes.get(vol).remove(force=True)
        except Exception:  # noqa: BLE001 - never made
            pass


def test_a_start_docker_refuses_is_one_line_and_leaves_no_container(docker_client, app_image, container_snapshot,
                                                                     tiny_model_dir):
    """The published port taken between the check and the start call: docker refuses the start; the
    created container is removed and the reason is one ColdstartError line."""
    import socket

    from coldstart.errors import ColdstartError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        ctr = run.create_restore(docker_client, app_image.tag, container_snapshot, tiny_model_dir, port)
        with pytest.raises(ColdstartError, match=f"docker could not start container {ctr.name}: .*{port}"):
            run.start(ctr)
    assert not docker_client.containers.list(all=True, filters={"id": ctr.id})


def test_a_taken_name_is_one_line_and_the_lazy_mount_goes(docker_host, docker_client, app_image, container_snapshot,
                                                          tiny_model_dir, tmp_path):
    """`coldstart container restore REF --name N` with N taken: docker refuses the create call; the
    command says so in one line, exits non-zero, and unmounts the lazy mount it made for the container."""
    import os
    import subprocess
    import sys

    from coldstart.registry import artifact, server

    srv = server.start(tmp_path / "registry", free_port())
    name = f"coldstart-test-taken-{os.getpid()}"
    try:
        docker_client.containers.create(app_image.tag, ["true"], name=name, entrypoint=["true"])
        ref = f"{srv.host}/snapshots/container-taken:v1"
        artifact.push(container_snapshot, ref)
        env = {**os.environ, "COLDSTART_LAZY_CACHE": str(tmp_path / "lazy-cache"),
               "COLDSTART_STATE_DIR": str(tmp_path / "state")}
        p = subprocess.run([sys.executable, "-m", "coldstart", "container", "restore", ref, "--model",
                            str(tiny_model_dir), "--port", str(free_port()), "--name", name, "--host", docker_host],
                           capture_output=True, text=True, timeout=600, env=env)
        assert p.returncode != 0
        last = p.stderr.strip().splitlines()[-1]
        assert last.startswith(f"error: docker could not create container {name}: ") and "in use" in last, p.stderr[-2000:]
        assert "Traceback" not in p.stderr
        mounts = tmp_path / "state" / "mounts"
        assert not mounts.exists() or not any(os.path.ismount(m) for m in mounts.iterdir()), list(mounts.iterdir())
    finally:
        _remove(docker_client, name)
        srv.stop()


def test_a_lazy_mount_made_for_a_container_goes_once_the_container_is_removed(docker_host, docker_client, app_image,
                                                                              container_snapshot, tiny_model_dir,
                                                                              tmp_path, monkeypatch):
    """`coldstart container restore REF` returns while its container serves from the host's lazy mount;
    the mount stays while the container exists, and the next one's clean-up (gc_container_mounts)
    unmounts it once the container is removed. As on a host, the mount's daemon prefetches only the
    profiled chunks, and is asked for the rest once the container serves restored: every chunk of the
    artifact then reaches the node's chunk cache."""
    import os
    import subprocess
    import sys

    import psutil

    from coldstart.registry import artifact, server
    from coldstart.registry.distribution import Ref, Registry

    srv = server.start(tmp_path / "registry", free_port())
    name = f"coldstart-test-mount-gc-{os.getpid()}"
    monkeypatch.setenv("COLDSTART_LAZY_CACHE", str(tmp_path / "lazy-cache"))
    monkeypatch.setenv("COLDSTART_STATE_DIR", str(tmp_path / "state"))
    try:
        ref = f"{srv.host}/snapshots/container-gc:v1"
        artifact.push(container_snapshot, ref)
        port = free_port()
        p = subprocess.run([sys.executable, "-m", "coldstart", "container", "restore", ref, "--model",
                            str(tiny_model_dir), "--port", str(port), "--name", name, "--host", docker_host],
                           capture_output=True, text=True, timeout=600, env=dict(os.environ))
        assert p.returncode == 0, p.stderr[-3000:]
        summary = json.loads(p.stdout.strip().splitlines()[-1])
        assert summary["restored"] is True and summary["snapshot_fetch_all"] is True, summary
        mnts = [m for m in (tmp_path / "state" / "mounts").iterdir() if m.is_dir()]
        assert len(mnts) == 1 and os.path.ismount(mnts[0])
        daemon = next(q for q in psutil.process_iter(["cmdline"]) if str(mnts[0]) in (q.info["cmdline"] or []))
        argv = daemon.info["cmdline"]
        assert argv[argv.index("--prefetch") + 1] == "profiled", argv
        index, _, _ = artifact.fetch_index(Registry(Ref.parse(ref)))
        want = [tmp_path / "lazy-cache" / "chunks" / c.digest.split(":", 1)[1][:2] / c.digest.split(":", 1)[1]
                for c in index.chunks]
        deadline = time.monotonic() + 300
        while (missing := [w for w in want if not w.exists()]) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not missing, f"{len(missing)} of {len(want)} chunks never fetched"
        assert run.gc_container_mounts(docker_client) == [] and os.path.ismount(mnts[0])  # still in use
        assert _completion(port, str(tiny_model_dir))["choices"][0]["text"]
        docker_client.containers.get(name).remove(force=True)
        assert run.gc_container_mounts(docker_client) == mnts
        assert not mnts[0].exists() and not list((tmp_path / "state" / "mounts").iterdir())
    finally:
        _remove(docker_client, name)
        for m in (tmp_path / "state" / "mounts").glob("*"):
            if os.path.ismount(m):
                subprocess.run(["fusermount3", "-u", "-z", str(m)])
        srv.stop()
